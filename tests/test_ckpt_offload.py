"""Offload regions: saved tensors go to host memory (ckpt_runtime/oplevel.py, ``Offloader``).

There is no GPU here, so the CUDA path runs against fakes of the documented API it uses:
``torch.cuda.Stream(device=)``, ``Stream.wait_stream``, ``Stream.record_event``,
``torch.cuda.stream(s)`` (a context manager), ``torch.cuda.current_stream(device)``,
``Stream.wait_event``, ``Tensor.to(device, non_blocking=True)`` and ``Tensor.record_stream``.
The fakes log the calls, so the tests check their order: the copy to the host runs on the
side stream after it waited for the current stream, and the copy back waits for that copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from ckpt_runtime import PlanError, apply_plan
from ckpt_runtime.oplevel import Offloader

pytestmark = pytest.mark.torch

Log = list[tuple[str, ...]]


class FakeStream:
    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait_stream", self.name, other.name))

    def record_event(self) -> str:
        self.log.append(("record_event", self.name))
        return f"event@{self.name}"

    def wait_event(self, event: str) -> None:
        self.log.append(("wait_event", self.name, event))


class FakeCudaModule:
    """The parts of ``torch.cuda`` the offloader uses; remembers the stream in use."""

    def __init__(self) -> None:
        self.log: Log = []
        self.current = FakeStream(self.log, "current")
        self.active = self.current

    def Stream(self, device: Any) -> FakeStream:
        self.log.append(("Stream", str(device)))
        return FakeStream(self.log, "side")

    def current_stream(self, device: Any) -> FakeStream:
        return self.active

    @contextlib.contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        previous, self.active = self.active, s
        try:
            yield
        finally:
            self.active = previous


class FakeCudaTensor:
    """A CUDA tensor: its data in a CPU tensor; its copy to the host is logged with the
    stream in use."""

    def __init__(self, data: torch.Tensor, cuda: FakeCudaModule) -> None:
        self.data, self.cuda, self.device = data, cuda, torch.device("cuda", 0)

    def to(self, device: str, non_blocking: bool = False) -> FakeHost:
        self.cuda.log.append(("to_host", self.cuda.active.name, str(non_blocking)))
        return FakeHost(self.data.clone(), self.cuda)

    def record_stream(self, s: FakeStream) -> None:
        self.cuda.log.append(("record_stream", s.name))


class FakeHost:
    """Pinned host memory: its copy back to the device is logged with the stream in use."""

    def __init__(self, data: torch.Tensor, cuda: FakeCudaModule) -> None:
        self.data, self.cuda = data, cuda

    def to(self, device: torch.device, non_blocking: bool = False) -> FakeCudaTensor:
        self.cuda.log.append(("to_device", self.cuda.active.name, str(device), str(non_blocking)))
        return FakeCudaTensor(self.data.clone(), self.cuda)


def test_cuda_offload_copies_on_a_side_stream() -> None:
    cuda = FakeCudaModule()
    offloader = Offloader("layers.0", cuda=cuda)
    tensor = FakeCudaTensor(torch.arange(4.0), cuda)
    packed = offloader.pack(tensor)  # type: ignore[arg-type]
    assert cuda.log == [
        ("Stream", "cuda:0"),
        ("wait_stream", "side", "current"),  # the side stream waits for the tensor's producer
        ("to_host", "side", "True"),  # the copy runs on the side stream, asynchronously
        ("record_event", "side"),
        ("record_stream", "side"),  # the allocator keeps the memory until the copy is done
    ]
    cuda.log.clear()
    unpacked = offloader.unpack(packed)
    assert cuda.log == [
        ("wait_event", "current", "event@side"),  # the copy back waits for the copy out
        ("to_device", "current", "cuda:0", "True"),
    ]
    assert isinstance(unpacked, FakeCudaTensor) and torch.equal(unpacked.data, torch.arange(4.0))
    cuda.log.clear()
    offloader.pack(FakeCudaTensor(torch.zeros(1), cuda))
    assert [e for e in cuda.log if e[0] == "Stream"] == []  # one side stream per region


def test_cpu_tensors_and_parameters_stay_put() -> None:
    offloader = Offloader("r", cuda=FakeCudaModule())
    cpu = torch.ones(2)
    weight = nn.Parameter(torch.ones(2))
    assert offloader.pack(cpu) is cpu and offloader.unpack(cpu) is cpu
    assert offloader.pack(weight) is weight


def test_offload_on_a_device_without_host_path_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)).to("meta")
    apply_plan(
        model,
        {
            "format": "ckview-plan",
            "version": 2,
            "regions": [{"module": "", "save": ["*"], "offload": True}],
        },
    )
    with pytest.raises(PlanError, match="device 'meta', which has no host path") as caught:
        model(torch.randn(3, 4, device="meta"))
    assert "\n" not in str(caught.value)


def test_offload_region_runs_its_call_under_the_hooks() -> None:
    """Every tensor the region saves goes through the offloader (on CPU it stays put)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    plain = nn.Sequential(*[m for m in model])  # same modules, no plan, for the reference
    x = torch.randn(5, 4)
    plain(x).sum().backward()
    expected = [p.grad.clone() for p in plain.parameters() if p.grad is not None]
    model.zero_grad()
    seen: list[torch.Size] = []
    applied = apply_plan(
        model,
        {
            "format": "ckview-plan",
            "version": 2,
            "regions": [{"module": "1", "save": ["*"], "offload": True}],
        },
    )
    patch = vars(model[1])["_call_impl"]
    pack = patch.offloader.pack

    def spy(t: torch.Tensor) -> Any:
        seen.append(t.shape)
        return pack(t)

    patch.offloader.pack = spy
    model(x).sum().backward()
    assert seen == [torch.Size([5, 8])]  # tanh saves its output
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.equal(g, e) for g, e in zip(grads, expected, strict=True))
    applied.remove()
