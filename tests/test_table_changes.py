"""What ``take_changes`` reports, against a naive oracle that keeps every row's value at the
last take (NOTE [ Final rows ] in recorder/buffers.py, NOTE [ Kept rows ] in
recorder/storage_rows.py): the rows new since the last take, those that differ from it, and
those rewritten after they were final, each once, with its values as they are."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recorder import storage_rows
from recorder.buffers import MutableTable
from recorder.storage_rows import KeptRows

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

ACTIONS = st.lists(
    st.tuples(st.sampled_from(["append", "set", "end", "rewrite", "take"]), st.integers(0, 99)),
    min_size=20,
    max_size=120,
)


class _Oracle:
    """The table as the hot path writes it, kept whole, and the rows as the takes rebuild it."""

    def __init__(self, table: MutableTable, final: int | None) -> None:
        self.table, self.final = table, final
        self.truth: list[list[int]] = []  # every row as written
        self.taken: dict[int, list[int]] = {}  # every row as the takes rebuild it
        self.late: set[int] = set()  # final rows rewritten since the last take

    def is_open(self, row: int) -> bool:
        return self.final is None or self.truth[row][self.final] < 0

    def append(self, value: int) -> None:
        values = [value + i for i in range(self.table.width)]
        if self.final is not None:
            values[self.final] = -1
        row = self.table.append(tuple(values))
        assert row == len(self.truth)
        self.truth.append(values)
        if isinstance(self.table, KeptRows) and value % 3 == 0:
            self.table.pinned.add(row)  # may be rewritten once final

    def set(self, row: int, column: int, value: int) -> None:
        self.table.set(row, self.table.columns[column].name, value)
        self.truth[row][column] = value

    def rewrite(self, row: int, column: int, value: int) -> None:
        self.set(row, column, value)
        self.table.rewritten(row)
        self.late.add(row)

    def take(self) -> None:
        seen = len(self.taken)
        rows, values = self.table.take_changes()
        expected = set(range(seen, len(self.truth))) | {r for r in self.late if r < seen}
        expected |= {r for r in range(seen) if self.taken[r] != self.truth[r]}
        assert sorted(rows.tolist()) == sorted(expected), (rows, expected)
        assert len(set(rows.tolist())) == len(rows)
        for row, got in zip(rows.tolist(), values.reshape(-1, self.table.width), strict=True):
            assert got.tolist() == self.truth[row], row
            self.taken[row] = list(self.truth[row])
        self.late.clear()


def _play(oracle: _Oracle, actions: list[tuple[str, int]]) -> None:
    """Write the table as the recorder may (NOTE [ Final rows ]): open rows freely, final rows
    only when pinned, and saying so."""
    kept = oracle.table if isinstance(oracle.table, KeptRows) else None
    for action, n in actions:
        rows = len(oracle.truth)
        column = n % oracle.table.width
        if action == "append" or not rows:
            oracle.append(n * 10)
            continue
        row = n % rows
        resident = kept is None or kept.holds(row)
        if action == "take":
            oracle.take()
        elif action in ("set", "end") and resident and oracle.is_open(row):
            if action == "end" and oracle.final is not None:
                column = oracle.final
            oracle.set(row, column, n + 1000)
        elif action == "rewrite" and resident and not oracle.is_open(row):
            pinned = kept is None or row in kept.pinned
            if pinned:
                oracle.rewrite(row, column, n + 2000)
    oracle.take()


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_a_table_without_final_rows_reports_each_change(actions: list[tuple[str, int]]) -> None:
    _play(_Oracle(MutableTable("steps"), None), actions)


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_a_table_with_final_rows_reports_each_change(actions: list[tuple[str, int]]) -> None:
    table = MutableTable("module_calls")
    table.final_once_set("end_ns")
    _play(_Oracle(table, table.index("end_ns")), actions)


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_kept_rows_report_each_change_as_rows_leave_memory(
    actions: list[tuple[str, int]],
) -> None:
    """Rows leave memory at (nearly) every take here, and the open rows' slots move."""
    written: list[Any] = []
    batch = storage_rows.BATCH_ROWS
    storage_rows.BATCH_ROWS = 2
    try:
        table = KeptRows(
            "module_calls", "end_ns", lambda *a: written.append(a), lambda *a: written.append(a)
        )
        _play(_Oracle(table, table.index("end_ns")), actions)
    finally:
        storage_rows.BATCH_ROWS = batch
