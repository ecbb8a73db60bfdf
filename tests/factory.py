"""Small recorded models for the tests: one factory instead of a private "record a tiny model"
helper per file, and the test models more than one file records. Imports torch: only files
marked ``torch`` (NOTE [ Test markers ] in conftest.py) import it."""

from __future__ import annotations

import functools
import inspect
import math
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


# ----------------------------------------------------------------------------- models at sizes
# (ckview fit: the same step recorded at several batch or sequence sizes)

VOCAB, WIDTH = 50, 32


def encoder() -> nn.Module:
    """A small TransformerEncoder language model (embedding, two layers, logits)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(WIDTH, 4, 64, dropout=0.0, batch_first=True)
    return nn.Sequential(
        nn.Embedding(VOCAB, WIDTH),
        nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
        nn.Linear(WIDTH, VOCAB),
    )


class Attention(nn.Module):
    """Attention written out: its scores (batch x sequence x sequence) grow quadratically."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(WIDTH), dim=-1)
        return x + self.out(scores @ v)


def attention_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Embedding(VOCAB, WIDTH), Attention(), Attention(), nn.Linear(WIDTH, VOCAB)
    )


def record_lm(path: Path, model: nn.Module, batch: int, seq: int) -> Path:
    """One step of ``model`` (token ids in, logits out, cross-entropy, Adam) recorded."""
    opt = torch.optim.Adam(model.parameters())
    torch.manual_seed(1)
    with Recorder(path, steps=1, warmup=1, progress=False):
        for _ in range(2):
            ids = torch.randint(0, VOCAB, (batch, seq))
            logits = model(ids)
            nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
    return path
