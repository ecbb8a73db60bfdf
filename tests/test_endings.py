"""Honest endings of a recording: every way it can end says what happened, and never leaves a
finding that is not one (issue 10, part 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckview.trace import open_trace
from tests.conftest import ROOT, read_run

pytestmark = [pytest.mark.torch, pytest.mark.gui, pytest.mark.recorder]

LOOP = """\
import sys
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
iterations, fail_in = {iterations}, {fail_in}
for i in range(iterations):
    loss = model(torch.randn(4, 8)).sum()
    if i == fail_in:
        raise {error}
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {{i}} loss {{loss.item():.4f}}")
"""


def _script(tmp_path: Path, iterations: int, fail_in: int = -1, error: str = "") -> Path:
    script = tmp_path / f"loop_{iterations}_{fail_in}.py"
    script.write_text(LOOP.format(iterations=iterations, fail_in=fail_in, error=error or "None"))
    return script


def _meta(path: Path) -> Any:
    with open_trace(path) as trace:
        return trace.meta


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".recording-" in p.name)


# ----------------------------------------------------------------------------- no step


@pytest.mark.parametrize(
    ("iterations", "warmup", "wanted"),
    [
        (
            1,
            2,
            "ckview: the script ended after 1 of 2 warmup steps; no step was recorded: lower "
            "--warmup or let the script run more steps",
        ),
        (
            1,
            1,
            "ckview: the script ended after 1 warmup step, before a recorded step ended; no step "
            "was recorded: lower --warmup, let the script run more steps, or say what a step is "
            "with --step-every (now auto)",
        ),
    ],
    ids=["inside warmup", "after warmup"],
)
def test_no_step_recorded_is_a_failure(
    iterations: int, warmup: int, wanted: str, tmp_path: Path, run_cli: Any
) -> None:
    out = tmp_path / "t.h5"
    script = _script(tmp_path, iterations)
    code, _, err = run_cli("record", "-o", str(out), "--warmup", str(warmup), str(script))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"{wanted} (incomplete trace: {out})"
    meta = _meta(out)
    assert not meta.complete and meta.steps_recorded == 0
    assert meta.error.startswith("no step was recorded")


def test_a_step_open_at_the_end_is_incomplete_and_left_out_of_per_step_figures(
    tmp_path: Path, run_cli: Any
) -> None:
    out = tmp_path / "t.h5"
    script = _script(tmp_path, 6, fail_in=3, error="RuntimeError('mid-step')")
    code, _, err = run_cli("record", "-o", str(out), "--steps", "5", str(script))
    assert code == 1, err
    steps = read_run(out)["steps"]
    assert steps["complete"].tolist() == [1, 1, 0]  # warmup 0; steps 1, 2; 3 failed inside
    done = steps["complete"] == 1
    complete_ns = int(np.sum((steps["end_ns"] - steps["start_ns"])[done]))
    code, text, _ = run_cli("summary", "--json", str(out))
    run = json.loads(text)["runs"]["main"]
    assert run["step_ns"] == complete_ns
    assert [s["complete"] for s in run["steps"]] == [1, 1, 0]  # listed, marked partial
    from ckview.analysis.recompute import step_durations
    from ckview.analysis.timing import step_time_ns

    assert len(step_durations(steps)) == 2
    assert step_time_ns({"steps": steps})[0] == complete_ns


# ----------------------------------------------------------------------------- the target


@pytest.fixture
def good_trace(tmp_path: Path, run_cli: Any) -> Path:
    out = tmp_path / "good.h5"
    code, _, err = run_cli("record", "-o", str(out), "--steps", "2", str(_script(tmp_path, 6)))
    assert code == 0, err
    return out


@pytest.mark.parametrize(
    ("iterations", "fail_in", "error", "code", "why"),
    [
        (6, 2, "RuntimeError('boom')", 1, "the script failed (RuntimeError: boom)"),
        (6, 2, "KeyboardInterrupt", 130, "the script failed (KeyboardInterrupt: interrupted)"),
        (1, -1, "", 1, "no step was recorded"),
    ],
    ids=["script fails", "interrupted", "no step"],
)
def test_a_failed_recording_never_destroys_a_good_trace(
    iterations: int,
    fail_in: int,
    error: str,
    code: int,
    why: str,
    good_trace: Path,
    run_cli: Any,
) -> None:
    before = good_trace.read_bytes()
    script = _script(good_trace.parent, iterations, fail_in, error)
    got, _, err = run_cli("record", "-o", str(good_trace), "--steps", "2", str(script))
    assert got == code
    assert good_trace.read_bytes() == before
    beside = good_trace.with_name("good.incomplete.h5")
    assert why in err and f"{beside}; {good_trace} was left as it was" in err
    assert not _meta(beside).complete
    assert _leftovers(good_trace.parent) == []


def test_a_good_recording_replaces_the_trace(good_trace: Path, run_cli: Any) -> None:
    script = _script(good_trace.parent, 6)
    code, _, err = run_cli("record", "-o", str(good_trace), "--steps", "3", str(script))
    assert code == 0, err
    assert _meta(good_trace).steps_recorded == 3
    assert _leftovers(good_trace.parent) == []
    assert not good_trace.with_name("good.incomplete.h5").exists()


def test_a_trace_that_does_not_validate_never_replaces_a_good_one(
    good_trace: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ckview.trace.staging
    from ckview.trace import ValidationReport

    before = good_trace.read_bytes()
    broken = ValidationReport(str(good_trace), problems=["a broken reference"])
    monkeypatch.setattr(ckview.trace.staging, "validate_trace", lambda path: broken)
    script = _script(good_trace.parent, 6)
    code, _, err = run_cli("record", "-o", str(good_trace), str(script))
    assert code == 1 and good_trace.read_bytes() == before
    beside = good_trace.with_name("good.incomplete.h5")
    assert f"does not pass ckview validate {beside}; it is kept there; {good_trace} was" in err


def test_a_recording_with_no_trace_at_its_target_is_not_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [ Writing beside the target ]: with no file at the target the recording goes there
    whatever it holds, so settling it neither validates nor opens it."""
    import ckview.trace.staging as staging

    def never(path: Any) -> Any:
        raise AssertionError(f"{path} opened")

    monkeypatch.setattr(staging, "validate_trace", never)
    monkeypatch.setattr(staging, "open_trace", never)
    target = tmp_path / "t.h5"
    for good in (True, False):
        staging.staging_path(target).write_bytes(b"recorded")
        assert staging.settle(staging.staging_path(target), target, good) == target
        assert target.read_bytes() == b"recorded" and not staging.staging_path(target).exists()
        target.unlink()


