"""The allocator's events as a source: a profiler window per step, merged into the window's op
and memory rows before they are written (NOTE [ Allocator events ] in recorder/allocations.py).
"""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import numpy as np

from ckview.trace.schema import NO_INDEX, Category
from recorder.allocations import AllocatorEvents, AllocatorMerge, AllocatorWindow, Block
from recorder.sources.base import RunPart
from recorder.tables import (
    OP_CALL,
    OP_START,
    ST_ALLOC_NS,
    ST_CALL,
    ST_CATEGORY,
    ST_DEVICE,
    ST_DTYPE,
    ST_FREE_NS,
    ST_MODULE,
    ST_NBYTES,
    ST_OP,
    ST_SHAPE,
    ST_STACK,
    ST_WIDTH,
    Flags,
    RunTables,
)

_TEMPORARY = int(Category.TEMPORARY)


class AllocatorSource:
    """Every block the allocator hands out and takes back, matched to the storages the op hook
    saw; blocks no storage claims become storage rows of their own (NOTE [ Matching blocks ]).
    ``stacks``: rows get the stack of their op (``--stacks``)."""

    def __init__(self, flags: Flags, stacks: bool) -> None:
        self._flags = flags
        self._stacks = stacks
        self._events = AllocatorEvents()
        self._merge = AllocatorMerge()
        self._tables: RunTables | None = None

    @property
    def running(self) -> bool:
        """A window is open."""
        return self._events.running

    def install(self) -> Callable[[], None]:
        return self._events.yield_to_the_script()

    def begin_run(self, run: RunTables) -> None:
        self._tables = run
        self._merge = AllocatorMerge()

    def step_begins(self, now: int) -> None:
        self.open_window()

    def step_ends(self, now: int) -> None:
        self.close_window()

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        self.close_window()
        return RunPart()

    def meta(self) -> dict[str, Any]:
        """The trace's ``allocator_events`` (NOTE [ Allocator events ] in allocations.py)."""
        missing = self._events.unavailable
        return {"allocator_events": f"op hook: {missing}" if missing else "allocator"}

    def open_window(self) -> None:
        self._events.start()

    def close_window(self) -> None:
        """Merge the allocator's events of the window into its rows and write them."""
        run = self._tables
        if run is None:
            return
        flags = self._flags
        busy, flags.busy = flags.busy, True
        try:
            window = self._events.stop()
            if window is not None:
                self._merge_window(run, window)
            run.ops.flush()
            run.mem.flush()
            del run.op_stacks[:]
        finally:
            flags.busy = busy

    def give_up(self, why: str) -> None:
        """No more windows in this recording: the window open now is merged first."""
        self.close_window()
        self._events.give_up(why)

    def stop(self) -> None:
        """The recorder is removed: a window left open by a failure is dropped (the profiler is
        the user's again)."""
        self._events.stop()

    def _merge_window(self, run: RunTables, window: AllocatorWindow) -> None:
        mem, ops = run.mem, run.ops
        # Copies: a live numpy view of an array.array would keep it from growing. A free that
        # the garbage collector runs meanwhile is appended after the window's rows.
        taken = len(mem.data)
        events = np.frombuffer(mem.data, dtype=np.int64).reshape(-1, mem.width).copy()
        op_rows = np.frombuffer(ops.data, dtype=np.int64).reshape(-1, ops.width).copy()
        first_op = ops.rows - len(op_rows)
        # Gathered for the window's rows alone (fancy indexing copies): a cost per window that
        # does not grow with the run. No view outlives this line (``_add_workspaces`` appends).
        storages = run.storages
        st_data = storages.data
        slots = storages.slots(events[:, 1])  # NOTE [ Kept rows ] in storage_rows.py
        address = np.frombuffer(storages.address, dtype=np.int64)[slots]
        nbytes = np.frombuffer(st_data, dtype=np.int64)[slots * ST_WIDTH + ST_NBYTES]
        del slots

        def workspaces(blocks: list[Block], ops: np.ndarray) -> int:
            local = ops - first_op
            calls = np.full(len(ops), NO_INDEX, dtype=np.int64)
            calls[local >= 0] = op_rows[local[local >= 0], OP_CALL]
            return self._add_workspaces(run, blocks, ops, calls)

        start = op_rows[:, OP_START]
        merged = self._merge.merge(window, events, address, nbytes, start, first_op, workspaces)
        mem.data = array.array("q", merged.tobytes()) + mem.data[taken:]
        for block in self._merge.touched:
            at = storages.slot(block.storage) * ST_WIDTH
            if block.alloc_ns >= 0 and st_data[at + ST_ALLOC_NS] >= 0:  # an ALLOC's block
                st_data[at + ST_NBYTES] = block.nbytes
                st_data[at + ST_ALLOC_NS] = block.alloc_ns
            if block.free_ns >= 0:
                st_data[at + ST_FREE_NS] = block.free_ns
        self._merge.touched.clear()

    def _add_workspaces(
        self, run: RunTables, blocks: list[Block], ops: np.ndarray, calls: np.ndarray
    ) -> int:
        """Storage rows for memory only the allocator saw (NOTE [ Matching blocks ]): temporaries
        of the op running when each block was allocated. Returns the first row."""
        storages = run.storages
        first = len(storages)
        modules = np.full(len(calls), NO_INDEX, dtype=np.int64)
        in_call = calls >= 0
        modules[in_call] = run.calls.column(calls[in_call], "module")  # NOTE [ Kept rows ]
        devices = {name: run.intern(name) for name in {block.device for block in blocks}}
        unknown = run.intern("")
        rows = np.empty((len(blocks), ST_WIDTH), dtype=np.int64)
        rows[:, ST_NBYTES] = [block.nbytes for block in blocks]
        rows[:, ST_DEVICE] = [devices[block.device] for block in blocks]
        rows[:, ST_CATEGORY] = _TEMPORARY
        rows[:, ST_DTYPE] = rows[:, ST_SHAPE] = unknown
        rows[:, ST_OP], rows[:, ST_CALL], rows[:, ST_MODULE] = ops, calls, modules
        rows[:, ST_ALLOC_NS] = [block.alloc_ns for block in blocks]
        rows[:, ST_FREE_NS] = [block.free_ns for block in blocks]
        stacks = [run.stack_of(int(op)) for op in ops] if self._stacks else NO_INDEX
        rows[:, ST_STACK] = stacks
        storages.data.frombytes(rows.tobytes())
        storages.address.frombytes(np.array([b.address for b in blocks], np.int64).tobytes())
        return first
