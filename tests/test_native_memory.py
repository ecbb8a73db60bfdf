"""The native path's memory over a long recording (issue 21, defect 6): what a step's rows leave
behind in the ledger must not grow with the number of steps recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ckview.trace import open_trace
from recorder import Recorder
from recorder.native_ledger import NativeLedger
from tests.conftest import NEEDS_COMPILER

pytestmark = [
    pytest.mark.torch,
    pytest.mark.recorder,
    NEEDS_COMPILER,
]


def test_block_map_holds_only_blocks_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Freed blocks leave the map ]: after each step, the ledger's block map is as large
    as the blocks still alive, not the blocks of every step so far."""
    monkeypatch.setenv("CKVIEW_RECORDER", "native")
    sizes: list[int] = []
    step_ends = NativeLedger.step_ends

    def counted(self: Any, now: int) -> None:
        step_ends(self, now)
        sizes.append(self._attribution.live_blocks())

    monkeypatch.setattr(NativeLedger, "step_ends", counted)
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(4)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = 12
    with Recorder(tmp_path / "t.h5", steps=steps, warmup=1, progress=False, timing_steps=0):
        for _ in range(steps + 1):
            model(torch.randn(16, 32)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    assert len(sizes) >= steps
    # one step allocates some 60 blocks; the map held them all before (sizes[-1] ~ 12 x 60)
    assert max(sizes[2:]) <= sizes[1] + 4, sizes


class _Layouts(nn.Module):
    """Outputs of every kind of layout: a scalar, 2-D float, 1-D int64, 9-D (past the sizes a
    row keeps)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        index = torch.argmax(y, dim=1)  # int64, 1-D
        deep = y.reshape(2, 2, 2, 1, 1, 1, 2, 1, 2).exp()  # 9-D
        return y[torch.arange(len(index)), index].sum() + deep.sum()


def test_layout_strings_name_each_layout_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [ Layout strings ] in ckattr_write.cpp: storages and saved tensors name their dtype and
    shape as the Python recorder writes them, each text interned once."""
    monkeypatch.setenv("CKVIEW_RECORDER", "native")
    torch.manual_seed(0)
    model = _Layouts()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False, timing_steps=0):
        for _ in range(3):
            model(torch.randn(4, 8)).backward()
            opt.step()
            opt.zero_grad()
    with open_trace(tmp_path / "t.h5") as trace:
        strings = list(trace.strings)
        run = trace.run("main")
        storages, saved = run.table("storages").read(), run.table("saved_events").read()
    assert len(set(strings)) == len(strings)
    layouts = {
        (strings[d], strings[s])
        for table in (storages, saved)
        for d, s in zip(table["dtype"].tolist(), table["shape"].tolist(), strict=True)
    }
    assert {("float32", "4x8"), ("float32", "scalar"), ("int64", "4")} <= layouts, layouts
    assert ("float32", "2x2x2x1x1x1x2x1x...") in layouts, layouts
    assert all(bool(d) == bool(s) for d, s in layouts), layouts  # both, or neither known
