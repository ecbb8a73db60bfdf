"""One run's tables while it is recorded, their column positions, and the recording's state.

Rows are int64 and row-major (recorder/buffers.py); the hot path writes them through the
column positions below (NOTE [ Hot-path buffers ] in buffers.py).
"""

from __future__ import annotations

import array
from collections.abc import Callable
from enum import Enum

from ckview.trace.schema import NO_INDEX, RUN_TABLES
from recorder.buffers import MutableTable, RowBuffer, Sink
from recorder.storage_rows import KeptRows, Patch, StorageRows


def _index(table: str, name: str) -> int:
    return [c.name for c in RUN_TABLES[table]].index(name)


ST_WIDTH = len(RUN_TABLES["storages"])
ST_NBYTES, ST_DEVICE, ST_CATEGORY, ST_DTYPE, ST_SHAPE = (
    _index("storages", name) for name in ("nbytes", "device", "category", "dtype", "shape")
)
ST_OP, ST_CALL, ST_MODULE, ST_ALLOC_NS, ST_FREE_NS, ST_STACK = (
    _index("storages", name)
    for name in ("op", "module_call", "module", "alloc_ns", "free_ns", "stack")
)
OP_START = _index("ops", "start_ns")
OP_CALL = _index("ops", "module_call")
CALL_WIDTH = len(RUN_TABLES["module_calls"])  # column 0 of a call row is its module
CALL_PHASE, CALL_END_NS, CALL_SEQ_END = (
    _index("module_calls", name) for name in ("phase", "end_ns", "seq_end")
)


class State(Enum):
    WARMUP = "warmup"
    RECORDING = "recording"
    TIMING = "timing"  # unrecorded plain steps of each run, after all are recorded (timing.py)
    BETWEEN_RUNS = "between runs"  # a run ended, the next begins at once (same step boundary)
    SETTLING = "settling"  # unrecorded, in the next run's context (runs.py: compiled code)
    DONE = "done"


class Flags:
    """What every part of the recorder reads: the recording's state; ``busy`` while the
    recorder runs ops of its own (writing, detaching), which the op hook then leaves out; and
    ``no_modules`` while no module has run forward (NOTE [ A forward without modules ] in
    hooks.py); ``compiled_forwards`` once such a loop's forwards begin at compiled calls (NOTE
    [ A compiled call begins a forward ] in hooks.py)."""

    __slots__ = ("busy", "compiled_forwards", "no_modules", "state")

    def __init__(self) -> None:
        self.state = State.WARMUP
        self.busy = False
        self.no_modules = False
        self.compiled_forwards = False

    @property
    def sees_forwards(self) -> bool:
        """Whether a hook sees each forward begin (a module call, or a compiled call): else
        the step ends where a backward ends (NOTE [ A forward without modules ] in hooks.py)."""
        return not self.no_modules or self.compiled_forwards


class RunTables:
    """One run's tables: appended ones (RowBuffer, written in batches to ``sink``) and ones that
    stay editable until the run ends (MutableTable); every run is self-contained (rows index
    its own tables)."""

    def __init__(self, name: str, sink: Sink, intern: Callable[[str], int], patch: Patch) -> None:
        self.name = name
        self.intern = intern
        """String ids of the trace's string table."""
        self.ops = RowBuffer("ops", sink)
        self.mem = RowBuffer("memory_events", sink)
        self.saved = RowBuffer("saved_events", sink)
        self.io = RowBuffer("module_io", sink)
        self.storages = StorageRows(sink, patch)  # NOTE [ Kept rows ]
        self.calls = KeptRows("module_calls", "end_ns", sink, patch)  # NOTE [ Kept rows ]
        self.steps = MutableTable("steps")
        self.steps.final_once_set("end_ns")  # NOTE [ Final rows ] in buffers.py
        self.regions = MutableTable("recompute_regions")
        self.regions.final_once_set("end_ns")
        self.op_stacks = array.array("q")  # the stack of each buffered op, with --stacks
        self.step = 0
        """The run's step under way."""
        self.t0 = 0
        """When the run's first recorded step began (perf_counter_ns): times are since then."""

    @property
    def appended(self) -> tuple[RowBuffer, ...]:
        return (self.ops, self.mem, self.saved, self.io)

    @property
    def editable(self) -> tuple[MutableTable, ...]:
        """The tables whose rows change after they are appended (the journal compares them)."""
        return (self.storages, self.calls, self.steps, self.regions)

    @property
    def written_as_they_go(self) -> tuple[KeptRows, ...]:
        """The editable tables written as rows become final (NOTE [ Kept rows ] in
        storage_rows.py): ``finish`` them when the run ends."""
        return (self.storages, self.calls)

    @property
    def written_at_end(self) -> tuple[MutableTable, ...]:
        """The editable tables written whole when the run ends."""
        return (self.steps, self.regions)

    def stack_of(self, op: int) -> int:
        """The stack row of buffered op ``op`` (-1 without --stacks or for an older op)."""
        at = op - (self.ops.rows - len(self.op_stacks))
        return self.op_stacks[at] if 0 <= at < len(self.op_stacks) else NO_INDEX
