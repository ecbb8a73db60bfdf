"""A run on several devices is read on its main one (NOTE [ One device per timeline ] in
ckview/trace/devices.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ckview.analysis import memory_timeline, summarize_run
from ckview.trace import open_trace
from ckview.trace.devices import main_device, on_device
from ckview.trace.schema import RUN_TABLES, Category, MemoryEventKind
from tests.conftest import copy_on_two_devices

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_traces" / "mlp.h5"
STRINGS = ["", "cpu", "cuda:0", "cuda:1"]


def _table(name: str, n: int) -> dict[str, np.ndarray]:
    return {c.name: np.zeros(n, dtype=c.dtype) for c in RUN_TABLES[name]}


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    """Random runs over storages on cpu, cuda:0 and cuda:1: each storage ALLOCs then maybe
    FREEs; saved events and module io point at random storages; steps start anywhere."""
    n = draw(st.integers(1, 10))
    storages = _table("storages", n)
    storages["device"][:] = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=n, max_size=n))
    storages["nbytes"][:] = draw(st.lists(st.integers(1, 1 << 30), min_size=n, max_size=n))
    storages["category"][:] = Category.ACTIVATION
    kinds = {
        s: [MemoryEventKind.ALLOC] + [MemoryEventKind.FREE] * draw(st.integers(0, 1))
        for s in range(n)
    }
    order = draw(st.permutations([s for s, k in kinds.items() for _ in k]))
    events = _table("memory_events", len(order))
    events["kind"][:] = [kinds[s].pop(0) for s in order]
    events["storage"][:] = order
    events["time_ns"][:] = np.arange(len(order))
    tables: dict[str, Any] = {"storages": storages, "memory_events": events}
    for name in ("saved_events", "module_io"):
        refs = draw(st.lists(st.integers(0, n - 1), max_size=6))
        tables[name] = _table(name, len(refs))
        tables[name]["storage"][:] = refs
    firsts = sorted(draw(st.lists(st.integers(0, len(order)), min_size=1, max_size=4)))
    tables["steps"] = _table("steps", len(firsts))
    tables["steps"]["first_memory_event"][:] = firsts
    return tables


@given(runs())
def test_the_main_device_alone_against_zeroed_bytes(tables: dict[str, Any]) -> None:
    """The timeline on one device equals the whole run's with the other devices' storages at
    0 bytes; every reference still names the same storage; step starts keep their events."""
    device = main_device(tables["storages"], STRINGS)
    devices = set(tables["storages"]["device"].tolist())
    if len(devices) < 2:
        assert device is None
        return
    assert device in ("cuda:0", "cuda:1")
    keep = tables["storages"]["device"] == STRINGS.index(device)
    mine = on_device(tables, STRINGS, device)
    zeroed = {**tables["storages"], "nbytes": np.where(keep, tables["storages"]["nbytes"], 0)}
    whole = memory_timeline(zeroed, tables["memory_events"])
    part = memory_timeline(mine["storages"], mine["memory_events"])
    on_mine = keep[tables["memory_events"]["storage"]]
    assert part.total.tolist() == [whole.total[0], *whole.total[1:][on_mine]]
    original = np.flatnonzero(keep)  # storage row on the device -> row in the whole run
    for name in ("memory_events", "saved_events", "module_io"):
        refs = tables[name]["storage"]
        assert original[mine[name]["storage"]].tolist() == refs[keep[refs]].tolist()
    for step, first in enumerate(tables["steps"]["first_memory_event"]):
        assert mine["steps"]["first_memory_event"][step] == np.count_nonzero(on_mine[:first])
    assert sum(mine["left_out"].values()) == np.count_nonzero(~keep)


def test_the_accelerator_wins_over_more_cpu_bytes() -> None:
    storages = _table("storages", 3)
    storages["device"][:] = [1, 1, 2]
    storages["nbytes"][:] = [1 << 30, 1 << 30, 1]
    assert main_device(storages, STRINGS) == "cuda:0"
    storages["device"][:] = [1, 1, 1]
    assert main_device(storages, STRINGS) is None


def test_summary_counts_the_gpu_only(tmp_path: Path, run_cli: Any) -> None:
    path = tmp_path / "two.h5"
    on_cuda = copy_on_two_devices(SAMPLE, path)
    assert 0 < np.count_nonzero(~on_cuda) < len(on_cuda)
    with open_trace(path) as trace:
        whole = trace.read_run("main", all_devices=True)
        mine = trace.read_run("main")
    assert mine["timeline_device"] == "cuda:0"
    zeroed = {**whole["storages"], "nbytes": np.where(on_cuda, whole["storages"]["nbytes"], 0)}
    expected = int(memory_timeline(zeroed, whole["memory_events"]).total.max())
    summary = summarize_run(mine, mine["modules"], mine["strings"])
    assert (
        summary.peak_bytes
        == expected
        < int(memory_timeline(whole["storages"], whole["memory_events"]).total.max())
    )
    code, out, err = run_cli("summary", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)["runs"]["main"]
    assert doc["peak_bytes"] == expected and doc["timeline_device"] == "cuda:0"
    assert doc["left_out_storages"] == {"cpu": int(np.count_nonzero(~on_cuda))}
    code, out, err = run_cli("summary", str(path))
    assert code == 0 and "memory on cuda:0 only; left out: storages" in out


def test_a_run_on_one_device_reads_unchanged() -> None:
    with open_trace(SAMPLE) as trace:
        tables = trace.read_run("main")
    assert "timeline_device" not in tables
