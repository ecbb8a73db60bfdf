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
a CRC-32, written with one ``write`` on a file opened for that record alone (a script that
closes every file descriptor cannot break it), and fsync'ed at most every ``SYNC_NS``: a killed
process loses at most the step in progress; a power cut at most ``SYNC_NS`` of steps. A normal
end (also Ctrl-C, SIGTERM, SIGHUP, an exception, ``os._exit`` under ``ckview record``) closes
the trace and removes the journal. A journal whose recorder is gone is turned into a trace by
``recover_journal`` (``ckview recover TRACE``, or any verb that reads TRACE): the completed
steps of every run, marked incomplete; a truncated or damaged last record is ignored. Plain
timing steps (after every run is recorded) are journaled too, each record holding its run's
whole timing tables. Why a journal and not HDF5's SWMR mode: SWMR needs every dataset created
before writing starts (runs are created as they begin) and cannot hold variable-length strings
(the string table), and a file that HDF5 itself cannot write (a full disk, a descriptor the
script closed) is still lost with SWMR; the journal covers those too (NOTE [ When the trace
cannot be written ] in recorder/sink.py)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
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
    """Appends records to a journal (NOTE [ The recording journal ])."""

    def __init__(self, path: Path, meta: Mapping[str, Any]) -> None:
        self.path = path
        self._last_sync = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, MAGIC + _frame({"kind": "open", "meta": dict(meta)}, {}))
        finally:
            os.close(fd)

    def append(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Append one record: a JSON-able ``header`` and named 1-D arrays."""
        blob = _frame(header, arrays)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(fd, blob)
            now = time.monotonic_ns()
            if now - self._last_sync >= SYNC_NS:
                os.fsync(fd)
                self._last_sync = now
        finally:
            os.close(fd)

    def remove(self) -> None:
        """The trace is closed: the journal is no longer needed."""
        self.path.unlink(missing_ok=True)


def _write_all(fd: int, blob: bytes | bytearray) -> None:
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view) :]


def _frame(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytearray:
    """One record: frame, header and the arrays' bytes, each copied once into the record (a
    step's record holds about 300 KB; joining copies cost 0.1 ms a step)."""
    arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    described = {**header, "arrays": [[n, a.dtype.str, len(a)] for n, a in arrays.items()]}
    described["stored"] = True  # not deflated (records of journals before it were)
    text = json.dumps(described, separators=(",", ":")).encode()
    at = _FRAME.size + _HEADER.size + len(text)
    blob = bytearray(at + sum(a.nbytes for a in arrays.values()))
    _HEADER.pack_into(blob, _FRAME.size, len(text))
    blob[_FRAME.size + _HEADER.size : at] = text
    data = np.frombuffer(blob, np.uint8)
    for a in arrays.values():
        data[at : at + a.nbytes] = a.reshape(-1).view(np.uint8)
        at += a.nbytes
    with memoryview(blob) as view:
        crc = zlib.crc32(view[_FRAME.size :])
    del data
    _FRAME.pack_into(blob, 0, len(blob) - _FRAME.size, crc)
    return blob


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
