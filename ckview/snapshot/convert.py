"""Convert a PyTorch memory snapshot (the dict) into a ckview trace: numpy only, no torch.

One run per device (``snapshot:cuda:N``) with one step covering the whole history. Storages are
the allocator's blocks: one row per lifetime (an ``alloc`` and its ``free_completed``).

NOTE [ Unknown, never guessed ]
    What a snapshot cannot say (what a block is for, its module, the op, dtype and shape) is
    left unknown: category ``UNKNOWN``, no module, no op, empty dtype and shape. The one
    exception is a category torch itself wrote on the event (``_profile_to_snapshot`` of the
    CPU/CUDA profiler does): that is torch's classification, not a guess.

NOTE [ Blocks live when the history began ]
    The history is a ring buffer, so it may begin with blocks already live. A free whose block
    has no ``alloc`` before it in the history, and a live block of the final ``segments`` at an
    address where no block of the history is open at its end, was live from the start (as
    memory_viz reads it: NOTE [ Snapshot replay ]): it becomes a pre-existing storage
    (``alloc_ns`` -1, a ``SEEN`` event at the start, so the timeline counts it from point 0:
    NOTE [ Pre-existing storages ] in ckview/analysis/timeline.py), and the imported timeline
    equals the replay.

NOTE [ Pairing frees with allocs ]
    Events are sorted stably by address: within one address, history order remains, so each
    ``free_completed`` pairs with the ``alloc`` right before it at that address, if it is one.
    This pairs every block lifetime without a per-event Python loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from ckview import __version__
from ckview.trace.schema import NO_INDEX, Category, MemoryEventKind
from ckview.trace.stacks import StackInterner
from ckview.trace.writer import RunWriter, TraceWriter

from .errors import SnapshotError
from .layout import (
    ALLOC,
    FREES,
    LIVE_STATES,
    SEGMENT_CLOSES,
    SEGMENT_OPENS,
    blocks,
    device_traces,
    devices,
    integer,
    segments,
)
from .reading import IMPORT_HINT

Progress = Callable[[int, int], None]
"""Called with (events done, events in all) while converting."""

#: Rows handed to the writer per append (the writer chunks them further).
BATCH = 1 << 18

_OTHER, _ALLOC, _FREE, _SEG_OPEN, _SEG_CLOSE = 0, 1, 2, 3, 4
_ACTION_CODES = {ALLOC: _ALLOC, **dict.fromkeys(FREES, _FREE)}
_ACTION_CODES.update(dict.fromkeys(SEGMENT_OPENS, _SEG_OPEN))
_ACTION_CODES.update(dict.fromkeys(SEGMENT_CLOSES, _SEG_CLOSE))


def run_name(device: int) -> str:
    """The name of the run that holds ``device``'s history."""
    return f"snapshot:cuda:{device}"


