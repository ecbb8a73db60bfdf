"""The native path's memory over a long recording (issue 21, defect 6): what a step's rows leave
behind in the ledger must not grow with the number of steps recorded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from recorder import Recorder
from recorder.native_ledger import NativeLedger

pytestmark = [
    pytest.mark.torch,
    pytest.mark.recorder,
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "c++")) is None,
        reason="no C++ compiler: the native recorder cannot be built here",
    ),
]


def test_block_map_holds_only_blocks_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Freed blocks leave the map ]: after each step, the ledger's block map is as large
    as the blocks still alive, not the blocks of every step so far."""
    monkeypatch.setenv("CKVIEW_RECORDER", "native")
    sizes: list[int] = []
    step_ends = NativeLedger.step_ends

    def counted(self: Any, now: int) -> None:
        step_ends(self, now)
        sizes.append(len(self._blocks.rows._keys))

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
