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
    settings_json,
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
    """Interns frames and call stacks, to be appended to the trace's root ``frames`` and
    ``stacks`` tables by ``write`` (rows here count from 0; ``write`` shifts them after those the
    trace already holds). A stack is named by the row of its innermost frame
    (docs/trace-format.md, ``stacks``; NOTE [ The stack prefix tree ] in ckview/trace/stacks.py).

    NOTE [ Frames by identity ]
        Torch shares frame dicts between the events of a snapshot (symbolized once each), so a
        frame dict already seen is found by ``id`` without reading its fields, and a whole stack
        by the tuple of its frame rows. The frame dicts are kept referenced while their ids are
        cached, so an id is never reused for another dict; the cache is emptied when it grows
        past ``MAX_CACHED`` (snapshots whose frames are not shared), which costs speed only.
    """

    MAX_CACHED = 1 << 20

    def __init__(self) -> None:
        self._frames: dict[tuple[str, int, str], int] = {}
        self._by_frames: dict[tuple[int, ...], int] = {}
        self._ids: dict[int, int] = {}
        self._alive: list[Any] = []
        self.frame_rows: list[tuple[str, int, str]] = []
        self._stacks = StackInterner()

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
            row = self._frames[key] = len(self.frame_rows)
            self.frame_rows.append(key)
        if len(self._ids) >= self.MAX_CACHED:
            self._ids.clear()
            self._alive.clear()
        self._ids[id(frame)] = row
        self._alive.append(frame)
        return row

    def write(self, writer: TraceWriter) -> int:
        """Append the interned frames and stacks to the trace; return the row of the first
        stack written (add it to the rows ``stack`` returned)."""
        frame_base = writer.root_rows("frames")
        stack_base = writer.root_rows("stacks")
        intern = writer.intern
        frames = np.array(
            [(intern(file), line, intern(name)) for file, line, name in self.frame_rows],
            dtype=np.int64,
        ).reshape(-1, 3)
        writer.append_root(
            "frames", {"file": frames[:, 0], "line": frames[:, 1], "name": frames[:, 2]}
        )
        stacks = self._stacks.columns()
        parent = stacks["parent"]
        writer.append_root(
            "stacks",
            {
                "frame": stacks["frame"] + frame_base,
                "parent": np.where(parent == NO_INDEX, NO_INDEX, parent + stack_base),
            },
        )
        return stack_base


@dataclass
class _Events:
    """One device's history as columns (times relative to the snapshot's first event)."""

    code: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    time_ns: np.ndarray
    stream: np.ndarray
    stack: np.ndarray  # allocations, and frees of blocks live when the history began
    category: np.ndarray  # as ``stack``: TORCH_CATEGORIES of the event's ``category``


#: Largest ``time_us`` accepted (2**53: exact in a float, and x1000 fits int64).
MAX_TIME_US = 2**53

_COLUMNS = ("code", "addr", "size", "stream", "stack", "category", "time_us")
_DTYPES = (np.uint8, np.int64, np.int64, np.int64, np.int32, np.uint8, np.int64)


class _Bad(Exception):
    """An event failed the fast checks of ``_History.add``; ``_check_event`` says why."""


