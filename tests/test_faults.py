"""The fault suite of a recording (issue 12, items 1, 2, 3, 7): however the process ends, every
completed step survives, no traceback from ckview, and no user file is destroyed.

Each case runs ``ckview record`` in a subprocess on a tiny script that hurts itself at a chosen
iteration (signals, ``os._exit``, a fork, closing every file descriptor); benchmarks/
fault_suite_record.py runs the longer version with counts per family.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckview.trace import Trace, open_trace
from ckview.trace.schema import RUN_TABLES
from tests.conftest import ROOT

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

SCRIPT = """\
import os, signal, sys, weakref
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
action, at = sys.argv[1], int(sys.argv[2])
for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 40):
    if i == at:
        if action == "exit":
            os._exit(3)
        elif action == "closefds":
            os.closerange(3, 4096)
        elif action == "fork":
            child = os.fork()
            if child == 0:
                raise RuntimeError("the child fails")
            os.waitpid(child, 0)
        elif action.endswith("-in-callback"):  # the handler runs inside a weakref callback
            def hurt(_ref, signum=getattr(signal, action.split("-")[0])):
                os.kill(os.getpid(), signum)
                for _ in range(1000):
                    pass
            box = type("Box", (), {})()
            keep = weakref.ref(box, hurt)
            del box
        elif action != "none":
            os.kill(os.getpid(), getattr(signal, action))
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""

EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129, "SIGKILL": -9, "exit": 3}