def test_a_failed_recording_takes_the_place_of_no_trace(tmp_path: Path, run_cli: Any) -> None:
    out = tmp_path / "new.h5"
    script = _script(tmp_path, 6, fail_in=3, error="RuntimeError('boom')")
    code, _, err = run_cli("record", "-o", str(out), "--steps", "5", str(script))
    assert code == 1
    assert f"the trace, marked incomplete, is {out}\n" in err
    assert not _meta(out).complete and _leftovers(tmp_path) == []


def test_the_recording_is_written_beside_the_target(tmp_path: Path) -> None:
    """While the script runs, the target is untouched and the trace grows beside it."""
    from ckview.trace.staging import staging_path
    from recorder import Recorder

    target = tmp_path / "t.h5"
    target.write_bytes(b"not yet")
    with Recorder(target, steps=1, warmup=0, progress=False) as recorder:
        assert staging_path(target).exists() and target.read_bytes() == b"not yet"
        import torch

        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    assert recorder.written == target and _meta(target).complete
    assert not staging_path(target).exists()


# ----------------------------------------------------------------------------- --compare


def test_compare_on_a_script_that_never_checkpoints_says_so(tmp_path: Path, run_cli: Any) -> None:
    out = tmp_path / "c.h5"
    code, _, err = run_cli("record", "-o", str(out), "--compare", str(_script(tmp_path, 6)))
    assert code == 0, err
    assert (
        "ckview: note: the script never checkpointed (nothing was recomputed in run "
        "'checkpointed'), so runs 'baseline' and 'checkpointed' are the same step"
    ) in err


def test_a_run_without_ops_is_not_compared(tmp_path: Path, run_cli: Any) -> None:
    """The script ends after run 'baseline': run 'checkpointed' holds no complete step and is
    listed as such, never as a peak change."""
    out = tmp_path / "c.h5"
    code, _, err = run_cli("record", "-o", str(out), "--compare", str(_script(tmp_path, 2)))
    assert code == 0, err
    assert "the script ended after 1 of 2 steps (1 per run)" in err
    assert "never checkpointed" not in err  # it was not recorded: nothing to say about it
    code, text, _ = run_cli("summary", str(out))
    assert code == 0
    row = next(line for line in text.splitlines() if line.startswith("checkpointed "))
    assert "no step recorded" in row and "%" not in row


# ----------------------------------------------------------------------------- progress


def _record(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "ckview", "record", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, as in a terminal
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_progress_never_runs_into_the_scripts_output(tmp_path: Path) -> None:
    script = _script(tmp_path, 6)
    proc = _record("--progress", "--steps", "3", "-o", "p.h5", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    assert "ckview: warmup step 1/1 done" in "\n".join(lines)
    assert sum(line.startswith("ckview: recorded step ") for line in lines) == 3
    for line in lines:  # each line is either ckview's or the script's, never both
        assert line.startswith("ckview: ") != line.startswith("step "), line
    assert [line for line in lines if line.startswith("step ")] == [
        line for line in lines if "loss" in line
    ]


def test_progress_is_off_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    proc = _record("-o", "p.h5", str(_script(tmp_path, 6)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert "warmup step" not in proc.stdout and "recorded step" not in proc.stdout
    assert "ckview: wrote p.h5 (1 step); next: ckview summary p.h5" in proc.stdout


# ----------------------------------------------------------------------------- words


def test_plurals(good_trace: Path, tmp_path: Path, run_cli: Any) -> None:
    code, text, _ = run_cli("summary", str(good_trace))
    assert code == 0 and " 2 steps recorded on cpu in 1 run " in text
    code, _, err = run_cli("record", "-o", str(tmp_path / "one.h5"), str(_script(tmp_path, 6)))
    assert code == 0 and "(1 step);" in err
    assert "(1 steps)" not in err and "1 runs" not in text


# ----------------------------------------------------------------------------- view


def test_view_opens_the_good_trace_and_says_what_is_wrong_with_the_other(
    good_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: Any
) -> None:
    import ckview.gui.app
    import ckview.gui.display

    opened: list[list[str]] = []

    def run_app(paths: list[str], **_: Any) -> int:
        opened.append(paths)
        return 0

    monkeypatch.setattr(ckview.gui.display, "display_problem", lambda: None)
    monkeypatch.setattr(ckview.gui.app, "run", run_app)
    bad = tmp_path / "bad.py"
    bad.write_text("print('not a trace')\n")
    code, _, err = run_cli("view", str(bad), str(good_trace))
    assert code == 0 and opened == [[str(good_trace)]]
    assert err.startswith(f"ckview: warning: not opened: {bad} is not a ckview trace")
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli("view", str(bad))  # nothing to open: the error, one line
    assert code == 2 and err.startswith(f"ckview: error: {bad} is not a ckview trace")
