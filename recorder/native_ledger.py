"""The storage ledger of the native path (``CKVIEW_RECORDER=native``): ops and allocator blocks
come from the native extension (recorder/native), drained and attributed once per step with
numpy, instead of from the Python dispatch mode and the profiler's allocator windows.

NOTE [ The native ledger ]
- Every allocator block allocated while a run records is one storage row, written when the step
  that allocated it ends (rows stay editable until the run ends: a later step may free it, save
  it or find it among the gradients). Ops are the extension's RecordFunction ranges (names such
  as ``aten.mm.default``, NOTE [ Interning op names ] in ckrec.cpp; ranges nest); an op still
  open at the boundary (``Optimizer.step``) is cut there.
- Storages that exist before the run (parameters, the optimizer's state, a batch made during
  warmup) are not blocks of the run: the Python ledger registers them as SEEN rows, as it does
  on its own path, when the step boundary reads the parameter, gradient and optimizer pointer
  sets (``mark_training_state``), or a module's inputs and a saved tensor name them.
- What Python sees during a step (a gradient or optimizer state marked at the optimizer's
  hooks, a module's inputs and outputs, a tensor that checkpoint's own saved-tensor hooks kept)
  is noted as (data pointer, time) and resolved at the step's end, against the blocks alive at
  that time; one that is no block of the run falls back to the Python ledger (SEEN), while its
  tensor is alive. Only weak references are held (NOTE [ Never hold a user tensor ]).
- Categories: OTHER for blocks made outside forward, backward and optimizer (promoted to INPUT
  when a module takes them or autograd saves them), else TEMPORARY; ACTIVATION for blocks
  autograd packed; PARAMETER, GRADIENT and OPTIMIZER_STATE from the pointer sets; the strongest
  wins (``CATEGORY_PRIORITY``), as in ``StorageLedger._promote``.
- Phases: FORWARD, BACKWARD and OTHER from the rows; OPTIMIZER between the optimizer's pre and
  post hooks, less the closure it calls (``closure_runs``), RECOMPUTE inside the recompute
  regions the Python phases record. Module calls are the Python hooks' rows: each native call
  is the Python call that began last before it (both hooks fire for every call, the Python one
  first).
"""

from __future__ import annotations

from array import array
from time import perf_counter_ns
from typing import Any

import numpy as np
import torch

from ckview.trace.schema import (
    CATEGORY_PRIORITY,
    NO_INDEX,
    Category,
    MemoryEventKind,
    Phase,
    SavedEventKind,
)
from recorder._torch import local, storage_of, tensors_in
from recorder.buffers import MutableTable
from recorder.compiled import COMPILED_REGIONS
from recorder.ledger import StorageLedger, StorageRef
from recorder.native.attribute import Attribution, Columns, LayoutIds, StepFacts
from recorder.native.maps import Blocks, CallMap, OpMap, intervals
from recorder.native.rows import Rows, drain
from recorder.oom import OomNote, requested_bytes, says_allocation_failed
from recorder.phases import FORWARD, OTHER
from recorder.tables import CALL_WIDTH, ST_CATEGORY, ST_MODULE, ST_WIDTH, RunTables, State

_RANK = np.zeros(len(Category), np.int64)
for _rank, _cat in enumerate(CATEGORY_PRIORITY):
    _RANK[_cat] = _rank

_ALLOC, _FREE = int(MemoryEventKind.ALLOC), int(MemoryEventKind.FREE)
_PACK = int(SavedEventKind.PACK)
_TEMPORARY, _OTHER = int(Category.TEMPORARY), int(Category.OTHER)
_ACTIVATION = int(Category.ACTIVATION)
_COMM = int(Category.COMM_BUFFER)
_BACKWARD_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION, the scope of a backward node's range
_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)  # fmt: skip


