"""The recording journal: every completed step, appended to a sidecar file as it ends.

NOTE [ The recording journal ]
HDF5 is not crash-safe: a process killed between two flushes (SIGKILL, ``os._exit``, the OOM
killer, a power cut) can leave the staging trace unreadable, and the tables that stay editable
while recording (storages, module calls, steps) are written only when a run ends. So beside the
staging trace ``NAME.recording-PID.h5`` the recorder appends, at every step boundary, one record
to ``NAME.recording-PID.journal``: the rows added since the last record (strings, ``modules``,
the append-only run tables) and the rows of the editable tables that changed (their indices and
new values), stored as they are (deflating a small-op step's record at level 1 cost 0.2x of the
step; the journal lives only as long as the recording). Each record is framed by its length and
a CRC-32, written with one ``writev`` on a file opened for that record alone (a script that
closes every file descriptor cannot break it), and fsync'ed at most every ``SYNC_NS`` (by a
thread of its own, NOTE [ Syncing the journal ]): a killed process loses at most the step in
progress; a power cut at most ``SYNC_NS`` of steps. A normal end (also Ctrl-C, SIGTERM,
SIGHUP, an exception, ``os._exit`` under ``ckview record``) closes the trace and removes the
journal. A journal whose recorder is gone is turned into a trace by
``recover_journal`` (``ckview recover TRACE``, or any verb that reads TRACE): the completed
steps of every run, marked incomplete; a truncated or damaged last record is ignored. Plain
timing steps (after every run is recorded) are journaled too, each record holding its run's
whole timing tables. Why a journal and not HDF5's SWMR mode: SWMR needs every dataset created
before writing starts (runs are created as they begin) and cannot hold variable-length strings
(the string table), and a file that HDF5 itself cannot write (a full disk, a descriptor the
script closed) is still lost with SWMR; the journal covers those too (NOTE [ When the trace
cannot be written ] in recorder/sink.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import threading
import weakref
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TraceError
from .schema import MODULES, RUN_TABLES
from .writer import TraceWriter

MAGIC = b"CKVIEW-JOURNAL 1\n"
SUFFIX = ".journal"
SYNC_NS = 2_000_000_000
"""At most this long between two fsyncs of the journal (NOTE [ The recording journal ])."""
_FRAME = struct.Struct("<QI")  # payload length, CRC-32 of the payload
_HEADER = struct.Struct("<I")  # JSON header length
_IOV_MAX = 1024  # the parts one writev takes at most (POSIX's IOV_MAX on Linux)
ROWS = "#rows"
"""The array of a changed-rows block that holds the row indices."""
RAW = "#raw"
"""The array of a run table's block that holds its rows raw (NOTE [ Raw rows in the journal ])."""


def room_for(journal: Path) -> bool:
    """Whether the disk of ``journal`` has room for the trace rebuilt from it (about the
    journal's size): on a full disk rebuilding is not tried (HDF5 fails badly there)."""
    try:
        return shutil.disk_usage(journal.parent).free > journal.stat().st_size + (1 << 16)
    except OSError:
        return False


def journal_path(staging: Path) -> Path:
    """The journal beside the staging trace ``staging``."""
    return staging.with_suffix(SUFFIX)


