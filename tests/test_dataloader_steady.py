"""A DataLoader whose workers deliver a batch ahead of its turn is warmed up past that before a
step is recorded (NOTE [ A data pipeline that settles ] in recorder/steady.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import recorder.runs
from ckview.cli.common import run_peak
from ckview.trace import open_trace
from recorder import Recorder, RunSpec
from recorder.steady import DataLoaders
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


def _loader() -> DataLoader[torch.Tensor]:
    return DataLoader(SlowSecondBatch(), batch_size=BATCH, num_workers=2, prefetch_factor=2)


def test_a_batch_kept_early_is_not_settled() -> None:
    loaders = DataLoaders()
    batches = iter(_loader())
    loaders.created(batches)
    assert not loaders.settled()  # its first 4 batches are in flight
    next(batches), next(batches)
    # waiting for the slow batch 1, the main process received batch 2 (and 4) and kept it
    kept = sorted(i for i, info in batches._task_info.items() if len(info) == 2)  # type: ignore[attr-defined]
    assert kept and not loaders.settled(), kept
    for x in batches:
        if loaders.settled():
            assert int(x[0, 0]) // BATCH >= 3, "settled before its first 4 batches were out"
            break
    else:
        raise AssertionError("never settled")


def test_runs_begin_after_the_dataloader_settles(tmp_path: Path) -> None:
    # Issue 21: verify's baseline was recorded in the second iteration, in which the main
    # process waited for batch 1 while it rebuilt and kept batches a worker had delivered early:
    # a batch or two more than every later run held, and every plan was projected that high.
    # Two identical runs must measure the same peak.
    torch.manual_seed(0)
    loader = _loader()
    model = nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "steady.h5"
    specs = (RunSpec("first"), RunSpec("second"))
    with Recorder(path, steps=1, warmup=1, runs=specs, progress=False) as rec:
        for x in loader:
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)  # the model is slower than the workers, as in most training
    assert rec.steps_recorded == 2
    peaks = {name: run_peak(read_run(path, name)) for name in ("first", "second")}
    assert peaks["first"] == peaks["second"], f"peaks: {peaks} (a batch: {BATCH_BYTES} B)"
    with open_trace(path) as trace:  # the iterations skipped, not the one asked
        assert trace.meta.warmup == rec.warmup_done >= 3


def test_a_warmup_that_stops_waiting_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        recorder.runs, "DATA_SETTLE_LIMIT", 1
    )  # batch 4, kept early, is still there
    model = nn.Linear(256, 256)
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False) as rec:
        for x in _loader():
            model(x).sum().backward()
    assert rec.steps_recorded == 1
    err = capsys.readouterr().err
    assert "warning: a DataLoader still delivers batches ahead of their turn after 2 " in err, err


SCRIPT = """
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowSecondBatch(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i // 4 == 1:
            time.sleep(0.1)
        return torch.full((8,), float(i))


model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, x in enumerate(DataLoader(SlowSecondBatch(), batch_size=4, num_workers=2)):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 2:
        break
"""


def test_a_script_that_ends_while_waiting_says_why(tmp_path: Path, run_cli: Any) -> None:
    script, out = tmp_path / "loop.py", tmp_path / "t.h5"
    script.write_text(SCRIPT)
    code, _, err = run_cli("record", "-o", str(out), "--warmup", "1", str(script))
    assert code == 1
    assert err.strip() == (
        "ckview: the script ended after 3 warmup steps (more than the 1 asked: the recorder "
        "waits until the model and its DataLoaders settle); no step was recorded: let the "
        f"script run more steps (incomplete trace: {out})"
    )
    with open_trace(out) as trace:
        assert trace.meta.error == (
            "no step was recorded: the code ended after 3 warmup steps, while a DataLoader still "
            "delivered batches ahead of their turn"
        )
