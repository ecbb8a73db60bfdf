"""OOM capture (NOTE [ OOM capture ] in recorder/oom.py) with real allocation failures on the
CPU: through ``ckview record`` and through the Recorder API."""

from __future__ import annotations

import contextlib
import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ckview.trace import open_trace, validate_trace
from recorder import Recorder
from recorder.oom import is_allocation_failure, requested_bytes
from tests.conftest import CKVIEW, DETERMINISTIC, ROOT

pytestmark = [pytest.mark.torch, pytest.mark.gui, pytest.mark.recorder]

HUGE = 2**62  # more than any machine has: the CPU allocator refuses it at once

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn


    class Grow(nn.Module):
        def forward(self, x):
            if getattr(self, "boom", False):
                torch.empty(2**62, dtype=torch.uint8)
            return x * 2


    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), Grow()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model[2][1].boom = step == int(sys.argv[1])
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    """
)


# --- the message --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 4611686018427387904 bytes. Error code 12 (Cannot "
            "allocate memory)",
            HUGE,
        ),
        (
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.06 GiB is free.",
            2 * 2**30,
        ),
        ("CUDA out of memory. Tried to allocate 20.50 MiB. GPU 0 ...", round(20.5 * 2**20)),
        ("CUDA out of memory. Tried to allocate 512 bytes. GPU 0 ...", 512),
        ("", -1),
        ("something else", -1),
    ],
)
def test_requested_bytes(message: str, expected: int) -> None:
    assert requested_bytes(message) == expected


def test_what_counts_as_an_allocation_failure() -> None:
    try:
        torch.empty(HUGE, dtype=torch.uint8)
    except RuntimeError as exc:
        assert is_allocation_failure(exc)  # what torch 2.13's CPU allocator raises
    assert is_allocation_failure(torch.OutOfMemoryError("CUDA out of memory."))
    assert is_allocation_failure(MemoryError())
    assert not is_allocation_failure(RuntimeError("shapes cannot be multiplied"))
    assert not is_allocation_failure(ValueError("can't allocate memory"))


# --- ckview record ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("oom")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    trace = tmp / "oom.h5"
    proc = subprocess.run(
        [*CKVIEW, "record", "-o", str(trace), "--steps", "3", str(script), "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=DETERMINISTIC,
    )
    return trace, proc


def test_record_exits_with_the_scripts_status_and_one_line(recorded: tuple[Path, Any]) -> None:
    trace, proc = recorded
    assert proc.returncode == 1  # Python's status for an uncaught exception
    ours = [line for line in proc.stderr.splitlines() if line.startswith("ckview")]
    assert len(ours) == 1, proc.stderr
    line = ours[0]
    assert "ran out of memory" in line
    assert "OOM in aten.empty.memory_format of Sequential.2.1, asked for 4.00 EiB" in line
    assert f"ckview summary {trace}" in line
    assert f"ckview plan {trace} --budget" in line


def test_the_trace_is_valid_and_marked(recorded: tuple[Path, Any]) -> None:
    trace, _ = recorded
    report = validate_trace(trace)
    assert report.ok, report.problems
    with open_trace(trace) as t:
        assert not t.meta.complete
        run = t.run("main")
        assert not run.complete
        assert run.oom_op == "aten.empty.memory_format"
        assert run.oom_module == "Sequential.2.1"
        assert run.oom_bytes == HUGE
        assert "can't allocate memory" in run.oom_message
        steps = run.table("steps").read()
        assert run.steps_recorded == 1  # step 0 of 3; step 1 failed
        assert steps["complete"].tolist() == [1, 0]
        assert steps["start_ns"][-1] <= run.oom_time_ns <= steps["end_ns"][-1]
        ops = run.table("ops").read()
        # Everything up to the failing op, nothing after it. The native path also keeps the
        # rows of the ops the error left (their ranges end as it unwinds, after the failure):
        # so no op began after the failing one.
        assert ops["start_ns"].max() <= run.oom_time_ns


def test_summary_opens_on_the_oom(recorded: tuple[Path, Any], run_cli: Any) -> None:
    trace, _ = recorded
    code, out, _ = run_cli("summary", str(trace), "--top", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "OOM in aten.empty.memory_format of Sequential.2.1, asked for 4.00 EiB"
    assert lines[1].startswith("  run main, at ") and "(step 1, forward)" in lines[1]
    assert lines[2].startswith("  live at the failure")
    block = out[: out.index("\n\n")]
    assert "    parameter " in block and "    activation " in block
    assert "  by module:" in block and "Sequential.2.0" in block
    assert "  largest tensors live at the failure:" in block
    assert "float32   32x32" in block
    assert f"next: ckview plan {trace} --budget SIZE" in block


def test_summary_json_has_the_oom(recorded: tuple[Path, Any], run_cli: Any) -> None:
    trace, _ = recorded
    _, out, _ = run_cli("summary", "--json", str(trace))
    oom = json.loads(out)["runs"]["main"]["oom"]
    assert (oom["op"], oom["module"], oom["nbytes"]) == (
        "aten.empty.memory_format",
        "Sequential.2.1",
        HUGE,
    )
    assert oom["phase"] == "forward"
    live = oom["live"]
    assert live["live_bytes"] == sum(live["by_category"].values())
    assert live["by_category"]["parameter"] == 4 * (16 * 32 + 32 + 32 * 32 + 32)


def test_plan_for_the_device_on_a_cpu_trace_is_a_clear_error(recorded: tuple[Path, Any]) -> None:
    trace, _ = recorded
    proc = subprocess.run(
        [*CKVIEW, "plan", str(trace), "--budget", "device"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=DETERMINISTIC,
    )
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("ckview: error: ") and "no device capacity" in line
    assert "give the budget as a size instead" in line and "Traceback" not in proc.stderr


def test_the_explorer_opens_on_the_oom(recorded: tuple[Path, Any]) -> None:
    from ckview.analysis.device import oom_event
    from ckview.app.run import load_trace

    trace, _ = recorded
    [run] = load_trace(trace).runs
    assert run.oom is not None and run.oom.nbytes == HUGE
    point = run.initial_point
    assert point == run.oom_point == oom_event(run.tables["memory_events"], run.oom.time_ns) + 1
    assert run.timeline.time_ns[point] <= run.oom.time_ns
    live = run.live_tensors(point)
    assert sum(t.nbytes for t in live) == run.timeline.total[point]
    assert {t.category for t in live} >= {"parameters", "activations"}


def test_the_timeline_centres_on_the_oom(qtbot: Any, recorded: tuple[Path, Any]) -> None:
    import pyqtgraph as pg

    from ckview.app.run import load_trace
    from ckview.gui.timeline import TimelineView

    trace, _ = recorded
    [run] = load_trace(trace).runs
    view = TimelineView()
    qtbot.addWidget(view)
    view.set_run(run)
    assert view.selected_point == run.oom_point
    x = float(run.x(view.axis)[run.oom_point])
    (x0, x1), _ = view.main.getPlotItem().getViewBox().viewRange()
    assert x0 < x < x1
    markers = [i for i in view._decor if isinstance(i, pg.InfiniteLine) and i.angle == 90]
    assert [m.value() for m in markers] == [x]
    assert markers[0].label.format == "OOM, asked for 4.00 EiB"


# --- the Recorder API ---------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, fail: BaseException | None) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail is not None and not isinstance(self.fail, RuntimeError):
            raise self.fail
        if self.fail is not None:
            torch.empty(HUGE, dtype=torch.uint8)
        return self.linear(x).relu()


def train(model: nn.Module, steps: int, fail_at: int, fail: BaseException | None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        model[1].fail = fail if step == fail_at else None
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def record_api(path: Path, fail: BaseException, catch: bool = False) -> None:
    """Record 3 steps; in the second, ``fail`` (a RuntimeError: a real allocation failure)."""
    model = nn.Sequential(nn.Linear(8, 8), Block(None))
    with Recorder(path, steps=3, warmup=1, progress=False):
        if catch:
            with contextlib.suppress(RuntimeError):  # the script copes and goes on
                train(model, 3, 2, fail)
            train(model, 3, -1, None)
        else:
            train(model, 4, 2, fail)


def test_recorder_api_marks_a_cpu_allocation_failure(tmp_path: Path) -> None:
    path = tmp_path / "api.h5"
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        record_api(path, RuntimeError("fail"))
    assert validate_trace(path).ok
    with open_trace(path) as t:
        run = t.run("main")
        assert (run.oom_op, run.oom_module, run.oom_bytes) == (
            "aten.empty.memory_format",
            "Sequential.1",
            HUGE,
        )


def test_an_oom_the_script_survives_is_not_the_runs(tmp_path: Path) -> None:
    path = tmp_path / "survived.h5"
    record_api(path, RuntimeError("fail"), catch=True)
    with open_trace(path) as t:
        assert t.meta.complete
        run = t.run("main")
        assert (run.oom_time_ns, run.oom_op, run.oom_message) == (-1, "", "")


def test_another_error_is_no_oom(tmp_path: Path) -> None:
    path = tmp_path / "other.h5"
    with pytest.raises(ValueError, match="not memory"):
        record_api(path, ValueError("not memory"))
    with open_trace(path) as t:
        assert not t.meta.complete
        assert t.run("main").oom_time_ns == -1


def test_a_memory_error_inside_an_op_is_an_oom(tmp_path: Path) -> None:
    @torch.library.custom_op("ckview_test::greedy", mutates_args=())
    def greedy(x: torch.Tensor) -> torch.Tensor:
        raise MemoryError

    class Greedy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return greedy(x)

    path = tmp_path / "memoryerror.h5"
    model = nn.Sequential(nn.Linear(8, 8), Greedy())
    with pytest.raises(MemoryError), Recorder(path, steps=1, warmup=0, progress=False):
        model(torch.randn(2, 8)).sum().backward()
    assert validate_trace(path).ok
    with open_trace(path) as t:
        run = t.run("main")
        assert (run.oom_op, run.oom_module, run.oom_bytes) == (
            "ckview_test.greedy.default",
            "Sequential.1",
            -1,
        )
        assert run.oom_message == "MemoryError: "


def test_the_window_shows_the_run_that_ended_in_the_oom(qtbot: Any, tmp_path: Path) -> None:
    from PyQt6.QtCore import QSettings

    from ckview.gui.main_window import MainWindow
    from recorder.session import RunSpec

    path = tmp_path / "runs.h5"
    model = nn.Sequential(nn.Linear(8, 8), Block(None))
    runs = (RunSpec("first"), RunSpec("second"))
    with (
        pytest.raises(RuntimeError, match="can't allocate memory"),
        Recorder(path, steps=1, warmup=1, runs=runs, progress=False),
    ):
        train(model, 4, 2, RuntimeError("fail"))  # step 2: the second run's
    with open_trace(path) as t:
        assert [t.run(n).oom_time_ns >= 0 for n in t.run_names] == [False, True]
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    with qtbot.waitSignal(w.loaded, timeout=20000):
        w.open_paths([str(path)])
    run = w.current_run()
    assert run is not None and run.name == "second"
    assert w.timeline.selected_point == run.oom_point


def test_an_oom_in_the_warmup_says_how_to_capture_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [*CKVIEW, "record", "-o", str(tmp_path / "w.h5"), str(script), "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=DETERMINISTIC,
    )
    assert proc.returncode == 1
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("ckview")]
    assert "ran out of memory in warm-up step 1" in line and "--warmup 0" in line


def set_run_attr(path: Path, name: str, value: Any) -> None:
    import h5py

    with h5py.File(path, "r+") as f:
        f["runs/main"].attrs[name] = value


@pytest.mark.parametrize(
    ("attrs", "problem"),
    [
        ({"oom_message": ""}, "oom_time_ns is set, but oom_message is empty"),
        ({"complete": True}, "ended in an OOM, yet it is marked complete"),
        ({"oom_bytes": -5}, "oom_bytes is -5"),
        ({"oom_time_ns": -1}, "oom_message or oom_op is set, but oom_time_ns is -1"),
    ],
)
def test_validation_of_the_oom_attributes(
    recorded: tuple[Path, Any], tmp_path: Path, attrs: dict[str, Any], problem: str
) -> None:
    import shutil

    path = tmp_path / "damaged.h5"
    shutil.copy(recorded[0], path)
    for name, value in attrs.items():
        set_run_attr(path, name, value)
    report = validate_trace(path)
    assert any(problem in p for p in report.problems), report.problems


def test_cuda_oom_bytes_come_from_the_allocators_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ OOM capture ]: on CUDA the observer's exact bytes, not the message's two decimals;
    attached only once the script has initialised CUDA (tested with fakes of torch's API)."""
    from recorder import _torch
    from recorder.oom import OomWatch
    from recorder.sources.oom import OomSource

    observers: list = []
    monkeypatch.setattr(_torch.torch.cuda, "is_available", lambda: True)
    initialised = [False]
    monkeypatch.setattr(_torch.torch.cuda, "is_initialized", lambda: initialised[0])
    monkeypatch.setattr(
        _torch.torch._C, "_cuda_attach_out_of_memory_observer", observers.append, raising=False
    )
    monkeypatch.setattr(_torch, "_oom_attached", [False])
    source = OomSource()
    undo = source.install()
    assert observers == []  # a CPU script so far: CUDA is not initialised by ckview
    initialised[0] = True
    source.step_begins(0)
    assert len(observers) == 1
    observers[0](0, 12_345_678, 80 << 30, 1 << 20)  # the allocator fails 12,345,678 bytes
    watch: OomWatch = source._watch
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 11.77 MiB. GPU 0 ...")
    assert watch.failed(error, "aten::mm", lambda: "model.fc", 5)
    assert watch.last is not None and watch.last.nbytes == 12_345_678
    undo()
    observers[0](0, 1, 2, 3)  # after the recording: heard by nobody
    assert watch.failed(error, "aten::mm", lambda: "model.fc", 6)
    assert watch.last.nbytes == round(11.77 * (1 << 20))  # from the message again


