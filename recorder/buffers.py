"""Fixed-width row buffers for the recorder's hot path.

NOTE [ Hot-path buffers ]
An event is one ``array.array('q').extend(tuple_of_ints)`` call: a few hundred nanoseconds, no
object that outlives the call, so the cyclic GC is never provoked (a tuple or dict kept per
event would be, see DESIGN.md "Hot path"). Rows are int64 while buffered; a batch is cut into
the schema's columns and dtypes only when it is handed to the trace writer.
"""

from __future__ import annotations

import array
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ckview.trace.schema import RUN_TABLES

Sink = Callable[[str, dict[str, np.ndarray]], None]


class RowBuffer:
    """Append-only rows of one run table, handed to ``sink`` in batches.

    ``rows`` counts every row ever appended (flushed or not), so a row's index in the trace is
    known the moment it is appended. Rows are appended one at a time to ``data`` (the hot path
    of the Python recorder) or a step's rows at once with :meth:`append_rows` (the native path:
    NOTE [ Blocks of rows ]).
    """

    def __init__(self, table: str, sink: Sink) -> None:
        self.table = table
        self.columns = RUN_TABLES[table]
        self.width = len(self.columns)
        self.data = array.array("q")
        self._blocks: list[np.ndarray] = []  # whole blocks of rows, flat, before ``data``
        self._block_values = 0
        self._sink = sink
        self._flushed = 0
        self._taken = 0  # rows handed to take_rows
        self._held: list[np.ndarray] = []  # rows flushed since, not taken yet

    @property
    def rows(self) -> int:
        return self._flushed + self.buffered // self.width

    @property
    def buffered(self) -> int:
        """The values appended since the last flush."""
        return self._block_values + len(self.data)

    # NOTE [ Blocks of rows ]
    # The native path appends a step's rows of a table at once, as an array the extension made
    # for them. Copied into ``data``, they cost 30-110 us a table a small-op step: an array
    # grows by a sixteenth, so nearly every step's rows moved the whole buffer (up to a batch,
    # about a megabyte) to fresh memory, and paid its page faults. A block is kept as it is
    # instead, until the batch is handed to the trace (one copy), and a step's block is also
    # what the journal takes. Rows appended to ``data`` before a block go into a block of their
    # own first (``_seal``), so the order of rows is the order they were appended in.
    def append_rows(self, rows: np.ndarray) -> None:
        """Append ``rows`` (integers, ``width`` a row), kept as they are (NOTE [ Blocks of
        rows ]): nothing may write them afterwards."""
        flat = np.ascontiguousarray(rows, np.int64).reshape(-1)
        if len(flat):
            self._seal()
            self._blocks.append(flat)
            self._block_values += len(flat)

    def _seal(self) -> None:
        """The rows in ``data`` become a block (NOTE [ Blocks of rows ])."""
        if len(self.data):
            data, self.data = self.data, array.array("q")
            self._blocks.append(np.frombuffer(data, np.int64))
            self._block_values += len(data)

    def since(self, row: int) -> np.ndarray:
        """The buffered rows from row ``row`` on (those flushed are not), as one (rows, width)
        array; a copy, or a block as it is."""
        return self._values_from(max(row - self._flushed, 0) * self.width).reshape(-1, self.width)

    def replace_since(self, row: int, rows: np.ndarray) -> None:
        """Replace the buffered rows from row ``row`` on with ``rows`` (as many)."""
        first = max(row - self._flushed, 0) * self.width
        self._seal()
        kept, at = [], 0
        for block in self._blocks:
            if at < first:
                kept.append(block[: first - at])
            at += len(block)
        self._blocks = kept
        self._block_values = sum(len(block) for block in kept)
        self.append_rows(rows)

    def _values_from(self, first: int) -> np.ndarray:
        """The buffered values from offset ``first`` on (flat). Slicing ``data`` copies just
        those and exports no buffer, so a free callback may append meanwhile."""
        pieces, at = [], 0
        for block in self._blocks:
            if at + len(block) > first:
                pieces.append(block[max(first - at, 0) :])
            at += len(block)
        tail = self.data[max(first - at, 0) :]
        if len(tail):
            pieces.append(np.frombuffer(tail, np.int64))
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)

    def take_rows(self) -> np.ndarray:
        """The rows appended since the last call, raw (int64, row-major; the journal's, NOTE
        [ Raw rows in the journal ] in ckview/trace/journal.py), flushed or not."""
        first = max(self._taken - self._flushed, 0) * self.width
        rows = self._values_from(first)
        rows = rows[: len(rows) // self.width * self.width]  # a row cut short is not taken
        held, self._held = self._held, []
        self._taken = self._flushed + (first + len(rows)) // self.width
        return np.concatenate([*held, rows]) if held else rows

    def flush(self) -> None:
        """Hand the buffered rows to the sink and start a new batch."""
        # Swap first: a free callback may append while the batch is being written. A row cut
        # short by an exception mid-append is dropped.
        self._seal()
        blocks, self._blocks, self._block_values = self._blocks, [], 0
        tables = [b[: len(b) // self.width * self.width].reshape(-1, self.width) for b in blocks]
        count = sum(len(table) for table in tables)
        if count == 0:
            return
        untaken, at = max(self._taken - self._flushed, 0), 0
        for table in tables:  # kept for take_rows (a step's rows: it runs at every step's end)
            if at + len(table) > untaken:
                self._held.append(table[max(untaken - at, 0) :].reshape(-1))  # views: nothing
            at += len(table)  # writes a block
        self._flushed += count
        self._sink(self.table, _block_columns(self.columns, tables))


class MutableTable:
    """Rows that stay editable until recording stops (storages, module calls, steps).

    A storage's category is refined while recording (a temporary becomes an activation when
    autograd saves it, a gradient once ``param.grad`` points to it), and a module call's end is
    known only when it returns, so these rows are written once, when recording stops. Rows are
    int64 and row-major: field ``name`` of row ``r`` is ``data[r * width + index(name)]``.
    """

    def __init__(self, table: str) -> None:
        self.table = table
        self.columns = RUN_TABLES[table]
        self.width = len(self.columns)
        self.data = array.array("q")
        self._index = {c.name: i for i, c in enumerate(self.columns)}
        self._final: int | None = None  # NOTE [ Final rows ]: the column that ends a row
        self._seen = 0  # rows at the last take_changes
        self._open = np.zeros(0, np.int64)  # rows that were not final then
        self._open_slots = self._open  # where they are in ``data``
        self.shift = 0
        """Row ``r`` is at slot ``r + shift`` of ``data`` (not so below ``base`` in
        recorder/storage_rows.py, NOTE [ Kept rows ]); new rows are always so."""
        self._taken = np.empty((0, self.width), np.int64)  # and their values then
        self._rewritten = array.array("q")  # final rows written since (NOTE [ Final rows ])

    def __len__(self) -> int:
        return len(self.data) // self.width

    def index(self, name: str) -> int:
        return self._index[name]

    def append(self, values: tuple[int, ...]) -> int:
        """Append one row (values in schema column order); return its index."""
        row = len(self.data) // self.width
        self.data.extend(values)
        return row

    def get(self, row: int, name: str) -> int:
        return self.data[row * self.width + self._index[name]]

    def set(self, row: int, name: str, value: int) -> None:
        self.data[row * self.width + self._index[name]] = value

    def final_once_set(self, column: str) -> None:
        """Rows whose ``column`` is set (>= 0) no longer change (NOTE [ Final rows ])."""
        self._final = self._index[column]

    def rewritten(self, row: int) -> None:
        """Row ``row`` was written after it was final (NOTE [ Final rows ]): the next
        :meth:`take_changes` reports it."""
        self._rewritten.append(row)

    def take_changes(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows added or changed since the last call (their indices, then the rows, raw:
        NOTE [ Raw rows in the journal ] in ckview/trace/journal.py), for the recording
        journal (NOTE [ The recording journal ]).
        The hot path writes ``data`` directly, so changes are found by comparing with a copy
        kept from the last call, of the rows that were not final then (NOTE [ Final rows ])."""
        count = len(self)
        seen, self._seen = self._seen, count
        if count == seen and not len(self._open) and not self._rewritten:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        first = seen + self.shift  # the slot of the first new row; new rows stay in memory
        with _no_collection():
            resident = len(self.data) // self.width
            table = np.frombuffer(self.data, np.int64, resident * self.width)
            table = table.reshape(resident, self.width)
            now = table[self._open_slots]  # the rows open at the last take, as they are now
            fresh = table[first : first + count - seen].copy()
            differs = (now != self._taken).any(axis=1)
            changed, values = self._open[differs], now[differs]
            if self._rewritten:
                late = np.frombuffer(self._rewritten, np.int64)
                changed = np.union1d(changed, late[late < seen])
                del late
                del self._rewritten[:]
                values = table[self._slots(changed)]
            del table
        new = np.arange(seen, count)
        rows = np.concatenate((changed, new))
        values = np.concatenate((values, fresh)).reshape(-1)
        if self._final is None:
            self._open = np.concatenate((self._open, new))
            self._open_slots = np.concatenate((self._open_slots, new + self.shift))
            self._taken = np.concatenate((now, fresh))
        else:
            still = now[:, self._final] < 0
            still_new = np.flatnonzero(fresh[:, self._final] < 0)
            self._open = np.concatenate((self._open[still], seen + still_new))
            self._open_slots = np.concatenate((self._open_slots[still], first + still_new))
            self._taken = np.concatenate((now[still], fresh[still_new]))
        return rows, values

    def _slots(self, rows: np.ndarray) -> np.ndarray:
        """Where ``rows`` are in ``data``: here, every row at its index (not so in
        recorder/storage_rows.py, which updates ``_open_slots`` when rows move)."""
        return rows

    def as_columns(self) -> dict[str, np.ndarray]:
        count = len(self)
        rows = np.frombuffer(self.data, dtype=np.int64, count=count * self.width)
        return _columns(self.columns, rows.reshape(count, self.width))


# NOTE [ Final rows ]
# take_changes runs once per recorded step, and comparing the whole table each time would cost
# in proportion to the run's length, in time and in the copy it keeps of the rows it compares.
# A table may name a column that ends a row: such rows are compared once more, at the next
# take, and never again. A storage ends at its free_ns, on both recorder paths:
# - native: nothing writes a storage row once it is freed;
# - Python: the free's weak-reference callback sets free_ns, and the allocator's merge refines
#   it (with nbytes and alloc_ns) when the step's window closes, which is before the step's take
#   (``RunSequencer._end_recorded_step``: the sources' ``step_ends``, then the journal).
# On both, a storage that the step's forward uses as an input makes the storages it was made
# from between steps inputs too (NOTE [ Inputs and their sources ] in ledger.py), freed or not:
# that write names the row (``rewritten``), and the next take reports it.
# Module calls end so (``PhaseState.close_call`` sets ``end_ns`` and ``seq_end`` together, and
# nothing writes the row after): without it the journal compared every call of the run at
# every step, 0.3 ms of a 6 ms small-op step after 100 steps, growing with the run. Steps and
# recompute regions end at their ``end_ns`` too: a step's counts are set with it
# (``RunSequencer._close_step_row``); a region's module and name are refined only while it is
# open, and the native path places its ops at the step's end, before the step's take (a step
# row each step compared 40 us a step after 150 steps).
# tests/test_record_memory.py holds the copy bounded, and the takes whole, on both paths;
# tests/test_table_changes.py holds each take to a naive oracle.
# The open rows' slots are kept beside them (``_open_slots``): new rows sit at ``row + shift``
# and the open rows move only when KeptRows drops rows, which updates them: a take looks no
# open row up in the kept rows (a search per take before).
# The table is read through a view of ``data``, not a copy. While a buffer is exported, an
# append raises, and a free callback (a weak reference's, run by the cyclic collector) may
# append: the collector is off while the view lives, and nothing in between drops a reference.
@contextmanager
def _no_collection() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _block_columns(columns: tuple, tables: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The columns of blocks of rows, each gathered and cast in one pass (NOTE [ Blocks of
    rows ]): joining the blocks first took a megabyte of fresh memory a batch."""
    return {
        c.name: np.concatenate([t[:, i] for t in tables], dtype=c.dtype, casting="unsafe")
        for i, c in enumerate(columns)
    }


def _columns(columns: tuple, rows: np.ndarray) -> dict[str, np.ndarray]:
    return {c.name: rows[:, i].astype(c.dtype) for i, c in enumerate(columns)}
