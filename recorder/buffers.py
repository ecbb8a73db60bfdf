"""Fixed-width column buffers for the recorder's hot path.

Each column is an ``array.array`` of the schema's width: appending a Python int to one costs
tens of nanoseconds and creates no GC-tracked object, unlike a tuple or dict per event (see
DESIGN.md, "Hot path"). A table buffer hands full batches to the trace writer as numpy views.
"""

from __future__ import annotations

import array
from collections.abc import Callable

import numpy as np

from ckview.trace.schema import RUN_TABLES, Column

_TYPECODES = {"<i1": "b", "|u1": "B", "<i4": "i", "<i8": "q"}


def _typecode(column: Column) -> str:
    code = _TYPECODES.get(column.dtype.str)
    if code is None or array.array(code).itemsize != column.dtype.itemsize:
        raise TypeError(f"no array typecode for column {column.name} ({column.dtype})")
    return code


class TableBuffer:
    """Append-only columns of one run table, flushed in batches to ``sink``.

    ``rows`` counts every row ever appended (flushed or not), so a row's index in the trace is
    known the moment it is appended.
    """

    def __init__(
        self,
        table: str,
        sink: Callable[[str, dict[str, np.ndarray]], None] | None,
        batch_rows: int = 1 << 16,
    ) -> None:
        self.table = table
        self.columns = RUN_TABLES[table]
        self.data = {c.name: array.array(_typecode(c)) for c in self.columns}
        self._sink = sink
        self._batch_rows = batch_rows
        self._flushed = 0

    @property
    def rows(self) -> int:
        return self._flushed + len(self.data[self.columns[0].name])

    def col(self, name: str) -> array.array:
        """The raw column, for binding ``append`` to a local in hot loops."""
        return self.data[name]

    def full(self) -> bool:
        return len(self.data[self.columns[0].name]) >= self._batch_rows

    def flush(self) -> None:
        """Hand the buffered rows to the sink and start a new batch."""
        # Swap in fresh columns first: a free callback may append while the batch is written.
        # A row cut short by an exception mid-append is dropped (min length).
        data, self.data = self.data, {c.name: array.array(_typecode(c)) for c in self.columns}
        pending = min(len(col) for col in data.values())
        if pending == 0 or self._sink is None:
            return
        batch = {
            c.name: np.frombuffer(data[c.name], dtype=c.dtype, count=pending).copy()
            for c in self.columns
        }
        self._flushed += pending
        self._sink(self.table, batch)


class MutableTable:
    """Rows that stay editable until recording stops (storages, module calls, steps).

    A storage's category is refined while recording (a temporary becomes an activation when
    autograd saves it, a gradient once ``param.grad`` points to it) and a module call's end is
    known only when it returns, so these rows are written once, when recording stops.
    """

    def __init__(self, table: str) -> None:
        self.table = table
        self.columns = RUN_TABLES[table]
        self.data = {c.name: array.array(_typecode(c)) for c in self.columns}

    def __len__(self) -> int:
        return len(self.data[self.columns[0].name])

    def col(self, name: str) -> array.array:
        return self.data[name]

    def as_columns(self) -> dict[str, np.ndarray]:
        return {
            c.name: np.frombuffer(self.data[c.name], dtype=c.dtype).copy() for c in self.columns
        }
