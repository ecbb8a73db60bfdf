"""A DataLoader whose workers deliver a batch ahead of its turn is warmed up past that before a
step is recorded (NOTE [ A data pipeline that settles ] in recorder/steady.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ckview.cli.common import run_peak
from recorder import Recorder, RunSpec
from tests.conftest import read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

BATCH = 4
BATCH_BYTES = BATCH * 256 * 4  # a batch of float32 samples of 256


class SlowSecondBatch(Dataset[torch.Tensor]):
    """Samples of 256 floats; those of batch 1 take long, so that while one worker makes batch
    1 the other delivers batches 2 and 4 ahead of their turn (kept by the main process)."""

    def __len__(self) -> int:
        return 16 * BATCH

    def __getitem__(self, i: int) -> torch.Tensor:
        if i // BATCH == 1:
            time.sleep(0.1)
        return torch.full((256,), float(i))


def test_runs_begin_after_the_dataloader_settles(tmp_path: Path) -> None:
    # Issue 21: verify's baseline was recorded in the second iteration, in which the main
    # process waited for batch 1 while it rebuilt and kept batches a worker had delivered early:
    # a batch or two more than every later run held, and every plan was projected that high.
    # Two identical runs must measure the same peak.
    torch.manual_seed(0)
    loader = DataLoader(SlowSecondBatch(), batch_size=BATCH, num_workers=2, prefetch_factor=2)
    model = nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "steady.h5"
    runs = (RunSpec("first"), RunSpec("second"))
    with Recorder(path, steps=1, warmup=1, runs=runs, progress=False) as rec:
        for x in loader:
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)  # the model is slower than the workers, as in most training
    assert rec.steps_recorded == 2
    peaks = {name: run_peak(read_run(path, name)) for name in ("first", "second")}
    assert peaks["first"] == peaks["second"], f"peaks: {peaks} (a batch: {BATCH_BYTES} B)"
