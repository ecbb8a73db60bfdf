"""Reserved memory of a run or a projection: its allocations replayed through the model of the
CUDA caching allocator (NOTE [ The caching allocator's rules ] in allocator.py), so that what
the recorder counts (live bytes of storages) can be compared with what the device gives out.
Pure functions over a run's tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ckview.analysis.allocator import AllocatorSettings, ReservedCurve, events_from_run, replay

MAX_EVENTS = 200_000
"""The model replays each event in Python (about 15 us each): ``ckview summary`` and the
explorer do not model runs with more memory events than this (3 s); ``ckview fit --budget
device``, asked for it, does."""

DEFAULTS = AllocatorSettings()
"""torch's default settings (no ``PYTORCH_CUDA_ALLOC_CONF``)."""


def cuda_ordinals(strings: Sequence[str], device_ids: np.ndarray) -> dict[int, int]:
    """String id -> ordinal of each CUDA device among ``device_ids`` ('cuda' alone is 0)."""
    out = {}
    for i in np.unique(np.asarray(device_ids)):
        name = strings[int(i)]
        if name == "cuda" or name.startswith("cuda:"):
            out[int(i)] = int(name.partition(":")[2] or 0)
    return out


def reserved_over(
    storages: Mapping[str, np.ndarray],
    strings: Sequence[str],
    events: Mapping[str, np.ndarray],
    copy: np.ndarray | None = None,
    settings: AllocatorSettings = DEFAULTS,
) -> ReservedCurve | None:
    """The caching allocator's reserved (and allocated) bytes over ``events`` (a run's
    ``memory_events``, or a projection's with ``copy`` flagging recomputed copies: blocks of
    their own) on the CUDA devices of ``storages``; None if no storage is on a CUDA device.
    Storages first SEEN (live before recording) are allocated there, in the order seen."""
    device = np.asarray(storages["device"])
    ordinals = cuda_ordinals(strings, device)
    if not ordinals:
        return None
    n = len(device)
    nbytes = np.asarray(storages["nbytes"], dtype=np.int64)
    storage = np.asarray(events["storage"], dtype=np.int64)
    if copy is not None:  # a copy is block n + its storage
        storage = storage + n * np.asarray(copy, dtype=np.int64)
    rows = events_from_run(
        np.asarray(events["kind"]),
        storage,
        np.asarray(events["time_ns"]),
        np.concatenate([nbytes, nbytes]),
        np.concatenate([device, device]),
        ordinals,
    )
    return replay(rows, settings)


def reserved_peak(curve: ReservedCurve | None) -> int:
    """The most ``curve`` reserves (0 for None or no event)."""
    if curve is None or not len(curve.reserved):
        return 0
    return int(curve.reserved.max())


def reserved_at_points(
    storages: Mapping[str, np.ndarray],
    strings: Sequence[str],
    events: Mapping[str, np.ndarray],
    settings: AllocatorSettings = DEFAULTS,
) -> np.ndarray | None:
    """(n+1,) int64: what the caching allocator model holds reserved at each point of a run's
    timeline (point 0: before the first event; an event on no CUDA device keeps the value
    before it); None if no storage is on a CUDA device."""
    curve = reserved_over(storages, strings, events, None, settings)
    if curve is None:
        return None
    device = np.asarray(storages["device"])
    storage = np.asarray(events["storage"], dtype=np.int64)
    nbytes = np.asarray(storages["nbytes"], dtype=np.int64)
    # The events events_from_run keeps, in order: the curve has one value per kept event.
    kept = np.isin(device[storage], list(cuda_ordinals(strings, device))) & (nbytes[storage] > 0)
    points = np.flatnonzero(kept)[: len(curve.reserved)] + 1
    values = np.zeros(len(storage) + 1, dtype=np.int64)
    values[points] = curve.reserved
    last = np.zeros(len(values), dtype=np.int64)
    last[points] = points
    return values[np.maximum.accumulate(last)]
