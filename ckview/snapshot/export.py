"""A run of a ckview trace as a PyTorch memory snapshot dict (torch's current layout), for
pytorch.org/memory_viz and the tools built on its format.

NOTE [ Exported snapshots ]
    ``device_traces[d]`` holds, in event order, an ``alloc`` for each storage's birth (its
    ALLOC, or the SEEN of an input that arrives when seen: NOTE [ Pre-existing storages ] in
    ckview/analysis/timeline.py) and ``free_requested`` + ``free_completed`` for each FREE.
    ``segments`` is the state at the end, as torch writes it: one segment per storage still
    live then, holding one ``active_allocated`` block. A storage live from the start therefore
    appears as a free without an alloc, or as a final block the history never touches, which
    is how a snapshot says "live when the history began" (NOTE [ Snapshot replay ]); the
    replayed allocated bytes equal the run's memory timeline.
    ckview records storages, not addresses: every storage gets an invented, stable address
    (rows laid end to end from ``FAKE_BASE``, each rounded up to 512 bytes as the caching
    allocator rounds), never reused, so a viewer sees each lifetime apart. Reserved memory is
    not exported (each block is its own segment). Only plain dicts, lists, tuples, str and int
    are built (NOTE [ A pickle is code ]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckview.analysis.stacks import stack_frames
from ckview.analysis.timeline import births, live_at_start
from ckview.trace.schema import NO_INDEX, MemoryEventKind

Table = Mapping[str, np.ndarray]

FAKE_BASE = 0x7F00_0000_0000
"""Address of the first storage of an exported run (NOTE [ Exported snapshots ])."""
ALIGN = 512


def fake_addresses(nbytes: np.ndarray) -> np.ndarray:
    """Stable, distinct addresses for storages of these sizes (NOTE [ Exported snapshots ])."""
    sizes = (np.maximum(np.asarray(nbytes, np.int64), 1) + ALIGN - 1) // ALIGN * ALIGN
    return FAKE_BASE + np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)


def device_indices(devices: Sequence[str]) -> list[int]:
    """The ``device_traces`` index of each device name: N for ``cuda:N``; other devices (the
    CPU) after the CUDA ones, or 0 when there is none."""
    cuda = [int(d.split(":", 1)[1]) for d in devices if d.startswith("cuda:") and d[5:].isdigit()]
    other = max(cuda, default=-1) + 1
    return [
        int(d.split(":", 1)[1]) if d.startswith("cuda:") and d[5:].isdigit() else other
        for d in devices
    ]


class _Frames:
    """Frame lists of stack rows, built once per stack (the same list object each time, so
    that pickle stores it once)."""

    def __init__(self, frames: Table | None, stacks: Table | None, strings: Sequence[str]):
        self._frames, self._stacks, self._strings = frames, stacks, strings
        self._cache: dict[int, list[dict[str, Any]]] = {NO_INDEX: []}

    def of(self, stack: int) -> list[dict[str, Any]]:
        found = self._cache.get(stack)
        if found is None:
            found = self._cache[stack] = self._build(stack)
        return found

    def _build(self, stack: int) -> list[dict[str, Any]]:
        if self._frames is None or self._stacks is None:
            return []
        files, lines, names = (self._frames[c] for c in ("file", "line", "name"))
        return [
            {
                "filename": self._strings[int(files[r])],
                "line": int(lines[r]),
                "name": self._strings[int(names[r])],
            }
            for r in stack_frames(self._stacks, stack)
        ]


def trace_to_snapshot(tables: Mapping[str, Any], strings: Sequence[str]) -> dict[str, Any]:
    """The snapshot dict of one run: ``tables`` holds its ``storages`` and ``memory_events``
    and, when the trace has them, the root ``frames`` and ``stacks`` (NOTE [ Exported
    snapshots ])."""
    storages, events = tables["storages"], tables["memory_events"]
    nbytes = np.asarray(storages["nbytes"], np.int64)
    stack = np.asarray(storages.get("stack", np.full(len(nbytes), NO_INDEX)), np.int64)
    address = fake_addresses(nbytes)
    ids, which = np.unique(np.asarray(storages["device"], np.int64), return_inverse=True)
    device = np.asarray(device_indices([strings[int(d)] for d in ids]), np.int64)[which]
    frames = _Frames(tables.get("frames"), tables.get("stacks"), strings)

    kind = np.asarray(events["kind"])
    storage = np.asarray(events["storage"], np.int64)
    born = births(storages, kind, storage)
    freed = kind == MemoryEventKind.FREE
    time_us = np.asarray(events["time_ns"], np.int64) // 1000
    traces: list[list[dict[str, Any]]] = [
        [] for _ in range(int(device.max()) + 1 if len(device) else 1)
    ]
    for row in np.flatnonzero(born | freed).tolist():
        s = int(storage[row])
        common = {
            "addr": int(address[s]),
            "size": int(nbytes[s]),
            "stream": 0,
            "time_us": int(time_us[row]),
            "frames": frames.of(int(stack[s])),
        }
        out = traces[int(device[s])]
        if born[row]:
            out.append({"action": "alloc", **common})
        else:
            out.append({"action": "free_requested", **common})
            out.append({"action": "free_completed", **common})
    return {
        "segments": _final_segments(storages, storage, born, freed, address, device, frames),
        "device_traces": traces,
    }


def _final_segments(
    storages: Table,
    storage: np.ndarray,
    born: np.ndarray,
    freed: np.ndarray,
    address: np.ndarray,
    device: np.ndarray,
    frames: _Frames,
) -> list[dict[str, Any]]:
    """One segment per storage live at the end (NOTE [ Exported snapshots ])."""
    n = len(address)
    live = live_at_start(storages).copy()
    live[storage[born]] = True
    live[storage[freed]] = False
    nbytes = np.asarray(storages["nbytes"], np.int64)
    stack = np.asarray(storages.get("stack", np.full(n, NO_INDEX)), np.int64)
    out = []
    for s in np.flatnonzero(live).tolist():
        size = int(nbytes[s])
        block = {
            "address": int(address[s]),
            "size": size,
            "requested_size": size,
            "state": "active_allocated",
            "frames": frames.of(int(stack[s])),
        }
        out.append(
            {
                "device": int(device[s]),
                "address": int(address[s]),
                "total_size": size,
                "allocated_size": size,
                "active_size": size,
                "requested_size": size,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [block],
            }
        )
    return out
