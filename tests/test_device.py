"""CUDA allocator state and NVML device totals (NOTE [ Device samples ] in recorder/device.py),
tested with fakes of torch.cuda's memory API and pynvml: there is no GPU here."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from ckview.analysis.device import device_states
from ckview.trace import open_trace, validate_trace
from ckview.trace.schema import RUN_TABLES, SampleReason
from recorder.device import DeviceSampler, Nvml, recorded_peak_time
from recorder.sources import device as device_source
from recorder.storage_rows import BATCH_ROWS
from recorder.tables import RunTables
from tests.factory import fake_devices, record_small
from tests.fake_cuda import FakeCuda, FakePynvml, GiB, MiB

pytestmark = [pytest.mark.torch, pytest.mark.gui]

DATA = Path(__file__).parent / "data"


def sampler(cuda: FakeCuda, nvml: FakePynvml | None) -> DeviceSampler:
    strings: list[str] = []

    def intern(s: str) -> int:
        if s not in strings:
            strings.append(s)
        return strings.index(s)

    opened = None if nvml is None else Nvml(nvml, os.getpid())
    made = DeviceSampler(intern, cuda=cuda, nvml=lambda: opened)
    made.strings = strings  # type: ignore[attr-defined]
    return made


def at_start(device: str, start: int, end: int) -> int:
    return start


# --- the sampler over fakes of the documented APIs -----------------------------------------


def test_boundaries_peaks_and_nvml_figures() -> None:
    cuda, nvml = FakeCuda(), FakePynvml()
    s = sampler(cuda, nvml)
    s.step_begins(100)
    s.step_ends(200, lambda device, start, end: start + 10)
    s.step_begins(200)
    s.step_ends(300, lambda device, start, end: start + 10)
    s.run_ends(300)
    columns = s.columns()
    assert set(columns) == {c.name for c in RUN_TABLES["device_samples"]}
    reasons = [SampleReason(r) for r in columns["reason"]]
    assert reasons.count(SampleReason.STEP_BOUNDARY) == 3
    assert reasons.count(SampleReason.PEAK) == 2
    assert list(columns["time_ns"]) == sorted(columns["time_ns"])
    assert cuda.resets == [0, 0]  # peaks start over as each step begins
    boundary = columns["reason"] == SampleReason.STEP_BOUNDARY
    assert (columns["largest_free"][boundary] == 6 * MiB).all()  # the largest inactive block
    assert (columns["nvml_total"] == 16 * GiB).all()
    assert (columns["nvml_process"][boundary] == 700 * MiB).all()
    assert (columns["nvml_others"][boundary] == 3 * GiB).all()
    peak = columns["reason"] == SampleReason.PEAK
    assert list(columns["time_ns"][peak]) == [110, 210]
    assert (columns["nvml_process"][peak] == -1).all()  # NVML cannot be read at the peak
    assert (columns["allocated"][peak] > columns["allocated"][boundary].max()).all()
    assert s.strings == ["cuda:0"]  # type: ignore[attr-defined]
    assert s.total_bytes == 16 * GiB


def test_a_step_peak_is_placed_before_its_rows_leave_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NOTE [ Device samples ]: each step's peak is placed on its storage rows as it ends, so
    nothing of them stays in memory for the run's end (NOTE [ Kept rows ]): the recorder's
    memory stays flat over a CUDA run's steps, and the peaks are where the rows put them."""
    fake_devices(monkeypatch, FakeCuda(), FakePynvml())
    strings = ["cpu", "cuda:0"]
    run = RunTables("main", lambda table, columns: None, strings.index, lambda *a: None)
    source = device_source.DeviceSource(strings.index)
    source.begin_run(run)
    peaks, held = [], []
    tracemalloc.start()
    try:
        for step in range(6):  # a 300 B CUDA block from 10 to 20 ns into the step: its peak
            start = step * 100
            source.step_begins(start)
            for _ in range(BATCH_ROWS):  # and a batch of CPU rows, that leave memory
                run.storages.add((1, 0, 0, -1, -1, -1, -1, -1, start + 30, start + 31, -1), 0)
            run.storages.add((300, 1, 0, -1, -1, -1, -1, -1, start + 10, start + 20, -1), 0)
            source.step_ends(start + 50)
            run.storages.take_changes()
            peaks.append(start + 10)
            held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert held[5] - held[2] < 32 * 1024  # 32 B a dropped row kept: 393 KiB
    samples = source.end_run(run, 600, "").tables["device_samples"]
    assert list(samples["time_ns"][samples["reason"] == SampleReason.PEAK]) == peaks