class JournalWriter:
    """Appends records to a journal (NOTE [ The recording journal ]); :meth:`close` or
    :meth:`remove` when done."""

    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.path = path
        _write_record(
            path,
            os.O_CREAT | os.O_TRUNC,
            [MAGIC, *_frame({"kind": "open", "meta": dict(meta)}, {})],
        )
        syncer = _Syncer(path)
        self._stop_syncing = weakref.finalize(self, syncer.stop)
        self._stop_syncing.atexit = False  # the thread is a daemon: it never holds exit up
        self._syncer = syncer

    def append(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Append one record: a JSON-able ``header`` and named 1-D arrays."""
        _write_record(self.path, os.O_APPEND, _frame(header, arrays))
        self._syncer.written()

    def close(self) -> None:
        """No more records: stop syncing (NOTE [ Syncing the journal ]); the journal stays."""
        self._stop_syncing()

    def remove(self) -> None:
        """The trace is closed: the journal is no longer needed."""
        self.close()
        discard_journal(self.path)


# NOTE [ Discarding the journal ]
# Removing a journal frees its blocks: 11 ms at the close of a 200-step small-op recording (a
# 60 MB journal), all of it in the recording's end. The file system frees them when the last
# link and the last descriptor are gone, so the path is unlinked at once with the file held
# open, and the descriptor is closed on a thread of its own, where the freeing happens. A new
# journal at the same path (the next recording to the same trace) is another file. The thread
# is not a daemon: the interpreter's exit waits for the close.
def discard_journal(path: Path) -> None:
    """Remove the journal at ``path`` now; its blocks are freed on a thread (NOTE
    [ Discarding the journal ])."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        fd = -1  # gone already, or unreadable: removed as it is
    try:
        path.unlink(missing_ok=True)
    finally:
        if fd >= 0:
            _close_on_a_thread(fd)


def _close_on_a_thread(fd: int) -> None:
    try:
        threading.Thread(target=os.close, args=(fd,), name="ckview-journal-discard").start()
    except RuntimeError:  # no new thread (the interpreter is exiting): close it here
        os.close(fd)


# NOTE [ Syncing the journal ]
# An fsync of the journal every SYNC_NS (some 100 records of a small-op step: 12 ms) held the
# step boundary about 0.15 ms a step on average: it runs on a daemon thread instead, which syncs
# once a record was written and then waits SYNC_NS (a power cut loses at most SYNC_NS of steps,
# and the fsync's time). os.fsync releases the GIL, so the recording runs on meanwhile.
# The thread opens the journal for each sync and holds nothing of the recorder: a removed
# journal is not synced, and a descriptor that the script closed and opened again as another
# file while the thread synced is not closed by it (``_sync`` compares the file first; one that
# a record opened at the same number: NOTE [ The journal's descriptors ]). It
# never outlives its JournalWriter (``close``, ``remove``, or the writer's collection stop and
# join it; a sync under way ends first), and never holds exit up (a daemon, not joined at
# exit). In a forked child (a DataLoader worker) the thread does not exist: ``stop`` does
# nothing there, and touches no lock that the parent's thread may have held at the fork.
class _Syncer:
    """fsyncs a journal at most every SYNC_NS, on its own thread (NOTE [ Syncing the journal ])."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._pid = os.getpid()
        self._due = threading.Event()  # a record was written since the last sync
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckview-journal-sync", daemon=True)
        self._thread.start()

    def written(self) -> None:
        self._due.set()

    def stop(self) -> None:
        """End the thread, after the sync under way if any (in a forked child: nothing)."""
        if os.getpid() != self._pid:
            return
        self._stopping.set()
        self._due.set()
        if threading.current_thread() is not self._thread:  # the collector may run there
            self._thread.join()

    def _run(self) -> None:
        while self._due.wait() and not self._stopping.is_set():
            self._due.clear()
            _sync(self._path)
            if self._stopping.wait(SYNC_NS / 1e9):
                return


def _sync(path: Path) -> None:
    """fsync the file at ``path`` if it is still there (NOTE [ Syncing the journal ], NOTE
    [ The journal's descriptors ])."""
    with _descriptors:
        try:
            fd = os.open(path, os.O_RDONLY)
            mine = os.fstat(fd)
        except OSError:
            return  # removed: nothing to keep (or the script closed it at once)
    with contextlib.suppress(OSError):  # an I/O error: the next sync tries again
        os.fsync(fd)
    with _descriptors:
        try:
            now = os.fstat(fd)
        except OSError:
            return  # the script closed the descriptor: it is not ours to close
        if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            os.close(fd)


# NOTE [ The journal's descriptors ]
# A script that closes every descriptor while the sync thread holds one on the journal frees
# that number, and the next record may open the journal at the same number. The sync thread
# closes only a descriptor that still names the journal, and that one does: without more, it
# closed the record's descriptor mid-write, and the recording ended as if the script had closed
# the trace (EBADF). So the journal's descriptors are opened and closed under one lock: a record
# holds it from open to close, the sync thread for its open and for its check and close, not
# for the fsync itself (which may take long, and would hold up the step boundary). A descriptor
# that names the journal when the sync thread holds the lock is its own. A forked child gets a
# lock of its own (another thread may have held the parent's at the fork).
_descriptors = threading.Lock()


def _new_lock_in_child() -> None:
    global _descriptors
    _descriptors = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def _write_record(path: Path, flags: int, parts: list[bytes | memoryview]) -> None:
    """Write ``parts`` to the journal at ``path`` on a descriptor of their own (NOTE [ The
    journal's descriptors ])."""
    with _descriptors:
        fd = os.open(path, os.O_WRONLY | flags, 0o644)
        try:
            _write_all(fd, parts)
        finally:
            os.close(fd)


def _write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """Write ``parts`` in order with one ``writev``, and more if it writes part."""
    views = [memoryview(part) for part in parts]
    while views:
        done = os.writev(fd, views[:_IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if done:
            views[0] = views[0][done:]


def _frame(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> list[bytes | memoryview]:
    """One record, as the parts to write in order: frame and header, then the arrays' bytes as
    they are (copying a step's 300 KB into one buffer cost more than ``writev`` of the parts);
    the CRC runs over the parts in turn."""
    arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    described = {**header, "arrays": [[n, a.dtype.str, len(a)] for n, a in arrays.items()]}
    described["stored"] = True  # not deflated (records of journals before it were)
    text = json.dumps(described, separators=(",", ":")).encode()
    head = _HEADER.pack(len(text)) + text
    parts = [a.data.cast("B") for a in arrays.values()]
    crc = zlib.crc32(head)
    for part in parts:
        crc = zlib.crc32(part, crc)
    length = len(head) + sum(len(part) for part in parts)
    return [_FRAME.pack(length, crc) + head, *parts]


def read_journal(path: Path) -> Iterator[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """The whole records of a journal, in order; a truncated or damaged tail ends them."""
    data = _read(path)
    if not data.startswith(MAGIC):
        raise TraceError(f"{path} is not a ckview recording journal", path=str(path))
    pos = len(MAGIC)
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        payload = data[pos + _FRAME.size : pos + _FRAME.size + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            return
        yield _parse(payload)
        pos += _FRAME.size + length


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}", path=str(path)) from None


def _parse(payload: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    (size,) = _HEADER.unpack_from(payload)
    header = json.loads(payload[_HEADER.size : _HEADER.size + size])
    data = payload[_HEADER.size + size :]
    if not header.pop("stored", False):
        data = zlib.decompress(data)
    pos, arrays = 0, {}
    for name, dtype, count in header.pop("arrays"):
        dt = np.dtype(dtype)
        arrays[name] = np.frombuffer(data, dt, count, pos).copy()
        pos += dt.itemsize * count
    return header, arrays


# ----------------------------------------------------------------------------- recovery


class _Table:
    """A table rebuilt from appended batches and changed rows."""

    def __init__(self, columns: tuple[Any, ...]) -> None:
        self.data = {c.name: np.empty(0, c.dtype) for c in columns}

    def append(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.data = {n: np.concatenate((col, arrays[n])) for n, col in self.data.items()}

    def set_rows(self, rows: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        if not len(rows):
            return
        size = max(int(rows.max()) + 1, len(next(iter(self.data.values()))))
        for name, col in self.data.items():
            if len(col) < size:
                col = np.concatenate((col, np.zeros(size - len(col), col.dtype)))
            col[rows] = arrays[name]
            self.data[name] = col


@dataclass
class _Run:
    tables: dict[str, _Table] = field(
        default_factory=lambda: {t: _Table(cols) for t, cols in RUN_TABLES.items()}
    )
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _State:
    meta: dict[str, Any]
    strings: list[str] = field(default_factory=list)
    modules: _Table = field(default_factory=lambda: _Table(MODULES))
    runs: dict[str, _Run] = field(default_factory=dict)
    steps: int = 0

    def apply(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.strings += header["strings"]
        self.meta.update(header["meta"])
        self.steps = int(header["meta"].get("steps_recorded", self.steps))
        _apply_blocks(self.modules, "modules", header["blocks"], arrays)
        run = self.runs.setdefault(header["run"], _Run())
        run.attrs = dict(header.get("attrs", run.attrs))  # a timing record has none
        t0 = int(header.get("t0", 0))
        for table, mode in header["blocks"].items():
            if table != "modules":
                _apply_block(run.tables[table], table, mode, arrays, t0)


def _apply_blocks(
    table: _Table, name: str, blocks: Mapping[str, str], arrays: Mapping[str, np.ndarray]
) -> None:
    if name in blocks:
        _apply_block(table, name, blocks[name], arrays)


def _apply_block(
    table: _Table, name: str, mode: str, arrays: Mapping[str, np.ndarray], t0: int = 0
) -> None:
    mine = {key.split("/", 1)[1]: a for key, a in arrays.items() if key.startswith(name + "/")}
    if RAW in mine:  # NOTE [ Raw rows in the journal ]
        mine.update(_raw_columns(RUN_TABLES[name], mine.pop(RAW), t0))
    if mode in ("append", "append-raw"):
        table.append(mine)
    else:
        table.set_rows(mine.pop(ROWS), mine)


# NOTE [ Raw rows in the journal ]
# A run table's block in a step record ("append-raw", "rows-raw") holds its rows as the
# recorder buffers them: one int64 array, row-major in the schema's column order, with times
# as ``perf_counter_ns`` values; the record's ``t0`` is the run's start. Reading the journal
# cuts them into typed columns and makes times relative to ``t0``, as the trace's writer does
# (times -1 stay -1). Cutting them while recording cost about 0.35 ms of a 6 ms small-op step
# (a cast and a copy per column and table, some 50 arrays a record); the journal is read only
# when a recording was killed. Older journals hold typed columns ("append", "rows").
def _raw_columns(columns: tuple[Any, ...], raw: np.ndarray, t0: int) -> dict[str, np.ndarray]:
    rows = raw.reshape(-1, len(columns))
    out = {}
    for i, c in enumerate(columns):
        col = rows[:, i].astype(c.dtype)
        if c.name.endswith("_ns"):
            np.subtract(col, t0, out=col, where=col >= 0)
        out[c.name] = col
    return out


@dataclass(frozen=True)
class Recovery:
    """What ``recover_journal`` rebuilt."""

    steps: int
    runs: int


def recover_journal(journal: Path, output: Path, error: str) -> Recovery:
    """Write the trace that ``journal`` holds to ``output``, marked incomplete with ``error``
    (NOTE [ The recording journal ]); TraceError if the journal is not one."""
    records = read_journal(journal)
    first = next(records, None)
    if first is None or first[0].get("kind") != "open":
        raise TraceError(f"{journal} holds no recording", path=str(journal))
    state = _State(dict(first[0]["meta"]))
    for header, arrays in records:
        state.apply(header, arrays)
    _write(state, output, error)
    return Recovery(state.steps, len(state.runs))


def _write(state: _State, output: Path, error: str) -> None:
    """Write the trace; on failure (a full disk) remove what was written and raise TraceError."""
    meta = {k: v for k, v in state.meta.items() if k not in ("complete", "error")}
    writer = TraceWriter(output, meta=meta)
    try:
        _fill(writer, state, error)
    except (OSError, RuntimeError) as exc:
        writer.abandon()
        output.unlink(missing_ok=True)
        raise TraceError(f"cannot write {output}: {_reason(exc)}", path=str(output)) from None


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if getattr(exc, "errno", None) == 28 or "errno = 28" in text:
        return "no space left on its disk; free some space and try again"
    return " ".join(text.split())[:200]


def _fill(writer: TraceWriter, state: _State, error: str) -> None:
    for text in state.strings:
        writer.intern(text)
    writer.append_modules(state.modules.data)
    for name, run in state.runs.items():
        out = writer.run(name)
        for table, data in run.tables.items():
            out.append(table, data.data)
        complete = bool(run.attrs.pop("complete", False))
        out.set_attrs(**run.attrs)
        out.close(complete=complete)
    writer.close(complete=False, error=error)