class StackTable:
    """Interns frames and call stacks into the trace's root ``frames`` and ``stacks`` tables.

    A stack is named by the row of its innermost frame (docs/trace-format.md, ``stacks``;
    NOTE [ The stack prefix tree ] in ckview/trace/stacks.py).

    NOTE [ Frames by identity ]
        Torch shares frame dicts between the events of a snapshot (symbolized once each), so a
        frame dict already seen is found by ``id`` without reading its fields, and a whole stack
        by the tuple of its frame rows. The frame dicts are kept referenced while their ids are
        cached, so an id is never reused for another dict; the cache is emptied when it grows
        past ``MAX_CACHED`` (snapshots whose frames are not shared), which costs speed only.
    """

    MAX_CACHED = 1 << 20

    def __init__(self, writer: TraceWriter) -> None:
        self._writer = writer
        self._frames: dict[tuple[str, int, str], int] = {}
        self._by_frames: dict[tuple[int, ...], int] = {}
        self._ids: dict[int, int] = {}
        self._alive: list[Any] = []
        self.frame_rows: list[tuple[int, int, int]] = []
        # Rows the trace already holds: ours come after them.
        self._frame_base = writer.root_rows("frames")
        self._stacks = StackInterner(writer.root_rows("stacks"))

    def stack(self, frames: Any) -> int:
        """The stack row of a list of frame dicts (innermost first); -1 for none."""
        if not isinstance(frames, list) or not frames:
            return NO_INDEX
        ids = self._ids
        try:
            key = tuple([ids[id(f)] for f in frames])
        except KeyError:
            key = tuple([self._frame(f) for f in frames])
        row = self._by_frames.get(key)
        if row is None:
            row = self._by_frames[key] = self._stacks.intern(key)
        return row

    def _frame(self, frame: Any) -> int:
        if not isinstance(frame, dict):
            raise SnapshotError(f"a frame is not a dict ({type(frame).__name__})")
        line = frame.get("line", 0)
        key = (
            str(frame.get("filename", "")),
            line if type(line) is int and 0 <= line < 2**31 else 0,
            str(frame.get("name", "")),
        )
        row = self._frames.get(key)
        if row is None:
            row = self._frames[key] = self._frame_base + len(self.frame_rows)
            intern = self._writer.intern
            self.frame_rows.append((intern(key[0]), key[1], intern(key[2])))
        if len(self._ids) >= self.MAX_CACHED:
            self._ids.clear()
            self._alive.clear()
        self._ids[id(frame)] = row
        self._alive.append(frame)
        return row

    def write(self) -> None:
        """Append the interned frames and stacks to the trace."""
        frames = np.array(self.frame_rows, dtype=np.int64).reshape(-1, 3)
        self._writer.append_root(
            "frames", {"file": frames[:, 0], "line": frames[:, 1], "name": frames[:, 2]}
        )
        self._writer.append_root("stacks", self._stacks.columns())


@dataclass
class _Events:
    """One device's history as columns."""

    code: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    time_ns: np.ndarray
    stream: np.ndarray
    stack: np.ndarray


#: Events read per chunk: Python lists of one chunk, then numpy arrays.
CHUNK = 65536
#: Largest ``time_us`` accepted (2**53: exact in a float, and x1000 fits int64).
MAX_TIME_US = 2**53


class _Bad(Exception):
    """An event failed the fast checks of ``_read_events``; ``_check_event`` says why."""


def _read_events(
    events: list[Any], device: int, t0_us: int, stacks: StackTable, tick: Callable[[int], None]
) -> _Events:
    """Stream a device's events into numpy arrays, chunk by chunk (NOTE [ Snapshot layouts ])."""
    n = len(events)
    out = _Events(
        code=np.zeros(n, np.uint8),
        addr=np.zeros(n, np.int64),
        size=np.zeros(n, np.int64),
        time_ns=np.zeros(n, np.int64),
        stream=np.zeros(n, np.int64),
        stack=np.full(n, NO_INDEX, np.int32),
    )
    raw_time = np.zeros(n, np.int64)
    for start in range(0, n, CHUNK):
        part = events[start : start + CHUNK]
        columns = _read_chunk(part, start, device, stacks)
        stop = start + len(part)
        for name, values in zip(("code", "addr", "size", "stream", "stack"), columns, strict=False):
            getattr(out, name)[start:stop] = values
        raw_time[start:stop] = columns[-1]
        tick(len(part))
    if (raw_time < 0).any():  # an event without time_us (older layouts): order only
        out.time_ns[:] = np.arange(n, dtype=np.int64) * 1000
    else:
        out.time_ns[:] = (raw_time - t0_us) * 1000
    np.maximum.accumulate(out.time_ns, out=out.time_ns)  # NOTE [ Event order ] in timeline.py
    return out


