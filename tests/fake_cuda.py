"""Fakes of the documented ``torch.cuda`` memory API and of ``pynvml`` (no GPU here).

Shapes follow torch's own source (``torch/cuda/memory.py``: ``memory_stats`` keys,
``memory_snapshot`` segments with ``device`` and ``blocks`` of ``size`` and ``state``) and
pynvml's (``nvmlDeviceGetMemoryInfo(handle).total``, ``nvmlDeviceGetComputeRunningProcesses``
entries with ``pid`` and ``usedGpuMemory``, None where not available).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MiB = 1 << 20
GiB = 1 << 30


@dataclass
class FakeCuda:
    """``torch.cuda`` with one device (or ``devices``) whose allocator grows 1 MiB per read."""

    devices: int = 1
    total: int = 16 * GiB
    allocated: int = 100 * MiB
    reserved: int = 128 * MiB
    free_blocks: tuple[int, ...] = (2 * MiB, 6 * MiB)
    grow: int = MiB
    """Bytes allocated and reserved grow by at each read."""
    peak_extra: int = 50 * MiB
    """Bytes a step's peak stands above the current figures."""
    nvml_index: dict[int, int] = field(default_factory=dict)
    resets: list[int] = field(default_factory=list)
    reads: int = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.devices

    def memory_stats(self, device: int) -> dict[str, Any]:
        self.reads += 1
        grow = self.reads * self.grow
        return {
            "allocated_bytes.all.current": self.allocated + grow,
            "allocated_bytes.all.peak": self.allocated + grow + self.peak_extra,
            "reserved_bytes.all.current": self.reserved + grow,
            "reserved_bytes.all.peak": self.reserved + grow + self.peak_extra,
            "num_ooms": 0,
        }

    def reset_peak_memory_stats(self, device: int) -> None:
        self.resets.append(device)

    def memory_snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        return [
            {
                "device": device,
                "address": 0,
                "total_size": self.reserved,
                "stream": 0,
                "segment_type": "large",
                "allocated_size": self.allocated,
                "active_size": self.allocated,
                "blocks": [
                    {"size": self.allocated, "state": "active_allocated", "address": 0},
                    *({"size": s, "state": "inactive", "address": 0} for s in self.free_blocks),
                ],
            }
            for device in range(self.devices)
        ]

    def get_device_properties(self, device: int) -> Any:
        return SimpleNamespace(total_memory=self.total)

    def _get_nvml_device_index(self, device: int) -> int:
        return self.nvml_index.get(device, device)


class NVMLError(Exception):
    pass


@dataclass
class FakePynvml:
    """``pynvml`` for one device used by this process (CUDA context + what torch reserved) and
    one other process."""

    total: int = 16 * GiB
    mine: int | None = 700 * MiB
    others: int = 3 * GiB
    pid: int = field(default_factory=os.getpid)
    broken: bool = False

    def nvmlInit(self) -> None:
        if self.broken:
            raise NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("handle", index)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(total=self.total, used=(self.mine or 0) + self.others)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return [
            SimpleNamespace(pid=self.pid, usedGpuMemory=self.mine),
            SimpleNamespace(pid=self.pid + 1, usedGpuMemory=self.others),
        ]
