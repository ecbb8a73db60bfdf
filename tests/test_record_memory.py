"""The recorder's memory over a long recording (issue 21, defect 6), on both recorder paths:
what the journal compares at each step must not grow with the steps recorded, and what it takes
must rebuild the tables (NOTE [ Final rows ] in recorder/buffers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ckview.trace import open_trace
from ckview.trace.schema import RUN_TABLES
from recorder import Recorder, storage_rows
from recorder.buffers import MutableTable
from recorder.phases import PhaseState
from recorder.storage_rows import KeptRows, StorageRows
from tests.conftest import NEEDS_COMPILER

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

PATHS = [pytest.param("native", marks=NEEDS_COMPILER), "python"]


def _record(tmp_path: Path, steps: int, prefetch: bool = False, ckpt: bool = False) -> None:
    """An MLP with Adam; with ``prefetch``, each step's batch is made from a temporary between
    steps (after backward), freed before the next step's forward makes it an input; with
    ``ckpt``, its last block is checkpointed (a recompute region a step)."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(4)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = torch.randn(16, 32)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not ckpt:
            return model(x)
        return checkpoint(model[3], model[:3](x), use_reentrant=False)

    with Recorder(tmp_path / "t.h5", steps=steps, warmup=1, progress=False, timing_steps=0):
        for _ in range(steps + 1):
            forward(batch).square().mean().backward()
            if prefetch:
                raw = torch.randn(16, 32) * 2
                batch = raw + 1
                del raw
            opt.step()
            opt.zero_grad()


def _at_each_take(
    monkeypatch: pytest.MonkeyPatch, cls: type[MutableTable], table: str, measure: Any
) -> list[Any]:
    """What ``measure(table)`` gives after each journal take of ``table`` (a step's end)."""
    seen: list[Any] = []
    take = cls.take_changes

    def measured(self: MutableTable) -> tuple[np.ndarray, np.ndarray]:
        taken = take(self)
        if self.table == table:
            seen.append(measure(self))
        return taken

    monkeypatch.setattr(cls, "take_changes", measured)
    return seen


@pytest.mark.parametrize("table", ["storages", "steps", "recompute_regions"])
@pytest.mark.parametrize("path", PATHS)
def test_journal_compares_only_rows_still_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, table: str
) -> None:
    """The rows the journal keeps a copy of, to find what changed, are the rows still open
    (storages: parameters, optimizer state, gradients): as many after 24 steps as after 3.
    Before, the Python path kept every storage row of the run (some 60 a step here), and both
    every step row and recompute region."""
    monkeypatch.setenv("CKVIEW_RECORDER", path)
    kept = _at_each_take(monkeypatch, MutableTable, table, lambda t: len(t._taken))
    steps = 24
    _record(tmp_path, steps, ckpt=True)
    assert len(kept) == steps
    assert max(kept[3:]) <= kept[2] + 4, kept


