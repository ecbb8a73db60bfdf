"""CUDA allocator state and NVML device totals, sampled at step boundaries, peaks and OOMs.

NOTE [ Device samples ]
On a CUDA run the recorder asks the caching allocator and NVML, per CUDA device in use, for
what a dispatch mode cannot see: memory reserved but free (fragmentation), the largest free
block, the device's total and what the process and the others use (the CUDA context, NCCL and
other libraries are the process's usage minus what PyTorch reserved). It asks at each step
boundary, at an OOM, and for each step's peak; nothing is asked per op.

* Boundary (``STEP_BOUNDARY``): ``torch.cuda.memory_stats(device)`` (``allocated_bytes.all.
  current``, ``reserved_bytes.all.current``), the largest ``inactive`` block of
  ``torch.cuda.memory_snapshot()`` on that device, and NVML (``nvmlDeviceGetMemoryInfo``'s
  total, ``nvmlDeviceGetComputeRunningProcesses``: this pid's entry, and the others').
* Peak (``PEAK``): the allocator keeps exact peaks, not their times. The recorder resets them
  (``torch.cuda.reset_peak_memory_stats``) as each recorded step begins and reads
  ``allocated_bytes.all.peak`` and ``reserved_bytes.all.peak`` as it ends; the row is placed
  at the step's recorded peak on that device (:func:`recorded_peak_time`), found as the step
  ends, while every storage row born or freed in it is still in memory (NOTE [ Kept rows ] in
  recorder/storage_rows.py). NVML cannot be read at that moment: its columns there are -1, as
  is ``largest_free``.
* OOM (``OOM``): read in the dispatch mode as the failing op raises (NOTE [ OOM capture ] in
  recorder/oom.py).

Without CUDA (a CPU run, no driver) nothing is sampled; without NVML (no ``pynvml``, no driver,
an NVML error) its columns are -1. Neither prints anything: a profiler that warns on every CPU
run is noise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ckview.trace.schema import SampleReason
from recorder.buffers import MutableTable

_UNKNOWN = -1
_BOUNDARY = int(SampleReason.STEP_BOUNDARY)
_PEAK = int(SampleReason.PEAK)
_OOM = int(SampleReason.OOM)


class Nvml:
    """NVML's view of the devices (``pynvml``): total memory and per-process usage."""

    def __init__(self, pynvml: Any, pid: int) -> None:
        self._nvml = pynvml
        self._pid = pid
        self._handles: dict[int, Any] = {}

    @classmethod
    def open(cls, pid: int | None = None) -> Nvml | None:
        """NVML initialised, or None where it cannot be (no package, no driver, no GPU)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # ImportError, NVMLError_*, OSError: no NVML is a normal state
            return None
        return cls(pynvml, os.getpid() if pid is None else pid)

    def usage(self, nvml_index: int) -> tuple[int, int, int]:
        """(device total, this process's usage, the other processes' usage); -1 where NVML
        does not say (this pid not listed: another PID namespace; usage not available)."""
        nvml = self._nvml
        try:
            handle = self._handles.get(nvml_index)
            if handle is None:
                handle = self._handles[nvml_index] = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except Exception:  # an NVMLError: the device is not NVML's to describe
            return _UNKNOWN, _UNKNOWN, _UNKNOWN
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return total, _UNKNOWN, _UNKNOWN
        mine = [p.usedGpuMemory for p in processes if p.pid == self._pid]
        others = [p.usedGpuMemory for p in processes if p.pid != self._pid]
        return total, _sum_known(mine) if mine else _UNKNOWN, _sum_known(others)


def _sum_known(values: list[int | None]) -> int:
    """Sum of used memory (0 for no process); -1 if any is not available (None)."""
    if any(v is None for v in values):
        return _UNKNOWN
    return int(sum(v for v in values if v is not None))


class DeviceSampler:
    """Samples of the CUDA devices in use (NOTE [ Device samples ]), as ``device_samples`` rows.

    ``intern`` gives string ids; ``cuda`` is ``torch.cuda`` (tests pass a fake of its documented
    API); ``nvml`` opens NVML once, at the first sample on a CUDA device.
    """

    def __init__(
        self,
        intern: Callable[[str], int],
        cuda: Any = None,
        nvml: Callable[[], Nvml | None] = Nvml.open,
    ) -> None:
        if cuda is None:
            import torch.cuda as cuda
        self._cuda = cuda
        self._intern = intern
        self._open_nvml = nvml
        self._nvml: Nvml | None = None
        self._nvml_tried = False
        self._rows = MutableTable("device_samples")
        self._peaks: list[tuple[int, int, int, int]] = []  # time, device, allocated, reserved
        self._step_start = 0
        self.total_bytes = _UNKNOWN
        """Memory of the first device sampled (NVML's total, else torch's), -1 if none."""

    def devices(self) -> list[int]:
        """CUDA devices in use: the allocator has reserved memory on them."""
        cuda = self._cuda
        if not cuda.is_available() or not cuda.is_initialized():
            return []
        return [
            i
            for i in range(cuda.device_count())
            if cuda.memory_stats(i).get("reserved_bytes.all.current", 0) > 0
        ]

    def step_begins(self, now: int) -> None:
        """A recorded step begins: a boundary sample, and the allocator's peaks start over."""
        self._step_start = now
        for device in self.devices():
            self._sample(device, now, _BOUNDARY)
            self._cuda.reset_peak_memory_stats(device)

    def step_ends(self, now: int, peak_time: Callable[[str, int, int], int]) -> None:
        """A recorded step ends: keep each device's allocator peaks over it, placed at
        ``peak_time(device, start, end)``: when the recorded memory of ``device`` peaks between
        two times."""
        for device in self.devices():
            stats = self._cuda.memory_stats(device)
            self._peaks.append(
                (
                    peak_time(f"cuda:{device}", self._step_start, now),
                    device,
                    int(stats.get("allocated_bytes.all.peak", _UNKNOWN)),
                    int(stats.get("reserved_bytes.all.peak", _UNKNOWN)),
                )
            )

    def run_ends(self, now: int) -> None:
        """The run's last boundary."""
        for device in self.devices():
            self._sample(device, now, _BOUNDARY)

    def oom(self, now: int) -> None:
        """An allocation failed (NOTE [ OOM capture ] in recorder/oom.py)."""
        for device in self.devices():
            self._sample(device, now, _OOM)

    def columns(self) -> dict[str, np.ndarray]:
        """The run's rows in time order, and start over for the next run."""
        for time, device, allocated, reserved in self._peaks:
            total = self._usage(device)[0] if self._nvml is not None else _UNKNOWN
            self._rows.append(
                (
                    time,
                    self._intern(f"cuda:{device}"),
                    _PEAK,
                    allocated,
                    reserved,
                    _UNKNOWN,
                    total,
                    _UNKNOWN,
                    _UNKNOWN,
                )
            )
        columns = self._rows.as_columns()
        order = np.argsort(columns["time_ns"], kind="stable")
        self._rows = MutableTable("device_samples")
        self._peaks = []
        return {name: values[order] for name, values in columns.items()}

    def _sample(self, device: int, now: int, reason: int) -> None:
        stats = self._cuda.memory_stats(device)
        total, process, others = self._usage(device)
        if self.total_bytes == _UNKNOWN:
            self.total_bytes = (
                total if total >= 0 else int(self._cuda.get_device_properties(device).total_memory)
            )
        self._rows.append(
            (
                now,
                self._intern(f"cuda:{device}"),
                reason,
                int(stats.get("allocated_bytes.all.current", _UNKNOWN)),
                int(stats.get("reserved_bytes.all.current", _UNKNOWN)),
                self._largest_free(device),
                total,
                process,
                others,
            )
        )

    def _usage(self, device: int) -> tuple[int, int, int]:
        if not self._nvml_tried:
            self._nvml_tried = True
            self._nvml = self._open_nvml()
        if self._nvml is None:
            return _UNKNOWN, _UNKNOWN, _UNKNOWN
        try:
            index = self._cuda._get_nvml_device_index(device)  # honours CUDA_VISIBLE_DEVICES
        except Exception:  # the device's NVML index cannot be told: say nothing wrong
            return _UNKNOWN, _UNKNOWN, _UNKNOWN
        return self._nvml.usage(index)

    def _largest_free(self, device: int) -> int:
        """The largest ``inactive`` block in the device's reserved segments."""
        try:
            segments = self._cuda.memory_snapshot(include_traces=False)
        except TypeError:  # torch before 2.8 has no include_traces
            segments = self._cuda.memory_snapshot()
        sizes = [
            int(block["size"])
            for segment in segments
            if segment.get("device") == device
            for block in segment.get("blocks", ())
            if block.get("state") == "inactive"
        ]
        return max(sizes, default=0)


def recorded_peak_time(columns: dict[str, np.ndarray], device: int, start: int, end: int) -> int:
    """When the recorded live bytes on ``device`` (a string id) peak between ``start`` and
    ``end``: the first time of the maximum, ``start`` if nothing changes.

    ``columns``: the run's ``storages`` (``nbytes``, ``device``, ``alloc_ns``, ``free_ns``;
    -1 for "before recording" and "still alive")."""
    on = columns["device"] == device
    nbytes = columns["nbytes"][on].astype(np.int64)
    alloc, free = columns["alloc_ns"][on], columns["free_ns"][on]
    born = (alloc >= start) & (alloc <= end)
    died = (free >= start) & (free <= end)
    # The state at ``start`` first (a change of 0), then the changes in time order; at one
    # time, allocations before frees.
    times = np.concatenate([[start], alloc[born], free[died]])
    deltas = np.concatenate([[0], nbytes[born], -nbytes[died]])
    order = np.lexsort((-deltas, times))
    live = np.cumsum(deltas[order])
    return int(times[order][int(np.argmax(live))])