class _History:
    """One device's history, read chunk by chunk into numpy columns as it arrives.

    NOTE [ Pairing as the history arrives ]
        ``open`` holds the addresses whose last allocation or free (so far) is an allocation:
        a free at an address not in it pairs with no allocation (NOTE [ Pairing frees with
        allocs ]: the event before it at its address is not an allocation), so its block was
        live when the history began and only such a free keeps its stack and category. The set
        holds the blocks live at one moment, not the history, and the events themselves can be
        dropped as soon as their chunk is read (the streaming reader does).
    """

    def __init__(self, device: int) -> None:
        self.device = device
        self.count = 0
        self._open: set[int] = set()
        self._parts: list[list[np.ndarray]] = [[] for _ in _COLUMNS]  # per column, per chunk

    def add(self, part: list[Any], stacks: StackTable) -> None:
        """Read the next events of the history (SnapshotError naming a bad one)."""
        codes, stack, live = _ACTION_CODES, stacks.stack, self._open
        get_category, unknown = TORCH_CATEGORIES.get, Category.UNKNOWN
        rows: list[list[int]] = [[] for _ in _COLUMNS]
        code_l, addr_l, size_l, stream_l, stack_l, category_l, time_l = rows
        for j, e in enumerate(part):
            try:
                code = codes.get(e["action"], _OTHER)
                addr = size = stream = 0
                frames, category = NO_INDEX, unknown
                if code:
                    addr, size, stream = e["addr"], e["size"], e.get("stream", 0)
                    if type(addr) is not int or type(size) is not int or type(stream) is not int:
                        raise _Bad
                    if code == _ALLOC:
                        live.add(addr)
                        keep = True
                    else:  # a free pairing with an allocation needs no stack
                        keep = code == _FREE and addr not in live
                        live.discard(addr)
                    if keep:
                        frames = stack(e.get("frames"))
                        c = e.get("category")
                        category = get_category(c, unknown) if isinstance(c, str) else unknown
                time_us = e.get("time_us", -1)
                if type(time_us) is not int:
                    raise _Bad
            except SnapshotError:
                raise
            except Exception:
                _bad_event(e, self.device, self.count + j)
            code_l.append(code)
            addr_l.append(addr)
            size_l.append(size)
            stream_l.append(stream)
            stack_l.append(frames)
            category_l.append(category)
            time_l.append(time_us)
        for parts, column in zip(self._parts, self._columns(part, rows), strict=True):
            parts.append(column)
        self.count += len(part)

    def _columns(self, part: list[Any], rows: list[list[int]]) -> list[np.ndarray]:
        try:
            columns = [np.array(r, dtype) for r, dtype in zip(rows, _DTYPES, strict=True)]
        except OverflowError:
            columns = []
        if (
            len(columns) < len(rows)
            or (columns[2] < 0).any()
            or (columns[6] < -1).any()
            or (columns[6] >= MAX_TIME_US).any()
        ):
            for j, e in enumerate(part):  # find the culprit and say what is wrong with it
                _check_event(e, f"device_traces[{self.device}][{self.count + j}]")
        return columns

    def first_time_us(self) -> int:
        """The ``time_us`` of the first event, -1 if none or it has none."""
        return int(self._parts[6][0][0]) if self.count else -1

    def events(self, t0_us: int) -> _Events:
        """The history as columns, times from ``t0_us`` (NOTE [ Event order ] in timeline.py)."""
        cols = []
        for parts, dtype in zip(self._parts, _DTYPES, strict=True):
            cols.append(np.concatenate(parts) if parts else np.zeros(0, dtype))
            parts.clear()  # one column at a time: the chunks and the whole never both held
        time_ns = cols[6]
        if (time_ns < 0).any():  # an event without time_us (older layouts): order only
            time_ns[:] = np.arange(len(time_ns), dtype=np.int64)
        else:
            time_ns -= t0_us
        time_ns *= 1000
        np.maximum.accumulate(time_ns, out=time_ns)
        return _Events(
            code=cols[0],
            addr=cols[1],
            size=cols[2],
            time_ns=time_ns,
            stream=cols[3],
            stack=cols[4],
            category=cols[5],
        )


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
    snapshot: dict[str, Any],
    device: int,
    ev: _Events,
    stacks: tuple[StackTable, int],
) -> None:
    """The tables of one device's run (NOTE [ Blocks live when the history began ]);
    ``stacks``: the table and the trace row its first stack will have."""
    table, stack_base = stacks
    device_id = writer.intern(f"cuda:{device}")
    mem = np.flatnonzero((ev.code == _ALLOC) | (ev.code == _FREE))
    is_alloc = ev.code[mem] == _ALLOC
    end_size, end_stack = _final_blocks(
        snapshot, device, _open_at_end(is_alloc, ev.addr[mem]), table
    )
    life = _pair(is_alloc, ev.addr[mem], len(end_size))
    n_pre = len(life.pre_events) + len(end_size)
    start_ns = int(ev.time_ns[0]) if len(ev.time_ns) else 0
    end_ns = int(ev.time_ns[-1]) if len(ev.time_ns) else 0
    # Per storage: (what the pre-existing frees say, the final blocks, the allocations).
    parts = (mem[life.pre_events], len(end_size), mem[life.open_event])
    storages = _storage_columns(ev, parts, end_size, end_stack)
    stack = storages["stack"]
    storages["stack"] = np.where(stack == NO_INDEX, NO_INDEX, stack + stack_base)
    storages["free_ns"] = _times(ev.time_ns[mem], life.close_event)
    storages["device"] = _constant(device_id, life.rows, np.int32)
    storages["dtype"] = storages["shape"] = _constant(writer.intern(""), life.rows, np.int32)
    run = writer.run(run_name(device))
    _append(run, "storages", storages)
    del storages, stack  # before the memory events' columns are made
    kind = np.where(is_alloc, MemoryEventKind.ALLOC, MemoryEventKind.FREE).astype(np.uint8)
    _append(
        run,
        "memory_events",
        {
            "kind": np.concatenate((np.full(n_pre, MemoryEventKind.SEEN, np.uint8), kind)),
            "storage": np.concatenate((np.arange(n_pre), life.owner)),
            "op": _constant(NO_INDEX, n_pre + len(mem), np.int32),
            "time_ns": np.concatenate((np.full(n_pre, start_ns, np.int64), ev.time_ns[mem])),
        },
    )
    _write_segments(run, snapshot, device, device_id, ev)
    _write_step(run, start_ns, end_ns)