@pytest.mark.parametrize("path", PATHS)
def test_journal_takes_rebuild_the_storages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Applying each take's changed rows to a copy gives the table as it is at that take (the
    storages, and the module calls), also when a storage freed at an earlier step becomes an
    input later (a prefetched batch's source: NOTE [ Inputs and their sources ] in
    recorder/ledger.py)."""
    monkeypatch.setenv("CKVIEW_RECORDER", path)
    monkeypatch.setattr(storage_rows, "BATCH_ROWS", 1)  # rows leave memory at every step
    take, rewritten = MutableTable.take_changes, MutableTable.rewritten
    editable = ("storages", "module_calls", "steps", "recompute_regions")
    copies: dict[str, dict[int, np.ndarray]] = {name: {} for name in editable}
    copy = copies["storages"]
    late: list[int] = []
    mismatches: list[Any] = []

    def checked(self: MutableTable) -> tuple[np.ndarray, np.ndarray]:
        rows, values = take(self)
        if self.table in copies:
            mine = copies[self.table]
            mine.update(zip(rows.tolist(), values.reshape(-1, self.width), strict=True))
            table = np.frombuffer(self.data, np.int64).reshape(-1, self.width)
            rows_here = (  # those whose rows leave memory hold some (NOTE [ Kept rows ])
                [*sorted(self.kept), *range(self.base, len(self))]
                if isinstance(self, KeptRows)
                else list(range(len(self)))
            )
            have = np.stack([mine[r] for r in rows_here]) if rows_here else table
            if not np.array_equal(have, table):
                mismatches.append((self.table, np.flatnonzero((have != table).any(axis=1))))
            del table
        return rows, values

    def noted(self: MutableTable, row: int) -> None:
        late.append(row)
        rewritten(self, row)

    monkeypatch.setattr(MutableTable, "take_changes", checked)
    monkeypatch.setattr(MutableTable, "rewritten", noted)
    _record(tmp_path, 6, prefetch=True, ckpt=True)
    assert late, "no source was freed before its product became an input"
    assert not mismatches, mismatches
    assert len(copies["steps"]) == 6 and len(copies["recompute_regions"]) >= 6
    # The trace holds the rows the journal took last, written as they went and kept ones
    # again at the end (NOTE [ Kept rows ]); times in it are since the run's start.
    with open_trace(tmp_path / "t.h5") as trace:
        written = trace.run("main").table("storages").read()
        called = trace.run("main").table("module_calls").read()
    calls = copies["module_calls"]
    taken_calls = np.stack([calls[r] for r in range(len(calls))])
    for i, column in enumerate(RUN_TABLES["module_calls"]):
        if not column.name.endswith("_ns"):
            values = called[column.name].astype(np.int64)
            assert np.array_equal(values, taken_calls[:, i]), column.name
    taken = np.stack([copy[r] for r in range(len(copy))])
    assert len(written["nbytes"]) == len(taken)
    t0 = None
    for i, column in enumerate(RUN_TABLES["storages"]):
        values = written[column.name].astype(np.int64)
        if column.name.endswith("_ns"):
            set_ = taken[:, i] >= 0
            t0 = t0 if t0 is not None else int((taken[:, i] - values)[set_][0])
            assert np.array_equal(values[set_], taken[set_, i] - t0), column.name
            assert (values[~set_] == taken[~set_, i]).all(), column.name
        else:
            assert np.array_equal(values, taken[:, i]), column.name


@pytest.mark.parametrize("path", PATHS)
def test_resident_storage_rows_do_not_grow_with_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """NOTE [ Kept rows ]: after each step, the storage rows in memory are the kept
    ones and the last step's, as many after 24 steps as after 4 (some 60 rows a step)."""
    monkeypatch.setenv("CKVIEW_RECORDER", path)
    monkeypatch.setattr(storage_rows, "BATCH_ROWS", 1)  # rows leave memory at every step
    resident = _at_each_take(monkeypatch, StorageRows, "storages", lambda t: len(t.data) // t.width)
    steps = 24
    _record(tmp_path, steps)
    assert len(resident) == steps
    assert max(resident[4:]) <= resident[3] + 4, resident


@pytest.mark.parametrize("path", PATHS)
def test_resident_call_rows_do_not_grow_with_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """NOTE [ Kept rows ]: after each step, the module-call rows in memory (13 calls a step
    here), the forward calls a backward looks up (NOTE [ Forward calls of past steps ] in
    recorder/phases.py) and the native path's call id map are as many after 24 steps as after
    4; the trace still holds every call, each ended. Before, all three grew by 13 a step."""
    monkeypatch.setenv("CKVIEW_RECORDER", path)
    monkeypatch.setattr(storage_rows, "BATCH_ROWS", 1)  # rows leave memory at every step
    sizes = _at_each_take(monkeypatch, KeptRows, "module_calls", _call_sizes)
    steps = 24
    _record(tmp_path, steps)
    assert len(sizes) == steps
    assert len(sizes[0]) == (3 if path == "native" else 2), sizes[0]
    for i in range(len(sizes[0])):
        assert max(size[i] for size in sizes[4:]) <= sizes[3][i] + 2, sizes
    with open_trace(tmp_path / "t.h5") as trace:
        calls = trace.run("main").table("module_calls").read()
    assert (calls["end_ns"] >= 0).all()
    assert np.array_equal(np.bincount(calls["step"]), np.full(steps, 13))  # 1 + 4 * (1 + 2)


def _call_sizes(calls: KeptRows) -> tuple[int, ...]:
    """The call rows in memory, then how many each index beside the table holds."""
    owners = [forget.__self__ for forget in calls.on_drop]  # type: ignore[attr-defined]
    return (len(calls.data) // calls.width, *map(_call_index_size, owners))


def _call_index_size(owner: object) -> int:
    """How many call rows ``owner`` indexes beside the call table."""
    if isinstance(owner, PhaseState):
        return len(owner._fw_calls)
    return owner._attribution.known_calls()  # type: ignore[attr-defined,no-any-return]
