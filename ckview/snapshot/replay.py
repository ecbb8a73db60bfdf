"""The snapshot's own account of allocated bytes over time: the oracle of the importer.

NOTE [ Snapshot replay ]
    What memory_viz plots as "active memory": the blocks live when the history began, then
    +size at each ``alloc`` and -size at each ``free_completed`` (NOTE [ Snapshot layouts ]).
    The state at the start is found by walking the history backwards from the final state:
    every live block of ``segments``, minus what an ``alloc`` of the history made, plus what a
    free of the history released. This is deliberately a plain loop over the events, written
    apart from the vectorised converter (convert.py), so that tests can hold one to the other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .layout import ALLOC, FREES, LIVE_STATES, blocks, device_traces, segments


def replay_allocated(snapshot: dict[str, Any], device: int) -> np.ndarray:
    """Allocated bytes on ``device`` before the first event and after each event of its
    history: ``(len(history) + 1,)`` int64 (NOTE [ Snapshot replay ])."""
    traces = device_traces(snapshot)
    events = traces[device] if device < len(traces) else []
    live: dict[int, int] = {}
    for i, seg in segments(snapshot, device):
        for address, size, state, _ in blocks(seg, f"segments[{i}]"):
            if state in LIVE_STATES:
                live[address] = size
    for e in reversed(events):
        if e["action"] in FREES:
            live[e["addr"]] = e["size"]
        elif e["action"] == ALLOC:
            live.pop(e["addr"], None)
    total = sum(live.values())
    out = [total]
    for e in events:
        if e["action"] == ALLOC:
            total += e["size"]
        elif e["action"] in FREES:
            total -= e["size"]
        out.append(total)
    return np.asarray(out, dtype=np.int64)


def replay_peak(snapshot: dict[str, Any], device: int) -> int:
    """The most bytes allocated on ``device`` at any moment of the history."""
    return int(replay_allocated(snapshot, device).max())
