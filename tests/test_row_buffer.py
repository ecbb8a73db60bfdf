"""A run table's row buffer (``RowBuffer``, NOTE [ Blocks of rows ] in recorder/buffers.py),
against a list of every row appended: rows appended one at a time and in blocks keep their
order, through flushes to the trace, the journal's takes and a step's rows put in order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recorder.buffers import RowBuffer

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

ACTIONS = st.lists(
    st.tuples(st.sampled_from(["row", "block", "take", "flush", "reorder"]), st.integers(0, 5)),
    min_size=10,
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ACTIONS)
def test_rows_keep_their_order_through_blocks_flushes_and_takes(actions: list) -> None:
    batches: list[np.ndarray] = []
    buf = RowBuffer("memory_events", lambda _, columns: batches.append(_rows(columns)))
    width = buf.width
    rows: list[list[int]] = []  # every row, as the buffer should hold it
    taken = flushed = 0
    for action, n in actions:
        if action == "row":
            rows.append([len(rows)] * width)
            buf.data.extend(rows[-1])
        elif action == "block":
            block = [[len(rows) + i] * width for i in range(n)]
            rows += block
            buf.append_rows(np.asarray(block, np.int64).reshape(-1, width))
        elif action == "take":
            got = buf.take_rows().reshape(-1, width)
            assert got.tolist() == rows[taken:]
            taken = len(rows)
        elif action == "flush":
            buf.flush()
            flushed = len(rows)
        else:  # a step's rows since the last take, put in another order (the memory events')
            start = max(taken, flushed)
            assert buf.since(taken).tolist() == rows[start:]
            rows[start:] = rows[start:][::-1]
            buf.replace_since(taken, np.asarray(rows[start:], np.int64).reshape(-1, width))
        assert buf.rows == len(rows)
        assert buf.buffered == (len(rows) - flushed) * width
    written = np.concatenate(batches) if batches else np.zeros((0, width), np.int64)
    assert written.tolist() == rows[:flushed]
    assert buf.since(0).tolist() == rows[flushed:]


def _rows(columns: dict[str, np.ndarray]) -> np.ndarray:
    return np.stack([column.astype(np.int64) for column in columns.values()], axis=1)
