"""What a projection answers: the projected peak, events, curve and recomputes (the NOTEs are
in ``ckview.analysis.projection``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ckview.analysis.regions import RegionInstances
from ckview.analysis.timeline import (
    MemoryTimeline,
    Peak,
)

# ----------------------------------------------------------------------------- results

DEFAULT_LINK_BANDWIDTH = 16e9
"""Bytes per second between device and host memory when nothing better is known: about half
of PCIe 4.0 x16's peak, what pinned copies on a side stream typically reach. The recorder does
not measure the link yet, so a CUDA trace uses this too unless the user gives one."""


@dataclass(frozen=True)
class ProjectedPeak:
    """Where a projected timeline peaks, comparable between ``project`` and ``ProjectionModel``."""

    bytes: int
    time_ns: int
    baseline_point: int
    """Baseline timeline point the peak stands at (a recompute's: the point it is inserted at)."""
    recompute_call: int
    """First call row of the instance whose recompute holds the peak (rows of ``module_calls``
    name an instance whatever list it was resolved from); -1 outside any recompute."""


@dataclass(frozen=True)
class ProjectedEvents:
    """The projected memory events, in order (the columns ``memory_timeline`` reads, and more)."""

    kind: np.ndarray
    """(m,) uint8: MemoryEventKind."""
    storage: np.ndarray
    """(m,) int64: row in ``storages`` (of the original, for a recomputed copy)."""
    time_ns: np.ndarray
    """(m,) int64: time of the event (NOTE [ Event keys ])."""
    instance: np.ndarray
    """(m,) int64: region instance that moved or inserted the event, -1 for a baseline event."""
    copy: np.ndarray
    """(m,) bool: the event allocates or frees a recomputed copy."""
    source: np.ndarray
    """(m,) int64: baseline event row the event is, moves or replays; -1 for a new free."""
    key: np.ndarray
    """(m,) int64: the sort key (NOTE [ Event keys ])."""
    point: np.ndarray
    """(m,) int64: baseline timeline point the event stands at (after baseline event e: e + 1;
    inserted before baseline event p: p)."""

    def __len__(self) -> int:
        return len(self.kind)

    def table(self) -> dict[str, np.ndarray]:
        """The events as a ``memory_events``-like table (``kind``, ``storage``, ``time_ns``)."""
        return {"kind": self.kind, "storage": self.storage, "time_ns": self.time_ns}


@dataclass(frozen=True)
class LiveStorages:
    """Storages live at one moment, recomputed copies flagged."""

    storage: np.ndarray
    """(l,) int64: storage rows, ascending (a row may appear twice: original and copy)."""
    copy: np.ndarray
    """(l,) bool: True for a recomputed copy of the storage."""


@dataclass(frozen=True)
class Recompute:
    """One recompute of a region instance in the projected backward."""

    instance: int
    region: int
    """Index of the instance's region in the list it was resolved from."""
    call: int
    """Row in ``module_calls`` of the instance's first call."""
    time_ns: int
    """When backward first needs the instance (NOTE [ Recompute in backward ])."""
    baseline_point: int
    """Baseline timeline point the replay is inserted at."""
    point: int
    """Projected timeline point the replay starts from (its first event makes point+1)."""
    compute_ns: int
    """The extra compute of the recompute (NOTE [ Extra compute from plain times ] in
    timing.py): from plain times with checkpoint's cost per call, or recorded op times."""


@dataclass(frozen=True)
class ProjectedCurve:
    """The projected total at display resolution (NOTE [ Projected curve ]), in key order."""

    time_ns: np.ndarray
    """(c,) int64: time of each state."""
    point: np.ndarray
    """(c,) int64: baseline timeline point each state stands at (to place it by op index)."""
    total: np.ndarray
    """(c,) int64: projected live bytes."""
    host: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(c,) int64: bytes the offload regions hold in host memory at each state; zero-length
    when none offloads (NOTE [ Host curve ])."""

    def __len__(self) -> int:
        return len(self.total)


@dataclass(frozen=True)
class Projection:
    """The projected timeline of a baseline run with some region instances checkpointed."""

    events: ProjectedEvents
    timeline: MemoryTimeline
    """Live bytes after each projected event (``timeline.event`` are rows of ``events``)."""
    peak: Peak
    """First maximum of the projected timeline (point, projected event row, time, bytes)."""
    projected_peak: ProjectedPeak
    live: LiveStorages
    """Storages live at the projected peak."""
    recomputes: tuple[Recompute, ...]
    extra_compute_ns: int
    plain_times: bool
    """``extra_compute_ns`` comes from plain timing steps (else from recorded op times, with
    the recorder's per-op cost: NOTE [ Extra compute from plain times ] in timing.py)."""
    instances: RegionInstances
    checkpointed: np.ndarray
    """(k,) bool: the instances checkpointed (the selected ones, outermost only)."""
    extra_compute_range_ns: tuple[int, int] = (0, 0)
    """The lowest and highest extra compute the measurements allow (NOTE [ How sure the extra
    time is ] in timing.py)."""
    offloaded_bytes: int = 0
    """Bytes the offload regions move to host memory and back (NOTE [ Offloaded instances ])."""
    host_peak_bytes: int = 0
    """The most bytes the offload regions hold in host memory at once (the maximum of
    ``host``)."""
    host: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(m+1,) int64: bytes the offload regions hold in host memory at each projected point;
    zero-length when no instance offloads (NOTE [ Host curve ])."""

    def transfer_ns(self, bandwidth: float = DEFAULT_LINK_BANDWIDTH) -> int:
        """Time to move the offloaded bytes to the host and back over a link of ``bandwidth``
        bytes per second (NOTE [ Offloaded instances ])."""
        return round(2 * self.offloaded_bytes / bandwidth * 1e9)

    @property
    def total(self) -> np.ndarray:
        """(m+1,) int64: live bytes at each projected point."""
        return self.timeline.total

    @property
    def by_category(self) -> np.ndarray:
        """(len(Category), m+1) int64: live bytes per category at each projected point."""
        return self.timeline.by_category
