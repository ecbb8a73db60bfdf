"""The storage ledger of the native path (``CKVIEW_RECORDER=native``): ops and allocator blocks
come from the native extension (recorder/native), drained and attributed once per step with
numpy, instead of from the Python dispatch mode and the profiler's allocator windows.

NOTE [ The native ledger ]
- Every allocator block allocated while a run records is one storage row, written when the step
  that allocated it ends (rows stay editable until the run ends: a later step may free it, save
  it or find it among the gradients). Ops are the extension's RecordFunction ranges (names such
  as ``aten.mm.default``, NOTE [ Interning op names ] in ckrec_ops.cpp; ranges nest); an op still
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
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import numpy as np
import torch

from ckview.trace.schema import (
    NO_INDEX,
    Category,
    IOKind,
    Phase,
    SavedEventKind,
)
from recorder._torch import is_fake, local, storage_of, tensors_in
from recorder.compiled import COMPILED_REGIONS
from recorder.ledger import StorageLedger, StorageRef
from recorder.native.attribute import Attribution
from recorder.native.rows import drain
from recorder.native_steps import StepWriting
from recorder.oom import OomNote, requested_bytes, says_allocation_failed
from recorder.phases import FORWARD, OTHER
from recorder.tables import ST_MODULE, ST_WIDTH, RunTables, State

_OTHER = int(Category.OTHER)
_ACTIVATION = int(Category.ACTIVATION)
_COMM = int(Category.COMM_BUFFER)
_GRADIENT, _OPTIMIZER_STATE = int(Category.GRADIENT), int(Category.OPTIMIZER_STATE)
_INPUT_IO, _OUTPUT_IO = int(IOKind.INPUT), int(IOKind.OUTPUT)
# their notes' ``what`` (NOTE [ Notes ] in ckrec_hooks.cpp)
_IN, _OUT = 2 + _INPUT_IO, 2 + _OUTPUT_IO
# NOTE [ Batches of the native path ]
# A step's rows are appended to the run's row buffers as blocks (NOTE [ Blocks of rows ] in
# buffers.py). A buffer that holds more than about a megabyte is handed to the trace at the
# step's end, instead of every few seconds (``_FILE_FLUSH_NS`` in runs.py): the rows in memory
# stay few, and a batch is still large enough to be written in whole chunks.
_BATCH_VALUES = 1 << 17
_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)  # fmt: skip


class NativeLedger(StepWriting, StorageLedger):
    """The ledger of the native path (NOTE [ The native ledger ]); ``ext`` is the loaded
    extension. Its step boundaries come through :class:`NativeRowsSource`."""

    def __init__(self, ext: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ext = ext
        self._dtype_names = {
            int(ext.dtype_code(torch.empty(0, dtype=d))): _name(d) for d in _DTYPES
        }
        self._name_ids = np.zeros(0, np.int64)  # extension name index -> string id
        self._compiled_name = -1  # the name index of a compiled forward's range, once seen
        ext.mark_ops(list(COMPILED_REGIONS))  # NOTE [ Outermost ops ] in native/attribute.py
        self._reset()

    def _reset(self) -> None:
        self._attribution = Attribution(self._ext)
        self._deferring = False  # the run's first step began: marks wait for its rows
        self._optimizer_spans: list[list[int]] = []
        self._in_backward = False
        self._backward_starts: list[int] = []
        self._calls_at_step = 0
        self._regions_at_step = 0  # recompute regions placed among the ops already
        self._seen_keys: dict[int, int] = {}  # storage row -> its key in the extension
        self._mem_mark = 0  # memory rows before the step under way (absolute)
        self._last_op: tuple[int, int, int, int] | None = None  # NOTE [ OOM capture on the ...
        self._calls_t, self._calls_stack = array("q"), array("q")  # NOTE [ Stacks on the ...
        self._python_sids: tuple[np.ndarray, np.ndarray] | None = None  # see _python_sid

    def begin_run(self, tables: RunTables) -> None:
        super().begin_run(tables)
        self._reset()
        self._attribution.use_strings(
            tables.intern, self._dtype_names, self._accelerator_id, self._cpu_id
        )
        tables.calls.on_drop.append(self._forget_calls)

    def _forget_calls(self) -> None:
        """Call rows left memory (NOTE [ Kept rows ] in storage_rows.py): the native call ids
        that name them leave the map (a step's ids name that step's rows)."""
        kept = self._calls.kept
        self._attribution.forget_calls(self._calls.base, np.fromiter(kept, np.int64, len(kept)))

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
        owners, optimizers = self._registry.owner_table(), self.optimizers.alive()
        missed, python = self._ext.note_gradients(owners, optimizers, _GRADIENT)
        for p, module in python:  # a subclass's `.grad` is Python's (NOTE [ Marks in one call ])
            if (grad := p.grad) is not None:
                self._note([grad], 0, _GRADIENT, [module])
        for grad, module in missed:
            self._register_noted(grad, 0, _GRADIENT, module)

    def mark_optimizer_tensors(self) -> None:
        if not self._deferring:
            super().mark_optimizer_tensors()
            return
        owners, optimizers = self._registry.owner_table(), self.optimizers.alive()
        missed = self._ext.note_optimizer_state(owners, optimizers, _OPTIMIZER_STATE)
        if missed is None:  # a value only Python's walk reads (NOTE [ Marks in one call ])
            found, modules = _optimizer_tensors(optimizers, self._registry.owner)
            self._note(found, 0, _OPTIMIZER_STATE, modules)
        else:
            for t, module in missed:
                self._register_noted(t, 0, _OPTIMIZER_STATE, module)
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
        outside modules ] in ckrec_hooks.cpp)."""
        optimizer = bool(self._optimizer_spans) and self._optimizer_spans[-1][1] < 0
        self._ext.pause_inputs(self._in_backward or optimizer)

    def on_saved(self, x: torch.Tensor, kind: SavedEventKind) -> None:
        """A tensor that other saved-tensor hooks (checkpoint's) kept: an activation."""
        if not self._deferring:
            super().on_saved(x, kind)
        else:  # kept (pack) or handed back recomputed (unpack): an activation
            self._note([local(x)], 1, _ACTIVATION, [NO_INDEX])

    def note_call_io(self, call: int, args: Any, kwargs: Any, output: Any) -> None:
        """A module call returns: its inputs and output in one extension call where it can
        (NOTE [ Module I/O in one call ] in ckrec_hooks.cpp), the rest as ``note_io``."""
        if not self._deferring:
            super().note_call_io(call, args, kwargs, output)
            return
        groups, first = (args, kwargs, output), 0
        while (left := self._ext.note_io(call, first, _IN, _OUT, args, kwargs, output)) is not None:
            group, missed = left
            kind = _OUTPUT_IO if group == 2 else _INPUT_IO
            if missed is None:
                self.note_io(call, groups[group], kind)
            else:
                for t in missed:
                    self._register_noted(t, 2 + kind, call, NO_INDEX)
            first = group + 1

    def note_io(self, call: int, value: Any, kind: int) -> None:
        if not self._deferring:
            super().note_io(call, value, kind)
            return
        found = [value] if isinstance(value, torch.Tensor) else list(tensors_in(value))
        self._note(found, 2 + kind, call, [NO_INDEX] * len(found))

    def _note(self, tensors: list[torch.Tensor], what: int, value: int, modules: list[int]) -> None:
        """Tensors Python saw (``what``: 0 mark, 1 saved, 2+ module I/O): the extension notes
        those on a block of the run or on a storage registered here (NOTE [ Notes ] in
        ckrec_hooks.cpp), resolved at the step's end; the others are storages from before the run,
        registered here as the Python ledger does, and noted at once."""
        for i in self._ext.note_all(tensors, what, value, modules):
            self._register_noted(tensors[i], what, value, modules[i])

    def _register_noted(self, t: torch.Tensor, what: int, value: int, module: int) -> None:
        """A tensor the extension did not note (NOTE [ Notes ]): its storage is registered here
        (unless it is empty), and the note applied at once."""
        st = None if is_fake(t) else storage_of(t)
        if st is None or st.nbytes() == 0 or t.is_meta:
            return
        ref = self._known.get(st._cdata)
        if ref is not None:
            sid: int | None = ref.sid
        else:
            now = perf_counter_ns()
            sid = self._register_existing(t, st, FORWARD if what == 2 else OTHER, now)
        if sid is not None:
            self._apply_python(sid, what, value, module)

    def _add_storage(
        self, t: torch.Tensor, st: Any, nbytes: int, category: int, op: int, call: int, now: int
    ) -> int:
        """A storage the Python ledger registers; the extension finds it by address then
        (NOTE [ Notes ] in ckrec_hooks.cpp)."""
        sid = super()._add_storage(t, st, nbytes, category, op, call, now)
        self._seen_keys[sid] = self._ext.see(t, sid)
        self._python_sids = None
        return sid

    def _on_free(self, ref: StorageRef) -> None:
        self._ext.unsee(self._seen_keys.pop(ref.sid, 0))
        self._python_sids = None
        super()._on_free(ref)

    def forget(self) -> None:
        super().forget()
        self._python_sids = None

    def _apply_python(self, sid: int, what: int, value: int, module: int) -> None:
        if what >= 2:
            self._io.data.extend((value, sid, what - 2))
            if what == 2 and self._category(sid) == _OTHER:
                self._promote_input(sid)
            return
        if what == 1 and self._category(sid) == _OTHER:
            self._promote_input(sid)  # saved, made outside the forward: as on_saved does
            return
        self._promote(sid, value)
        at = self._st.slot(sid) * ST_WIDTH + ST_MODULE
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
            for buf in self._tables.appended:  # NOTE [ Batches of the native path ]
                if buf.buffered > _BATCH_VALUES:
                    buf.flush()
        finally:
            flags.busy = False

    def _write_step(self, now: int) -> None:
        rows = drain(self._ext)
        self._learn_names(int(rows.ops["name"].max(initial=-1)) + 1)
        calls = self._step_calls()
        forward = self._forward_spans(rows, calls, now)
        if self._flags.no_modules:
            forward = np.concatenate([forward, self._functional_forward_spans(rows.ops)])
        spans = [(Phase.FORWARD, forward)]
        spans.append((Phase.OPTIMIZER, intervals(self._optimizer_spans, now)))
        spans.append((Phase.RECOMPUTE, self._recompute_spans(now)))
        facts = self._attribution.step(rows, spans, nested=True)
        self._optimizer_spans, self._backward_starts = [], []
        written = self._write_rows(facts, calls, now)
        self._remember_last_op(facts)
        self._place_regions(facts, now)
        saved = self._write_blocks(written)
        self._apply_inputs(rows, facts)
        self._promote_saved(saved)
        self._write_saved(written)
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

    def graph_leaves(self, roots: list[torch.Tensor]) -> list[torch.Tensor]:
        """The leaf tensors a backward from ``roots`` trains (NOTE [ Leaves of a graph ] in
        ckrec_hooks.cpp)."""
        return list(self._ext.graph_leaves(roots))

    # NOTE [ OOM capture on the native path ]
    # No Python frame runs around an op to catch its allocation failure (NOTE [ OOM capture ]
    # in recorder/oom.py), so the failure is found after the fact, when the run ends with an
    # allocation error. Where the allocator reports the failure (CUDA's caching allocator
    # does), its OOM row names the innermost op open on the thread and the bytes asked for.
    # Otherwise (the CPU allocator) the failing op is the last op that an exception left (the
    # innermost of those the error unwound, ``raised`` in its row, NOTE [ Op ends ] in
    # ckrec_ops.cpp), and the bytes are those the error message gives. (On CUDA no row said
    # ``raised``: seen on an H200, torch 2.11.) The op is placed in the module call it ran in,
    # at the time it began. A MemoryError that no op raised is Python's own:
    # not an OOM, as on the Python path.
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

    def _seen_input(self, t: torch.Tensor | None, phase: int, now: int) -> int:
        """The storage row of a tensor an op read that no block or registered storage holds
        (from before the run): registered now, as ``StorageLedger._see_input`` does; -1 if it
        died since, or has no storage."""
        st = None if t is None or is_fake(t) else storage_of(t)
        if t is None or st is None:
            return -1
        ref = self._known.get(st._cdata)
        if ref is not None:
            return ref.sid
        sid = self._register_existing(t, st, phase, now)
        return -1 if sid is None else sid

    # ------------------------------------------------------------------ helpers


def _optimizer_tensors(
    optimizers: list[torch.optim.Optimizer], owner: Callable[[torch.Tensor], int]
) -> tuple[list[torch.Tensor], list[int]]:
    """Every tensor of the optimizers' state, each with its parameter's owner, walked in
    Python (NOTE [ Marks in one call ] in native/ckrec_marks.cpp)."""
    found, modules = [], []
    for opt in optimizers:
        for param, state in opt.state.items():
            module = owner(param)
            for value in state.values():  # tensors, or lists of them (L-BFGS's history)
                for tensor in tensors_in(value):
                    found.append(tensor)
                    modules.append(module)
    return found, modules


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def intervals(spans: list[list[int]], now: int) -> np.ndarray:
    """(start, end) rows; an end still -1 (open) is ``now``."""
    if not spans:
        return np.zeros((0, 2), np.int64)
    out = np.asarray(spans, np.int64).reshape(-1, 2)
    out[out[:, 1] < 0, 1] = now
    return out
