"""The recorder's event sources behind one protocol (NOTE [ Sources ] in recorder/sources/base.py):
a source given to ``Recorder(sources=...)`` is called at every lifecycle moment, in order, and
what it adds lands in the trace, with no edit to the Recorder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ckview.trace import open_trace
from recorder import Recorder
from recorder.sources.base import RunPart, Source
from recorder.tables import RunTables

pytestmark = [pytest.mark.torch, pytest.mark.recorder]
TOTAL = 12_345_678


class FakeSource:
    """Writes down every call it gets; its meta fills ``device_total_bytes``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def install(self) -> Callable[[], None]:
        self.calls.append("install")
        return lambda: self.calls.append("undo")

    def begin_run(self, run: RunTables) -> None:
        self.calls.append(f"begin_run {run.name}")

    def step_begins(self, now: int) -> None:
        self.calls.append("step_begins")

    def step_ends(self, now: int) -> None:
        self.calls.append("step_ends")

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        self.calls.append(f"end_run {run.name} {len(run.steps)} steps")
        return RunPart()

    def meta(self) -> dict[str, Any]:
        self.calls.append("meta")
        return {"device_total_bytes": TOTAL}


def test_a_source_sees_every_moment_of_a_recording_in_order(tmp_path: Path) -> None:
    fake = FakeSource()
    source: Source = fake  # the protocol, checked by mypy
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False, sources=[source]):
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    # Each recorded step is journaled with the trace's meta as it stands (a "meta" per step).
    step = ["step_begins", "step_ends", "meta"]
    assert fake.calls == [
        "install",
        "begin_run main",
        *step * 2,
        "end_run main 2 steps",
        "meta",
        "undo",
    ]
    with open_trace(tmp_path / "t.h5") as trace:
        assert trace.meta.complete
        assert trace.meta.steps_recorded == 2
        assert trace.meta.device_total_bytes == TOTAL