def _record(tmp_path: Path, *args: str, out: str = "out.h5") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "ckview", "record", "-o", out]
    return subprocess.run(
        [*command, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=stops_as_by_default,
    )


def stops_as_by_default() -> None:
    """The child takes SIGINT, SIGTERM and SIGHUP as an interactive shell gives them, however
    the suite was started: ``nohup`` ignores SIGHUP, and a non-interactive shell starts a
    background job with SIGINT ignored; ckview keeps an inherited ignored stop ignored, as
    Python does (NOTE [ A stop is never lost ])."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _steps(path: Path) -> tuple[int, list[int]]:
    """Steps recorded per the meta, and the complete step rows of each run."""
    with open_trace(path) as trace:
        assert isinstance(trace, Trace)
        rows = []
        for name in trace.run_names:
            steps = trace.run(name).table("steps").read()
            rows.append(int(np.count_nonzero(steps["complete"])))
        return trace.meta.steps_recorded, rows


def _no_ckview_traceback(stderr: str) -> None:
    """A traceback may come from the script (Python prints the script's own), never from
    ckview, the recorder or h5py."""
    for marker in ("ckview/", "recorder/", "h5py", "Fatal Python error"):
        assert marker not in stderr, stderr


# ----------------------------------------------------------------------------- signals


@pytest.mark.parametrize(
    ("sig", "at", "steps", "timing", "kept"),
    [
        ("SIGTERM", 0, 20, 0, 0),  # in warmup
        ("SIGINT", 2, 20, 0, 1),  # after step 1
        ("SIGHUP", 12, 20, 0, 11),  # after many steps
        ("SIGKILL", 12, 20, 0, 11),
        ("SIGKILL", 5, 2, 2, 2),  # during the timing steps: one of them kept
    ],
)
def test_a_signal_keeps_every_completed_step(
    tmp_path: Path, run_cli: Any, sig: str, at: int, steps: int, timing: int, kept: int
) -> None:
    done = _record(
        tmp_path, f"--steps={steps}", f"--timing-steps={timing}", "train.py", sig, str(at)
    )
    assert done.returncode == EXIT[sig], done.stderr
    _no_ckview_traceback(done.stderr)
    out = tmp_path / "out.h5"
    if sig == "SIGKILL":  # nothing could run: the journal is rebuilt, by ckview recover or by
        # the first verb that reads the trace (here: the killed recording's own file)
        assert not out.exists()
        (staging,) = tmp_path.glob("out.recording-*.h5")
        assert staging.with_suffix(".journal").exists()
        code, _, err = run_cli(
            *(["recover", str(out)] if at > steps else ["validate", str(staging)])
        )
        assert code == 0 and f"recovered {kept} step" in err, err
        assert not list(tmp_path.glob("out.recording-*")), "the journal and staging are gone"
    else:
        assert "stopped by a signal" in done.stderr or "interrupted" in done.stderr
    recorded, rows = _steps(out)
    assert recorded == kept and sum(rows) == kept
    with open_trace(out) as trace:
        assert trace.meta.complete is False or (sig != "SIGKILL" and at >= steps + 1)
        if timing:  # the schedule: a warm-up step, then kept ones; killed in the second kept
            assert len(trace.run(trace.run_names[0]).table("timing_steps")) == 1


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])  # SIGHUP takes SIGTERM's handler
def test_a_signal_in_a_weakref_callback_still_stops_the_script(tmp_path: Path, sig: str) -> None:
    """NOTE [ A stop is never lost ]: Python swallows an exception raised in a weak-reference
    callback, and the recorder sees frees through such callbacks: the stop is held and raised
    after it."""
    done = _record(tmp_path, "--steps=20", "train.py", f"{sig}-in-callback", "12")
    assert done.returncode == EXIT[sig], done.stderr
    _no_ckview_traceback(done.stderr)
    assert "Exception ignored" not in done.stderr
    recorded, rows = _steps(tmp_path / "out.h5")
    assert 11 <= recorded < 20 and sum(rows) == recorded  # stopped within a step or two


SESSION = ROOT / "recorder" / "session.py"


def _bookkeeping(code: str, **names: Any) -> None:
    """Run ``code`` as if it were the recorder's own (its frames carry the recorder's path)."""
    exec(compile(code, str(SESSION), "exec"), {"sys": sys, "signal": signal, **names})


def test_a_stop_in_the_recorders_bookkeeping_is_raised_at_the_scripts_next_line() -> None:
    """NOTE [ A stop is never lost ]: in the recorder's own code the handler raises nothing; the
    stop is held and raised at the next line of the frame the bookkeeping returns to."""
    from ckview.cli import stops
    from recorder import SignalExit

    lines_run = []
    with pytest.raises(SignalExit):
        _bookkeeping("stops._stop(signal.SIGTERM, sys._getframe())", stops=stops)
        lines_run.append("the line after the bookkeeping")  # the stop is raised before it
    assert lines_run == [] and stops._held.frame is None and sys.gettrace() is None
    with pytest.raises(KeyboardInterrupt):
        stops._stop(signal.SIGINT, sys._getframe())  # the script's own code: raised at once


def test_a_held_stop_follows_its_frame_out_when_that_frame_returns_first() -> None:
    from ckview.cli import stops
    from recorder import SignalExit

    def calls_the_recorder_last() -> None:
        _bookkeeping("stops._stop(signal.SIGTERM, sys._getframe())", stops=stops)

    lines_run = []
    with pytest.raises(SignalExit):
        calls_the_recorder_last()  # its last line: the stop moves out to this frame
        lines_run.append("the caller's next line")
    assert lines_run == [] and stops._held.frame is None


def test_a_stop_swallowed_by_a_weakref_callback_is_raised_after_it(monkeypatch: Any) -> None:
    """Python swallows what a weak-reference callback raises; the hook holds it instead, for
    the next line of the code that dropped the reference."""
    import weakref

    from ckview.cli import stops
    from recorder import SignalExit

    monkeypatch.setattr(sys, "unraisablehook", stops._hold_if_swallowed(sys.unraisablehook))

    def hurt(_ref: Any) -> None:
        raise SignalExit(signal.SIGTERM)

    box = type("Box", (), {})()
    ref = weakref.ref(box, hurt)
    lines_run = []
    with pytest.raises(SignalExit):
        del box  # the callback runs here and its SignalExit is swallowed
        lines_run.append("the line after the callback")
    assert lines_run == [] and ref() is None


def test_the_frame_a_stop_is_raised_in_lies_outside_the_recorder() -> None:
    from ckview.cli import stops

    inside: dict[str, Any] = {}
    _bookkeeping("out['frame'] = sys._getframe()", out=inside)
    assert stops.in_the_recorder(inside["frame"])
    outside = stops.frame_outside_the_recorder(inside["frame"])
    assert outside is not None and outside.f_code.co_name == "_bookkeeping"  # exec's caller
    assert not stops.in_the_recorder(sys._getframe())
    assert stops.frame_outside_the_recorder(sys._getframe()) is sys._getframe()


def test_an_inherited_ignored_sigint_stays_ignored(tmp_path: Path) -> None:
    """NOTE [ A stop is never lost ]: a job that a non-interactive shell starts in the
    background has SIGINT ignored; ckview, like Python, leaves it so. SIGTERM still stops."""

    def sigint_ignored() -> None:
        stops_as_by_default()
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "ckview", "record", "-o", "out.h5", "--steps=6"]
    done = subprocess.run(
        [*command, "train.py", "SIGINT", "3", "8"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=sigint_ignored,
    )
    assert done.returncode == 0, done.stderr
    assert _steps(tmp_path / "out.h5") == (6, [6])


def test_os_exit_in_the_script_closes_the_trace_first(tmp_path: Path) -> None:
    done = _record(tmp_path, "--steps=20", "train.py", "exit", "6")
    assert done.returncode == 3
    _no_ckview_traceback(done.stderr)
    assert "os._exit(3) in the script" in done.stderr
    assert _steps(tmp_path / "out.h5") == (5, [5])


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory: Any) -> Path:
    """A complete trace of 2 steps, recorded by the suite's script."""
    folder = tmp_path_factory.mktemp("good")
    done = _record(folder, "--steps=2", "--timing-steps=0", "train.py", "none", "-1", "5")
    assert done.returncode == 0, done.stderr
    return folder / "out.h5"


def test_recover_keeps_a_good_trace(tmp_path: Path, run_cli: Any, good_trace: Path) -> None:
    _record(tmp_path, "--steps=20", "train.py", "SIGKILL", "4")
    shutil.copy(good_trace, tmp_path / "out.h5")
    code, out, err = run_cli("summary", str(tmp_path / "out.h5"))
    assert code == 0 and "out.incomplete.h5" in err and "was left as it was" in err
    assert "2 steps recorded" in out and "complete" in out
    assert _steps(tmp_path / "out.h5") == (2, [2])
    assert _steps(tmp_path / "out.incomplete.h5") == (3, [3])
    code, _, err = run_cli("recover", str(tmp_path / "out.h5"))
    assert code == 2 and err.count("\n") == 1 and "no killed recording" in err


# ----------------------------------------------------------------------------- the journal


@pytest.mark.parametrize("runs", [("main",), ("a", "b")])
@pytest.mark.parametrize("ops_per_layer", [1, 600])
def test_the_journal_rebuilds_the_same_trace(
    tmp_path: Path, monkeypatch: Any, runs: tuple[str, ...], ops_per_layer: int
) -> None:
    """What a killed recording's journal gives back is, table for table, what the closed trace
    holds, timings included. With 600 ops per layer the
    hot-path buffers are written mid-step (every 4096 ops), so records take rows both from
    written batches and from the buffers."""
    import torch

    from ckview.trace.journal import recover_journal
    from recorder import Recorder, RunSpec
    from recorder.sink import TraceSink as Session

    class Slow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(ops_per_layer):
                x = x * 1.0001
            return x

    kept = tmp_path / "kept.journal"
    settle = Session._settle

    def keep_journal(self: Any, writer: Any, error: str) -> None:
        shutil.copy(self.journal, kept)
        settle(self, writer, error)

    monkeypatch.setattr(Session, "_settle", keep_journal)
    layers = [torch.nn.Linear(8, 16), Slow(), torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    specs = [RunSpec(name) for name in runs]
    with Recorder(tmp_path / "t.h5", steps=4, warmup=1, timing_steps=1, runs=specs):
        for _ in range(2 + 6 * len(runs)):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    recover_journal(kept, tmp_path / "r.h5", "rebuilt")
    with open_trace(tmp_path / "t.h5") as real, open_trace(tmp_path / "r.h5") as rebuilt:
        assert list(rebuilt.strings) == list(real.strings)
        assert rebuilt.meta.steps_recorded == real.meta.steps_recorded == 4 * len(runs)
        assert rebuilt.meta.complete is False and rebuilt.meta.error == "rebuilt"
        assert rebuilt.run_names == real.run_names == list(runs)
        _same(real.modules.read(), rebuilt.modules.read())
        for name in runs:
            assert len(real.run(name).table("ops")) > (4096 if ops_per_layer > 1 else 0)
            for table in RUN_TABLES:
                _same(real.run(name).table(table).read(), rebuilt.run(name).table(table).read())
            timed = len(real.run(name).table("timing_steps"))  # NOTE [ Enough plain steps ]
            assert len(rebuilt.run(name).table("timing_steps")) == timed >= 1
            assert rebuilt.run(name).steps_recorded == 4


def test_the_journal_takes_each_buffered_row_once() -> None:
    """NOTE [ Raw rows in the journal ]: a record takes the rows appended since the last one,
    also those a flush handed to the trace meanwhile, each once."""
    from recorder.buffers import RowBuffer

    buf = RowBuffer("memory_events", lambda table, columns: None)
    width = buf.width

    def append(first: int, count: int) -> None:
        buf.data.extend(range(first * width, (first + count) * width))

    def taken() -> list[int]:
        return (buf.take_rows().reshape(-1, width)[:, 0] // width).tolist()

    append(0, 3)
    assert taken() == [0, 1, 2]
    append(3, 2)
    assert taken() == [3, 4]
    append(5, 1)
    buf.flush()  # rows 3 and 4 were taken: only 5 is held for the next record
    append(6, 1)
    assert taken() == [5, 6]
    buf.flush()
    assert taken() == [] and buf.rows == 7


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_damaged_journal_tail_is_ignored(tmp_path: Path) -> None:
    from ckview.trace.journal import JournalWriter, read_journal

    path = tmp_path / "x.journal"
    journal = JournalWriter(path, {"command": ["x"]})
    journal.append({"kind": "step", "n": 1}, {"a/b": np.arange(5)})
    journal.append({"kind": "step", "n": 2}, {"a/b": np.arange(7)})
    whole = path.read_bytes()
    for cut in (len(whole) - 1, len(whole) - 20):
        path.write_bytes(whole[:cut])
        assert [h.get("n") for h, _ in read_journal(path)] == [None, 1]
    flipped = bytearray(whole)
    flipped[-3] ^= 0xFF
    path.write_bytes(bytes(flipped))
    assert [h.get("n") for h, _ in read_journal(path)] == [None, 1]


# ----------------------------------------------------------------------------- disk full, busy


def test_a_full_disk_keeps_the_steps_recorded_before(
    tmp_path: Path, monkeypatch: Any, run_cli: Any
) -> None:
    """The trace's flushes (one per step here) fail with ENOSPC from the fourth on: one line,
    the steps journaled until then are rebuilt into the trace, marked incomplete, and the
    journal stops too (writing on would only fill the disk further)."""
    from ckview.trace import writer

    calls = {"n": 0}
    flush = writer.TraceWriter.flush

    def failing_flush(self: Any) -> None:
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        flush(self)

    monkeypatch.setattr(writer.TraceWriter, "flush", failing_flush)
    monkeypatch.setattr("recorder.runs._FILE_FLUSH_NS", 0)  # a flush per step
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code, _, err = run_cli(
        "record", "--steps=10", "-o", str(tmp_path / "o.h5"), str(script), "none", "-1", "14"
    )
    assert "cannot write the trace: the disk is full" in err
    assert "Traceback" not in err
    assert code == 1, (err, sorted(p.name for p in tmp_path.iterdir()))
    recorded, rows = _steps(tmp_path / "o.h5")
    assert recorded == 4 and rows == [4]  # journaled before the failed flush of step 4's end
    assert not list(tmp_path.glob("o.recording-*"))


def test_a_trace_open_elsewhere_says_so(tmp_path: Path) -> None:
    from ckview.trace import TraceError, TraceWriter

    path = tmp_path / "busy.h5"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import h5py,sys; f=h5py.File({str(path)!r},'w'); f.flush(); "
            "print('open', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(TraceError, match="it is open elsewhere"):
            TraceWriter(path)
    finally:
        holder.communicate("")


# ----------------------------------------------------------------------------- bad scripts


def test_a_forked_child_that_fails_leaves_the_parents_trace(tmp_path: Path) -> None:
    done = _record(tmp_path, "--steps=5", "--timing-steps=0", "train.py", "fork", "3", "7")
    assert done.returncode == 0, done.stderr
    assert "RuntimeError: the child fails" in done.stderr  # the script's own traceback
    assert done.stderr.count("ckview: ") == 1, done.stderr  # the parent's line only
    assert _steps(tmp_path / "out.h5") == (5, [5])


def test_a_script_that_closes_every_file_descriptor(tmp_path: Path) -> None:
    done = _record(tmp_path, "--steps=6", "--timing-steps=0", "train.py", "closefds", "3", "8")
    assert done.returncode == 0, done.stderr
    _no_ckview_traceback(done.stderr)
    assert _steps(tmp_path / "out.h5") == (6, [6])
    with open_trace(tmp_path / "out.h5") as trace:
        assert trace.meta.complete


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["--steps", "999999999999"], "--steps: must be from 1 to 1,000,000, got 9"),
        (["--steps", "-1"], "--steps: must be from 1 to 1,000,000, got -1"),
        (["--steps", "0"], "--steps: must be from 1 to 1,000,000, got 0"),  # one message
        (["--warmup", "10000000"], "--warmup: must be from 0 to 1,000,000"),
        (["--timing-steps", "1" + "0" * 30], "--timing-steps: must be from 0 to"),
    ],
)
def test_int_options_are_checked_when_parsed(
    tmp_path: Path, run_cli: Any, capsys: Any, argv: list[str], wanted: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(SystemExit) as exit_:
        run_cli("record", *argv, str(script))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert wanted in err and "Traceback" not in err


def test_a_package_without_main(tmp_path: Path, run_cli: Any, monkeypatch: Any) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_cli("record", "-m", "pkg")
    assert code == 2 and err.count("\n") == 1 and "package without __main__.py" in err


# ----------------------------------------------------------------------------- -o collisions


def test_o_is_never_the_script(tmp_path: Path, run_cli: Any) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for verb in ("record", "verify"):
        code, _, err = run_cli(verb, "--plan", "none", "-o", str(script), str(script))
        assert code == 2 and "an input of this command" in err, err
    assert script.read_text() == SCRIPT


def test_o_is_never_a_plan_file(tmp_path: Path, run_cli: Any) -> None:
    plan = tmp_path / "plan.json"
    text = '{"format": "ckview-plan", "version": 1, "name": "p", "regions": []}'
    plan.write_text(text)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code, _, err = run_cli("record", "--plan", str(plan), "-o", str(plan), str(script))
    assert code == 2 and err.count("\n") == 1, err
    assert plan.read_text() == text


def test_o_is_never_a_file_that_is_not_a_trace(tmp_path: Path, run_cli: Any) -> None:
    notes = tmp_path / "notes.h5"
    notes.write_text("my notes")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code, _, err = run_cli("record", "-o", str(notes), str(script))
    assert code == 2 and "is not a ckview trace" in err and err.count("\n") == 1
    assert notes.read_text() == "my notes"


def test_plan_and_export_never_write_over_their_trace(tmp_path: Path, run_cli: Any) -> None:
    trace = ROOT / "sample_traces" / "mlp.h5"
    copy = tmp_path / "t.csv"
    shutil.copy(trace, copy)
    before = copy.read_bytes()
    code, _, err = run_cli("plan", str(copy), "--budget", "90%", "-o", str(copy))
    assert code == 2 and "an input of this command" in err
    code, _, err = run_cli("export", str(copy), "-o", str(copy))
    assert code == 2 and "an input of this command" in err
    assert copy.read_bytes() == before


def test_a_failing_recording_never_replaces_a_good_trace(tmp_path: Path, good_trace: Path) -> None:
    shutil.copy(good_trace, tmp_path / "out.h5")
    before = (tmp_path / "out.h5").read_bytes()
    failed = _record(tmp_path, "--steps=20", "--warmup=3", "train.py", "SIGTERM", "1")
    assert failed.returncode == 143
    assert (tmp_path / "out.h5").read_bytes() == before
    assert "out.h5 was left as it was" in failed.stderr


def test_a_good_recording_says_it_replaced_a_trace(
    tmp_path: Path, run_cli: Any, good_trace: Path
) -> None:
    out = tmp_path / "out.h5"
    shutil.copy(good_trace, out)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    args = ("--steps=1", "--timing-steps=0", "-o", str(out), str(script), "none", "-1", "4")
    code, _, err = run_cli("record", *args)
    assert code == 0 and "(1 step, replacing the trace that was there)" in err, err
    assert _steps(out) == (1, [1])


@pytest.mark.parametrize(("there", "new", "replaced"), [(5, 2, False), (2, 5, True), (2, 2, True)])
def test_an_incomplete_trace_is_replaced_only_by_one_as_complete(
    tmp_path: Path, there: int, new: int, replaced: bool
) -> None:
    from ckview.trace import TraceWriter
    from ckview.trace.staging import incomplete_path, settle

    target, staging = tmp_path / "t.h5", tmp_path / "t.recording-1.h5"
    for path, steps in ((target, there), (staging, new)):
        with TraceWriter(path, meta={"steps_recorded": steps}) as writer:
            writer.close(complete=False, error="interrupted")
    written = settle(staging, target, good=False)
    assert written == (target if replaced else incomplete_path(target))
    assert _steps(target)[0] == (new if replaced else there)