def _read_chunk(part: list[Any], start: int, device: int, stacks: StackTable) -> list[np.ndarray]:
    """(code, addr, size, stream, stack, time_us or -1) of a chunk of events. Only allocations
    get their stack here (a free carries its block's allocation frames again; the few frees
    whose block was allocated before the history get theirs in ``_write_device``)."""
    codes, stack = _ACTION_CODES, stacks.stack
    rows: list[list[int]] = [[], [], [], [], [], []]
    code_l, addr_l, size_l, stream_l, stack_l, time_l = rows
    for j, e in enumerate(part):
        try:
            code = codes.get(e["action"], _OTHER)
            addr = size = stream = 0
            frames = NO_INDEX
            if code:
                addr, size, stream = e["addr"], e["size"], e.get("stream", 0)
                if type(addr) is not int or type(size) is not int or type(stream) is not int:
                    raise _Bad
                if code == _ALLOC:
                    frames = stack(e.get("frames"))
            time_us = e.get("time_us", -1)
            if type(time_us) is not int:
                raise _Bad
        except SnapshotError:
            raise
        except Exception:
            _bad_event(e, device, start + j)
        code_l.append(code)
        addr_l.append(addr)
        size_l.append(size)
        stream_l.append(stream)
        stack_l.append(frames)
        time_l.append(time_us)
    try:
        columns = [np.array(r, np.int64) for r in rows]
    except OverflowError:
        columns = []
    if (
        len(columns) < len(rows)
        or (columns[2] < 0).any()
        or (columns[5] < -1).any()
        or (columns[5] >= MAX_TIME_US).any()
    ):
        for j, e in enumerate(part):  # find the culprit and say what is wrong with it
            _check_event(e, f"device_traces[{device}][{start + j}]")
    return columns


def _bad_event(e: Any, device: int, index: int) -> NoReturn:
    where = f"device_traces[{device}][{index}]"
    _check_event(e, where)
    raise SnapshotError(f"{where} is not a valid event")


def _check_event(e: Any, where: str) -> None:
    """Raise the SnapshotError that says what is wrong with event ``e``, if anything."""
    if not isinstance(e, dict) or "action" not in e:
        raise SnapshotError(f"{where} is not an event (a dict with an 'action')")
    if not isinstance(e["action"], str):
        raise SnapshotError(f"{where}.action is not a string")
    if _ACTION_CODES.get(e["action"], _OTHER):
        integer(e.get("addr"), f"{where}.addr")
        if integer(e.get("size"), f"{where}.size") < 0:
            raise SnapshotError(f"{where}.size is negative ({e['size']})")
        integer(e.get("stream", 0), f"{where}.stream")
    if "time_us" in e and not 0 <= integer(e["time_us"], f"{where}.time_us") < MAX_TIME_US:
        raise SnapshotError(f"{where}.time_us is out of range ({e['time_us']})")


def _first_time_us(snapshot: dict[str, Any]) -> int:
    """The earliest ``time_us`` of the first events of all devices (0 if none has one)."""
    firsts = [
        events[0].get("time_us")
        for events in device_traces(snapshot)
        if events and isinstance(events[0], dict)
    ]
    times = [t for t in firsts if type(t) is int and 0 <= t < MAX_TIME_US]
    return min(times) if times else 0


@dataclass
class _Lifetimes:
    """Open/close events paired into lifetimes (NOTE [ Pairing frees with allocs ])."""

    owner: np.ndarray  # per open/close event (history order): its lifetime row
    rows: int  # lifetimes in all: pre-existing first, then one per open event
    pre_events: np.ndarray  # the close event of each pre-existing lifetime that has one
    open_event: np.ndarray  # per lifetime after the pre-existing ones: its open event
    close_event: np.ndarray  # per lifetime: its close event, -1 if none


def _pair(is_open: np.ndarray, addr: np.ndarray, extra_pre: int) -> _Lifetimes:
    """Pair events at the same address: each close with the open right before it, if any.

    Lifetimes: first the closes with no open (live when the history began), then ``extra_pre``
    more pre-existing ones (the caller's), then one per open event, in history order."""
    k = len(is_open)
    order = np.lexsort((np.arange(k), addr))
    open_s, addr_s = is_open[order], addr[order]
    after_open = np.zeros(k, bool)
    after_open[1:] = (addr_s[1:] == addr_s[:-1]) & open_s[:-1]
    paired_s = ~open_s & after_open
    orphan = np.zeros(k, bool)
    orphan[order] = ~open_s & ~after_open
    n_orphan = int(orphan.sum())
    base = n_orphan + extra_pre
    owner = np.empty(k, np.int64)
    owner[orphan] = np.arange(n_orphan)
    owner[is_open] = base + np.arange(int(is_open.sum()))
    owner_s = owner[order]
    paired_at = np.flatnonzero(paired_s)
    owner_s[paired_at] = owner_s[paired_at - 1]
    owner[order] = owner_s
    rows = base + int(is_open.sum())
    close_event = np.full(rows, NO_INDEX, np.int64)
    closes = np.flatnonzero(~is_open)
    close_event[owner[closes]] = closes
    return _Lifetimes(
        owner=owner,
        rows=rows,
        pre_events=np.flatnonzero(orphan),
        open_event=np.flatnonzero(is_open),
        close_event=close_event,
    )


