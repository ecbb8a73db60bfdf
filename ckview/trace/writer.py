"""TraceWriter: writes a trace file, batch by batch, in the current format version.

The file is a valid (incomplete) trace from the moment the writer is created and after every
``flush()``; ``close()`` marks it complete. See docs/trace-format.md.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from . import _layout as L
from .errors import TraceError, one_line
from .schema import (
    CHECKPOINTING,
    FORMAT_NAME,
    FORMAT_VERSION,
    GROUP_TYPES,
    META_FIELDS,
    ROOT_TABLES,
    RUN_FIELDS,
    RUN_INT_FIELDS,
    RUN_STR_FIELDS,
    RUN_TABLES,
    TIMING_TABLES,
    Column,
)
from .structure import written_here

#: What ``append`` accepts for one column: a numpy array of any integer dtype, an array.array,
#: a list of ints...
ColumnData = Any


def _cannot_create(path: str, error: OSError) -> str:
    """One line: why ``path`` cannot be created, and what to do."""
    if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EBUSY) or "lock" in str(error):
        return (
            f"cannot write {path}: it is open elsewhere (a viewer or another recording holds "
            "it); close that program or write to another path"
        )
    if error.errno == errno.ENOSPC:
        return f"cannot create {path}: no space left on its disk; free some space"
    reason = os.strerror(error.errno) if error.errno else one_line(error)
    return f"cannot create {path} ({reason}); check that its directory exists and is writable"


_ABANDONED: list[h5py.File] = []
"""Files left open on purpose (TraceWriter.abandon)."""

# NOTE [ A file closed under the writer ]
# A script may close every file descriptor (``os.closerange(3, ...)``), the trace's too.
# Before each write the writer checks (one fstat) that its descriptor still names the trace:
# a closed one is reopened at the same number and writing goes on; one that names another
# file by now (the script opened one and got the number) is never written or closed again,
# and the trace is rebuilt from the journal (NOTE [ The recording journal ] in journal.py).


def _to_devnull(fd: int) -> None:
    """Make ``fd`` name a file that takes any write and is lost (in this process only): an
    anonymous memory file (sparse: HDF5's last writes are small), else /dev/null."""
    try:
        null = os.memfd_create("ckview-discarded")
    except (AttributeError, OSError):
        null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


def _mark(node: h5py.Group | h5py.Dataset, kind: str) -> None:
    """Write the ``ckview_type`` / ``ckview_type_version`` attributes of a group."""
    type_name, version = GROUP_TYPES[kind]
    node.attrs[L.TYPE_ATTR] = type_name
    node.attrs[L.TYPE_VERSION_ATTR] = np.int64(version)


def _as_column(values: ColumnData, column: Column, table: str) -> np.ndarray:
    """Convert one column of a batch to its schema dtype, refusing values that would wrap."""
    arr = np.asarray(values)
    where = f"{table}.{column.name}"
    if arr.ndim != 1:
        raise ValueError(f"{where}: expected a 1-D sequence, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, column.dtype)
    if arr.dtype.kind not in "iub":
        raise ValueError(f"{where}: expected integers, got dtype {arr.dtype}")
    if not np.can_cast(arr.dtype, column.dtype):
        info = np.iinfo(column.dtype)
        low, high = arr.min(), arr.max()
        if low < info.min or high > info.max:
            raise ValueError(f"{where}: values {low}..{high} do not fit {column.dtype}")
    return arr.astype(column.dtype, copy=False)


@dataclass(frozen=True)
class _Storage:
    """How column datasets are chunked and compressed."""

    chunk_rows: int
    filters: dict[str, Any]
    compressor: _ChunkCompressor | None


def _storage(chunk_rows: int, filters: Mapping[str, Any] | None, threads: int | None) -> _Storage:
    """Storage settings; our own threaded compressor only for shuffle + deflate filters."""
    filters = dict(L.DEFAULT_FILTERS if filters is None else filters)
    if threads is None:
        threads = min(4, os.cpu_count() or 1)
    deflate = set(filters) == {"compression", "compression_opts", "shuffle"} and (
        filters["compression"] == "gzip" and filters["shuffle"]
    )
    level = filters.get("compression_opts", 0)
    compressor = _ChunkCompressor(level, threads) if deflate and threads > 0 else None
    return _Storage(chunk_rows, filters, compressor)


_MIN_CHUNK_ROWS = 1024


def _fitting_chunk(rows: int, most: int) -> int:
    """Chunk rows for a table of ``rows`` rows that takes no more (NOTE [ Datasets made when
    first written ]): the power of two that holds them, within [_MIN_CHUNK_ROWS, ``most``]."""
    return min(most, max(_MIN_CHUNK_ROWS, 1 << max(rows - 1, 0).bit_length()))


def _shuffle(chunk: np.ndarray) -> bytes:
    """HDF5's shuffle filter: all first bytes of the elements, then all second bytes..."""
    return chunk.view(np.uint8).reshape(-1, chunk.itemsize).T.tobytes()


# NOTE [ A partial chunk, deflated without its padding ]
# HDF5 stores a chunk whole: the last, partial chunk of a column is its rows, then zeros (the fill
# value) up to the chunk's size, and the shuffle + deflate filters run over all of it. Compressing
# the partial chunks is most of a trace's close, and the zeros were up to half of that (a 64 Ki-row
# column 26% full: 1.17 ms whole, 0.59 ms as below; a 200-step small-op recording's close went from
# 60-62 ms to 45-58 ms). The shuffled chunk is, for each byte of an element in turn, the rows' bytes
# and then the padding's zeros. Deflate's format lets each such piece be compressed on its own,
# byte-aligned by a full flush (after which no match reaches back), and the zeros once for every
# plane. The zlib stream is these pieces between the usual header, a final empty block and the
# Adler-32 of the whole (zeros leave its first sum as it is and add that sum to the second once per
# zero byte). Any inflate, HDF5's filter too, restores from it the shuffled chunk that HDF5's own
# filters would have compressed.
def _deflate_padded(rows: np.ndarray, size: int, level: int) -> bytes:
    """The shuffle + deflate (zlib) encoding of ``rows`` followed by zeros up to ``size``."""
    zeros = size - len(rows)
    gap = zlib.compressobj(level, zlib.DEFLATED, -15)
    gap_piece = gap.compress(bytes(zeros)) + gap.flush(zlib.Z_FULL_FLUSH)
    deflate = zlib.compressobj(level, zlib.DEFLATED, -15)
    parts, adler = [zlib.compress(b"", level)[:2]], 1  # the zlib header for ``level``
    for plane in rows.view(np.uint8).reshape(-1, rows.itemsize).T:
        data = plane.tobytes()
        parts += [deflate.compress(data), deflate.flush(zlib.Z_FULL_FLUSH), gap_piece]
        adler = zlib.adler32(data, adler)
        first, second = adler & 0xFFFF, adler >> 16
        adler = (second + zeros * first) % _ADLER_MOD << 16 | first
    parts += [deflate.flush(zlib.Z_FINISH), adler.to_bytes(4, "big")]
    return b"".join(parts)


_ADLER_MOD = 65521


class _ChunkCompressor:
    """Shuffle + deflate whole chunks on worker threads, for ``write_direct_chunk``.

    HDF5 runs its filters serially on one core, which caps writing near 4-5 M events/s; zlib and
    numpy copies release the GIL, so a pool of threads runs them in parallel. The bytes are
    exactly what HDF5's own shuffle + deflate filters produce, so any HDF5 reader decodes them.
    """

    def __init__(self, level: int, threads: int) -> None:
        self._level = level
        self._pool = ThreadPoolExecutor(threads, "ckview-compress") if threads > 1 else None

    def start(self, chunks: list[np.ndarray], size: int) -> list[Future[bytes]]:
        """Compress ``chunks`` of ``size`` rows (a shorter one is padded with zeros: NOTE [ A
        partial chunk, deflated without its padding ]) on the pool's threads (NOTE [ Chunks
        compressed while the caller runs on ]); without a pool, here and now."""
        if self._pool is not None:
            return [self._pool.submit(self._one, chunk, size) for chunk in chunks]
        done = []
        for chunk in chunks:
            future: Future[bytes] = Future()
            future.set_result(self._one(chunk, size))
            done.append(future)
        return done

    def _one(self, chunk: np.ndarray, size: int) -> bytes:
        if len(chunk) < size:
            return _deflate_padded(chunk, size, self._level)
        return zlib.compress(_shuffle(chunk), self._level)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class _TableWriter:
    """Appends batches of rows to one table group: one resizable dataset per column.

    With a compressor, full chunks go straight to disk pre-compressed and the rows of the last,
    partial chunk wait in ``_tail`` until the next append fills it or ``flush`` writes it through
    HDF5 (it is rewritten whole once full). ``_tail`` is a buffer per column, grown by doubling
    up to a chunk and filled in place, so an append copies its own rows only (a recording appends
    a few hundred rows at a time, and copying the waiting tail each time moved megabytes a
    step). Without a compressor, HDF5 compresses every append itself.
    The column datasets are created when rows first go to disk (NOTE [ Datasets made when
    first written ]).
    """

    def __init__(
        self,
        group: h5py.Group,
        name: str,
        columns: tuple[Column, ...],
        storage: _Storage,
    ) -> None:
        _mark(group, "modules" if name == "modules" else "table")
        self.name = name
        self._group = group
        self._columns = columns
        self._chunk_rows = storage.chunk_rows
        self._filters = storage.filters
        self._compressor = storage.compressor
        self._datasets: dict[str, h5py.Dataset] = {}  # made when first written
        self._tail = {c.name: np.empty(0, c.dtype) for c in columns}  # rows from _stored on
        self._tail_rows = 0  # rows used of each ``_tail`` buffer
        self.rows = 0  # rows appended
        self._stored = 0  # rows in whole chunks written directly (compressor only)
        self._extent = 0  # length of the datasets on disk
        self._compressing: list[tuple[str, int, Future[bytes]]] = []  # (column, row, chunk)

    def append(self, data: Mapping[str, ColumnData]) -> None:
        """Append one batch: every column, equal lengths (ValueError otherwise)."""
        arrays = self._convert(data)
        if len(arrays[self._columns[0].name]) == 0:
            return
        self._write_compressed()
        with self._same_length_on_failure():
            if self._compressor is None:
                self._write_rows(arrays)
            else:
                self._write_chunks(arrays, self._compressor)

    @contextlib.contextmanager
    def _same_length_on_failure(self) -> Iterator[None]:
        """Even on Ctrl-C, a write that fails leaves every column at the length it had
        before, so the file stays readable."""
        extent = self._extent
        try:
            yield
        except BaseException:
            for dataset in self._datasets.values():
                with contextlib.suppress(Exception):
                    dataset.resize((extent,))
            raise

    # NOTE [ Datasets made when first written ]
    # A column's chunk size is fixed when its dataset is made, and HDF5 compresses a partial
    # last chunk whole: 64 Ki rows of int64 are 512 KB to deflate (0.7 ms) even for 10 rows.
    # Made at the file's start, the 91 datasets of a run cost 12-30 ms, and their partial
    # chunks 35 ms at its close: a tenth of a 300 ms step, for a short recording. So a table
    # makes its datasets when rows first go to disk: at a whole chunk or a flush during the
    # run, with the usual chunk size (the table may grow); at the file's close (``final``),
    # with chunks that fit the rows it has (a power of two, at least ``_MIN_CHUNK_ROWS``).
    # Before then the table exists in the file as an empty group; nothing reads the file then
    # (a recording's journal holds the rows).
    def flush(self, final: bool = False) -> None:
        """Write the chunks compressed meanwhile and the rows still waiting in the partial last
        chunk; ``final``: the file is closing, no row comes after (NOTE [ Datasets made when
        first written ])."""
        self._write_compressed()
        self._make_datasets(_fitting_chunk(self.rows, self._chunk_rows) if final else None)
        if self._extent == self.rows:
            return
        if self._compressor is not None:
            self._write_tail(self._compressor)
        else:
            self._resize(self.rows)
            for name, dataset in self._datasets.items():
                dataset[self._stored : self.rows] = self._tail[name][: self._tail_rows]
        self._extent = self.rows

    def _write_tail(self, compressor: _ChunkCompressor) -> None:
        """The rows waiting in ``_tail`` as their chunk, padded and compressed on the
        compressor's threads (NOTE [ A partial chunk, deflated without its padding ]); a later
        flush or whole chunk writes the chunk again."""
        size = next(iter(self._datasets.values())).chunks[0]
        names = list(self._tail)
        blobs = compressor.start([self._tail[n][: self._tail_rows] for n in names], size)
        with self._same_length_on_failure():
            self._resize(self.rows)
            for name, blob in zip(names, blobs, strict=True):
                self._datasets[name].id.write_direct_chunk((self._stored,), blob.result())

    def patch(self, rows: np.ndarray, data: Mapping[str, ColumnData]) -> None:
        """Write rows ``rows`` (increasing, each appended before) again: every column."""
        arrays = self._convert(data)
        if not len(rows):
            return
        if rows[-1] >= self.rows:
            raise ValueError(f"{self.name}: row {rows[-1]} is beyond its {self.rows} rows")
        self._write_compressed()
        # Rows may be on disk (whole chunks, or a partial chunk flushed), in the partial last
        # chunk in memory (with a compressor: rows from ``_stored`` on), or both.
        on_disk = rows < self._extent
        in_tail = rows >= self._stored if self._compressor is not None else ~on_disk
        for name, values in arrays.items():
            if on_disk.any():
                self._datasets[name][rows[on_disk]] = values[on_disk]
            if in_tail.any():
                self._tail[name][rows[in_tail] - self._stored] = values[in_tail]

    def _make_datasets(self, chunk_rows: int | None = None) -> None:
        """Make the column datasets unless made (NOTE [ Datasets made when first written ]),
        with chunks of ``chunk_rows`` rows (None: the usual size)."""
        if self._datasets:
            return
        chunk_rows = chunk_rows or self._chunk_rows
        self._datasets = {
            c.name: self._group.create_dataset(
                c.name,
                shape=(self._extent,),
                maxshape=(None,),
                dtype=c.dtype,
                chunks=(chunk_rows,),
                **self._filters,
            )
            for c in self._columns
        }

    def _write_rows(self, arrays: dict[str, np.ndarray]) -> None:
        self._make_datasets()
        end = self.rows + len(arrays[self._columns[0].name])
        for name, arr in arrays.items():
            dataset = self._datasets[name]
            dataset.resize((end,))
            dataset[self.rows :] = arr
        self.rows = self._extent = end

    def _write_chunks(self, arrays: dict[str, np.ndarray], compressor: _ChunkCompressor) -> None:
        size, at = self._chunk_rows, 0
        n = len(arrays[self._columns[0].name])
        chunks: list[tuple[str, int, np.ndarray]] = []  # (column, first row, rows)
        while at < n:
            take = min(size - self._tail_rows, n - at)
            if take == size:  # a whole chunk of the batch, copied: the caller may reuse it
                chunks += [
                    (name, self._stored, arr[at : at + size].copy()) for name, arr in arrays.items()
                ]
            else:
                self._fill_tail(arrays, at, take)
                if self._tail_rows < size:
                    break
                chunks += [(name, self._stored, tail) for name, tail in self._tail.items()]
                self._tail = {name: np.empty(0, tail.dtype) for name, tail in self._tail.items()}
                self._tail_rows = 0
            self._stored += size
            at += take
        blobs = compressor.start([chunk for _, _, chunk in chunks], size)
        self._compressing = [
            (name, row, blob) for (name, row, _), blob in zip(chunks, blobs, strict=True)
        ]
        self.rows = self._stored + self._tail_rows

    def _fill_tail(self, arrays: dict[str, np.ndarray], at: int, take: int) -> None:
        """Copy rows ``at:at+take`` of the batch to the tail, which grows by doubling."""
        used, need = self._tail_rows, self._tail_rows + take
        for name, arr in arrays.items():
            tail = self._tail[name]
            if need > len(tail):
                grown = np.empty(min(self._chunk_rows, max(need, 2 * len(tail))), tail.dtype)
                grown[:used] = tail[:used]
                self._tail[name] = tail = grown
            tail[used:need] = arr[at : at + take]
        self._tail_rows = need

    # NOTE [ Chunks compressed while the caller runs on ]
    # Compressing a batch's whole chunks takes milliseconds (level 1, 64 Ki rows a column), on
    # the compressor's threads. The caller (the recorder, at a step's end) does not wait for
    # them: they are written to the file by the next append to the table, its flush or the
    # file's close, by when they are done. Until then the rows count as stored (``rows``), and
    # a reader of the file sees them only after a flush, as it sees any batch (HDF5 is
    # flushed at ``TraceWriter.flush``). A failure while writing them (a full disk, Ctrl-C)
    # leaves every column at the length before, and keeps them for a retry.
    def _write_compressed(self) -> None:
        """Write the chunks started by the last append (NOTE [ Chunks compressed while the
        caller runs on ])."""
        if not self._compressing:
            return
        self._make_datasets()
        extent = self._extent
        end = max(row for _, row, _ in self._compressing) + self._chunk_rows
        with self._same_length_on_failure():
            if end > extent:
                self._resize(end)
            for name, row, blob in self._compressing:
                self._datasets[name].id.write_direct_chunk((row,), blob.result())
        self._extent = max(extent, end)
        self._compressing = []

    def _resize(self, rows: int) -> None:
        for dataset in self._datasets.values():
            dataset.resize((rows,))

    def _convert(self, data: Mapping[str, ColumnData]) -> dict[str, np.ndarray]:
        names = [c.name for c in self._columns]
        missing = [n for n in names if n not in data]
        extra = [n for n in data if n not in names]
        if missing or extra:
            raise ValueError(
                f"{self.name}: append needs exactly the columns {names}; "
                f"missing {missing}, unexpected {extra}"
            )
        arrays = {c.name: _as_column(data[c.name], c, self.name) for c in self._columns}
        lengths = {n: len(a) for n, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{self.name}: columns have different lengths {lengths}")
        return arrays


class RunWriter:
    """Writes the tables of one run (``/runs/<name>``). Get one from ``TraceWriter.run``."""

    def __init__(self, trace: TraceWriter, group: h5py.Group, name: str, order: int) -> None:
        _mark(group, "run")
        group.attrs[L.ORDER_ATTR] = np.int64(order)
        group.attrs["name"] = name
        group.attrs["complete"] = False
        for key, unset in RUN_INT_FIELDS.items():
            group.attrs[key] = np.int64(unset)
        for key in RUN_STR_FIELDS:
            group.attrs[key] = ""
        self.name = name
        self._trace = trace
        self._group = group
        self._tables = {
            table: _TableWriter(group.create_group(table), table, columns, trace._storage)
            for table, columns in RUN_TABLES.items()
        }
        self.closed = False

    def append(self, table: str, columns: Mapping[str, ColumnData]) -> None:
        """Append a batch of rows to ``table``: every column of it, all of the same length.

        The timing tables (schema.TIMING_TABLES) take rows after the run is closed too: plain
        timing steps come once every run is recorded."""
        if table in TIMING_TABLES:
            self._trace._check_open()
        else:
            self._check_open()
        if table not in self._tables:
            raise ValueError(f"unknown table {table!r}; run tables: {', '.join(RUN_TABLES)}")
        self._tables[table].append(columns)

    def patch(self, table: str, rows: np.ndarray, columns: Mapping[str, ColumnData]) -> None:
        """Write rows ``rows`` (increasing) of ``table``, appended before, again: a recorder
        writes a storage row when the row can no longer change, or early and again at the
        run's end (NOTE [ Kept rows ] in recorder/storage_rows.py)."""
        self._check_open()
        if table not in self._tables:
            raise ValueError(f"unknown table {table!r}; run tables: {', '.join(RUN_TABLES)}")
        self._tables[table].patch(np.asarray(rows, np.int64), columns)

    def set_attrs(self, **attrs: int | str) -> None:
        """Set run attributes other than ``name`` and ``complete``: integers
        (schema.RUN_INT_FIELDS: ``steps_recorded``, ``oom_bytes``, ``oom_time_ns``) and strings
        (schema.RUN_STR_FIELDS: ``checkpointing``, ``oom_op``, ``oom_module``, ``oom_message``)."""
        self._check_open()
        for key, value in attrs.items():
            if key not in RUN_FIELDS or key in ("name", "complete"):
                raise ValueError(f"cannot set run attribute {key!r}; use close() for 'complete'")
            if key == "checkpointing" and value not in CHECKPOINTING:
                raise ValueError(f"checkpointing must be one of {CHECKPOINTING}, got {value!r}")
            if key in RUN_STR_FIELDS:
                if not isinstance(value, str):
                    raise TypeError(f"run attribute {key!r} must be a str, got {value!r}")
                self._group.attrs[key] = value
            else:
                self._group.attrs[key] = np.int64(L.attr_int(key, value))

    def close(self, complete: bool = True) -> None:
        """Mark the run complete (or not) and refuse further appends. Idempotent."""
        if self.closed:
            return
        self._group.attrs["complete"] = bool(complete)
        self.closed = True

    def _flush(self, final: bool = False) -> None:
        for table in self._tables.values():
            table.flush(final)

    def _check_open(self) -> None:
        self._trace._check_open()
        if self.closed:
            raise ValueError(f"run {self.name!r} of {self._trace.path} is closed")


class TraceWriter:
    """Creates (or overwrites) a trace file and writes it in batches.

    ``meta`` sets fields of ``/meta`` (schema.META_FIELDS, except ``complete`` and ``error``
    which ``close`` sets); ``start_time`` and ``python_version`` default to now and this Python.

    ``chunk_rows``, ``filters`` (h5py ``create_dataset`` keywords) and ``threads`` exist for
    benchmarks; ckview itself writes the defaults that docs/trace-format.md prescribes. With
    shuffle + deflate filters (the default) up to ``threads`` threads compress whole chunks
    (None: one per CPU, at most 4; 0: leave compression to HDF5, serially).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: Mapping[str, Any] | None = None,
        *,
        chunk_rows: int = L.CHUNK_ROWS,
        filters: Mapping[str, Any] | None = None,
        threads: int | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._storage = _storage(chunk_rows, filters, threads)
        initial = self._initial_meta(meta or {})
        try:
            self._file = h5py.File(self.path, "w")
        except OSError as e:
            raise TraceError(_cannot_create(self.path, e), path=self.path) from e
        self._strings: dict[str, int] = {}
        self._texts: list[str] = []  # the strings by id
        self._pending: list[str] = []
        self._runs: dict[str, RunWriter] = {}
        self.closed = self._abandoned = False
        self._identity = _identity(os.fstat(self._file.id.get_vfd_handle()))
        try:
            self._create_layout(initial)
            self._file.flush()
        except BaseException:
            self._file.close()
            raise

    def _initial_meta(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        for key in ("complete", "error"):
            if key in meta:
                raise ValueError(f"meta field {key!r} is set by close(), not by the caller")
        values = {name: L.meta_default(name) for name in META_FIELDS}
        values["start_time"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        values["python_version"] = platform.python_version()
        values.update(meta)
        return {name: L.encode_meta(name, value) for name, value in values.items()}

    def _create_layout(self, meta: Mapping[str, Any]) -> None:
        f = self._file
        f.attrs[L.FORMAT_ATTR] = FORMAT_NAME
        f.attrs[L.FORMAT_VERSION_ATTR] = np.int64(FORMAT_VERSION)
        group = f.create_group(L.META)
        _mark(group, "meta")
        group.attrs.update(meta)
        self._string_ds = f.create_dataset(
            L.STRINGS,
            shape=(0,),
            maxshape=(None,),
            chunks=(L.STRING_CHUNK_ROWS,),
            dtype=h5py.string_dtype("utf-8"),
        )
        _mark(self._string_ds, "strings")
        self._root_tables = {
            name: _TableWriter(f.create_group(name), name, columns, self._storage)
            for name, columns in ROOT_TABLES.items()
        }
        f.create_group(L.RUNS)

    def intern(self, text: str) -> int:
        """The string id of ``text``, adding it to the string table if new."""
        sid = self._strings.get(text)
        if sid is None:
            self._check_open()
            if not isinstance(text, str):
                raise TypeError(f"only str can be interned, got {text!r}")
            text.encode("utf-8")  # fail here, not at flush, on lone surrogates
            sid = self._strings[text] = len(self._strings)
            self._texts.append(text)
            self._pending.append(text)
        return sid

    def strings_since(self, start: int) -> list[str]:
        """The strings interned with ids ``start`` and on."""
        return self._texts[start:]

    def fileno(self) -> int:
        """The file descriptor HDF5 writes the trace through; -1 once closed."""
        if self.closed:
            return -1
        try:
            return int(self._file.id.get_vfd_handle())
        except (ValueError, RuntimeError, OSError):
            return -1

    def check_file(self) -> None:
        """Make sure the file descriptor HDF5 writes to is still this trace's (NOTE [ A file
        closed under the writer ]): reopen it if the process closed it; TraceError if the
        number now names another file."""
        self._check_open()
        fd = self._file.id.get_vfd_handle()
        try:
            same = _identity(os.fstat(fd)) == self._identity
        except OSError:  # closed (os.closerange): put the trace back at the same number
            reopened = os.open(self.path, os.O_RDWR)
            if reopened != fd:
                os.dup2(reopened, fd)
                os.close(reopened)
            return
        if not same:
            raise TraceError(
                f"the script closed the file descriptor of {self.path} and opened another "
                "file at its number; the trace can no longer be written there",
                path=self.path,
            )

    def abandon(self) -> None:
        """Stop writing without finishing the file, which the caller discards: whatever HDF5
        still writes goes to /dev/null (on a full disk it would fail again). Never raises;
        idempotent. NOTE [ A file closed under the writer ]: if the descriptor names another
        file by now (the script's), the HDF5 file is left open, never flushed from here."""
        if self._abandoned:
            return
        self.closed = self._abandoned = True
        try:
            fd = self._file.id.get_vfd_handle()
            if _identity(os.fstat(fd)) != self._identity:
                _ABANDONED.append(self._file)  # closing it would write into that file
                return
        except OSError:  # closed: /dev/null takes the number
            pass
        with contextlib.suppress(Exception):
            _to_devnull(fd)
        with contextlib.suppress(Exception):
            self._file.close()
        if self._storage.compressor is not None:
            self._storage.compressor.close()

    def forget_in_child(self) -> None:
        """In a forked child: the file is the parent's. Whatever HDF5 writes from this process
        from now on (its last flush at exit) goes to /dev/null."""
        self.closed = True
        with contextlib.suppress(Exception):
            _to_devnull(self._file.id.get_vfd_handle())

    def append_modules(self, columns: Mapping[str, ColumnData]) -> None:
        """Append rows to the root ``modules`` table (every column of schema.MODULES)."""
        self.append_root("modules", columns)

    def append_root(self, table: str, columns: Mapping[str, ColumnData]) -> None:
        """Append rows to a root table (schema.ROOT_TABLES: ``modules``, ``frames``,
        ``stacks``): every column of it, all of the same length."""
        self._check_open()
        if table not in self._root_tables:
            raise ValueError(f"unknown root table {table!r}; root tables: {', '.join(ROOT_TABLES)}")
        self._root_tables[table].append(columns)

    def root_rows(self, table: str) -> int:
        """Rows appended so far to a root table (schema.ROOT_TABLES)."""
        if table not in self._root_tables:
            raise ValueError(f"unknown root table {table!r}; root tables: {', '.join(ROOT_TABLES)}")
        return self._root_tables[table].rows

    def run(self, name: str) -> RunWriter:
        """The writer of run ``name``, creating ``/runs/<name>`` on first use."""
        writer = self._runs.get(name)
        if writer is None:
            self._check_open()
            group = self._file[L.RUNS].create_group(L.encode_run_name(name))
            writer = self._runs[name] = RunWriter(self, group, name, len(self._runs))
        return writer

    def update_meta(self, **fields: Any) -> None:
        """Set meta fields (not ``complete``/``error``, which ``close`` sets)."""
        self._check_open()
        for key in ("complete", "error"):
            if key in fields:
                raise ValueError(f"meta field {key!r} is set by close()")
        encoded = {name: L.encode_meta(name, value) for name, value in fields.items()}
        self._file[L.META].attrs.update(encoded)

    def set_call_costs(self, rows: Sequence[tuple[int, int, int, int]]) -> None:
        """Store checkpoint's cost per call by size (``/meta`` attribute
        ``checkpoint_call_by_size``): rows of (bytes, median, low, high ns), by bytes."""
        self._check_open()
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        if (np.diff(table[:, 0]) <= 0).any() or (table < 0).any():
            raise ValueError(f"call costs must be non-negative, by increasing bytes: {rows!r}")
        self._file[L.META].attrs[L.CALL_COSTS] = table

    def set_plan_all_times(self, rows: Sequence[tuple[int, int, int]]) -> None:
        """Store the timing steps under plan all (``/meta`` attribute ``plan_all_times``): rows
        of (round, -1, step ns) and (round, module row, recompute ns)."""
        self._check_open()
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        damage = L.plan_all_damage(table)
        if damage:
            raise ValueError(f"plan-all times: {damage}")
        self._file[L.META].attrs[L.PLAN_ALL_TIMES] = table

    def flush(self) -> None:
        """Write pending strings and flush HDF5: the file on disk is then a readable trace."""
        self._check_open()
        self._write_pending()
        self._file.flush()

    def close(self, complete: bool = True, error: str = "") -> None:
        """Set ``complete``/``error``, close runs still open (as incomplete), close the file.

        Idempotent: later calls do nothing.
        """
        if self.closed:
            return
        self.closed = True
        try:
            self._write_pending(final=True)
            for run in self._runs.values():
                run.close(complete=False)
            self._file[L.META].attrs["complete"] = bool(complete)
            self._file[L.META].attrs["error"] = str(error)
        finally:
            self._file.close()
            if self._storage.compressor is not None:
                self._storage.compressor.close()
        written_here(self.path)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close(complete=True)
        else:
            message = str(exc)
            error = f"{exc_type.__name__}: {message}" if message else exc_type.__name__
            self.close(complete=False, error=error)

    def _write_pending(self, final: bool = False) -> None:
        """Write new strings and the partial last chunk of every table; ``final`` when the file
        closes (NOTE [ Datasets made when first written ])."""
        if self._pending:
            # Offset from the ids, not the dataset length, so a retry after a failure is exact.
            n = len(self._strings) - len(self._pending)
            self._string_ds.resize((n + len(self._pending),))
            self._string_ds[n:] = np.array(self._pending, dtype=object)
            self._pending.clear()
        for table in self._root_tables.values():
            table.flush(final)
        for run in self._runs.values():
            run._flush(final)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"the trace writer of {self.path} is closed")