def _ops(raised: list[int]) -> dict[str, np.ndarray]:
    n = len(raised)
    return {
        "id": np.arange(5, 5 + n),
        "raised": np.asarray(raised, np.uint8),
        "name": np.arange(1, 1 + n),
        "module_call": np.full(n, -1),
        "start_ns": np.arange(10, 10 + 10 * n, 10),
    }


@pytest.mark.parametrize(
    ("raised", "ooms", "expected"),
    [
        # CUDA: the caching allocator's OOM row names the op (no row said raised on an H200)
        ([0, 0, 0], {"t": [25], "op": [6], "bytes": [4096]}, (2, 20, 4096)),
        # CPU: no allocator row; the last op an exception left, bytes from the message
        ([0, 1, 1], {"t": [], "op": [], "bytes": []}, (3, 30, -1)),
        ([0, 0, 0], {"t": [], "op": [], "bytes": []}, None),
    ],
)
def test_the_native_paths_failing_op(
    raised: list[int], ooms: dict[str, list[int]], expected: tuple[int, int, int] | None
) -> None:
    """NOTE [ OOM capture on the native path ]: which op a step's rows say failed."""
    from types import SimpleNamespace

    from ckview.trace.schema import NO_INDEX
    from recorder.native_steps import StepWriting

    attribution = SimpleNamespace(call_rows=lambda rows: np.full(len(rows), NO_INDEX))
    ledger = SimpleNamespace(
        _last_op=None, _calls=SimpleNamespace(data=[]), _attribution=attribution
    )
    facts = SimpleNamespace(
        ops=_ops(raised), ooms={k: np.asarray(v) for k, v in ooms.items()}, raised=sum(raised)
    )
    StepWriting._remember_last_op(ledger, facts)  # type: ignore[arg-type]
    if expected is None:
        assert ledger._last_op is None
    else:
        name, t0, nbytes = expected
        assert ledger._last_op == (name, NO_INDEX, t0, nbytes)
