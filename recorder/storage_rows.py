"""Tables whose rows leave memory once written and final: the run's storages and module calls.

NOTE [ Kept rows ]
A long recording must not grow with its steps: a storage row is some 100 bytes, a step makes
hundreds; a module call row is 64 bytes, one a module call. When the journal takes a step
(``take_changes``), the rows made before the step it takes (up to the take before) are appended
to the trace as they are, and dropped from memory, except the rows that can still change, which
are *kept*: rows not final yet (NOTE [ Final rows ] in buffers.py: for storages, parameters,
optimizer state, anything alive; for calls, a call not returned), and storage rows ``pinned``
as the sources of a storage made between steps (NOTE [ Inputs and their sources ] in
ledger.py: a freed source still becomes an input with its product). Kept rows stay until the
run ends, when they are written again in place (``finish``); a row's index in the trace never
changes, other tables refer to storage and call rows by it.
The rows of the last step stay as they are: most storages alive at a step boundary (the batch,
the gradients until ``zero_grad``) are freed in the next step, and so never need a rewrite; a
backward may come after its forward's step ended, and looks up that step's forward calls
(NOTE [ Forward calls of past steps ] in phases.py). Rows go in batches of ``BATCH_ROWS`` at
least: a write to the trace per step cost the native path's small-op step 5%
(the writer copies its partial chunk at each append).
In memory, ``data`` holds the kept rows first, in row order, then every row from ``base`` on:
row ``r`` is at slot ``r + shift`` when ``r >= base``, else at slot ``kept[r]``. The hot path
addresses a row through ``slot`` (``slots`` for an array of rows); a dropped row has no slot
(``kept[r]`` raises KeyError, ``slots`` asserts). What indexes call rows beside the table
forgets the dropped ones when told (``on_drop``): ``PhaseState``'s forward calls by sequence
number, and the native ledger's call id map.
On CUDA the device samples place each step's peak on the storage rows as the step ends
(NOTE [ Device samples ] in recorder/device.py): every row born or freed in the step is in
memory then (born since the last take, or open until then).
"""

from __future__ import annotations

import array
from collections.abc import Callable

import numpy as np

from recorder.buffers import MutableTable, _columns, _no_collection

Columns = dict[str, np.ndarray]
BATCH_ROWS = 1 << 12
"""Rows dropped together (NOTE [ Kept rows ]): some 400 KiB of storage rows in memory at most,
for one write to the trace and one copy of the kept rows every few thousand rows."""
Sink = Callable[[str, Columns], None]
Patch = Callable[[str, np.ndarray, Columns], None]
"""Write rows of a table again: the table, the rows (in order), their columns."""
_DEVICE_COLUMNS = ("nbytes", "device", "alloc_ns", "free_ns")


