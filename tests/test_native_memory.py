"""The native path's memory over a long recording (issue 21, defect 6): what a step's rows leave
behind in the ledger must not grow with the number of steps recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from recorder import Recorder
from recorder.native import attribute
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


def test_layout_ids_agree_with_layout_texts_across_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """LayoutIds (a sorted table of shape hashes kept across steps) gives each row the ids of
    the texts layout_texts writes, also for a layout first seen in a later step, and falls back
    to layout_texts when two shapes share a hash."""
    strings: list[str] = []

    def intern(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    names = {0: "float32", 1: "int64"}
    ids = attribute.LayoutIds(intern, names)
    rng = np.random.default_rng(0)

    def check(n: int) -> None:
        ndim = rng.integers(-1, 4, n).astype(np.int8)
        dims = np.zeros((n, attribute.DIMS), np.int64)
        for row in range(n):
            dims[row, : max(int(ndim[row]), 0)] = rng.integers(1, 4, max(int(ndim[row]), 0))
        dtype = np.where(ndim >= 0, rng.integers(0, 2, n), -1).astype(np.int8)
        d, s = ids.ids(dtype, ndim, dims)
        texts_d, di, texts_s, si = attribute.layout_texts(dtype, ndim, dims, names)
        known = ndim >= 0
        assert [strings[i] for i in d[known]] == [texts_d[i] for i in di[known]]
        assert [strings[i] for i in s[known]] == [texts_s[i] for i in si[known]]
        assert (d[~known] == intern("")).all() and (s[~known] == intern("")).all()

    check(50)
    check(200)  # shapes of the first step and new ones
    monkeypatch.setattr(attribute, "_MIX", np.zeros_like(attribute._MIX))  # every hash is 0
    check(50)
