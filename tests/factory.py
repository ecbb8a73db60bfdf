"""Small recorded models for the tests: one factory instead of a private "record a tiny model"
helper per file, and the test models more than one file records. Imports torch: only files
marked ``torch`` (NOTE [ Test markers ] in conftest.py) import it."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from recorder import Recorder
from recorder.device import DeviceSampler, Nvml
from recorder.sources import device as device_source
from tests.fake_cuda import FakeCuda, FakePynvml


def mean_square(out: torch.Tensor) -> torch.Tensor:
    """The default loss: the output's mean square."""
    return out.square().mean()


def record_model(
    path: Path,
    model: nn.Module,
    input_shape: tuple[int, ...] = (),
    *,
    steps: int = 1,
    warmup: int = 1,
    iterations: int | None = None,
    loss: Callable[[torch.Tensor], torch.Tensor] = mean_square,
    step: Callable[[nn.Module], torch.Tensor] | None = None,
    lr: float = 0.1,
    **options: Any,
) -> Path:
    """Record ``model`` trained by SGD (``lr``): each turn of the loop backpropagates
    ``step(model)``, by default ``loss(model(x))`` of a random ``x`` of ``input_shape``. The
    loop turns ``iterations`` times (default ``warmup + steps``), of which the recorder keeps
    ``steps`` after ``warmup``; ``options`` go to ``Recorder`` (``stacks``, ``timing_steps``,
    ``runs``). Returns ``path``."""

    def on_random_input(m: nn.Module) -> torch.Tensor:
        return loss(m(torch.randn(*input_shape)))

    turn = step or on_random_input
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with Recorder(path, steps=steps, warmup=warmup, progress=False, **options):
        for _ in range(warmup + steps if iterations is None else iterations):
            turn(model).backward()
            opt.step()
            opt.zero_grad()
    return path


def record_small(path: Path, steps: int = 2) -> Path:
    """A three-layer MLP, ``steps`` recorded steps after one warm-up step."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return record_model(path, model, (4, 8), steps=steps, loss=torch.sum)


def fake_devices(monkeypatch: pytest.MonkeyPatch, cuda: FakeCuda, nvml: FakePynvml) -> None:
    """Make the recorder sample the fake ``cuda`` and ``nvml`` as its device (tests/fake_cuda)."""
    monkeypatch.setattr(
        device_source,
        "DeviceSampler",
        functools.partial(DeviceSampler, cuda=cuda, nvml=lambda: Nvml(nvml, os.getpid())),
    )


class StackNet(nn.Module):
    """Two layers and a tanh between them, whose saved activation is made at ``TANH_LINE``
    (the allocation-site tests record it with ``stacks=True``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.a(x))  # the activation Tanh saves is made here
        return self.b(hidden)


TANH_LINE = inspect.getsourcelines(StackNet.forward)[1] + 1
"""The line of ``StackNet.forward`` that makes the activation ``tanh`` saves."""
TANH_SITE = f"{__file__}:{TANH_LINE} (StackNet.forward)"
"""That line as the trace names an allocation site."""


def record_stack_net(path: Path, stacks: bool = True) -> Path:
    """``StackNet`` recorded for one step after a warm-up step and one more turn, with the
    allocation stacks if ``stacks``."""
    torch.manual_seed(0)
    return record_model(path, StackNet(), (8, 16), iterations=3, stacks=stacks)
