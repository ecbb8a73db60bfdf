"""What a snapshot dict holds, across torch versions (2.1 to today), read defensively.

NOTE [ Snapshot layouts ]
    ``torch.cuda.memory._snapshot()`` returns ``{"segments": [...], "device_traces": [...]}``
    (plus ``allocator_settings`` in newer versions, kept as JSON in the trace's meta by
    ``settings_json``). ``segments`` is the state when
    the snapshot was taken: each segment (one ``cudaMalloc``, or an expandable segment) has
    ``device``, ``address``, ``total_size``, ``stream`` and ``blocks``; each block has ``size``,
    ``state`` (``active_allocated``, ``active_awaiting_free`` or ``inactive``; older:
    ``active_pending_free``) and ``frames``, and its ``address`` (older layouts and
    ``_profile_to_snapshot`` omit it: blocks then tile their segment in order). Torch 2.0
    kept a block's frames in ``history[-1]["frames"]``. ``device_traces[d]`` is the allocator's
    history on device ``d``, oldest first (a ring buffer: it may begin in the middle of things):
    events with ``action``, ``addr``, ``size``, ``stream``, ``frames`` and ``time_us`` (absent in
    older layouts). ``alloc`` makes a block live; ``free_requested`` only asks to free it;
    ``free_completed`` (``free`` in the oldest layouts) releases its bytes; ``segment_alloc`` /
    ``segment_free`` and ``segment_map`` / ``segment_unmap`` reserve and release memory;
    ``snapshot`` and ``oom`` mark moments. Frames list the innermost call first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .errors import SnapshotError

ALLOC = "alloc"
FREES = frozenset({"free_completed", "free"})
SEGMENT_OPENS = frozenset({"segment_alloc", "segment_map"})
SEGMENT_CLOSES = frozenset({"segment_free", "segment_unmap"})
LIVE_STATES = frozenset({"active_allocated", "active_awaiting_free", "active_pending_free"})


INT64 = (-(2**63), 2**63 - 1)


def integer(value: Any, where: str) -> int:
    """``value`` as an int64 (bool is not one); SnapshotError naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotError(f"{where} is not an integer ({type(value).__name__})")
    if not INT64[0] <= value <= INT64[1]:
        raise SnapshotError(f"{where} is out of range ({value})")
    return value


def field(entry: Any, key: str, where: str) -> Any:
    """``entry[key]`` of a dict entry; SnapshotError naming ``where`` if either is missing."""
    if not isinstance(entry, dict):
        raise SnapshotError(f"{where} is not a dict ({type(entry).__name__})")
    if key not in entry:
        raise SnapshotError(f"{where} has no '{key}'")
    return entry[key]


def device_traces(snapshot: dict[str, Any]) -> list[list[Any]]:
    """The history of each device (``[]`` for a snapshot without history)."""
    traces: list[list[Any]] = snapshot.get("device_traces", [])
    return traces


#: Device indices accepted (CUDA device ordinals).
MAX_DEVICES = 1 << 16


def segment_device(segment: Any, i: int) -> int:
    """The device of ``segments[i]``: an ordinal from 0 (SnapshotError otherwise)."""
    device = integer(field(segment, "device", f"segments[{i}]"), f"segments[{i}].device")
    if not 0 <= device < MAX_DEVICES:
        raise SnapshotError(f"segments[{i}].device is not a device ordinal ({device})")
    return device


def segments(snapshot: dict[str, Any], device: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, segment)`` of each segment of ``device`` in the final state."""
    for i, seg in enumerate(snapshot.get("segments", [])):
        if segment_device(seg, i) == device:
            yield i, seg


def devices(snapshot: dict[str, Any]) -> list[int]:
    """Devices with a history or a segment, in order."""
    found = {d for d, events in enumerate(device_traces(snapshot)) if events}
    for i, seg in enumerate(snapshot.get("segments", [])):
        found.add(segment_device(seg, i))
    return sorted(found)


def blocks(segment: dict[str, Any], where: str) -> Iterator[tuple[int, int, str, list[Any]]]:
    """``(address, size, state, frames)`` of each block of a segment (NOTE [ Snapshot
    layouts ]: a block without ``address`` follows the previous one)."""
    address = integer(field(segment, "address", where), f"{where}.address")
    entries = field(segment, "blocks", where)
    if not isinstance(entries, list):
        raise SnapshotError(f"{where}.blocks is not a list")
    for j, block in enumerate(entries):
        at = f"{where}.blocks[{j}]"
        size = integer(field(block, "size", at), f"{at}.size")
        if size < 0:
            raise SnapshotError(f"{at}.size is negative ({size})")
        address = integer(block.get("address", address), f"{at}.address")
        state = field(block, "state", at)
        yield address, size, str(state), block_frames(block)
        address += size


def block_frames(block: dict[str, Any]) -> list[Any]:
    """A block's allocation frames: ``frames``, or torch 2.0's ``history[-1]["frames"]``."""
    frames = block.get("frames")
    if frames is None:
        history = block.get("history")
        if isinstance(history, list) and history and isinstance(history[-1], dict):
            frames = history[-1].get("frames")
    return frames if isinstance(frames, list) else []


def settings_json(snapshot: dict[str, Any]) -> str:
    """The snapshot's ``allocator_settings`` as a JSON object, '' if it has none (torch 2.0)."""
    settings = snapshot.get("allocator_settings")
    if settings is None:
        return ""
    if not isinstance(settings, dict):
        raise SnapshotError(f"allocator_settings is a {type(settings).__name__}, not a dict")
    try:
        return json.dumps(settings, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"allocator_settings is not plain data ({exc})") from None