def test_columns_start_over_for_the_next_run() -> None:
    s = sampler(FakeCuda(), FakePynvml())
    s.step_begins(1)
    s.step_ends(2, at_start)
    s.columns()
    assert all(len(v) == 0 for v in s.columns().values())


def test_every_device_in_use_is_sampled() -> None:
    cuda = FakeCuda(devices=2, nvml_index={0: 3, 1: 1})
    s = sampler(cuda, FakePynvml())
    s.run_ends(5)
    assert s.strings == ["cuda:0", "cuda:1"]  # type: ignore[attr-defined]


def test_without_cuda_nothing_is_sampled(capsys: pytest.CaptureFixture[str]) -> None:
    cuda = FakeCuda()
    cuda.is_available = lambda: False  # type: ignore[method-assign]
    s = sampler(cuda, FakePynvml())
    s.step_begins(1)
    s.step_ends(2, at_start)
    s.oom(3)
    assert all(len(v) == 0 for v in s.columns().values())
    assert s.total_bytes == -1
    assert capsys.readouterr() == ("", "")


def test_without_nvml_the_allocator_still_speaks(capsys: pytest.CaptureFixture[str]) -> None:
    s = sampler(FakeCuda(total=8 * GiB), None)
    s.step_begins(1)
    columns = s.columns()
    assert len(columns["time_ns"]) == 1
    for name in ("nvml_total", "nvml_process", "nvml_others"):
        assert columns[name][0] == -1
    assert columns["reserved"][0] > 0
    assert s.total_bytes == 8 * GiB  # torch's total_memory stands in for NVML's
    assert capsys.readouterr() == ("", "")


def test_nvml_that_cannot_start_is_no_nvml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pynvml

    broken = FakePynvml(broken=True)
    monkeypatch.setattr(pynvml, "nvmlInit", broken.nvmlInit)
    assert Nvml.open() is None
    assert capsys.readouterr() == ("", "")


def test_this_machine_without_a_driver_has_no_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU machine has NVML")
    assert Nvml.open() is None
    assert capsys.readouterr() == ("", "")


def test_a_process_nvml_does_not_list_is_unknown() -> None:
    nvml = FakePynvml(pid=1)  # another PID namespace: our pid is not listed
    assert Nvml(nvml, pid=os.getpid()).usage(0)[1] == -1
    nvml = FakePynvml(mine=None)  # usedGpuMemory not available (pynvml gives None)
    assert Nvml(nvml, pid=nvml.pid).usage(0) == (16 * GiB, -1, 3 * GiB)


def test_no_other_process_uses_nothing() -> None:
    nvml = FakePynvml()
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda handle: [  # type: ignore[method-assign]
        SimpleNamespace(pid=nvml.pid, usedGpuMemory=nvml.mine)
    ]
    assert Nvml(nvml, pid=nvml.pid).usage(0) == (16 * GiB, 700 * MiB, 0)


def test_recorded_peak_time() -> None:
    storages = {
        "nbytes": np.array([100, 50, 70, 10]),
        "device": np.array([1, 1, 1, 2]),
        "alloc_ns": np.array([-1, 10, 20, 15]),
        "free_ns": np.array([-1, 30, 40, -1]),
    }
    assert recorded_peak_time(storages, 1, 0, 100) == 20  # 100 + 50 + 70
    assert recorded_peak_time(storages, 1, 31, 100) == 31  # only frees: the start
    assert recorded_peak_time(storages, 2, 0, 100) == 15
    assert recorded_peak_time(storages, 3, 0, 100) == 0


