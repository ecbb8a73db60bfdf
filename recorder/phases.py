"""Where the step is: forward, backward, recompute, optimizer; the open module calls; which
forward module call a backward op belongs to; recompute regions.

NOTE [ Autograd nodes stay unwrapped ]
Asking torch for the autograd node that runs a backward op (``_current_autograd_node()``) gives
the node a Python object, and (torch 2.13) a node keeps its Python object for as long as it
lives. A graph whose nodes have Python objects is freed recursively, one C stack frame chain per
node: 40,000 of them in one chain overflow an 8 MiB stack and the process dies with SIGSEGV when
the graph is dropped (a chain of 100,000 scalar adds, as in a checkpointing tutorial's
HeavyModel; plain torch does the same to any script that touches ``grad_fn`` of that many
nodes). So the recorder tells "in backward" by ``_current_graph_task_id()``, which creates
nothing, and asks for the node, to attribute backward ops to module calls through its sequence
number, for at most ``_NODE_BUDGET`` nodes per backward pass; past that, ops keep the last
attribution and ``seq_nr`` -1.

NOTE [ Recompute regions ]
A region opens when the recompute depth goes 0 -> 1 and closes at 1 -> 0. Three sources nest
inside each other and all count: ckpt_runtime's markers (they know the region id and target),
torch.utils.checkpoint's recomputation hook (non-reentrant; no target), and module forward calls
inside backward (reentrant checkpoint, or the first module of a region that no outer source
named). Ops while the depth is above 0 are RECOMPUTE.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from time import perf_counter_ns

import numpy as np

from ckview.trace.schema import NO_INDEX, Phase
from recorder._torch import current_node_seq, queue_backward_callback, sequence_nr
from recorder.modules import ModuleRegistry
from recorder.tables import (
    CALL_END_NS,
    CALL_PHASE,
    CALL_SEQ_END,
    CALL_WIDTH,
    Flags,
    RunTables,
    State,
)

FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER, OTHER = (int(p) for p in Phase)
_NODE_BUDGET = 8192  # NOTE [ Autograd nodes stay unwrapped ]: 5x below the crash depth


class PhaseState:
    """The phase of the op running now and the module call it runs in.

    ``stack`` holds the open module calls as (module row, call row or -1).
    """

    def __init__(self, flags: Flags, registry: ModuleRegistry) -> None:
        self._flags = flags
        self._registry = registry
        self.on_backward_end: Callable[[], None] = _nothing
        """Called at the end of each backward pass (queued when backward begins)."""
        self._tables: RunTables | None = None
        self.in_backward = False
        self.optimizer_depth = 0  # > 0 inside optimizer.step(), 0 again inside its closure
        self.recompute_depth = 0
        self.top_phase = OTHER
        self.stack: list[tuple[int, int]] = []
        self._node_budget = _NODE_BUDGET
        self._open_region = NO_INDEX
        self._region_inferred = False
        # backward op -> forward module call, via autograd sequence numbers
        self._fw_seq_begin: list[int] = []
        self._fw_calls: list[int] = []
        self.last_seq = -2
        self.last_seq_call = NO_INDEX

    def begin_run(self, tables: RunTables) -> None:
        """A run's fresh tables: module calls open now have no row in them."""
        self._tables = tables
        tables.calls.on_drop.append(self._forget_calls)
        self._fw_seq_begin, self._fw_calls = [], []
        self.last_seq, self.last_seq_call = -2, NO_INDEX
        self.stack = [(row, NO_INDEX) for row, _ in self.stack]
        self._open_region = NO_INDEX

    def enter_backward(self, queue: bool = True) -> None:
        """Backward begins; ``queue``: its end comes from autograd's final callback (else the
        caller says it, as ``_torch.bracket_backward`` does on the native path)."""
        self.in_backward = True
        self.top_phase = BACKWARD
        self._node_budget = _NODE_BUDGET
        if queue:
            queue_backward_callback(self.on_backward_end)

    def backward_ended(self) -> None:
        self.in_backward = False
        self.recompute_depth = 0
        self._close_region()
        self.top_phase = OTHER

    def node_seq(self) -> int:
        """Sequence number of the autograd node running now; -1 if none, or -2 once this
        backward's node budget is spent (NOTE [ Autograd nodes stay unwrapped ])."""
        if self._node_budget <= 0:
            return -2
        seq = current_node_seq()
        if seq is None:
            return -1
        if seq != self.last_seq:
            self._node_budget -= 1
        return seq

    def backward_call(self, seq: int) -> int:
        """The forward module call whose ops created the autograd node numbered ``seq``."""
        if seq == self.last_seq:
            return self.last_seq_call
        i = bisect_right(self._fw_seq_begin, seq) - 1
        call = self._fw_calls[i] if i >= 0 else NO_INDEX
        calls = self._run.calls
        while call != NO_INDEX:
            end = calls.get(call, "seq_end")
            if end == -1 or seq < end:
                break
            call = calls.get(call, "parent")
            if call != NO_INDEX and not calls.holds(call):
                call = NO_INDEX  # NOTE [ Forward calls of past steps ]
        self.last_seq, self.last_seq_call = seq, call
        return call

    # NOTE [ Forward calls of past steps ]
    # A backward looks up the forward calls of its own step, or the step before at most (a
    # backward after the step's boundary), and those stay in memory (NOTE [ Kept rows ] in
    # storage_rows.py): when call rows leave memory, they leave the lookup too, which so
    # stays as long as a step or two whatever the run's length (issue 21, defect 6). A node
    # made earlier than that (a graph kept across steps) finds no call. So does a node made in
    # a call that spans steps after a child call returned, once the call returned and left
    # memory; while it runs, it is kept.
    def _forget_calls(self) -> None:
        """Call rows left memory: forget them (NOTE [ Forward calls of past steps ])."""
        calls = self._run.calls
        rows = np.asarray(self._fw_calls, np.int64)
        kept = calls.resident(rows)
        self._fw_calls = rows[kept].tolist()
        self._fw_seq_begin = np.asarray(self._fw_seq_begin, np.int64)[kept].tolist()
        if self.last_seq_call != NO_INDEX and not calls.holds(self.last_seq_call):
            self.last_seq, self.last_seq_call = -2, NO_INDEX

    @property
    def _run(self) -> RunTables:
        assert self._tables is not None, "no run begun"
        return self._tables

    # ------------------------------------------------------------------------- module calls

    def open_call(self, module_row: int) -> int:
        """A module call begins while recording: its row (a recompute inside backward)."""
        run, stack = self._tables, self.stack
        assert run is not None, "no run begun"
        phase = RECOMPUTE if self.in_backward else FORWARD
        seq = sequence_nr()
        parent = stack[-1][1] if stack else NO_INDEX
        call = run.calls.append(
            (module_row, parent, phase, run.step, perf_counter_ns(), -1, seq, -1)
        )
        if phase == RECOMPUTE:
            self.recompute_enter(NO_INDEX, module_row)
        else:
            self._fw_seq_begin.append(seq)
            self._fw_calls.append(call)
        return call

    def close_call(self, call: int) -> None:
        """A module call opened while recording returns."""
        run = self._tables
        assert run is not None, "no run begun"
        calls = run.calls
        at, data = calls.slot(call) * CALL_WIDTH, calls.data  # one row, written in place
        data[at + CALL_END_NS] = perf_counter_ns()
        data[at + CALL_SEQ_END] = sequence_nr()
        if data[at + CALL_PHASE] == RECOMPUTE:
            self.recompute_exit()

    def module_running(self) -> str:
        """Path of the module call the current op runs in (in backward: the forward call of the
        last attributed node), '' if none."""
        if self.in_backward and not self.recompute_depth:
            call = self.last_seq_call
            row = NO_INDEX if call == NO_INDEX else self._run.calls.get(call, "module")
        else:
            row = self.stack[-1][0] if self.stack else NO_INDEX
        return "" if row == NO_INDEX else self._registry.display(row)

    # ------------------------------------------------------------------------- recompute

    def recompute_enter(self, region: int, module: int, name: str | None = None) -> None:
        """A recompute begins (NOTE [ Recompute regions ])."""
        recording = self._flags.state is State.RECORDING
        if self.recompute_depth == 0 and recording:
            run = self._run
            label = run.intern(name or (self._registry.display(module) if module >= 0 else ""))
            self._open_region = run.regions.append(
                (region, module, label, run.step, perf_counter_ns(), -1, run.ops.rows, -1)
            )
            self._region_inferred = module == NO_INDEX and name is None
        elif self._open_region != NO_INDEX and recording:
            self._refine_region(region, module)
        self.recompute_depth += 1

    def _refine_region(self, region: int, module: int) -> None:
        """A marker inside the open region: torch's own checkpoint opened it (id -1), and a
        plan's op-level region names itself inside (ckpt_runtime.apply), so it is the plan's;
        a region opened without a target widens to the modules it runs."""
        regions = self._run.regions
        if region >= 0 and regions.get(self._open_region, "region") < 0:
            regions.set(self._open_region, "region", region)
        if self._region_inferred and module >= 0:
            self._widen_region(module)

    def _widen_region(self, module: int) -> None:
        """A region opened without a target (torch's recompute of `layer.forward`, as HF does)
        belongs to the common ancestor of the modules it runs."""
        regions, registry = self._run.regions, self._registry
        current = regions.get(self._open_region, "module")
        owner = module if current == NO_INDEX else registry.common_ancestor(current, module)
        if owner != current:
            regions.set(self._open_region, "module", owner)
            regions.set(self._open_region, "name", self._run.intern(registry.display(owner)))

    def recompute_exit(self) -> None:
        self.recompute_depth = max(0, self.recompute_depth - 1)
        if self.recompute_depth == 0:
            self._close_region()

    def _close_region(self) -> None:
        if self._open_region != NO_INDEX and self._flags.state is State.RECORDING:
            regions = self._run.regions
            regions.set(self._open_region, "end_ns", perf_counter_ns())
            regions.set(self._open_region, "end_op", self._run.ops.rows)
        self._open_region = NO_INDEX

    # Listener protocol of ckpt_runtime.markers.
    def on_recompute_begin(self, region_id: int, target: object) -> None:
        module = self._registry.row(target)
        name = None if module is not None else getattr(target, "__qualname__", repr(target))
        self.recompute_enter(region_id, NO_INDEX if module is None else module, name)

    def on_recompute_end(self, region_id: int, target: object) -> None:
        self.recompute_exit()


def _nothing() -> None:
    pass
