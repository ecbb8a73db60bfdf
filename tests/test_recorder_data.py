"""Batches are inputs from when they arrive (NOTE [ Pre-existing storages ], NOTE [ Inputs and
their sources ]): DataLoader worker processes, and in-memory datasets that the loop indexes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ckview.analysis import summarize_run
from ckview.trace.schema import Category, MemoryEventKind, Phase
from recorder import Recorder
from tests.conftest import read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

BATCH = 16
BATCH_BYTES = BATCH * 64 * 4 + BATCH * 32 * 4  # x and y, float32


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))


def _summary(tables: dict[str, Any]) -> Any:
    return summarize_run(tables, tables["modules"], tables["strings"])


def _record_with_workers(path: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8 * BATCH, 64), torch.randn(8 * BATCH, 32))
    loader = DataLoader(data, batch_size=BATCH, num_workers=2, prefetch_factor=2)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(path, steps=3, warmup=1, progress=False) as rec:
        for x, y in loader:
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert rec.steps_recorded == 3
    return read_run(path)


def test_worker_batches_are_inputs_from_when_they_arrive(tmp_path: Path) -> None:
    tables = _record_with_workers(tmp_path / "a.h5")
    st, ev = tables["storages"], tables["memory_events"]
    batch = st["nbytes"] == BATCH * 64 * 4
    # Every batch came from a worker (shared memory, no op of the step made it): an input,
    # there from its arrival. The Python path sees it first at the op that reads it (SEEN,
    # never allocated); on the native path its arrival is the mapping of the worker's shared
    # memory, which torch reports to the profiler's memory hook (an ALLOC outside any op,
    # between steps).
    assert batch.sum() >= 3
    assert (st["category"][batch] == Category.INPUT).all()
    seen = ev["storage"][ev["kind"] == MemoryEventKind.SEEN]
    if tables["meta"].recorder == "python":
        assert (st["alloc_ns"][batch] == -1).all()
        assert np.isin(np.flatnonzero(batch), seen).all()
    else:
        arrived = st["op"][batch]
        assert (tables["ops"]["phase"][arrived[arrived >= 0]] == Phase.OTHER).all()
        allocated = ev["storage"][ev["kind"] == MemoryEventKind.ALLOC]
        assert np.isin(np.flatnonzero(batch), np.concatenate([seen, allocated])).all()

    summary = _summary(tables)
    # At the peak: the batches that had arrived and were not freed yet (the step's own, and
    # those a worker delivered early: they are in this process), not every batch of the run, as
    # when they counted from the start.
    inputs = np.flatnonzero(st["category"] == Category.INPUT)
    seen_at = np.full(len(st["nbytes"]), 1 << 62)
    freed_at = np.full(len(st["nbytes"]), 1 << 62)
    for row in range(len(ev["kind"]) - 1, -1, -1):  # backwards: the first event wins
        kind, storage = ev["kind"][row], ev["storage"][row]
        (freed_at if kind == MemoryEventKind.FREE else seen_at)[storage] = row
    there = [s for s in inputs if seen_at[s] <= summary.peak_event < freed_at[s]]
    assert summary.by_category["input"] == int(st["nbytes"][there].sum()) >= BATCH_BYTES
    # At the start: the parameters and their gradients (recording began at the warmup's
    # optimizer step, before zero_grad), no batch.
    params = int(st["nbytes"][st["category"] == Category.PARAMETER].sum())
    assert summary.baseline_bytes == 2 * params


def test_at_start_is_the_same_in_identical_runs(tmp_path: Path) -> None:
    first = _summary(_record_with_workers(tmp_path / "a.h5"))
    second = _summary(_record_with_workers(tmp_path / "b.h5"))
    assert first.baseline_bytes == second.baseline_bytes


def test_indexed_in_memory_dataset_is_input(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data, targets = torch.randn(250, 64), torch.randn(250, 32)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False):
        for _ in range(3):
            idx = torch.randint(0, 250, (BATCH,))
            x, y = data[idx], targets[idx]  # gathered copies, made between steps
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    tables = read_run(tmp_path / "t.h5")
    st = tables["storages"]
    dataset = np.isin(st["nbytes"], [250 * 64 * 4, 250 * 32 * 4])
    assert dataset.sum() == 2
    assert (st["category"][dataset] == Category.INPUT).all()
    op_names = np.array(tables["strings"])[tables["ops"]["name"]]
    gathered = (st["op"] >= 0) & (op_names[st["op"]] == "aten.index.Tensor")
    assert gathered.sum() == 4 and (st["category"][gathered] == Category.INPUT).all()
    summary = _summary(tables)
    assert summary.by_category["other"] < 250 * 32 * 4
