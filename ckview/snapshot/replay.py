"""The snapshot's own account of allocated bytes over time: the oracle of the importer.

NOTE [ Snapshot replay ]
    What memory_viz plots as "active memory" (``process_alloc_data`` of torch's MemoryViz.js),
    step by step: ``alloc`` opens a block at its address; a free (``free_completed``, or
    ``free`` in the oldest layouts; not ``free_requested``) closes the block open at its
    address, or, if none is open there, is a block that was live when the history began. A
    block live in the final ``segments`` whose address has no block open at the end of the
    history was live from the start too. Allocated bytes start at the sum of those blocks, then
    +size at each alloc and -size at each free. This is deliberately a plain loop over the
    events, written apart from the vectorised converter (convert.py), so that tests can hold
    one to the other.
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
    open_blocks: dict[int, int] = {}  # address -> size of the block allocated there
    start = 0
    for e in events:
        if e["action"] == ALLOC:
            open_blocks[e["addr"]] = e["size"]
        elif e["action"] in FREES and open_blocks.pop(e["addr"], None) is None:
            start += e["size"]  # freed, never allocated in the history: live at its start
    for i, seg in segments(snapshot, device):
        for address, size, state, _ in blocks(seg, f"segments[{i}]"):
            if state in LIVE_STATES and address not in open_blocks:
                start += size
    total = start
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