class KeptRows(MutableTable):
    """A table whose rows leave memory once written to the trace and final, but those that can
    still change (NOTE [ Kept rows ]): ``sink`` appends rows to the trace, ``patch`` writes
    rows written before again."""

    def __init__(self, table: str, final: str, sink: Sink, patch: Patch) -> None:
        super().__init__(table)
        self.final_once_set(final)  # NOTE [ Final rows ] in buffers.py
        self._ends = self.index(final)
        self.base = 0
        self.shift = 0
        self.kept: dict[int, int] = {}
        self.pinned: set[int] = set()
        """Rows kept even once final (storages: sources an input may still promote)."""
        self.on_drop: list[Callable[[], None]] = []
        """Called once rows left memory: what indexes rows beside the table forgets them."""
        self._sink, self._patch = sink, patch
        self._kept_rows = np.zeros(0, np.int64)  # the keys of ``kept``, in order
        self._previous = 0  # the row count at the take before the last

    def __len__(self) -> int:
        return len(self.data) // self.width - self.shift

    def slot(self, row: int) -> int:
        return row + self.shift if row >= self.base else self.kept[row]

    def _slots(self, rows: np.ndarray) -> np.ndarray:
        old = rows < self.base
        if not old.any():
            return rows + self.shift
        at = np.searchsorted(self._kept_rows, rows[old])
        assert (self._kept_rows[np.minimum(at, len(self._kept_rows) - 1)] == rows[old]).all(), (
            f"a {self.table} row dropped from memory was addressed (NOTE [ Kept rows ])"
        )
        slots = rows + self.shift
        slots[old] = at
        return slots

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """The slots of ``rows`` (int64), each in memory."""
        return self._slots(np.asarray(rows, np.int64))

    def holds(self, row: int) -> bool:
        """Whether row ``row`` is in memory."""
        return row >= self.base or row in self.kept

    def resident(self, rows: np.ndarray) -> np.ndarray:
        """Which of ``rows`` (int64, each >= 0) are in memory."""
        return (rows >= self.base) | np.isin(rows, self._kept_rows)

    def column(self, rows: np.ndarray, name: str) -> np.ndarray:
        """Column ``name`` of ``rows`` (each in memory), a copy."""
        slots = self.slots(rows)
        with _no_collection():
            values = np.frombuffer(self.data, np.int64)[slots * self.width + self.index(name)]
        return values

    def append(self, values: tuple[int, ...]) -> int:
        row = len(self)
        self.data.extend(values)
        return row

    def get(self, row: int, name: str) -> int:
        return self.data[self.slot(row) * self.width + self.index(name)]

    def set(self, row: int, name: str, value: int) -> None:
        self.data[self.slot(row) * self.width + self.index(name)] = value

    def take_changes(self) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`MutableTable.take_changes`; then the rows made before the previous take
        go to the trace, and leave memory unless kept (NOTE [ Kept rows ])."""
        taken = super().take_changes()
        cut, self._previous = self._previous, len(self)
        if cut - self.base >= BATCH_ROWS:
            self._drop_below(cut)
            for forget in self.on_drop:
                forget()
        return taken

    def _drop_below(self, cut: int) -> None:
        with _no_collection():
            table = np.frombuffer(self.data, np.int64).reshape(-1, self.width)
            first = self.base + self.shift
            passing = table[first : cut + self.shift]
            self._sink(self.table, _columns(self.columns, passing))
            rows = np.arange(self.base, cut)
            keep = passing[:, self._ends] < 0
            if self.pinned:
                keep |= np.isin(rows, np.fromiter(self.pinned, np.int64, len(self.pinned)))
            order = np.concatenate((np.arange(len(self.kept)), first + np.flatnonzero(keep)))
            rest = table[cut + self.shift :]
            data = np.concatenate((table[order], rest)).reshape(-1)
            self._reordered(order, cut + self.shift)
            del table, passing, rest
        self._kept_rows = np.concatenate((self._kept_rows, rows[keep]))
        self.kept = {row: slot for slot, row in enumerate(self._kept_rows.tolist())}
        self.base, self.shift = cut, len(self._kept_rows) - cut
        self.data[:] = array.array("q", data.tobytes())
        self._open_slots = self._slots(self._open)  # the rows moved (NOTE [ Final rows ])

    def _reordered(self, order: np.ndarray, rest: int) -> None:
        """The slots now hold the rows of old slots ``order``, then those from slot ``rest``
        on: what a subclass holds beside ``data`` by slot follows."""

    def finish(self) -> None:
        """The run ends: append the rows not written yet, and write the kept rows again."""
        with _no_collection():
            table = np.frombuffer(self.data, np.int64).reshape(-1, self.width)
            self._sink(self.table, _columns(self.columns, table[self.base + self.shift :]))
            kept = _columns(self.columns, table[: len(self._kept_rows)])
            del table
        if len(self._kept_rows):
            self._patch(self.table, self._kept_rows, kept)


class StorageRows(KeptRows):
    """The ``storages`` table (NOTE [ Kept rows ]), with each row's storage address."""

    def __init__(self, sink: Sink, patch: Patch) -> None:
        super().__init__("storages", "free_ns", sink, patch)
        self.address = array.array("q")
        """The ``data_ptr`` of each row in memory, by slot."""

    def add(self, values: tuple[int, ...], address: int) -> int:
        """Append one row and its storage's address; return the row."""
        row = self.append(values)
        self.address.append(address)
        return row

    def _reordered(self, order: np.ndarray, rest: int) -> None:
        address = np.frombuffer(self.address, np.int64)
        address = np.concatenate((address[order], address[rest:]))
        self.address[:] = array.array("q", address.tobytes())

    def device_columns(self) -> Columns:
        """``nbytes``, ``device``, ``alloc_ns`` and ``free_ns`` of the rows in memory, in no
        particular order (NOTE [ Kept rows ]: those of the step under way among them)."""
        with _no_collection():
            table = np.frombuffer(self.data, np.int64).reshape(-1, self.width)
            rows = table[:, [self.index(name) for name in _DEVICE_COLUMNS]]  # a copy
            del table
        return {name: rows[:, i] for i, name in enumerate(_DEVICE_COLUMNS)}