def _final_blocks(
    snapshot: dict[str, Any], device: int, open_at_end: np.ndarray, stacks: StackTable
) -> tuple[np.ndarray, np.ndarray]:
    """(size, stack) of the live blocks of the final state at an address where no block of
    the history is open at its end (NOTE [ Blocks live when the history began ])."""
    sizes, stack_rows = [], []
    for i, seg in segments(snapshot, device):
        for address, size, state, frames in blocks(seg, f"segments[{i}]"):
            if state in LIVE_STATES and not _contains(open_at_end, address):
                sizes.append(size)
                stack_rows.append(stacks.stack(frames))
    return np.asarray(sizes, np.int64), np.asarray(stack_rows, np.int64)


def _final_segments(
    snapshot: dict[str, Any], device: int, open_at_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(address, size, stream) of the final segments at an address where no segment of the
    history is open at its end: reserved from the start."""
    rows = []
    for i, seg in segments(snapshot, device):
        address = integer(seg.get("address"), f"segments[{i}].address")
        if not _contains(open_at_end, address):
            size = integer(seg.get("total_size"), f"segments[{i}].total_size")
            if size < 0:
                raise SnapshotError(f"segments[{i}].total_size is negative ({size})")
            rows.append((address, size, integer(seg.get("stream", 0), f"segments[{i}].stream")))
    arr = np.asarray(rows, np.int64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def _open_at_end(is_open: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """Sorted addresses whose last event (in history order) opens a block there."""
    order = np.lexsort((np.arange(len(addr)), addr))
    addr_s = addr[order]
    last = np.ones(len(addr_s), bool)
    last[:-1] = addr_s[1:] != addr_s[:-1]
    return addr_s[last & is_open[order]]


def _contains(sorted_values: np.ndarray, value: int) -> bool:
    i = int(np.searchsorted(sorted_values, value))
    return i < len(sorted_values) and int(sorted_values[i]) == value


def _write_device(
    writer: TraceWriter,
    run: RunWriter,
    snapshot: dict[str, Any],
    device: int,
    ev: _Events,
    stacks: StackTable,
) -> None:
    """The tables of one device's run (NOTE [ Blocks live when the history began ])."""
    device_id = writer.intern(f"cuda:{device}")
    mem = np.flatnonzero((ev.code == _ALLOC) | (ev.code == _FREE))
    is_alloc = ev.code[mem] == _ALLOC
    end_size, end_stack = _final_blocks(
        snapshot, device, _open_at_end(is_alloc, ev.addr[mem]), stacks
    )
    life = _pair(is_alloc, ev.addr[mem], len(end_size))
    n_pre = len(life.pre_events) + len(end_size)
    start_ns = int(ev.time_ns[0]) if len(ev.time_ns) else 0
    end_ns = int(ev.time_ns[-1]) if len(ev.time_ns) else 0
    traces = device_traces(snapshot)
    events = traces[device] if device < len(traces) else []
    # Per storage: (what the pre-existing frees say, the final blocks, the allocations).
    parts = (mem[life.pre_events], len(end_size), mem[life.open_event])
    storages = _storage_columns(events, ev, parts, end_size, end_stack, stacks)
    storages["free_ns"] = _times(ev.time_ns[mem], life.close_event)
    storages["device"] = np.full(life.rows, device_id, np.int32)
    storages["dtype"] = storages["shape"] = np.full(life.rows, writer.intern(""), np.int32)
    _append(run, "storages", storages)
    kind = np.where(is_alloc, MemoryEventKind.ALLOC, MemoryEventKind.FREE).astype(np.uint8)
    _append(
        run,
        "memory_events",
        {
            "kind": np.concatenate((np.full(n_pre, MemoryEventKind.SEEN, np.uint8), kind)),
            "storage": np.concatenate((np.arange(n_pre), life.owner)),
            "op": np.full(n_pre + len(mem), NO_INDEX, np.int32),
            "time_ns": np.concatenate((np.full(n_pre, start_ns, np.int64), ev.time_ns[mem])),
        },
    )
    _write_segments(run, snapshot, device, device_id, ev)
    _write_step(run, start_ns, end_ns)


def _storage_columns(
    events: list[Any],
    ev: _Events,
    parts: tuple[np.ndarray, int, np.ndarray],
    end_size: np.ndarray,
    end_stack: np.ndarray,
    stacks: StackTable,
) -> dict[str, np.ndarray]:
    """Storage columns known from the events: ``parts`` are the event rows of the frees of
    blocks live when the history began, the number of final blocks the history never touches,
    and the event rows of the allocations (NOTE [ Unknown, never guessed ])."""
    pre, n_end, opened = parts
    pre_stack = np.asarray([stacks.stack(events[i].get("frames")) for i in pre.tolist()], np.int64)
    rows = len(pre) + n_end + len(opened)
    return {
        "nbytes": np.concatenate((ev.size[pre], end_size, ev.size[opened])),
        "category": np.concatenate(
            (
                _categories(events, pre),
                np.full(n_end, Category.UNKNOWN, np.uint8),
                _categories(events, opened),
            )
        ),
        "op": np.full(rows, NO_INDEX, np.int32),
        "module_call": np.full(rows, NO_INDEX, np.int32),
        "module": np.full(rows, NO_INDEX, np.int32),
        "alloc_ns": np.concatenate((np.full(len(pre) + n_end, -1, np.int64), ev.time_ns[opened])),
        "stack": np.concatenate((pre_stack, end_stack, ev.stack[opened])),
    }


def _write_step(run: RunWriter, start_ns: int, end_ns: int) -> None:
    """One step covering the whole history; the run is then complete."""
    run.append(
        "steps",
        {
            "step": [0],
            "start_ns": [start_ns],
            "end_ns": [end_ns],
            "first_op": [0],
            "first_memory_event": [0],
            "forwards": [-1],
            "backwards": [-1],
            "optimizer_steps": [-1],
            "complete": [1],
        },
    )
    run.set_attrs(steps_recorded=1)
    run.close()


def _write_segments(
    run: RunWriter, snapshot: dict[str, Any], device: int, device_id: int, ev: _Events
) -> None:
    """Reserved memory: the history's segment events paired, plus final segments it never
    touches (reserved from the start)."""
    seg = np.flatnonzero((ev.code == _SEG_OPEN) | (ev.code == _SEG_CLOSE))
    is_open = ev.code[seg] == _SEG_OPEN
    addr = ev.addr[seg]
    end_addr, end_size, end_stream = _final_segments(snapshot, device, _open_at_end(is_open, addr))
    life = _pair(is_open, addr, len(end_addr))
    pre = life.pre_events
    n_pre = len(pre) + len(end_addr)
    free_ns = _times(ev.time_ns[seg], life.close_event)
    _append(
        run,
        "segments",
        {
            "device": np.full(life.rows, device_id, np.int32),
            "address": np.concatenate((addr[pre], end_addr, addr[life.open_event])),
            "nbytes": np.concatenate((ev.size[seg][pre], end_size, ev.size[seg][life.open_event])),
            "alloc_ns": np.concatenate(
                (np.full(n_pre, -1, np.int64), ev.time_ns[seg][life.open_event])
            ),
            "free_ns": free_ns,
            "stream": np.concatenate(
                (ev.stream[seg][pre], end_stream, ev.stream[seg][life.open_event])
            ),
        },
    )


#: Categories of torch's memory profiler (``torch.profiler._memory_profiler.Category``), as
#: ``torch.cuda._memory_viz._profile_to_snapshot`` writes them on events: torch's own
#: classification, so kept (NOTE [ Unknown, never guessed ]). Others (``autograd_detail``,
#: ``unknown``) and events without one are UNKNOWN.
TORCH_CATEGORIES = {
    "parameter": Category.PARAMETER,
    "gradient": Category.GRADIENT,
    "optimizer_state": Category.OPTIMIZER_STATE,
    "activation": Category.ACTIVATION,
    "temporary": Category.TEMPORARY,
    "input": Category.INPUT,
}


def _categories(events: list[Any], rows: np.ndarray) -> np.ndarray:
    """The category of each event row: TORCH_CATEGORIES of its ``category``, else UNKNOWN."""
    get, unknown = TORCH_CATEGORIES.get, Category.UNKNOWN
    found = [
        get(c, unknown) if isinstance(c := events[i].get("category"), str) else unknown
        for i in rows.tolist()
    ]
    return np.asarray(found, np.uint8)


def _times(time_ns: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``time_ns[rows]``, -1 where a row is -1."""
    out = np.full(len(rows), -1, np.int64)
    known = rows >= 0
    out[known] = time_ns[rows[known]]
    return out


def _append(run: RunWriter, table: str, columns: dict[str, np.ndarray]) -> None:
    rows = len(next(iter(columns.values())))
    for start in range(0, max(rows, 1), BATCH):
        run.append(table, {k: v[start : start + BATCH] for k, v in columns.items()})


def snapshot_to_trace(
    snapshot: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    source: str = "",
    progress: Progress | None = None,
) -> list[str]:
    """Write ``snapshot`` (a dict as ``torch.cuda.memory._snapshot()`` returns, already checked
    by ``reading.check_snapshot``) as a trace at ``path``; return the run names written.

    ``source`` names where the snapshot came from (for the trace's ``command`` and messages).
    A snapshot that breaks its format raises SnapshotError (one line, naming ``source``)."""
    found = _devices(snapshot, source or "the snapshot")  # before the file is created
    meta = {
        "ckview_version": __version__,
        "device": f"cuda:{found[0]}",
        "command": ["ckview", "import", source] if source else [],
        "steps_requested": 1,
        "steps_recorded": 1,
        "step_rule": "the whole allocator history of the snapshot",
        "source": "snapshot",
    }
    with TraceWriter(path, meta) as writer:
        return write_snapshot(writer, snapshot, source=source, progress=progress)


def write_snapshot(
    writer: TraceWriter,
    snapshot: dict[str, Any],
    *,
    source: str = "",
    progress: Progress | None = None,
) -> list[str]:
    """Add ``snapshot``'s runs (``snapshot:cuda:N``), frames and stacks to an open trace (the
    recorder's, for one): the frames and stacks come after those the trace holds, and nothing
    else may append to those two tables until this returns. Returns the run names."""
    label = source or "the snapshot"
    found = _devices(snapshot, label)
    traces = device_traces(snapshot)
    tick = _Ticker(sum(len(traces[d]) for d in found if d < len(traces)), progress)
    t0 = _first_time_us(snapshot)
    stacks = StackTable(writer)
    names = []
    for device in found:
        events = traces[device] if device < len(traces) else []
        try:
            ev = _read_events(events, device, t0, stacks, tick)
            name = run_name(device)
            _write_device(writer, writer.run(name), snapshot, device, ev, stacks)
        except SnapshotError as exc:
            raise _invalid(label, exc) from None
        names.append(name)
    stacks.write()
    return names


def _devices(snapshot: dict[str, Any], label: str) -> list[int]:
    """The devices to convert; SnapshotError if none or if a segment's device is bad."""
    try:
        found = devices(snapshot)
    except SnapshotError as exc:
        raise _invalid(label, exc) from None
    if not found:
        raise SnapshotError(
            f"{label} holds no memory history and no segments; take it with "
            "torch.cuda.memory._record_memory_history() enabled"
        )
    return found


class _Ticker:
    """Counts events converted and tells ``progress``."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self._progress = total, 0, progress

    def __call__(self, n: int) -> None:
        self.done += n
        if self._progress is not None:
            self._progress(self.done, self.total)


def _invalid(label: str, exc: SnapshotError) -> SnapshotError:
    return SnapshotError(f"{label} is not a valid snapshot ({exc}); {IMPORT_HINT}")