# --- the analysis ---------------------------------------------------------------------------


def samples(**columns: list[int]) -> dict[str, np.ndarray]:
    out = {c.name: np.asarray(columns[c.name], dtype=c.dtype) for c in RUN_TABLES["device_samples"]}
    return out


def test_device_states_fragmentation_and_what_pytorch_does_not_account_for() -> None:
    table = samples(
        time_ns=[0, 5, 10],
        device=[0, 0, 0],
        reason=[0, 1, 0],
        allocated=[100, 400, 150],
        reserved=[200, 500, 300],
        largest_free=[20, -1, 60],
        nvml_total=[1000, 1000, 1000],
        nvml_process=[450, -1, 520],
        nvml_others=[10, -1, 30],
    )
    [state] = device_states(table, ["cuda:0"])
    assert (state.device, state.total, state.process, state.others) == ("cuda:0", 1000, 520, 30)
    assert state.not_by_pytorch == 250  # 450 - 200 and 520 - 300
    assert (state.reserved, state.allocated, state.fragmentation) == (500, 400, 100)
    assert state.largest_free == 60  # at the boundary that reserved the most


def test_device_states_of_a_cpu_run_are_none() -> None:
    empty = samples(**{c.name: [] for c in RUN_TABLES["device_samples"]})
    assert device_states(empty, []) == []


# --- a recording with the fakes -------------------------------------------------------------


@pytest.fixture
def cuda_trace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    fake_devices(monkeypatch, FakeCuda(), FakePynvml())
    path = tmp_path / "cuda.h5"
    record_small(path)
    return path


def test_recorder_writes_device_samples(cuda_trace: Path) -> None:
    assert validate_trace(cuda_trace).ok
    with open_trace(cuda_trace) as trace:
        assert trace.meta.device_total_bytes == 16 * GiB
        table = trace.run("main").table("device_samples").read()
        steps = trace.run("main").table("steps").read()
        reasons = list(table["reason"])
        assert reasons.count(SampleReason.STEP_BOUNDARY) == 3  # 2 steps: 3 boundaries
        assert reasons.count(SampleReason.PEAK) == 2
        boundary = table["time_ns"][table["reason"] == SampleReason.STEP_BOUNDARY]
        assert set(boundary) == {*steps["start_ns"], *steps["end_ns"]}


def test_a_cpu_recording_has_no_device_samples(tmp_path: Path) -> None:
    path = tmp_path / "cpu.h5"
    record_small(path, steps=1)
    with open_trace(path) as trace:
        assert trace.meta.device_total_bytes == -1
        assert len(trace.run("main").table("device_samples")) == 0


def test_summary_shows_the_device_block(cuda_trace: Path, run_cli: Any) -> None:
    code, out, _ = run_cli("summary", str(cuda_trace))
    assert code == 0
    block = out[out.index("  device cuda:0") :].splitlines()
    assert block[0] == "  device cuda:0, total 16.0 GiB"
    assert block[1].split() == [
        "this",
        "process",
        "700",
        "MiB",
        "(other",
        "processes",
        "3.00",
        "GiB)",
    ]
    assert "not by PyTorch" in block[2] and "CUDA context" in block[2]
    assert block[3].lstrip().startswith("reserved") and "allocated" in block[3]
    assert "fragmentation" in block[4] and "largest free block 6.00 MiB" in block[4]
    code, out, _ = run_cli("summary", "--json", str(cuda_trace))
    [device] = json.loads(out)["runs"]["main"]["devices"]
    assert device["total"] == 16 * GiB and device["largest_free"] == 6 * MiB


