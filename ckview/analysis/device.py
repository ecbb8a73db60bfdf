"""The device around the recorded step: CUDA allocator state, NVML totals, and an OOM.

Reads the run table ``device_samples`` (NOTE [ Device samples ] in recorder/device.py) and the
run attributes ``oom_*`` (docs/trace-format.md, since v4). Data in, data out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.analysis.breakdown import bytes_by_category, bytes_by_module, module_paths
from ckview.analysis.summary import NO_MODULE, top_storages
from ckview.analysis.timeline import live_storages
from ckview.analysis.types import Table

UNKNOWN = -1


@dataclass(frozen=True)
class DeviceState:
    """What one CUDA device held over a run; each figure -1 where nobody said.

    ``process``, ``others`` and ``not_by_pytorch`` are the most seen at a sample (NVML is read
    at step boundaries and at an OOM); ``reserved`` and ``allocated`` are the allocator's peaks;
    ``fragmentation`` and ``largest_free`` are read at the sample that reserved the most.
    """

    device: str
    total: int
    process: int
    others: int
    not_by_pytorch: int
    """This process's NVML usage minus what PyTorch reserved: CUDA context, NCCL, libraries."""
    reserved: int
    allocated: int
    fragmentation: int
    """Reserved minus allocated."""
    largest_free: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def device_states(
    samples: Table, strings: Sequence[str], total_bytes: int = UNKNOWN
) -> list[DeviceState]:
    """Per device of ``device_samples`` (in order of first sample), its state over the run;
    empty for a CPU run. ``total_bytes``: the trace's ``device_total_bytes``, for a device NVML
    did not describe."""
    device = np.asarray(samples["device"])
    _, first = np.unique(device, return_index=True)
    return [
        _state(samples, device == device[i], strings[int(device[i])], total_bytes)
        for i in sorted(first)
    ]


def _state(samples: Table, rows: np.ndarray, name: str, total_bytes: int) -> DeviceState:
    column = {key: np.asarray(values)[rows] for key, values in samples.items()}
    reserved, allocated = column["reserved"], column["allocated"]
    known = (column["nvml_process"] >= 0) & (reserved >= 0)
    extra = column["nvml_process"][known] - reserved[known]
    most = int(np.argmax(reserved))
    free_known = column["largest_free"] >= 0
    largest_free = UNKNOWN
    if free_known.any():
        at = np.flatnonzero(free_known)[int(np.argmax(reserved[free_known]))]
        largest_free = int(column["largest_free"][at])
    total = _most(column["nvml_total"])
    return DeviceState(
        device=name,
        total=total if total >= 0 else total_bytes,
        process=_most(column["nvml_process"]),
        others=_most(column["nvml_others"]),
        not_by_pytorch=int(extra.max()) if extra.size else UNKNOWN,
        reserved=int(reserved[most]),
        allocated=_most(allocated),
        fragmentation=int(reserved[most] - allocated[most]) if allocated[most] >= 0 else UNKNOWN,
        largest_free=largest_free,
    )


def _most(values: np.ndarray) -> int:
    """The largest known value (-1 if none is known)."""
    return int(values.max()) if values.size else UNKNOWN


@dataclass(frozen=True)
class Oom:
    """The allocation failure a run ended in (run attributes ``oom_*``)."""

    op: str
    """The aten op, '' if unknown."""
    module: str
    """The module path, '' if none or unknown."""
    nbytes: int
    """Bytes asked for, -1 if unknown."""
    time_ns: int
    message: str

    @classmethod
    def of_run(cls, run: Any) -> Oom | None:
        """The OOM of a trace's run (``ckview.trace`` ``Run``), None if it did not end in one."""
        if run.oom_time_ns < 0:
            return None
        return cls(run.oom_op, run.oom_module, run.oom_bytes, run.oom_time_ns, run.oom_message)

    def headline(self) -> str:
        """'OOM in aten.mm.default of Net.fc, asked for 2.00 GiB'."""
        where = f"in {self.op or 'code outside any aten op'}"
        if self.module:
            where += f" of {self.module}"
        return f"OOM {where}, asked for {self.asked()}"

    def asked(self) -> str:
        """What the failing allocation asked for: '2.00 GiB', or 'an unknown size'."""
        from ckview.analysis.units import format_bytes

        return "an unknown size" if self.nbytes < 0 else format_bytes(self.nbytes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OomMoment:
    """What was live when the allocation failed."""

    event: int
    """memory_events row after which the failure came, -1 if before any."""
    live_bytes: int
    by_category: dict[str, int]
    top_modules: list[tuple[str, int]]
    top_storages: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["top_modules"] = [list(pair) for pair in self.top_modules]
        return out


def oom_event(events: Table, time_ns: int) -> int:
    """The last memory event at or before ``time_ns`` (-1 if none): the state the failing
    allocation met."""
    return int(np.searchsorted(np.asarray(events["time_ns"]), time_ns, side="right")) - 1


def oom_moment(
    tables: Mapping[str, Table], modules: Table, strings: Sequence[str], oom: Oom, top: int = 8
) -> OomMoment:
    """Live storages at ``oom.time_ns`` by category, by module, and the largest ones."""
    storages = tables["storages"]
    event = oom_event(tables["memory_events"], oom.time_ns)
    live = live_storages(storages, tables["memory_events"], event)
    paths = module_paths(modules, strings)
    categories = bytes_by_category(storages, live)
    return OomMoment(
        event=event,
        live_bytes=int(np.asarray(storages["nbytes"], dtype=np.int64)[live].sum()),
        by_category={c.name.lower(): b for c, b in categories.items() if b},
        top_modules=[
            (NO_MODULE if m < 0 else paths[m], b) for m, b in bytes_by_module(storages, live, top)
        ],
        top_storages=top_storages(tables, live, paths, strings, top),
    )