class NativeLedger(StorageLedger):
    """The ledger of the native path (NOTE [ The native ledger ]); ``ext`` is the loaded
    extension. Its step boundaries come through :class:`NativeRowsSource`."""

    def __init__(self, ext: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ext = ext
        self._dtype_names = {
            int(ext.dtype_code(torch.empty(0, dtype=d))): _name(d) for d in _DTYPES
        }
        self._name_ids = np.zeros(0, np.int64)  # extension name index -> string id
        self._name_is_op = np.zeros(0, np.uint8)  # whether it is a dispatcher op's
        self._name_is_compiled = np.zeros(0, bool)  # whether it is a compiled forward's range
        self._reset()

    def _reset(self) -> None:
        self._attribution = Attribution()
        self._deferring = False  # the run's first step began: marks wait for its rows
        self._blocks = Blocks()
        self._optimizer_spans: list[list[int]] = []
        self._in_backward = False
        self._backward_starts: list[int] = []
        self._calls_at_step = 0
        self._regions_at_step = 0  # recompute regions placed among the ops already
        self._seen_keys: dict[int, int] = {}  # storage row -> its key in the extension
        self._mem_mark = 0  # memory rows before the step under way (absolute)
        self._last_op: tuple[int, int, int, int] | None = None  # NOTE [ OOM capture on the ...
        self._calls_t, self._calls_stack = array("q"), array("q")  # NOTE [ Stacks on the ...

    def begin_run(self, tables: RunTables) -> None:
        super().begin_run(tables)
        tables.storages.final_once_set("free_ns")  # NOTE [ Final rows ] in buffers.py
        self._layout_ids_of = LayoutIds(tables.intern, self._dtype_names)
        self._reset()

    # ------------------------------------------------------------------ what Python sees

    def flush(self) -> None:
        """Write the buffered rows (no allocator window to wait for on this path)."""
        flags = self._flags
        flags.busy = True
        try:
            for buf in self._tables.appended:
                buf.flush()
            del self._op_stacks[:]
        finally:
            flags.busy = False

    def mark(self, t: torch.Tensor, category: int, owner: torch.Tensor | None = None) -> None:
        if not self._deferring:
            super().mark(t, category, owner)
            return
        module = self._registry.owner(owner if owner is not None else t)
        self._note([t], 0, category, [module])

    def mark_gradients(self) -> None:
        if not self._deferring:
            super().mark_gradients()
            return
        if self._phases.optimizer_depth:
            self._optimizer_spans.append([perf_counter_ns(), -1])
            self._pause_inputs()
        owner = self._registry.owner
        grads, modules = [], []
        for p in self.parameters():
            if p.grad is not None:
                grads.append(p.grad)
                modules.append(owner(p))
        self._note(grads, 0, int(Category.GRADIENT), modules)

    def mark_optimizer_tensors(self) -> None:
        if not self._deferring:
            super().mark_optimizer_tensors()
            return
        owner = self._registry.owner
        found, modules = [], []
        for opt in list(self.optimizers):
            for param, state in opt.state.items():
                module = owner(param)
                for value in state.values():  # tensors, or lists of them (L-BFGS's history)
                    for tensor in tensors_in(value):
                        found.append(tensor)
                        modules.append(module)
        self._note(found, 0, int(Category.OPTIMIZER_STATE), modules)
        if self._optimizer_spans and self._optimizer_spans[-1][1] < 0:
            self._optimizer_spans[-1][1] = perf_counter_ns()
            self._pause_inputs()

    def shared_input(self, t: torch.Tensor) -> None:
        """A tensor rebuilt from another process's shared memory (a DataLoader worker's batch)
        is an input, also one the recorded steps never use (NOTE [ Inputs and their sources ]
        in ledger.py: the Python path tells it by its shared storage when it first sees it)."""
        if self._flags.state is State.RECORDING:
            self.mark(t, int(Category.INPUT))

    def comm_buffer(self, t: torch.Tensor) -> None:
        """FSDP filled its communication buffer ``t`` (NOTE [ FSDP's storages ] in ledger.py:
        no op hook sees ``fsdp.all_gather_copy_in`` or ``fsdp.chunk_cat`` name it here)."""
        if self._flags.state is State.RECORDING:
            self.mark(t, _COMM)

    def closure_runs(self, running: bool) -> None:
        """The closure cuts the optimizer's span: its ops are FORWARD and BACKWARD (L-BFGS,
        Lightning's ``step(closure=...)``); the optimizer's own ops after it are OPTIMIZER."""
        if not self._deferring:
            return
        spans, now = self._optimizer_spans, perf_counter_ns()
        if running and spans and spans[-1][1] < 0:
            spans[-1][1] = now
        elif not running and self._phases.optimizer_depth:
            spans.append([now, -1])
        self._pause_inputs()

    def _pause_inputs(self) -> None:
        """Op inputs are not needed in backward or the optimizer's step (NOTE [ Op inputs
        outside modules ] in ckrec.cpp)."""
        optimizer = bool(self._optimizer_spans) and self._optimizer_spans[-1][1] < 0
        self._ext.pause_inputs(self._in_backward or optimizer)

    def on_saved(self, x: torch.Tensor, kind: SavedEventKind) -> None:
        """A tensor that other saved-tensor hooks (checkpoint's) kept: an activation."""
        if not self._deferring:
            super().on_saved(x, kind)
        else:  # kept (pack) or handed back recomputed (unpack): an activation
            self._note([local(x)], 1, _ACTIVATION, [NO_INDEX])

    def note_io(self, call: int, value: Any, kind: int) -> None:
        if not self._deferring:
            super().note_io(call, value, kind)
            return
        found = list(tensors_in(value))
        self._note(found, 2 + kind, call, [NO_INDEX] * len(found))

    def _note(self, tensors: list[torch.Tensor], what: int, value: int, modules: list[int]) -> None:
        """Tensors Python saw (``what``: 0 mark, 1 saved, 2+ module I/O): the extension notes
        those on a block of the run or on a storage registered here (NOTE [ Notes ] in
        ckrec.cpp), resolved at the step's end; the others are storages from before the run,
        registered here as the Python ledger does, and noted at once."""
        for i in self._ext.note_all(tensors, what, value, modules):
            t = tensors[i]
            st = storage_of(t)
            if st is None or st.nbytes() == 0 or t.is_meta:
                continue
            ref = self._known.get(st._cdata)
            if ref is not None:
                sid: int | None = ref.sid
            else:
                now = perf_counter_ns()
                sid = self._register_existing(t, st, FORWARD if what == 2 else OTHER, now)
            if sid is not None:
                self._apply_python(sid, what, value, modules[i])

    def _add_storage(
        self, t: torch.Tensor, st: Any, nbytes: int, category: int, op: int, call: int, now: int
    ) -> int:
        """A storage the Python ledger registers; the extension finds it by address then
        (NOTE [ Notes ] in ckrec.cpp)."""
        sid = super()._add_storage(t, st, nbytes, category, op, call, now)
        self._seen_keys[sid] = self._ext.see(t, sid)
        return sid

    def _on_free(self, ref: StorageRef) -> None:
        self._ext.unsee(self._seen_keys.pop(ref.sid, 0))
        super()._on_free(ref)

    def _apply_python(self, sid: int, what: int, value: int, module: int) -> None:
        if what >= 2:
            self._io.data.extend((value, sid, what - 2))
            if what == 2 and self._st_data[sid * ST_WIDTH + ST_CATEGORY] == _OTHER:
                self._promote_input(sid)
            return
        if what == 1 and self._st_data[sid * ST_WIDTH + ST_CATEGORY] == _OTHER:
            self._promote_input(sid)  # saved, made outside the forward: as on_saved does
            return
        self._promote(sid, value)
        at = sid * ST_WIDTH + ST_MODULE
        if what == 0 and self._st_data[at] == NO_INDEX:
            self._st_data[at] = module

    # ------------------------------------------------------------------ step boundaries

    def step_begins(self) -> None:
        """A recorded step begins; at a run's first, what ran before (warmup) is dropped."""
        if not self._deferring:
            drain(self._ext)
            self._ext.forget_blocks()  # warmup's blocks are storages from before the run
            self._backward_starts = []
            self._deferring = True
            self._calls_at_step = len(self._calls)
            self._mem_mark = self._mem.rows
            self.on_torch_call()  # the step's first blocks may come before its first call

    def step_ends(self, now: int) -> None:
        """Drain the step's rows, attribute them and write them into the run's tables."""
        if not self._deferring:
            return
        flags = self._flags
        flags.busy = True
        try:
            self._write_step(now)
        finally:
            flags.busy = False

    def _write_step(self, now: int) -> None:
        rows = drain(self._ext)
        self._learn_names(int(rows.ops["name"].max(initial=-1)) + 1)
        forward = self._forward_spans(rows, now)
        if self._flags.no_modules:
            forward = np.concatenate([forward, self._functional_forward_spans(rows.ops)])
        spans = [(Phase.FORWARD, forward)]
        spans.append((Phase.OPTIMIZER, intervals(self._optimizer_spans, now)))
        spans.append((Phase.RECOMPUTE, self._recompute_spans(now)))
        facts = self._attribution.step(rows, spans, self._name_is_op)
        self._optimizer_spans, self._backward_starts = [], []
        py_call = self._python_calls(facts)
        self._remember_last_op(facts, py_call)
        op_rows = self._write_ops(facts, py_call, now)
        self._place_regions(facts.ops, now)
        saved = self._write_blocks(facts, py_call, op_rows)
        self._apply_inputs(rows, facts)
        self._promote_saved(saved)
        self._write_saved(facts, py_call, op_rows)
        self._apply_notes(facts.notes)
        self._sort_memory_events()
        self._calls_at_step = len(self._calls)

    def backward_begins(self) -> None:
        """A backward pass begins (``_torch.bracket_backward``): the forward's top-level ops
        before it are FORWARD (the Python path's ``top_phase``)."""
        self._phases.enter_backward(queue=False)
        self._backward_starts.append(perf_counter_ns())
        self._in_backward = True
        self._pause_inputs()

    def backward_ends(self) -> None:
        """The backward pass that ``backward_begins`` began returned."""
        self._in_backward = False
        self._pause_inputs()

    def _forward_spans(self, rows: Rows, now: int) -> np.ndarray:
        """From each top-level forward call's start to the next backward (or the step's end):
        ops outside modules there (the loss) are FORWARD, as on the Python path. A compiled
        forward graph run outside backward begins a forward too: compiled around the model
        (``torch.compile(step_fn)``), no module call runs (NOTE [ Compiled code on the native
        path ] in compiled.py)."""
        calls = self._calls
        data = _rows_from(calls, self._calls_at_step)
        root = (data[:, calls.index("parent")] == NO_INDEX) & (
            data[:, calls.index("phase")] == FORWARD
        )
        ops = rows.ops
        compiled = self._name_is_compiled[ops["name"]] & (ops["graph_task"] < 0)
        starts = np.concatenate([data[root, calls.index("start_ns")], ops["t0"][compiled]])
        backward = np.asarray([*self._backward_starts, now], np.int64)
        ends = backward[np.minimum(np.searchsorted(backward, starts), len(backward) - 1)]
        return np.stack([starts, ends], axis=1)

    def _functional_forward_spans(self, ops: np.ndarray) -> np.ndarray:
        """In a loop without modules (NOTE [ A forward without modules ] in hooks.py), a
        backward's forward began at the op that made the graph's first node: its node has the
        smallest sequence number among the backward's node ranges, and that op is the last
        forward op that started with that number (an op starts with the number of the next
        node, and only an op that makes a node moves it on). The forward runs from that op's
        top-level op to the backward."""
        backward = np.asarray(self._backward_starts, np.int64)
        if not len(backward) or not len(ops):
            return np.zeros((0, 2), np.int64)
        node = (ops["scope"] == _BACKWARD_SCOPE) & (ops["seq"] >= 0)
        forward = (ops["scope"] != _BACKWARD_SCOPE) & (ops["graph_task"] < 0)
        which = np.searchsorted(backward, ops["t0"], side="right") - 1  # backward pass of each
        spans = []
        for i, start in enumerate(backward.tolist()):
            seqs = ops["seq"][node & (which == i)]
            if not len(seqs):
                continue
            made = np.flatnonzero(forward & (ops["seq"] == seqs.min()) & (ops["t0"] < start))
            if not len(made):
                continue
            first = made[np.argmax(ops["t0"][made])]
            top = np.flatnonzero(ops["id"] == ops["top"][first])
            begin = ops["t0"][top[0] if len(top) else first]
            spans.append((begin, start))
        return np.asarray(spans, np.int64).reshape(-1, 2)

    def graph_leaves(self, roots: list[torch.Tensor]) -> list[torch.Tensor]:
        """The leaf tensors a backward from ``roots`` trains (NOTE [ Leaves of a graph ] in
        ckrec.cpp)."""
        return list(self._ext.graph_leaves(roots))

    def _recompute_spans(self, now: int) -> np.ndarray:
        regions = self._tables.regions
        if not len(regions):
            return np.zeros((0, 2), np.int64)
        cols = regions.as_columns()
        ends = np.where(cols["end_ns"] < 0, now, cols["end_ns"])
        return np.stack([cols["start_ns"], ends], axis=1).astype(np.int64)

    def _python_calls(self, facts: StepFacts) -> CallMap:
        """Each native call id's Python call row: the one that began last before it."""
        first = self._calls_at_step
        starts = _rows_from(self._calls, first)[:, self._calls.index("start_ns")]
        native = facts.calls
        at = np.searchsorted(starts, native["start_ns"], side="right") - 1
        rows = np.where(at >= 0, at + first, NO_INDEX)
        self._blocks.calls.add(native["call"].astype(np.int64), rows)
        modules = self._blocks.call_modules
        modules.extend(_rows_from(self._calls, len(modules))[:, 0])
        return CallMap(self._blocks.calls, modules.values)

    # NOTE [ OOM capture on the native path ]
    # No Python frame runs around an op to catch its allocation failure (NOTE [ OOM capture ]
    # in recorder/oom.py), so the failure is found after the fact, when the run ends with an
    # allocation error: the failing op is the last op that an exception left (the innermost of
    # those the error unwound, ``raised`` in its row, NOTE [ Op ends ] in ckrec.cpp), in the
    # module call it ran in, at the time it began. The bytes asked for are those of the
    # allocator's own OOM row (CUDA's caching allocator reports one), else those the error
    # message gives (the CPU allocator's). A MemoryError that no op raised is Python's own:
    # not an OOM, as on the Python path.
    def _remember_last_op(self, facts: StepFacts, calls: CallMap) -> None:
        ops, ooms = facts.ops, facts.ooms
        raised = np.flatnonzero(ops["raised"])
        if not len(raised):
            return
        row = int(raised[-1])  # ops come in id order: the last raised began last
        nbytes = int(ooms["bytes"][-1]) if len(ooms["t"]) else -1
        call = int(calls.row(ops["module_call"][row : row + 1])[0])
        module = NO_INDEX if call == NO_INDEX else int(self._calls.data[call * CALL_WIDTH])
        self._last_op = (int(ops["name"][row]), module, int(ops["start_ns"][row]), nbytes)

    def failure(self, error: str) -> OomNote | None:
        """The allocation failure that ended the run with ``error``, if it is one (NOTE [ OOM
        capture on the native path ])."""
        if self._last_op is None or not says_allocation_failed(error):
            return None
        name, module, t0, nbytes = self._last_op
        path = "" if module == NO_INDEX else self._registry.display(module)
        if nbytes < 0:
            nbytes = requested_bytes(error)
        return OomNote(error, self._ext.names(name)[0], path, nbytes, t0)

    # NOTE [ Stacks on the native path ]
    # ``--stacks`` (NOTE [ User frames ] in stacks.py) needs the Python stack of the code that
    # made each block; the extension's callbacks run in C++, often with the GIL released, where
    # no Python stack can be read. So with ``--stacks`` a TorchFunctionMode
    # (``_torch.watch_torch_calls``) notes the user's stack at each torch call made from
    # Python (``on_torch_call``: the time and the interned stack), and a block takes the stack
    # of the last call that began before its allocation (torch's own calls inside one are not
    # seen; the engine's backward work takes the ``backward()`` call's). It costs a Python call
    # and a stack walk per torch call of the user's code, about what the Python path pays per
    # op; without ``--stacks`` nothing is installed.
    def on_torch_call(self) -> None:
        """A torch call from the user's Python begins (NOTE [ Stacks on the native path ])."""
        if self._deferring and self._stacks is not None:
            self._calls_t.append(perf_counter_ns())
            self._calls_stack.append(self._stacks.current())

    def _stacks_at(self, t: np.ndarray) -> np.ndarray:
        """The stack row of the last torch call begun at or before each time; the step's calls
        are dropped but the last, which the next step's first blocks may take."""
        if self._stacks is None or not len(self._calls_t):
            return np.full(len(t), NO_INDEX, np.int64)
        times = np.frombuffer(self._calls_t, np.int64)
        stacks = np.frombuffer(self._calls_stack, np.int64)
        at = np.searchsorted(times, t, side="right") - 1
        found = np.where(at >= 0, stacks[np.maximum(at, 0)], NO_INDEX)
        last_t, last_stack = times[-1], stacks[-1]
        del times, stacks
        self._calls_t, self._calls_stack = array("q", [last_t]), array("q", [last_stack])
        return found

    def _write_ops(self, facts: StepFacts, calls: CallMap, now: int) -> OpMap:
        ops = facts.ops
        kept = ops["outer"] == ops["id"]  # NOTE [ Outermost ops ] in native/attribute.py
        first = self._ops.rows
        names = self._string_ids(ops["name"][kept])
        call = np.where(
            ops["phase"] == Phase.RECOMPUTE, calls.row(ops["call"]), calls.row(ops["module_call"])
        )[kept]
        end = np.where(ops["end_ns"] < 0, now, ops["end_ns"])[kept]
        table = np.stack(
            [
                names,
                ops["phase"][kept].astype(np.int64),
                call,
                np.full(len(names), self._tables.step),
                ops["start_ns"][kept],
                end,
                ops["seq_nr"][kept],
            ],
            axis=1,
        )
        self._ops.data.frombytes(table.astype(np.int64).tobytes())
        rows = np.full(len(kept), NO_INDEX, np.int64)
        rows[kept] = np.arange(first, first + len(names))
        outer_rows = OpMap(ops["id"], rows, ops["start_ns"]).row(ops["outer"])
        return OpMap(ops["id"], outer_rows, ops["start_ns"])

    def _place_regions(self, ops: Columns, now: int) -> None:
        """The first and end op rows of this step's recompute regions, now that its ops are
        rows: the Python phases opened them before the step's ops were written."""
        regions = self._tables.regions
        count = len(regions)
        if count > self._regions_at_step:
            kept = ops["outer"] == ops["id"]
            starts = np.sort(ops["start_ns"][kept])
            first = self._ops.rows - len(starts)
            for row in range(self._regions_at_step, count):
                start, end = regions.get(row, "start_ns"), regions.get(row, "end_ns")
                at = int(np.searchsorted(starts, start))
                stop = int(np.searchsorted(starts, end if end >= 0 else now))
                regions.set(row, "first_op", first + at)
                if end >= 0:
                    regions.set(row, "end_op", first + stop)
        self._regions_at_step = count

    def _string_ids(self, names: np.ndarray) -> np.ndarray:
        """String ids of the extension's op name indexes (interned once per name)."""
        self._learn_names(int(names.max(initial=-1)) + 1)
        return self._name_ids[names]

    def _learn_names(self, count: int) -> None:
        """Fetch the extension's op names up to index ``count`` (and which are ops)."""
        known = len(self._name_ids)
        if count > known:
            texts = self._ext.names(known)
            new = [self._tables.intern(text) for text in texts]
            self._name_ids = np.concatenate([self._name_ids, np.asarray(new, np.int64)])
            is_op = np.frombuffer(self._ext.ops_among_names(known), np.uint8).copy()
            is_op[np.isin(texts, COMPILED_REGIONS)] = 1  # NOTE [ Compiled code on the native path ]
            self._name_is_op = np.concatenate([self._name_is_op, is_op])
            forward = np.asarray(texts) == COMPILED_REGIONS[0]
            self._name_is_compiled = np.concatenate([self._name_is_compiled, forward])

    def _write_blocks(self, facts: StepFacts, calls: CallMap, ops: OpMap) -> np.ndarray:
        """Write the step's blocks; returns the storage rows autograd saved."""
        blocks = facts.blocks
        n = len(blocks["block"])
        first = len(self._st_data) // ST_WIDTH
        sids = np.arange(first, first + n)
        recompute = blocks["phase"] == Phase.RECOMPUTE
        call = calls.row(np.where(recompute, blocks["call"], blocks["module_call"]))
        category = np.where(blocks["phase"] == Phase.OTHER, _OTHER, _TEMPORARY)
        dtype, shape = self._layout_ids(blocks["dtype"], blocks["ndim"], blocks["dims"])
        op = ops.row(blocks["op"], blocks["alloc_ns"])
        table = np.stack(
            [
                blocks["nbytes"],
                self._device_ids(blocks["device_type"], blocks["device_index"]),
                category,
                dtype,
                shape,
                op,
                call,
                calls.module(call),
                blocks["alloc_ns"],
                blocks["free_ns"],
                self._stacks_at(blocks["alloc_ns"]),
            ],
            axis=1,
        ).astype(np.int64)
        self._st_data.frombytes(table.tobytes())
        self._tables.st_address.frombytes(blocks["ptr"].astype(np.int64).tobytes())
        self._blocks.add(blocks, sids)
        events = [np.stack([np.full(n, _ALLOC), sids, op, blocks["alloc_ns"]], axis=1)]
        freed = blocks["free_ns"] >= 0
        free_op = ops.row(blocks["free_op"][freed], blocks["free_ns"][freed], last=True)
        events.append(
            np.stack(
                [np.full(freed.sum(), _FREE), sids[freed], free_op, blocks["free_ns"][freed]], 1
            )
        )
        late = facts.late_frees
        late_sid = self._blocks.sid(late["block"])
        known = late_sid >= 0
        self._set_storages(late_sid[known], "free_ns", late["free_ns"][known])
        late_op = ops.row(late["free_op"][known], late["free_ns"][known], last=True)
        events.append(
            np.stack(
                [np.full(known.sum(), _FREE), late_sid[known], late_op, late["free_ns"][known]], 1
            )
        )
        self._mem.data.frombytes(np.concatenate(events).astype(np.int64).tobytes())
        saved = np.concatenate([sids[blocks["saved"]], self._blocks.sid(facts.late_saved)])
        return saved[saved >= 0]  # promoted once the step's op inputs are known

    def _apply_inputs(self, rows: Rows, facts: StepFacts) -> None:
        """The rules of NOTE [ Inputs and their sources ] (ledger.py) from the tensors ops
        outside modules read (NOTE [ Op inputs outside modules ] in ckrec.cpp): a storage from
        before the run is registered (SEEN) at its first read; an op between steps links its
        new blocks to what it read; an op of the forward (the loss) makes what it reads that was
        made outside the forward an input."""
        inputs = rows.inputs
        if not len(inputs):
            return
        ids = facts.ops["id"]  # in id order
        at = np.minimum(np.searchsorted(ids, inputs["op"]), max(len(ids) - 1, 0))
        known = (ids[at] == inputs["op"]) if len(ids) else np.zeros(len(inputs), bool)
        phase = np.where(known, facts.ops["phase"][at] if len(ids) else 0, Phase.OTHER)
        sid = np.where(inputs["block"] >= 0, self._blocks.sid(inputs["block"]), inputs["sid"])
        for row in np.flatnonzero((sid < 0) & (inputs["tensor"] >= 0)).tolist():
            sid[row] = self._seen_input(
                rows.input_tensors[int(inputs["tensor"][row])],
                FORWARD if phase[row] == Phase.FORWARD else OTHER,
                int(inputs["t"][row]),
            )
        between = (phase == Phase.OTHER) & (sid >= 0)
        if between.any():
            made = self._blocks.sid(facts.blocks["block"])
            for op in np.unique(inputs["op"][between]).tolist():
                sources = sid[between & (inputs["op"] == op)].tolist()
                for out in made[facts.blocks["top_op"] == op].tolist():
                    self._sources.setdefault(out, []).extend(s for s in sources if s != out)
        forward = np.unique(sid[(phase == Phase.FORWARD) & (sid >= 0)])
        view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
        other = forward[view[forward, ST_CATEGORY] == _OTHER].tolist()
        del view
        for s in other:
            self._promote_input(s)

    def _seen_input(self, t: torch.Tensor | None, phase: int, now: int) -> int:
        """The storage row of a tensor an op read that no block or registered storage holds
        (from before the run): registered now, as ``StorageLedger._see_input`` does; -1 if it
        died since, or has no storage."""
        st = None if t is None else storage_of(t)
        if t is None or st is None:
            return -1
        ref = self._known.get(st._cdata)
        if ref is not None:
            return ref.sid
        sid = self._register_existing(t, st, phase, now)
        return -1 if sid is None else sid

    def _write_saved(self, facts: StepFacts, calls: CallMap, ops: OpMap) -> None:
        saved = facts.saved
        sid = self._blocks.sid(saved["block"])
        old = sid < 0  # a block from before the run (a parameter): its SEEN row, by pointer
        sid[old] = self._python_sid(saved["ptr"][old])
        keep = sid >= 0
        dtype, shape = self._layout_ids(saved["dtype"], saved["ndim"], saved["dims"])
        pack = saved["kind"] == _PACK
        call = calls.row(saved["module_call"])
        table = np.stack(
            [
                saved["kind"].astype(np.int64),
                sid,
                ops.row(saved["op"], saved["t"]),
                call,
                shape,
                dtype,
                saved["nbytes"],
                saved["t"],
            ],
            axis=1,
        )[keep]
        self._saved.data.frombytes(table.astype(np.int64).tobytes())
        self._promote_saved(np.unique(sid[keep & pack]))

    def _promote_saved(self, sids: np.ndarray) -> None:
        """Saved by autograd: an activation; made outside the forward (a batch), an input
        (``StorageLedger.on_saved``)."""
        category = np.frombuffer(self._st_data, np.int64)[sids * ST_WIDTH + ST_CATEGORY]
        for sid in sids[category == _OTHER].tolist():
            self._promote_input(sid)
        self._promote_all(sids[category != _OTHER], _ACTIVATION)

    def _python_sid(self, ptr: np.ndarray) -> np.ndarray:
        """Storage rows the Python ledger registered (alive), by data pointer; -1 if none."""
        sids = np.fromiter((r.sid for r in self._known.values() if r.sid >= 0), np.int64)
        if not len(ptr) or not len(sids):
            return np.full(len(ptr), -1, np.int64)
        address = np.frombuffer(self._tables.st_address, np.int64)[sids]
        order = np.argsort(address)
        address, sids = address[order], sids[order]
        at = np.minimum(np.searchsorted(address, ptr), len(address) - 1)
        return np.where(address[at] == ptr, sids[at], -1)

    def _apply_notes(self, notes: Columns) -> None:
        """The step's note rows (NOTE [ Notes ] in ckrec.cpp), each on a block of the run.
        Storages still OTHER take them one by one, in time order, as ``_apply_python`` does
        (being used as an input or saved makes them inputs); for the others the order does not
        matter (categories only strengthen; a mark's module fills an empty one, first wins)."""
        sid = np.where(notes["block"] >= 0, self._blocks.sid(notes["block"]), notes["sid"])
        keep = sid >= 0
        sid, what, value, module = (
            sid[keep],
            notes["what"][keep],
            notes["value"][keep],
            notes["module"][keep].astype(np.int64),
        )
        view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
        other = view[sid, ST_CATEGORY] == _OTHER
        del view
        for row in np.flatnonzero(other).tolist():
            self._apply_python(int(sid[row]), int(what[row]), int(value[row]), int(module[row]))
        rest = ~other
        io = rest & (what >= 2)
        if io.any():
            rows = np.stack([value[io], sid[io], what[io].astype(np.int64) - 2], axis=1)
            self._io.data.frombytes(rows.astype(np.int64).tobytes())
        self._promote_all(sid[rest & (what == 1)], _ACTIVATION)
        marks = rest & (what == 0)
        for category in np.unique(value[marks]).tolist():
            self._promote_all(sid[marks & (value == category)], category)
        owned = marks & (module != NO_INDEX)
        first_sid, first = np.unique(sid[owned], return_index=True)
        self._set_modules(first_sid, module[owned][first])

    def _sort_memory_events(self) -> None:
        """The step's memory rows (its blocks', and the Python ledger's: SEEN, frees of SEEN
        storages) in time order; earlier steps' rows all come before."""
        mem = self._mem
        first = max(self._mem_mark - (mem.rows - len(mem.data) // mem.width), 0) * mem.width
        while True:
            count = len(mem.data)
            tail = np.frombuffer(mem.data[first:], np.int64).reshape(-1, mem.width)
            ordered = tail[np.argsort(tail[:, mem.width - 1], kind="stable")].tobytes()
            if len(mem.data) == count:  # no free callback appended meanwhile
                break
        del mem.data[first:]
        mem.data.frombytes(ordered)
        self._mem_mark = mem.rows

    # ------------------------------------------------------------------ helpers

    def _promote_all(self, sids: np.ndarray, category: int) -> None:
        if not len(sids):
            return
        view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
        current = view[sids, ST_CATEGORY]
        stronger = _RANK[category] < _RANK[current]
        view[sids[stronger], ST_CATEGORY] = category
        del view, current

    def _set_modules(self, sids: np.ndarray, modules: np.ndarray) -> None:
        """Give each storage its module where it has none."""
        if len(sids):
            view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
            empty = view[sids, ST_MODULE] == NO_INDEX
            view[sids[empty], ST_MODULE] = modules[empty]
            del view, empty

    def _set_storages(self, sids: np.ndarray, column: str, values: np.ndarray) -> None:
        if len(sids):
            view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
            view[sids, self._tables.storages.index(column)] = values
            del view

    def _layout_ids(self, dtype: np.ndarray, ndim: np.ndarray, dims: np.ndarray) -> tuple[Any, Any]:
        return self._layout_ids_of.ids(dtype, ndim, dims)

    def _device_ids(self, device_type: np.ndarray, index: np.ndarray) -> np.ndarray:
        key = device_type.astype(np.int64) * 65536 + index.astype(np.int64) + 1  # index -1: CPU
        unique, inverse = np.unique(key, return_inverse=True)
        ids = []
        for k in unique.tolist():
            kind, i = divmod(k, 65536)
            i -= 1
            if kind == 1:
                self.saw_cuda = True
            ids.append(self._cpu_id if kind == 0 else self._tables.intern(f"cuda:{i}"))
        return np.asarray(ids, np.int64)[inverse.reshape(-1)]


def _rows_from(table: MutableTable, first: int) -> np.ndarray:
    """A copy of ``table``'s rows from row ``first`` on (slicing the array copies just them and
    exports no buffer, so a free callback may append meanwhile)."""
    tail = table.data[first * table.width :]
    return np.frombuffer(tail, np.int64).reshape(-1, table.width)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