def test_summary_of_a_cpu_trace_says_nothing_of_devices(run_cli: Any) -> None:
    code, out, err = run_cli("summary", str(DATA / "traces_v3" / "mlp.h5"))
    assert code == 0 and err == ""
    assert "device cuda" not in out and "NVML" not in out and "not by PyTorch" not in out
    code, out, _ = run_cli("summary", "--json", str(DATA / "traces_v3" / "mlp.h5"))
    run = json.loads(out)["runs"]["main"]
    assert run["devices"] == [] and run["oom"] is None


def test_plan_for_the_device_capacity(cuda_trace: Path, run_cli: Any) -> None:
    code, out, _ = run_cli("plan", str(cuda_trace), "--budget", "device")
    assert code == 0
    assert "budget 16.0 GiB (the device's capacity)" in out


def test_timeline_lines_of_a_cuda_run(cuda_trace: Path) -> None:
    from ckview.app.run import load_trace

    [run] = load_trace(cuda_trace).runs
    labels = [label for label, _ in run.device_lines()]
    assert labels[0] == "device cuda:0 16.0 GiB"
    assert labels[1].startswith("reserved ")
    assert run.device is not None and run.device_lines()[1][1] == run.device.reserved


def test_timeline_draws_the_device_lines(
    qtbot: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pyqtgraph as pg

    from ckview.app.run import load_trace
    from ckview.gui.timeline import TimelineView

    KiB = 1024  # a device scaled to the small step, so that both lines are in view
    cuda = FakeCuda(total=5 * KiB, allocated=3 * KiB, reserved=4 * KiB, grow=0, peak_extra=512)
    fake_devices(monkeypatch, cuda, FakePynvml(total=5 * KiB, mine=5 * KiB, others=0))
    record_small(tmp_path / "small.h5")
    [run] = load_trace(tmp_path / "small.h5").runs
    view = TimelineView()
    qtbot.addWidget(view)
    view.set_run(run)
    horizontal = [
        item for item in view._decor if isinstance(item, pg.InfiniteLine) and item.angle == 0
    ]
    assert [line.label.format for line in horizontal] == [
        "device cuda:0 5.00 KiB",
        "reserved 4.50 KiB (at most)",
    ]
    assert [line.value() for line in horizontal] == [5 * KiB, 4.5 * KiB]
    assert view.main.getPlotItem().getViewBox().viewRange()[1][1] >= 5 * KiB


def test_a_capacity_far_above_the_step_is_not_fitted() -> None:
    from ckview.gui.timeline import _near

    assert _near(2 * GiB, [80 * GiB, 3 * GiB]) == [3 * GiB]


def test_version_3_files_read_with_no_device_and_no_oom() -> None:
    paths = sorted((DATA / "traces_v3").glob("*.h5"))
    assert {p.stem for p in paths} >= {"mlp", "transformer_compare"}
    for path in paths:
        assert validate_trace(path).ok
        with open_trace(path) as trace:
            assert trace.format_version == 3
            assert trace.meta.device_total_bytes == -1
            for name in trace.run_names:
                run = trace.run(name)
                assert (run.oom_op, run.oom_module, run.oom_message) == ("", "", "")
                assert (run.oom_bytes, run.oom_time_ns) == (-1, -1)
                assert len(run.table("device_samples")) == 0


def test_cuda_check_without_a_gpu_says_so_and_exits_0() -> None:
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: run benchmarks/cuda_check.py itself")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "cuda_check.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    assert line.startswith("no GPU: ")
    assert proc.stderr == ""


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("time_ns", 0, "device_samples.time_ns decreases"),
        ("reserved", -7, "device_samples.reserved has 1 values below -1"),
        ("reason", 9, "device_samples.reason has 1 values that are not a SampleReason"),
        ("device", 10**6, "device_samples.device has 1 values outside strings"),
    ],
)
def test_validation_of_device_samples(
    cuda_trace: Path, column: str, value: int, problem: str
) -> None:
    import h5py

    with h5py.File(cuda_trace, "r+") as f:
        f["runs/main/device_samples"][column][-1] = value
    report = validate_trace(cuda_trace)
    assert any(problem in p for p in report.problems), report.problems
