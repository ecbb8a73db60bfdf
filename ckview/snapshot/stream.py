"""Reading a big snapshot pickle in bounded memory, without running any code in it.

NOTE [ Streaming a snapshot ]
    Python's unpickler builds the whole snapshot before anyone sees it (about 9x the pickle's
    size), and a pickle of protocol 4+ MEMOIZEs every container and string, so even a reader
    that hands events on as they complete keeps them all alive through its memo. This reader
    makes two passes over the file, reading it a block at a time:

    1. ``_scan`` walks the opcodes without building anything: it refuses any opcode that names
       or calls a class (NOTE [ A pickle is code ]), so nothing is built from a refused
       pickle; it checks every declared length against the file and every GET against the
       memo so far, and notes which memo entries are ever fetched back (GET) and where for the
       last time. Torch fetches back strings, frame dicts and frames lists, never events.
    2. ``_Builder`` runs the plain-data opcodes. Its memo keeps only the entries ``_scan`` saw
       fetched back, each until the block in which it is fetched for the last time. The lists
       of ``device_traces`` are recognised as they are created (the pickler pushes a
       container's items right after it, so the container below them and, in a dict, the key
       before tell where a new list goes): their events go to the ``SnapshotConverter`` in
       the pickler's batches (1000 at most) and are dropped.

    Memory then grows with what the memo keeps (distinct strings and frames, and frames lists
    still to be fetched) and with the converter's numpy columns (about 50 bytes an event), not
    with the events as Python objects (about 550 bytes an event unpickled).
    Whatever the builder cannot follow exactly (a protocol below 2, sets, recursive tuples,
    memo entries out of order, a history fetched back or laid out another way, an event
    fetched back after it was handed on) raises ``_Fallback``, and ``read_snapshot`` reads
    the file with the restricted C unpickler instead: same trace, more memory. So does an
    event the converter rejects: where a hand-made pickle nests lists without MARKs, a list
    can be taken for a history that is not one, and only the whole object says for sure
    which event is bad. Anything that could run code is refused by both, by the scan before
    anything is built. One difference remains, for hand-made pickles only: a frames list or
    frame dict fetched back and changed after an event that holds it was handed on is read
    as it was at that moment (the pickler never changes a container after filling it).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, NoReturn, Protocol

import numpy as np

from ckview.trace.text import printable

from .convert import SnapshotConverter
from .errors import SnapshotError
from .reading import check_snapshot, load_snapshot, refused, unreadable

Progress = Callable[[int, int], None]

#: Files at least this big are streamed; smaller ones are read by the C unpickler, which is
#: faster and whose memory (about 9x the file) is small enough there.
STREAM_ABOVE = 64 << 20

#: Bytes read from the file at a time.
BLOCK = 1 << 20

_MARGIN = 16  # more than any fixed-size opcode with its argument

# Opcodes (pickletools.opcodes) that plain data uses, protocol 2 to 5.
_MARK, _STOP = 0x28, 0x2E
_BININT, _BININT1, _BININT2, _NONE, _BINFLOAT = 0x4A, 0x4B, 0x4D, 0x4E, 0x47
_BINUNICODE, _SHORT_BINUNICODE, _BINUNICODE8 = 0x58, 0x8C, 0x8D
_BINBYTES, _SHORT_BINBYTES, _BINBYTES8, _BYTEARRAY8 = 0x42, 0x43, 0x8E, 0x96
_EMPTY_LIST, _APPEND, _APPENDS = 0x5D, 0x61, 0x65
_EMPTY_DICT, _SETITEM, _SETITEMS = 0x7D, 0x73, 0x75
_EMPTY_TUPLE, _TUPLE, _TUPLE1, _TUPLE2, _TUPLE3 = 0x29, 0x74, 0x85, 0x86, 0x87
_BINGET, _LONG_BINGET, _BINPUT, _LONG_BINPUT, _MEMOIZE = 0x68, 0x6A, 0x71, 0x72, 0x94
_PROTO, _FRAME, _NEWTRUE, _NEWFALSE, _LONG1, _LONG4 = 0x80, 0x95, 0x88, 0x89, 0x8A, 0x8B

#: Opcodes that name, build or call objects of a class, or fetch data from outside the file.
_GLOBAL = 0x63
_REFUSED = {
    _GLOBAL: "a class or function (pickle opcode GLOBAL)",
    0x93: "a class or function (pickle opcode STACK_GLOBAL)",
    0x52: "a call (pickle opcode REDUCE)",
    0x62: "an object's state (pickle opcode BUILD)",
    0x69: "a class instance (pickle opcode INST)",
    0x6F: "a class instance (pickle opcode OBJ)",
    0x81: "a class instance (pickle opcode NEWOBJ)",
    0x92: "a class instance (pickle opcode NEWOBJ_EX)",
    0x50: "a persistent id",
    0x51: "a persistent id",
    0x82: "an extension (pickle opcode EXT1)",
    0x83: "an extension (pickle opcode EXT2)",
    0x84: "an extension (pickle opcode EXT4)",
    0x97: "an out-of-band buffer",
    0x98: "an out-of-band buffer",
}

#: Plain-data opcodes the builder does not run (older protocols, sets, recursive tuples):
#: such a file is read by the C unpickler (NOTE [ Streaming a snapshot ]).
_ELSEWHERE = frozenset(b"IFLSTUVgpld012\x8f\x90\x91")

#: Argument bytes of opcodes whose argument has a fixed size (``_scan`` skips them).
_FIXED = [-1] * 256
for _op, _n in {
    _MARK: 0, _NONE: 0, _NEWTRUE: 0, _NEWFALSE: 0, _EMPTY_LIST: 0, _EMPTY_DICT: 0,
    _EMPTY_TUPLE: 0, _APPEND: 0, _APPENDS: 0, _SETITEM: 0, _SETITEMS: 0, _TUPLE: 0,
    _TUPLE1: 0, _TUPLE2: 0, _TUPLE3: 0, _BININT: 4, _BININT1: 1, _BININT2: 2, _BINFLOAT: 8,
    _FRAME: 8,
}.items():  # fmt: skip
    _FIXED[_op] = _n

_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_I32 = struct.Struct("<i").unpack_from
_F64 = struct.Struct(">d").unpack_from


class _Fallback(Exception):
    """Plain data that the streaming builder does not follow exactly: read it the C way."""


class _Unreadable(Exception):
    """Not a pickle the reader can read: damaged, truncated, or lying about its lengths."""


class _Refused(Exception):
    """The pickle asks for something that could run code (NOTE [ A pickle is code ])."""


class Stages(Protocol):
    """Progress shown in stages (the ``ckview import`` bar)."""

    def stage(self, what: str, unit: str, scale: int) -> Progress:
        """The progress callback of a new stage."""

    def done(self) -> None:
        """The current stage is over."""


def read_snapshot(
    path: str | os.PathLike[str],
    converter: SnapshotConverter,
    stages: Stages | None = None,
    stream_above: int | None = None,
) -> dict[str, Any]:
    """Read the snapshot file at ``path``: its histories go to ``converter``, and the rest of
    the snapshot (without ``device_traces``) is returned for ``converter.to_trace``. Files of
    ``stream_above`` bytes or more (default ``STREAM_ABOVE``) are streamed (NOTE [ Streaming a
    snapshot ]). SnapshotError (one line) if the file is unreadable, refused or not a
    snapshot."""
    label = os.fspath(path)
    try:
        size = os.path.getsize(label)
    except OSError:
        size = 0  # load_snapshot says why it cannot be read
    if size >= (STREAM_ABOVE if stream_above is None else stream_above):
        try:
            return _stream(label, size, converter, stages)
        except _Fallback:
            converter.reset()
            if stages is not None:
                stages.done()
    snapshot = load_snapshot(label, _stage(stages, "reading", "MiB", 2**20))
    if stages is not None:
        stages.done()
    converter.add_snapshot(snapshot, _stage(stages, "converting", "events", 1))
    if stages is not None:
        stages.done()
    return {k: v for k, v in snapshot.items() if k != "device_traces"}


def _stage(stages: Stages | None, what: str, unit: str, scale: int) -> Progress | None:
    return None if stages is None else stages.stage(what, unit, scale)


def _stream(
    label: str, size: int, converter: SnapshotConverter, stages: Stages | None
) -> dict[str, Any]:
    try:
        with open(label, "rb") as f:
            plan = _scan(f, size, _stage(stages, "scanning", "MiB", 2**20))
            if stages is not None:
                stages.done()
            builder = _Builder(f, size, plan, converter, _stage(stages, "reading", "MiB", 2**20))
            result = builder.run()
            if stages is not None:
                stages.done()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SnapshotError(f"cannot read {label} ({reason}); check the path") from None
    except _Refused as exc:
        raise SnapshotError(refused(label, str(exc))) from None
    except _Unreadable as exc:
        raise SnapshotError(unreadable(label, str(exc))) from None
    except MemoryError:
        raise SnapshotError(unreadable(label, "it does not fit in memory")) from None
    return builder.rest(result)


class _Blocks:
    """The file a block at a time: ``buf`` holds bytes from file offset ``start``."""

    def __init__(self, f: IO[bytes], size: int, progress: Progress | None) -> None:
        self.f, self.size, self.progress = f, size, progress
        self.start = 0
        self.buf = b""

    def at(self, i: int, need: int = _MARGIN) -> tuple[bytes, int, int]:
        """Move the window to buffer position ``i`` holding at least ``need`` bytes (fewer at
        the end of the file); returns (buffer, 0, the last position an opcode may start at
        without another call: one with a fixed-size argument, or the file's last byte)."""
        self.start += i
        self.f.seek(self.start)
        self.buf = self.f.read(max(BLOCK, need))
        if self.progress is not None:
            self.progress(min(self.start + len(self.buf), self.size), self.size)
        end = self.start + len(self.buf) >= self.size
        return self.buf, 0, len(self.buf) - (1 if end else _MARGIN)


@dataclass
class _Plan:
    """What pass 1 learnt about the memo (NOTE [ Streaming a snapshot ])."""

    keep: bytearray  # per memo index: 1 if it is ever fetched back
    drop_at: np.ndarray  # file offsets of the last fetches, ascending
    drop: np.ndarray  # the memo index fetched last at each of them


def _scan(f: IO[bytes], size: int, progress: Progress | None) -> _Plan:
    """Pass 1 (NOTE [ Streaming a snapshot ]): which memo entries are fetched back, and
    where for the last time."""
    blocks = _Blocks(f, size, progress)
    buf, i, limit = blocks.at(0)
    last: dict[int, int] = {}
    fixed, base = _FIXED, 0
    count = 0  # memo entries so far
    try:
        if not buf or buf[0] != _PROTO or not 2 <= buf[1] <= 5:
            raise _Fallback  # protocol 0 or 1 (no PROTO), or one this reader does not know
        while True:
            if i > limit:
                if blocks.start + i >= size:
                    raise _Unreadable("it ends before its STOP opcode")
                buf, i, limit = blocks.at(i)
                base = blocks.start
            op = buf[i]
            if op == _BINGET:
                index = buf[i + 1]
                if index >= count:
                    _bad_get(index)
                last[index] = base + i
                i += 2
            elif op == _LONG_BINGET:
                index = _U32(buf, i + 1)[0]
                if index >= count:
                    _bad_get(index)
                last[index] = base + i
                i += 5
            elif op == _MEMOIZE:
                count += 1
                i += 1
            elif fixed[op] >= 0:
                i += 1 + fixed[op]
            elif op in (_SHORT_BINUNICODE, _SHORT_BINBYTES, _LONG1):
                i += 2 + buf[i + 1]
            elif op in (_BINUNICODE, _BINBYTES, _LONG4):
                i += 5 + _length(_U32(buf, i + 1)[0], base + i, size)
            elif op in (_BINUNICODE8, _BINBYTES8, _BYTEARRAY8):
                i += 9 + _length(_U64(buf, i + 1)[0], base + i, size)
            elif op in (_BINPUT, _LONG_BINPUT):
                index = buf[i + 1] if op == _BINPUT else _U32(buf, i + 1)[0]
                if index > count:
                    raise _Fallback  # a memo with holes: MEMOIZE would number differently
                count += index == count
                i += 2 if op == _BINPUT else 5
            elif op == _PROTO:
                i += 2
            elif op == _STOP:
                return _plan(last, count)
            elif op in _REFUSED:
                raise _Refused(_global_name(buf, i) if op == _GLOBAL else _REFUSED[op])
            elif op in _ELSEWHERE:
                raise _Fallback
            else:
                raise _Unreadable(f"unknown opcode {op:#04x} at byte {base + i}")
    except (IndexError, struct.error):
        raise _Unreadable("it ends in the middle of an opcode") from None


def _plan(last: dict[int, int], count: int) -> _Plan:
    keep = bytearray(count + 1)
    index = np.fromiter(last.keys(), np.int64, len(last))
    at = np.fromiter(last.values(), np.int64, len(last))
    last.clear()
    keep_view = np.frombuffer(keep, np.uint8)
    keep_view[index] = 1
    del keep_view  # a bytearray with a live view cannot be resized; keep it plain
    order = np.argsort(at, kind="stable")
    return _Plan(keep=keep, drop_at=at[order], drop=index[order])


def _global_name(buf: bytes, i: int) -> str:
    """``module.name`` of a GLOBAL opcode (its argument: two lines of text)."""
    lines = buf[i + 1 : i + 1 + 2 * _MARGIN * _MARGIN].split(b"\n")
    if len(lines) < 3:
        return _REFUSED[_GLOBAL]
    return printable(f"{lines[0].decode('latin-1')}.{lines[1].decode('latin-1')}")


def _bad_get(index: int) -> NoReturn:
    raise _Unreadable(f"it fetches memo entry {index} before storing it")


def _length(n: int, at: int, size: int) -> int:
    """A declared length, checked against what is left of the file."""
    if n > size - at:
        raise _Unreadable(f"at byte {at} it declares {n} bytes, more than the file holds")
    return n


class _Streamed:
    """A list of ``device_traces``: its events go to the converter (NOTE [ Streaming a
    snapshot ]); ``index`` is where the pickler's layout says the list goes."""

    __slots__ = ("count", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.count = 0


class _Builder:
    """Pass 2 (NOTE [ Streaming a snapshot ]): runs the plain-data opcodes."""

    def __init__(
        self,
        f: IO[bytes],
        size: int,
        plan: _Plan,
        converter: SnapshotConverter,
        progress: Progress | None,
    ) -> None:
        self.blocks = _Blocks(f, size, progress)
        self.plan = plan
        self.dropped = 0  # entries of plan.drop dropped from the memo so far
        self.memo_peak = 0  # the most entries the memo held at a block boundary
        self.converter = converter
        self.memo: dict[int, Any] = {}
        self.kept_ids: set[int] = set()  # containers the memo keeps
        self.top: dict[Any, Any] | None = None
        self.traces: list[Any] | None = None
        self.histories: list[_Streamed] = []

    def run(self) -> Any:
        """The unpickled top-level object, with a ``_Streamed`` for each streamed list."""
        try:
            return self._run()
        except (IndexError, struct.error, KeyError, TypeError, ValueError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise _Unreadable(f"{type(exc).__name__}: {reason}") from None

    def _run(self) -> Any:
        blocks, memo, keep = self.blocks, self.memo, self.plan.keep
        buf, i, limit = blocks.at(0)
        stack: list[Any] = []
        push = stack.append
        metastack: list[list[Any]] = []
        count = 0
        # Opcodes in the order of how often a snapshot uses them.
        while True:
            if i > limit:
                buf, i, limit = blocks.at(i)
                self._drop(blocks.start)
            op = buf[i]
            if op == _BINGET:
                push(memo[buf[i + 1]])
                i += 2
            elif op == _LONG_BINGET:
                push(memo[_U32(buf, i + 1)[0]])
                i += 5
            elif op == _LONG1:
                n = buf[i + 1]
                push(int.from_bytes(buf[i + 2 : i + 2 + n], "little", signed=True))
                i += 2 + n
            elif op == _MEMOIZE:
                if keep[count]:
                    self._keep(count, stack[-1])
                count += 1
                i += 1
            elif op == _MARK:
                metastack.append(stack)
                stack = []
                push = stack.append
                i += 1
            elif op == _EMPTY_DICT:
                d: dict[Any, Any] = {}
                if self.top is None and not stack and not metastack:
                    self.top = d
                push(d)
                i += 1
            elif op == _SETITEMS:
                items = stack
                stack = metastack.pop()
                push = stack.append
                d = stack[-1]
                if type(d) is not dict or len(items) & 1:
                    _bad_set_items(d)
                pairs = iter(items)
                d.update(zip(pairs, pairs, strict=False))  # pairs: even length checked
                i += 1
            elif op == _BININT1:
                push(buf[i + 1])
                i += 2
            elif op == _BININT:
                push(_I32(buf, i + 1)[0])
                i += 5
            elif op == _APPENDS:
                items = stack
                stack = metastack.pop()
                push = stack.append
                self._append(stack[-1], items)
                i += 1
            elif op == _EMPTY_LIST:
                push(self._new_list(stack, metastack))
                i += 1
            elif op == _BININT2:
                push(buf[i + 1] | buf[i + 2] << 8)
                i += 3
            elif op == _SHORT_BINUNICODE:
                n = buf[i + 1]
                push(buf[i + 2 : i + 2 + n].decode("utf-8", "surrogatepass"))
                i += 2 + n
            elif op == _SHORT_BINBYTES:
                n = buf[i + 1]
                push(buf[i + 2 : i + 2 + n])
                i += 2 + n
            elif op == _SETITEM:
                value = stack.pop()
                key = stack.pop()
                d = stack[-1]
                if type(d) is not dict:
                    _bad_set_items(d)
                d[key] = value
                i += 1
            elif op == _APPEND:
                value = stack.pop()
                self._append(stack[-1], [value])
                i += 1
            elif op == _FRAME:
                i += 9
            elif op in (_NONE, _NEWTRUE, _NEWFALSE):
                push(None if op == _NONE else op == _NEWTRUE)
                i += 1
            elif op == _BINFLOAT:
                push(_F64(buf, i + 1)[0])
                i += 9
            elif op in (_EMPTY_TUPLE, _TUPLE1, _TUPLE2, _TUPLE3):
                n = 0 if op == _EMPTY_TUPLE else op - _TUPLE1 + 1
                if len(stack) < n:
                    raise _Unreadable("a tuple of more items than the stack holds")
                items = stack[len(stack) - n :]
                del stack[len(stack) - n :]
                push(tuple(items))
                i += 1
            elif op == _TUPLE:
                items = stack
                stack = metastack.pop()
                push = stack.append
                push(tuple(items))
                i += 1
            elif op in (_BINPUT, _LONG_BINPUT):
                index = buf[i + 1] if op == _BINPUT else _U32(buf, i + 1)[0]
                if keep[index]:
                    self._keep(index, stack[-1])
                count += index == count
                i += 2 if op == _BINPUT else 5
            elif op == _STOP:
                return stack.pop()
            elif op == _PROTO:
                i += 2
            else:  # strings and bytes with a 4- or 8-byte length, LONG4
                buf, i, limit = self._long_argument(op, (buf, i, limit), stack)

    def _drop(self, offset: int) -> None:
        """Drop the memo entries last fetched before file offset ``offset``."""
        self.memo_peak = max(self.memo_peak, len(self.memo))
        plan, start = self.plan, self.dropped
        stop = int(np.searchsorted(plan.drop_at, offset))
        if stop > start:
            memo, kept_ids = self.memo, self.kept_ids
            for index in plan.drop[start:stop].tolist():
                value = memo.pop(index, None)
                if type(value) is dict:
                    kept_ids.discard(id(value))
            self.dropped = stop

    def _long_argument(
        self, op: int, window: tuple[bytes, int, int], stack: list[Any]
    ) -> tuple[bytes, int, int]:
        """Push the value of an opcode with a 4- or 8-byte length; the window after it."""
        buf, i, limit = window
        wide = op in (_BINUNICODE8, _BINBYTES8, _BYTEARRAY8)
        if op not in (_BINUNICODE, _BINBYTES, _LONG4) and not wide:
            raise _Unreadable(f"unexpected opcode {op:#04x}")  # _scan let it through: a bug
        n = (_U64 if wide else _U32)(buf, i + 1)[0]
        head = 9 if wide else 5
        if i + head + n > len(buf):
            buf, i, limit = self.blocks.at(i, head + n)
        raw = buf[i + head : i + head + n]
        if op in (_BINUNICODE, _BINUNICODE8):
            stack.append(raw.decode("utf-8", "surrogatepass"))
        elif op == _LONG4:
            stack.append(int.from_bytes(raw, "little", signed=True))
        else:
            stack.append(bytearray(raw) if op == _BYTEARRAY8 else raw)
        return buf, i + head + n, limit

    def _keep(self, index: int, value: Any) -> None:
        """Store a memo entry that is fetched back later."""
        if type(value) is _Streamed or (self.traces is not None and value is self.traces):
            raise _Fallback  # a history fetched back: it would be empty there
        self.memo[index] = value
        if type(value) is dict:
            self.kept_ids.add(id(value))

    def _new_list(self, stack: list[Any], metastack: list[list[Any]]) -> Any:
        """A new list, or a ``_Streamed`` where the pickler's layout puts a list of
        ``device_traces`` (checked again in ``rest``)."""
        top, traces = self.top, self.traces
        if top is None:
            return []
        batch = metastack[-1][-1] if metastack and metastack[-1] else None
        if traces is None:
            if (len(stack) >= 2 and stack[-2] is top and stack[-1] == "device_traces") or (
                batch is top and len(stack) % 2 == 1 and stack[-1] == "device_traces"
            ):
                self.traces = []
                return self.traces
            return []
        if stack and stack[-1] is traces:
            index = len(traces)
        elif batch is not None and batch is traces:
            index = len(traces) + len(stack)
        else:
            return []
        history = _Streamed(index)
        self.histories.append(history)
        return history

    def _append(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            target.extend(items)
        elif type(target) is _Streamed:
            if self.kept_ids and not self.kept_ids.isdisjoint(map(id, items)):
                raise _Fallback  # an event fetched back later, maybe changed
            try:
                self.converter.add(target.index, items)
            except SnapshotError:
                # Maybe not a history after all (NOTE [ Streaming a snapshot ]): the C
                # unpickler's reading says what is wrong, and where.
                raise _Fallback from None
            target.count += len(items)
        else:
            raise _Unreadable(f"APPEND to a {type(target).__name__}")

    def rest(self, result: Any) -> dict[str, Any]:
        """The snapshot without ``device_traces``, once its histories are all checked to be
        where their layout said (SnapshotError if it is not a snapshot)."""
        label = self.converter.label
        if not isinstance(result, dict):
            check_snapshot(result, label)
        traces = result.get("device_traces", [])
        if self.histories and (result is not self.top or traces is not self.traces):
            raise _Fallback
        shown = dict(result)
        if isinstance(traces, list):
            placed = [h for i, h in enumerate(traces) if type(h) is _Streamed and h.index == i]
            if len(placed) != len(self.histories) or any(type(h) is list and h for h in traces):
                raise _Fallback  # histories laid out another way: not streamed
            shown["device_traces"] = [[] if type(h) is _Streamed else h for h in traces]
        check_snapshot(shown, label)
        shown.pop("device_traces", None)
        return shown


def _bad_set_items(target: Any) -> NoReturn:
    if type(target) is dict:
        raise _Unreadable("SETITEMS with an odd number of items")
    raise _Unreadable(f"SETITEMS on a {type(target).__name__}")
