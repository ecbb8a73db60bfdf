"""CUDA devices as a source: allocator state and NVML totals sampled at step boundaries, at
each step's peak and at an OOM (NOTE [ Device samples ] in recorder/device.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from recorder.device import DeviceSampler, recorded_peak_time
from recorder.sources.base import RunPart, nothing_to_undo
from recorder.tables import RunTables


class DeviceSource:
    """The run's ``device_samples`` table and the trace's ``device_total_bytes``."""

    def __init__(self, intern: Callable[[str], int]) -> None:
        self._sampler = DeviceSampler(intern)
        self._run: RunTables | None = None

    def install(self) -> Callable[[], None]:
        return nothing_to_undo

    def begin_run(self, run: RunTables) -> None:
        self._run = run

    def step_begins(self, now: int) -> None:
        self._sampler.step_begins(now)

    def step_ends(self, now: int) -> None:
        """Each device's peak over the step, placed on the storage rows the sources before this
        one wrote for it (NOTE [ Device samples ] in recorder/device.py)."""
        self._sampler.step_ends(now, self._peak_time)

    def _peak_time(self, device: str, start: int, end: int) -> int:
        run = self._run
        assert run is not None, "a step ends inside a run"
        return recorded_peak_time(run.storages.device_columns(), run.intern(device), start, end)

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        """The run's samples, its last boundary sampled at its last step's end (``now`` if it
        has none)."""
        last = len(run.steps) - 1
        self._sampler.run_ends(run.steps.get(last, "end_ns") if last >= 0 else now)
        return RunPart(tables={"device_samples": self._sampler.columns()})

    def meta(self) -> dict[str, Any]:
        return {
            "device_total_bytes": self._sampler.total_bytes,
            "allocator_settings": allocator_settings(),
        }

    def oom(self, now: int) -> None:
        """An allocation failed (NOTE [ OOM capture ] in recorder/oom.py): sample the devices."""
        self._sampler.oom(now)


def allocator_settings() -> str:
    """The trace's meta ``allocator_settings``: the ``PYTORCH_CUDA_ALLOC_CONF`` the script ran
    with, as a JSON object, so that the allocator model replays with the same rules
    (``ckview.analysis.allocator.settings_from_meta``); '' where it is not set."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return json.dumps({"PYTORCH_CUDA_ALLOC_CONF": conf}) if conf else ""
