"""The storage ledger: every op's row, every storage it allocates, frees, saves or reads, and
what each storage is (its category and owner). This is the per-op hot path.

NOTE [ Never hold a user tensor ]
The recorder keeps only integers and weak references to storages. Holding a tensor (or a
storage) would keep its memory alive and change the very curve being measured. The pack hook
returns ``x.detach()`` rather than ``x``: returning an op's own output would create a reference
cycle through its ``grad_fn`` that the garbage collector cannot see, leaking the tensor.

NOTE [ New storage = unknown output storage ]
Before looking at an op's outputs, every input storage is registered (as pre-existing if it was
never seen). An output whose storage is still unknown was therefore allocated by this op; an
output that is a view of an input (``weight.t()``) is found among the inputs and is not an
allocation. This is what makes the recorded "allocated since the step began" agree with the
allocator: pre-existing parameters and inputs are ``SEEN``, never ``ALLOC``.

NOTE [ Cooperating with other saved-tensor hooks ]
Only the innermost saved-tensor hooks apply, so inside a non-reentrant
``torch.utils.checkpoint`` region (or a user's offloading hooks) ours are not called. While
recording, the constructor of ``saved_tensors_hooks`` is wrapped (recorder/_torch.py) so that
every hook pair created meanwhile reports to the recorder too: a pack that returns a tensor
keeps that tensor for backward, and an unpack that returns a tensor (e.g. one recomputed by
checkpoint) hands it to backward; both make the storage an activation. A pack that returns an
opaque holder keeps nothing.

NOTE [ Inputs and their sources ]
A storage made outside the step's forward and used by it (or saved by autograd) is an INPUT: a
batch. Batches are often made from other storages between steps: ``x = data[idx]`` gathers from
an in-memory dataset, ``x = batch.float() / 255`` converts a loaded one. Ops outside forward,
backward and optimizer (phase OTHER, few per step) link their new outputs to the storages they
read, and when an output becomes an INPUT, the OTHER storages it was made from become INPUTs
too: the dataset tensor a loop indexes is input data, not "other". A CPU storage in shared
memory when first seen came from a DataLoader worker process: an INPUT too, also a batch a
worker delivered early that the recorded steps never used.

NOTE [ Buffers are noted at a run's start ]
A module's buffers (BatchNorm's running statistics, a causal mask) live through every step, as
parameters do, but no op returns them: batch norm updates its running statistics in place
inside ``native_batch_norm``. The Python path sees them as op inputs (INPUT, pre-existing); the
native path sees op outputs only, so a run in which some op wrote one in place (a plan's
recompute guard restoring running statistics: ``copy_``) held them and a run without did not:
DenseNet's ``sqrt`` plan measured 5,312 B (-0.13%) above its projection over the baseline. So
each run notes every registered module's buffers when its first step begins, as INPUT (the
category the Python path gives them), on both paths.

NOTE [ FSDP's storages ]
A DTensor (FSDP2's sharded parameters, their gradients and optimizer state) is a wrapper whose
own storage is a placeholder of the global size; its data is its ``_local_tensor``, so the
recorder follows that one (``local``), and a DTensor parameter's local data is a
SHARDED_PARAMETER. FSDP's own ops name its buffers: ``fsdp.all_gather_copy_in`` makes the flat
all-gather buffers and ``fsdp.chunk_cat`` fills the reduce-scatter input (COMM_BUFFER),
``fsdp.split_with_sizes_copy`` fills the all-gathered parameters (UNSHARDED_PARAMETER). FSDP
frees and re-allocates an unsharded parameter by resizing its storage (no op; the storage object
lives on), so the recorder wraps FSDP's ``free_unsharded_param`` and
``alloc_all_gather_outputs`` (recorder/_torch.py): a resize to 0 is the storage's FREE, and a
resize back is a new storage row (ALLOC) of the same StorageImpl, owned by the parameter's
module, its old weak reference disarmed (``sid`` -1).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from time import perf_counter_ns
from typing import Any

import torch

from ckview.trace.schema import (
    CATEGORY_PRIORITY,
    NO_INDEX,
    Category,
    IOKind,
    MemoryEventKind,
    SavedEventKind,
)
from recorder._torch import Parameter, Tensor, current_graph_task_id, local, storage_of, tensors_in
from recorder.allocations import WINDOW_ROWS
from recorder.modules import ModuleRegistry, WeakList
from recorder.phases import BACKWARD, FORWARD, OPTIMIZER, OTHER, RECOMPUTE, PhaseState
from recorder.sources.allocator import AllocatorSource
from recorder.stacks import Stacks
from recorder.tables import (
    CALL_WIDTH,
    ST_CATEGORY,
    ST_FREE_NS,
    ST_MODULE,
    ST_WIDTH,
    Flags,
    RunTables,
    State,
)

_RANK = [0] * len(Category)
for _rank, _cat in enumerate(CATEGORY_PRIORITY):
    _RANK[_cat] = _rank

_ALLOC, _FREE, _SEEN = (int(k) for k in MemoryEventKind)
_PARAMETER = int(Category.PARAMETER)
_INPUT = int(Category.INPUT)
_OTHER_CAT = int(Category.OTHER)
_TEMPORARY = int(Category.TEMPORARY)
_ACTIVATION = int(Category.ACTIVATION)
_SHARDED = int(Category.SHARDED_PARAMETER)
_UNSHARDED = int(Category.UNSHARDED_PARAMETER)
_COMM = int(Category.COMM_BUFFER)
_INPUT_IO, _OUTPUT_IO = int(IOKind.INPUT), int(IOKind.OUTPUT)
_FSDP_OPS = {  # NOTE [ FSDP's storages ]: op -> (category, which of its tensors)
    "fsdp.all_gather_copy_in.default": (_COMM, "result"),
    "fsdp.split_with_sizes_copy.default": (_UNSHARDED, "out"),
    "fsdp.chunk_cat.default": (_COMM, "out"),
}


class StorageRef(weakref.ref):
    """Weak reference to a storage that remembers its trace row and registry key."""

    __slots__ = ("key", "sid")
    sid: int
    key: int


class StorageLedger:
    """The rows of ops, storages, memory and saved events of the run being recorded."""

    def __init__(
        self,
        flags: Flags,
        phases: PhaseState,
        registry: ModuleRegistry,
        allocator: AllocatorSource,
        stacks: Stacks | None,
    ) -> None:
        self._flags = flags
        self._phases = phases
        self._registry = registry
        self._allocator = allocator
        self._stacks = stacks
        self.optimizers: WeakList[torch.optim.Optimizer] = WeakList()
        self.saw_cuda = False
        self.last_op = NO_INDEX
        # storages: registry key (StorageImpl address) -> weak ref, only while alive
        self._known: dict[int, StorageRef] = {}
        self._names: dict[Any, int] = {}
        self._op_names: dict[int, int] = {}
        self._op_funcs: list[Any] = []
        self._layouts: dict[tuple[Any, Any], tuple[int, int]] = {}
        self._op_categories: dict[int, tuple[int, str]] = {}  # NOTE [ FSDP's storages ]
        self._sources: dict[int, list[int]] = {}
        self._n_ops = 0

    def begin_run(self, tables: RunTables) -> None:
        """Fresh tables: storages alive across runs are SEEN again in the next run."""
        self._tables = tables
        self._ops, self._mem, self._saved, self._io = tables.appended
        self._st_data = tables.storages.data
        self._st = tables.storages  # rows by slot: NOTE [ Kept rows ]
        self._calls = tables.calls
        self._op_stacks = tables.op_stacks
        self._cpu_id = tables.intern("cpu")
        self._known.clear()
        self._sources = {}
        self._n_ops = 0
        self.last_op = NO_INDEX

    def forget(self) -> None:
        """Let go of every storage (dropping the weak refs also drops their callbacks)."""
        self._known.clear()

    # ------------------------------------------------------------------------- ops (hot path)

    def on_op(self, func: Any, args: Any, kwargs: Any, out: Any, t0: int, t1: int) -> None:
        ph = self._phases
        stack = ph.stack
        seq = -1
        if ph.in_backward or current_graph_task_id() >= 0:
            if not ph.in_backward:
                ph.enter_backward()
            if ph.recompute_depth:
                phase, call = RECOMPUTE, stack[-1][1] if stack else NO_INDEX
            else:
                phase = BACKWARD
                seq = ph.node_seq()
                if seq == -2:
                    seq, call = -1, ph.last_seq_call
                else:
                    call = ph.backward_call(seq)
        elif ph.optimizer_depth:
            phase, call = OPTIMIZER, NO_INDEX
        elif stack:
            phase, call = FORWARD, stack[-1][1]
        else:
            phase, call = ph.top_phase, NO_INDEX

        name = self._op_names.get(id(func))  # OpOverload's own __hash__ is Python code
        if name is None:
            name = self._op_name(func)
        row = self._n_ops
        self._n_ops = row + 1
        self.last_op = row
        self._ops.data.extend((name, phase, call, self._tables.step, t0, t1, seq))
        if self._stacks is not None:  # NOTE [ User frames ] in stacks.py
            self._op_stacks.append(self._stacks.current())

        # NOTE [ New storage = unknown output storage ]: inputs first, then outputs.
        for arg in args:
            if isinstance(arg, Tensor):
                self._see_input(arg, phase, t1)
            elif type(arg) is list or type(arg) is tuple:
                for item in arg:
                    if isinstance(item, Tensor):
                        self._see_input(item, phase, t1)
        if kwargs:
            for arg in kwargs.values():
                if isinstance(arg, Tensor):
                    self._see_input(arg, phase, t1)
        if isinstance(out, Tensor):
            self._see_output(out, row, call, phase, t1)
        elif type(out) is tuple or type(out) is list:
            for item in out:
                if isinstance(item, Tensor):
                    self._see_output(item, row, call, phase, t1)
        if phase == OTHER:
            self._link_sources(args, kwargs, out)
        if self._op_categories and name in self._op_categories:
            category, which = self._op_categories[name]
            for t in tensors_in(out if which == "result" else kwargs.get("out")):
                self.mark(t, category)
        if row & 4095 == 4095:
            self.flush()

    def _op_name(self, func: Any) -> int:
        """The string id of an op first seen."""
        name = self._op_names[id(func)] = self._tables.intern(str(func))
        self._op_funcs.append(func)  # keeps id(func) from being reused
        if str(func) in _FSDP_OPS:
            self._op_categories[name] = _FSDP_OPS[str(func)]
        return name

    def flush(self) -> None:
        """Write the buffered rows; ops and memory events wait for their allocator window's
        merge (NOTE [ Allocator events ] in allocations.py), which a full window brings on."""
        allocator, mem = self._allocator, self._mem
        if allocator.running and len(mem.data) > WINDOW_ROWS * mem.width:
            allocator.close_window()
            allocator.open_window()
        flags = self._flags
        flags.busy = True
        try:
            held = (self._ops, mem) if allocator.running else ()
            for buf in self._tables.appended:
                if buf not in held:
                    buf.flush()
            if self._ops not in held:
                del self._op_stacks[:]
        finally:
            flags.busy = False

    def _link_sources(self, args: Any, kwargs: Any, out: Any) -> None:
        """Outside the step's phases (data handling between steps): remember which storages an
        op's new outputs were made from (NOTE [ Inputs and their sources ])."""
        made = [s for s in map(self._sid_of, tensors_in(out)) if s is not None]
        if not made:
            return
        sources = [s for s in map(self._sid_of, tensors_in(args, kwargs)) if s is not None]
        for sid in made:
            if sid not in sources:
                self._sources.setdefault(sid, []).extend(sources)
        self._st.pinned.update(sources)  # NOTE [ Kept rows ] in storage_rows.py

    def _sid_of(self, t: torch.Tensor) -> int | None:
        st = storage_of(t)
        ref = None if st is None else self._known.get(st._cdata)
        return None if ref is None else ref.sid

    def _promote_input(self, sid: int) -> None:
        """An OTHER storage used by the step's forward is an input, and so is every OTHER
        storage it was made from (NOTE [ Inputs and their sources ])."""
        data, storages, todo = self._st_data, self._st, [sid]
        while todo:
            row = todo.pop()
            at = storages.slot(row) * ST_WIDTH
            storages.pinned.discard(row)
            if data[at + ST_CATEGORY] == _OTHER_CAT:
                data[at + ST_CATEGORY] = _INPUT
                todo += self._sources.pop(row, ())
                if data[at + ST_FREE_NS] >= 0:  # a source freed before
                    storages.rewritten(row)  # NOTE [ Final rows ] in buffers.py

    def _see_input(self, t: torch.Tensor, phase: int, now: int) -> None:
        try:
            plain = type(t) is Tensor or type(t) is Parameter
            st = (t if plain else local(t)).untyped_storage()
        except (RuntimeError, NotImplementedError):
            return  # sparse, mkldnn: no storage to follow
        ref = self._known.get(st._cdata)
        if ref is None:
            self._register_existing(t, st, phase, now)
        elif phase == FORWARD and self._category(ref.sid) == _OTHER_CAT:
            self._promote_input(ref.sid)  # made outside the forward (a batch), used by it

    def _see_output(self, t: torch.Tensor, op: int, call: int, phase: int, now: int) -> None:
        if type(t) is not Tensor and type(t) is not Parameter:
            t = local(t)  # NOTE [ FSDP's storages ]
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st._cdata in self._known:
            return
        nbytes = st.nbytes()
        if nbytes == 0 or t.is_meta:
            return
        category = _OTHER_CAT if phase == OTHER else _TEMPORARY
        sid = self._add_storage(t, st, nbytes, category, op, call, now)
        self._mem.data.extend((_ALLOC, sid, op, now))

    def _register_existing(self, t: torch.Tensor, st: Any, phase: int, now: int) -> int | None:
        """First sight of a storage made before recording (or outside any op)."""
        nbytes = st.nbytes()
        if nbytes == 0 or t.is_meta:
            return None
        data = local(t)
        if isinstance(t, Parameter):
            category = _PARAMETER if data is t else _SHARDED  # NOTE [ FSDP's storages ]
        elif phase == FORWARD or (t.is_cpu and st.is_shared()):
            category = _INPUT  # NOTE [ Inputs and their sources ]: also a worker's batch
        else:
            category = _OTHER_CAT
        sid = self._add_storage(data, st, nbytes, category, NO_INDEX, NO_INDEX, -1)
        self._mem.data.extend((_SEEN, sid, self.last_op, now))
        return sid

    def _add_storage(
        self, t: torch.Tensor, st: Any, nbytes: int, category: int, op: int, call: int, now: int
    ) -> int:
        dtype_id, shape_id = self.layout_ids(t)
        device_id = self._cpu_id if t.is_cpu else self._device_id(t)
        calls = self._calls
        module = calls.data[calls.slot(call) * CALL_WIDTH] if call != NO_INDEX else NO_INDEX
        row = (nbytes, device_id, category, dtype_id, shape_id, op, call, module, now)
        sid = self._st.add((*row, -1, self._tables.stack_of(op)), st.data_ptr())
        ref = StorageRef(st, self._on_free)
        ref.sid = sid
        ref.key = st._cdata
        self._known[ref.key] = ref
        return sid

    def _on_free(self, ref: StorageRef) -> None:
        """Weak-reference callback: the storage's memory was just released."""
        self._known.pop(ref.key, None)
        if self._flags.state is not State.RECORDING or ref.sid < 0:
            return  # sid -1: freed already by a resize (NOTE [ FSDP's storages ])
        now = perf_counter_ns()
        self._st_data[self._st.slot(ref.sid) * ST_WIDTH + ST_FREE_NS] = now
        self._mem.data.extend((_FREE, ref.sid, self.last_op, now))

    def _category(self, sid: int) -> int:
        return self._st_data[self._st.slot(sid) * ST_WIDTH + ST_CATEGORY]

    def _promote(self, sid: int, category: int) -> None:
        """Give storage ``sid`` ``category`` unless it already has a stronger one."""
        at = self._st.slot(sid) * ST_WIDTH + ST_CATEGORY
        if _RANK[category] < _RANK[self._st_data[at]]:
            self._st_data[at] = category

    def _sid(self, t: torch.Tensor, st: Any, now: int | None = None) -> int | None:
        """The storage row of ``t`` (storage ``st``), registered if never seen; None if empty."""
        ref = self._known.get(st._cdata)
        if ref is not None:
            return ref.sid
        return self._register_existing(t, st, OTHER, perf_counter_ns() if now is None else now)

    # ------------------------------------------------------------------------- categories

    def mark(self, t: torch.Tensor, category: int, owner: torch.Tensor | None = None) -> None:
        """Give the tensor's storage ``category`` unless it already has a stronger one.

        ``owner`` is the parameter a gradient or optimizer state belongs to (a parameter owns
        itself): its module becomes the storage's module.
        """
        st = storage_of(t)
        sid = None if st is None else self._sid(t, st)
        if sid is None:
            return
        if category == _PARAMETER and local(t) is not t:
            category = _SHARDED  # NOTE [ FSDP's storages ]
        self._promote(sid, category)
        at = self._st.slot(sid) * ST_WIDTH + ST_MODULE
        if self._st_data[at] == NO_INDEX:
            self._st_data[at] = self._registry.owner(owner if owner is not None else t)

    def parameters(self) -> Iterator[torch.Tensor]:
        """The modules' parameters, and an optimizer's that no module owns."""
        yield from self._registry.parameters()
        yield from self.optimizer_parameters()

    def optimizer_parameters(self) -> Iterator[torch.Tensor]:
        """The parameters of the optimizers seen, a module's parameter included."""
        for opt in self.optimizers.alive():
            for group in opt.param_groups:
                yield from group["params"]

    def mark_training_state(self) -> None:
        """A run's first recorded step begins: note the parameters, gradients and optimizer
        state that exist, and the modules' buffers (NOTE [ Buffers are noted at a run's start ])."""
        for p in self.parameters():
            self.mark(p, _PARAMETER)
        for b in self._registry.buffers():
            self.mark(b, _INPUT)
        self.mark_gradients()
        self.mark_optimizer_tensors()

    def mark_gradients(self) -> None:
        for p in self.parameters():
            if p.grad is not None:
                self.mark(p.grad, int(Category.GRADIENT), owner=p)

    def mark_optimizer_tensors(self) -> None:
        for opt in self.optimizers.alive():
            for param, state in opt.state.items():
                # Values may be lists of tensors (L-BFGS's history: old_dirs, old_stps, ro).
                for value in state.values():
                    for tensor in tensors_in(value):
                        self.mark(tensor, int(Category.OPTIMIZER_STATE), owner=param)

    def closure_runs(self, running: bool) -> None:
        """An optimizer's closure begins (``running``) or returns: its forward and backward
        are not the optimizer's. Here each op reads ``PhaseState.optimizer_depth``, which the
        closure's wrapper sets: nothing to do."""

    def on_saved(self, x: torch.Tensor, kind: SavedEventKind) -> None:
        """Autograd keeps (PACK) or hands back (UNPACK) ``x``: its storage is an activation, or
        an input if made outside the step's forward."""
        x = local(x)
        st = storage_of(x)
        sid = None if st is None else self._sid(x, st)
        if sid is None:
            return  # an empty storage
        # Made outside the step's forward (a batch from the data loader) and saved: an input.
        if self._category(sid) == _OTHER_CAT:
            self._promote_input(sid)
        else:
            self._promote(sid, _ACTIVATION)
        ph = self._phases
        if kind is SavedEventKind.PACK:
            call = ph.stack[-1][1] if ph.stack else NO_INDEX
        else:
            seq = ph.node_seq()
            call = ph.last_seq_call if seq == -2 else ph.backward_call(seq)
        dtype_id, shape_id = self.layout_ids(x)
        self._saved.data.extend(
            (int(kind), sid, self.last_op, call, shape_id, dtype_id, x.nbytes, perf_counter_ns())
        )

    def note_call_io(self, call: int, args: Any, kwargs: Any, output: Any) -> None:
        """Record the storages of a module call's inputs (positional, then keyword) and of its
        output, as it returns."""
        self.note_io(call, args, _INPUT_IO)
        if kwargs:
            self.note_io(call, kwargs, _INPUT_IO)
        self.note_io(call, output, _OUTPUT_IO)

    def note_io(self, call: int, value: Any, kind: int) -> None:
        """Record the storages of the tensors going into or out of a module call."""
        now = perf_counter_ns()
        for t in tensors_in(value):
            st = storage_of(t)
            sid = None if st is None else self._sid(t, st, now)
            if sid is not None:
                self._io.data.extend((call, sid, kind))

    def on_resized(self, fsdp_param: Any) -> None:
        """FSDP resized the storages of a parameter's all-gather outputs: to 0 is their FREE,
        back is an ALLOC of a new storage row, owned by the parameter's module (NOTE [ FSDP's
        storages ])."""
        if self._flags.state is not State.RECORDING:
            return
        module = self._registry.row(fsdp_param._module_info.module)
        stack = self._phases.stack
        for tensor in fsdp_param.all_gather_outputs:
            st = tensor.untyped_storage()
            ref = self._known.get(st._cdata)
            if st.nbytes() == 0:
                if ref is not None:
                    self._on_free(ref)
                    ref.sid = ref.key = -1
                continue
            if ref is None:
                now = perf_counter_ns()
                call = stack[-1][1] if stack else NO_INDEX
                sid = self._add_storage(tensor, st, st.nbytes(), _UNSHARDED, NO_INDEX, call, now)
                self._mem.data.extend((_ALLOC, sid, self.last_op, now))
            else:
                sid = ref.sid
                self._promote(sid, _UNSHARDED)
            if module is not None:
                self._st_data[self._st.slot(sid) * ST_WIDTH + ST_MODULE] = module

    # ------------------------------------------------------------------------- string ids

    def _device_id(self, t: torch.Tensor) -> int:
        device = t.device
        key = ("device", device)
        sid = self._names.get(key)
        if sid is None:
            self.saw_cuda |= device.type == "cuda"
            sid = self._names[key] = self._tables.intern(str(device))
        return sid

    def layout_ids(self, t: torch.Tensor) -> tuple[int, int]:
        """String ids of the tensor's dtype and shape ('64x128')."""
        key = (t.dtype, t.shape)
        ids = self._layouts.get(key)
        if ids is None:
            dtype = str(t.dtype).removeprefix("torch.")
            shape = "x".join(map(str, t.shape)) or "scalar"
            ids = self._layouts[key] = (self._tables.intern(dtype), self._tables.intern(shape))
        return ids
