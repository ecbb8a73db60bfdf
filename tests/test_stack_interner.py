"""The stack interner both writers of stacks use (NOTE [ The stack prefix tree ])."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ckview.trace.schema import NO_INDEX
from ckview.trace.stacks import StackInterner

#: Stacks of frame rows, innermost first, over few frames so that prefixes are shared.
STACK_LISTS = st.lists(st.lists(st.integers(0, 5), max_size=6), max_size=30)


def walk(interner: StackInterner, base: int, row: int) -> list[int]:
    """The frames of stack ``row``, innermost first, by following ``parent`` (naive oracle)."""
    frames = []
    while row != NO_INDEX:
        frame, row = interner.rows[row - base]
        frames.append(frame)
    return frames


def test_no_frames_is_no_stack() -> None:
    interner = StackInterner()
    assert interner.intern([]) == NO_INDEX
    assert interner.rows == []


def test_shared_callers_share_rows() -> None:
    interner = StackInterner()
    a = interner.intern([2, 1, 0])  # 2 called from 1 called from 0
    b = interner.intern([3, 1, 0])
    assert interner.rows == [(0, NO_INDEX), (1, 0), (2, 1), (3, 1)]
    assert (a, b) == (2, 3)
    assert interner.intern([1, 0]) == 1  # a prefix already interned adds nothing
    assert len(interner.rows) == 4


def test_rows_are_numbered_after_the_base_and_columns_slice_from_start() -> None:
    interner = StackInterner(base=10)
    assert interner.intern([7, 8]) == 11
    assert interner.intern([9, 8]) == 12
    columns = interner.columns(1)
    np.testing.assert_array_equal(columns["frame"], [7, 9])
    np.testing.assert_array_equal(columns["parent"], [10, 10])
    assert [len(c) for c in StackInterner().columns().values()] == [0, 0]


@given(STACK_LISTS, st.integers(0, 100))
def test_interned_stacks_walk_back_to_their_frames(stacks: list[list[int]], base: int) -> None:
    interner = StackInterner(base)
    rows = [interner.intern(frames) for frames in stacks]
    for frames, row in zip(stacks, rows, strict=True):
        assert walk(interner, base, row) == frames
    # The same stack gets the same row, different stacks different rows.
    by_stack = {tuple(f): r for f, r in zip(stacks, rows, strict=True)}
    assert len(set(by_stack.values())) == len(by_stack)
    # The format's rules: parents are earlier rows, each (frame, parent) is stored once.
    for i, (_, parent) in enumerate(interner.rows):
        assert parent == NO_INDEX or base <= parent < base + i
    assert len(set(interner.rows)) == len(interner.rows)
