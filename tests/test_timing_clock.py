"""NOTE [ Times on an accelerator ]: on CUDA a timing step is synchronised and each forward
call is timed by CUDA events (tested with a fake of the documented torch.cuda API)."""

from __future__ import annotations

from typing import Any

import pytest

from recorder.timing import CudaClock, HostClock, StepTimer, clock_for

pytestmark = pytest.mark.torch


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)``: ``record`` stamps the device's time."""

    def __init__(self, device: FakeDevice, enable_timing: bool = False) -> None:
        assert enable_timing
        self.device, self.at_ms = device, -1.0

    def record(self) -> None:
        self.at_ms = self.device.queued_ms  # when the queued work before it completes

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.device.synced_ms >= end.at_ms, "read before the device caught up"
        return end.at_ms - self.at_ms


class FakeDevice:
    """A device whose queued work takes ``queued_ms`` in all; the host does not wait for it."""

    def __init__(self, initialized: bool = True) -> None:
        self.queued_ms, self.synced_ms, self.syncs = 0.0, 0.0, 0
        self.initialized = initialized

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def synchronize(self) -> None:
        self.syncs += 1
        self.synced_ms = self.queued_ms

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # torch.cuda.Event
        return FakeEvent(self, enable_timing)

    def launch(self, ms: float) -> None:
        self.queued_ms += ms


def test_a_cuda_run_times_its_calls_by_device_events() -> None:
    device = FakeDevice()
    timer = StepTimer(1, CudaClock(device))
    timer.start_step("baseline", keep=True, round=0, calls=True)
    timer.call_begin(3)
    device.launch(2.5)  # the call's kernels: 2.5 ms on the device, queued at once
    timer.call_end(3)
    timer.call_begin(3)
    device.launch(1.0)
    timer.call_end(3)
    timer.end_step()
    assert device.syncs >= 2  # the step's start and end
    calls = timer.runs["baseline"].calls_ns[0]
    assert calls == {3: [2_500_000, 1_000_000]}


def test_the_clock_follows_the_scripts_use_of_cuda() -> None:
    assert isinstance(clock_for(FakeDevice(initialized=True)), CudaClock)
    assert isinstance(clock_for(FakeDevice(initialized=False)), HostClock)


def test_a_cpu_run_keeps_host_clocks() -> None:
    timer = StepTimer(1, HostClock())
    for calls in (False, True):  # NOTE [ Quiet timing steps ]: the step, then its calls
        timer.start_step("main", keep=True, round=0, calls=calls)
        timer.call_begin(0)
        sum(range(10_000))
        timer.call_end(0)
        timer.end_step()
    times = timer.runs["main"]
    [(durations,)] = [c.values() for c in times.calls_ns]  # the calls step's alone
    step_ns: Any = times.steps_ns
    assert len(step_ns) == 1 and len(durations) == 1 and durations[0] > 0 and step_ns[0] > 0