def _storage_columns(
    ev: _Events,
    parts: tuple[np.ndarray, int, np.ndarray],
    end_size: np.ndarray,
    end_stack: np.ndarray,
) -> dict[str, np.ndarray]:
    """Storage columns known from the events: ``parts`` are the event rows of the frees of
    blocks live when the history began, the number of final blocks the history never touches,
    and the event rows of the allocations (NOTE [ Unknown, never guessed ])."""
    pre, n_end, opened = parts
    rows = len(pre) + n_end + len(opened)
    return {
        "nbytes": np.concatenate((ev.size[pre], end_size, ev.size[opened])),
        "category": np.concatenate(
            (ev.category[pre], np.full(n_end, Category.UNKNOWN, np.uint8), ev.category[opened])
        ),
        "op": _constant(NO_INDEX, rows, np.int32),
        "module_call": _constant(NO_INDEX, rows, np.int32),
        "module": _constant(NO_INDEX, rows, np.int32),
        "alloc_ns": np.concatenate((np.full(len(pre) + n_end, -1, np.int64), ev.time_ns[opened])),
        "stack": np.concatenate((ev.stack[pre], end_stack, ev.stack[opened])),
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


def _constant(value: int, rows: int, dtype: type) -> np.ndarray:
    """A column of ``rows`` times ``value`` that takes no memory (a read-only view)."""
    return np.broadcast_to(np.asarray(value, dtype), (rows,))


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


#: Events handed to the converter at once from a snapshot dict.
CHUNK = 65536


class SnapshotConverter:
    """Converts a snapshot whose histories arrive in pieces: ``add`` each device's events in
    history order (devices in order), then ``to_trace`` or ``write`` with the rest of the
    snapshot (its ``segments``; its ``device_traces`` are not read again). Both the in-memory
    path and the streaming reader (ckview/snapshot/stream.py) go through it, so they write the
    same trace. ``label`` names the snapshot in messages."""

    def __init__(self, label: str = "the snapshot") -> None:
        self.label = label
        self.events = 0
        self._stacks = StackTable()
        self._histories: dict[int, _History] = {}

    def reset(self) -> None:
        """Forget every event added (to read the snapshot again another way)."""
        self.events = 0
        self._stacks = StackTable()
        self._histories.clear()

    def add(self, device: int, events: list[Any]) -> None:
        """Read the next ``events`` of ``device``'s history (they may be dropped afterwards)."""
        history = self._histories.get(device)
        if history is None:
            history = self._histories[device] = _History(device)
        try:
            history.add(events, self._stacks)
        except SnapshotError as exc:
            raise _invalid(self.label, exc) from None
        self.events += len(events)

    def add_snapshot(self, snapshot: dict[str, Any], progress: Progress | None = None) -> None:
        """``add`` every history of a snapshot dict, ``CHUNK`` events at a time;
        ``progress(events added, events in all)``."""
        traces = device_traces(snapshot)
        total = sum(len(events) for events in traces)
        for device, events in enumerate(traces):
            for start in range(0, len(events), CHUNK):
                self.add(device, events[start : start + CHUNK])
                if progress is not None:
                    progress(self.events, total)

    def devices(self, snapshot: dict[str, Any]) -> list[int]:
        """The devices to convert (with a history or a segment); SnapshotError if none."""
        found = {d for d, h in self._histories.items() if h.count}
        try:
            found.update(devices({"segments": snapshot.get("segments", [])}))
        except SnapshotError as exc:
            raise _invalid(self.label, exc) from None
        if not found:
            raise SnapshotError(
                f"{self.label} holds no memory history and no segments; take it with "
                "torch.cuda.memory._record_memory_history() enabled"
            )
        return sorted(found)

    def to_trace(
        self, snapshot: dict[str, Any], path: str | os.PathLike[str], source: str = ""
    ) -> list[str]:
        """Write a new trace at ``path`` (none is created if the snapshot is refused); return
        the run names. ``source`` names the file the snapshot came from."""
        found = self.devices(snapshot)
        try:
            settings = settings_json(snapshot)
        except SnapshotError as exc:
            raise _invalid(self.label, exc) from None
        meta = {
            "ckview_version": __version__,
            "device": f"cuda:{found[0]}",
            "command": ["ckview", "import", source] if source else [],
            "steps_requested": 1,
            "steps_recorded": 1,
            "step_rule": "the whole allocator history of the snapshot",
            "source": "snapshot",
            "allocator_settings": settings,
        }
        with TraceWriter(path, meta) as writer:
            return self.write(writer, snapshot)

    def write(self, writer: TraceWriter, snapshot: dict[str, Any]) -> list[str]:
        """Add the runs (``snapshot:cuda:N``), frames and stacks to an open trace: the frames
        and stacks come after those the trace holds, and nothing else may append to those two
        tables until this returns. Returns the run names."""
        found = self.devices(snapshot)
        firsts = [h.first_time_us() for h in self._histories.values()]
        t0 = min([t for t in firsts if t >= 0], default=0)
        stacks = (self._stacks, writer.root_rows("stacks"))
        for device in found:
            history = self._histories.pop(device, None) or _History(device)
            try:
                _write_device(writer, snapshot, device, history.events(t0), stacks)
            except SnapshotError as exc:
                raise _invalid(self.label, exc) from None
        self._stacks.write(writer)
        return [run_name(d) for d in found]


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
    converter = SnapshotConverter(source or "the snapshot")
    converter.add_snapshot(snapshot, progress)
    return converter.to_trace(snapshot, path, source)


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
    converter = SnapshotConverter(source or "the snapshot")
    converter.add_snapshot(snapshot, progress)
    return converter.write(writer, snapshot)


def _invalid(label: str, exc: SnapshotError) -> SnapshotError:
    return SnapshotError(f"{label} is not a valid snapshot ({exc}); {IMPORT_HINT}")
