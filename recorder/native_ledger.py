"""The storage ledger of the native path (``CKVIEW_RECORDER=native``): ops and allocator blocks
come from the native extension (recorder/native), drained and attributed once per step with
numpy, instead of from the Python dispatch mode and the profiler's allocator windows.

NOTE [ The native ledger ]
- Every allocator block allocated while a run records is one storage row, written when the step
  that allocated it ends (rows stay editable until the run ends: a later step may free it, save
  it or find it among the gradients). Ops are the extension's RecordFunction ranges (names such
  as ``aten::mm``, ranges nest); an op still open at the boundary (``Optimizer.step``) is cut
  there.
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
  post hooks, RECOMPUTE inside the recompute regions the Python phases record. Module calls are
  the Python hooks' rows: each native call is the Python call that began last before it (both
  hooks fire for every call, the Python one first).
"""

from __future__ import annotations

import weakref
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
from recorder.ledger import StorageLedger
from recorder.native.attribute import Attribution, StepFacts, layout_texts
from recorder.native.rows import drain
from recorder.phases import FORWARD, OTHER
from recorder.tables import CALL_WIDTH, ST_CATEGORY, ST_MODULE, ST_WIDTH, RunTables

_RANK = np.zeros(len(Category), np.int64)
for _rank, _cat in enumerate(CATEGORY_PRIORITY):
    _RANK[_cat] = _rank

_ALLOC, _FREE = int(MemoryEventKind.ALLOC), int(MemoryEventKind.FREE)
_PACK = int(SavedEventKind.PACK)
_TEMPORARY, _OTHER = int(Category.TEMPORARY), int(Category.OTHER)
_ACTIVATION = int(Category.ACTIVATION)
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
        self._reset()

    def _reset(self) -> None:
        self._attribution = Attribution()
        self._deferring = False  # the run's first step began: marks wait for its rows
        self._blocks = _Blocks()
        self._noted: list[tuple[int, int, int, int, int, Any]] = []
        self._optimizer_spans: list[list[int]] = []
        self._backward_starts: list[int] = []
        self._calls_at_step = 0

    def begin_run(self, tables: RunTables) -> None:
        super().begin_run(tables)
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
        self._note(t, 0, category, module)

    def mark_gradients(self) -> None:
        if self._deferring and self._phases.optimizer_depth:
            self._optimizer_spans.append([perf_counter_ns(), -1])
        super().mark_gradients()

    def mark_optimizer_tensors(self) -> None:
        super().mark_optimizer_tensors()
        if self._optimizer_spans and self._optimizer_spans[-1][1] < 0:
            self._optimizer_spans[-1][1] = perf_counter_ns()

    def on_saved(self, x: torch.Tensor, kind: SavedEventKind) -> None:
        """A tensor that other saved-tensor hooks (checkpoint's) kept: an activation."""
        if not self._deferring:
            super().on_saved(x, kind)
        else:  # kept (pack) or handed back recomputed (unpack): an activation
            self._note(local(x), 1, _ACTIVATION, NO_INDEX)

    def note_io(self, call: int, value: Any, kind: int) -> None:
        if not self._deferring:
            super().note_io(call, value, kind)
            return
        for t in tensors_in(value):
            self._note(t, 2 + kind, call, NO_INDEX)

    def _note(self, t: torch.Tensor, what: int, value: int, module: int) -> None:
        """Resolved at the step's end (NOTE [ The native ledger ]): 0 mark, 1 saved, 2+ io."""
        st = storage_of(t)
        if st is None or st.nbytes() == 0 or t.is_meta:
            return
        ref = self._known.get(st._cdata)
        if ref is not None:  # a storage from before the run, registered already
            self._apply_python(ref.sid, what, value, module)
            return
        self._noted.append((st.data_ptr(), perf_counter_ns(), what, value, module, weakref.ref(t)))

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
            self._backward_starts = []
            self._deferring = True
            self._calls_at_step = len(self._calls)

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
        spans = [(Phase.FORWARD, self._forward_spans(now))]
        spans.append((Phase.OPTIMIZER, _spans(self._optimizer_spans, now)))
        spans.append((Phase.RECOMPUTE, self._recompute_spans(now)))
        facts = self._attribution.step(rows, spans)
        self._optimizer_spans, self._backward_starts = [], []
        py_call = self._python_calls(facts)
        op_rows = self._write_ops(facts, py_call, now)
        self._write_blocks(facts, py_call, op_rows)
        self._write_saved(facts, py_call, op_rows)
        self._resolve_noted()
        self._sort_memory_events()
        self._calls_at_step = len(self._calls)

    def backward_begins(self) -> None:
        """A backward pass begins (``_torch.bracket_backward``): the forward's top-level ops
        before it are FORWARD (the Python path's ``top_phase``)."""
        self._phases.enter_backward(queue=False)
        self._backward_starts.append(perf_counter_ns())

    def _forward_spans(self, now: int) -> np.ndarray:
        """From each top-level forward call's start to the next backward (or the step's end):
        ops outside modules there (the loss) are FORWARD, as on the Python path."""
        calls = self._calls
        data = np.frombuffer(calls.data.tobytes(), np.int64).reshape(-1, CALL_WIDTH)
        data = data[self._calls_at_step :]
        root = (data[:, calls.index("parent")] == NO_INDEX) & (
            data[:, calls.index("phase")] == FORWARD
        )
        starts = data[root, calls.index("start_ns")]
        backward = np.asarray([*self._backward_starts, now], np.int64)
        ends = backward[np.minimum(np.searchsorted(backward, starts), len(backward) - 1)]
        return np.stack([starts, ends], axis=1)

    def _recompute_spans(self, now: int) -> np.ndarray:
        regions = self._tables.regions
        if not len(regions):
            return np.zeros((0, 2), np.int64)
        cols = regions.as_columns()
        ends = np.where(cols["end_ns"] < 0, now, cols["end_ns"])
        return np.stack([cols["start_ns"], ends], axis=1).astype(np.int64)

    def _python_calls(self, facts: StepFacts) -> _CallMap:
        """Each native call id's Python call row: the one that began last before it."""
        data = np.frombuffer(self._calls.data.tobytes(), np.int64).reshape(-1, CALL_WIDTH)
        first = self._calls_at_step
        starts = data[first:, self._calls.index("start_ns")]
        native = facts.calls
        at = np.searchsorted(starts, native["start_ns"], side="right") - 1
        rows = np.where(at >= 0, at + first, NO_INDEX)
        self._blocks.calls.add(native["call"].astype(np.int64), rows)
        return _CallMap(self._blocks.calls, data[:, 0])

    def _write_ops(self, facts: StepFacts, calls: _CallMap, now: int) -> _OpMap:
        ops = facts.ops
        first = self._ops.rows
        names = self._string_ids(ops["name"])
        call = np.where(
            ops["phase"] == Phase.RECOMPUTE, calls.row(ops["call"]), calls.row(ops["module_call"])
        )
        end = np.where(ops["end_ns"] < 0, now, ops["end_ns"])
        table = np.stack(
            [
                names,
                ops["phase"].astype(np.int64),
                call,
                np.full(len(names), self._tables.step),
                ops["start_ns"],
                end,
                ops["seq_nr"],
            ],
            axis=1,
        )
        self._ops.data.frombytes(table.astype(np.int64).tobytes())
        return _OpMap(ops["id"], np.arange(first, first + len(names)))

    def _string_ids(self, names: np.ndarray) -> np.ndarray:
        """String ids of the extension's op name indexes (interned once per name)."""
        top = int(names.max(initial=-1)) + 1
        known = len(self._name_ids)
        if top > known:
            texts = self._ext.names(known)
            new = [self._tables.intern(text) for text in texts]
            self._name_ids = np.concatenate([self._name_ids, np.asarray(new, np.int64)])
        return self._name_ids[names]

    def _write_blocks(self, facts: StepFacts, calls: _CallMap, ops: _OpMap) -> None:
        blocks = facts.blocks
        n = len(blocks["block"])
        first = len(self._st_data) // ST_WIDTH
        sids = np.arange(first, first + n)
        recompute = blocks["phase"] == Phase.RECOMPUTE
        call = calls.row(np.where(recompute, blocks["call"], blocks["module_call"]))
        category = np.where(blocks["phase"] == Phase.OTHER, _OTHER, _TEMPORARY)
        dtype, shape = self._layout_ids(blocks["dtype"], blocks["ndim"], blocks["dims"])
        op = ops.row(blocks["op"])
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
                np.full(n, NO_INDEX),
            ],
            axis=1,
        ).astype(np.int64)
        self._st_data.frombytes(table.tobytes())
        self._tables.st_address.frombytes(blocks["ptr"].astype(np.int64).tobytes())
        self._blocks.add(blocks, sids)
        events = [np.stack([np.full(n, _ALLOC), sids, op, blocks["alloc_ns"]], axis=1)]
        freed = blocks["free_ns"] >= 0
        free_op = ops.row(blocks["free_op"][freed])
        events.append(
            np.stack(
                [np.full(freed.sum(), _FREE), sids[freed], free_op, blocks["free_ns"][freed]], 1
            )
        )
        late = facts.late_frees
        late_sid = self._blocks.sid(late["block"])
        known = late_sid >= 0
        self._set_storages(late_sid[known], "free_ns", late["free_ns"][known])
        self._blocks.freed(late["block"][known], late["free_ns"][known])
        late_op = ops.row(late["free_op"][known])
        events.append(
            np.stack(
                [np.full(known.sum(), _FREE), late_sid[known], late_op, late["free_ns"][known]], 1
            )
        )
        self._mem.data.frombytes(np.concatenate(events).astype(np.int64).tobytes())
        saved = np.concatenate([sids[blocks["saved"]], self._blocks.sid(facts.late_saved)])
        self._promote_saved(saved[saved >= 0])

    def _write_saved(self, facts: StepFacts, calls: _CallMap, ops: _OpMap) -> None:
        saved = facts.saved
        sid = self._blocks.sid(saved["block"])
        old = sid < 0  # a block from before the run (a parameter): its SEEN row, by pointer
        sid[old] = self._python_sid(saved["ptr"][old])
        keep = sid >= 0
        dtype, shape = self._layout_ids(saved["dtype"], saved["ndim"], saved["dims"])
        pack = saved["kind"] == _PACK
        call = calls.row(np.where(pack, saved["call"], -1))
        table = np.stack(
            [
                saved["kind"].astype(np.int64),
                sid,
                ops.row(saved["op"]),
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

    def _resolve_noted(self) -> None:
        """Marks, saved tensors and module I/O noted during the step, against its blocks."""
        noted, self._noted = self._noted, []
        if not noted:
            return
        ptr = np.array([n[0] for n in noted], np.int64)
        when = np.array([n[1] for n in noted], np.int64)
        sids = self._blocks.alive_at(ptr, when)
        for (_, t, what, value, module, ref), sid in zip(noted, sids.tolist(), strict=True):
            if sid < 0:
                tensor = ref()
                st = None if tensor is None else storage_of(tensor)
                if tensor is None or st is None:
                    continue  # gone before the step ended, and no block of the run
                phase = FORWARD if what == 2 else OTHER
                sid = self._sid(tensor, st, t) if what != 2 else self._io_sid(tensor, st, phase, t)
                if sid is None:
                    continue
            self._apply_python(sid, what, value, module)

    def _io_sid(self, t: torch.Tensor, st: Any, phase: int, now: int) -> int | None:
        ref = self._known.get(st._cdata)
        return ref.sid if ref is not None else self._register_existing(t, st, phase, now)

    def _sort_memory_events(self) -> None:
        """Rows of the Python ledger (SEEN, frees of SEEN storages) and the step's block rows
        in time order (earlier steps' rows all come before)."""
        mem = self._mem
        rows = np.frombuffer(mem.data.tobytes(), np.int64).reshape(-1, mem.width)
        order = np.argsort(rows[:, mem.width - 1], kind="stable")
        del mem.data[:]
        mem.data.frombytes(rows[order].tobytes())

    # ------------------------------------------------------------------ helpers

    def _promote_all(self, sids: np.ndarray, category: int) -> None:
        if not len(sids):
            return
        view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
        current = view[sids, ST_CATEGORY]
        stronger = _RANK[category] < _RANK[current]
        view[sids[stronger], ST_CATEGORY] = category
        del view, current

    def _set_storages(self, sids: np.ndarray, column: str, values: np.ndarray) -> None:
        if len(sids):
            view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
            view[sids, self._tables.storages.index(column)] = values
            del view

    def _layout_ids(self, dtype: np.ndarray, ndim: np.ndarray, dims: np.ndarray) -> tuple[Any, Any]:
        dtypes, d, shapes, s = layout_texts(dtype, ndim, dims, self._dtype_names)
        intern = self._tables.intern
        unknown = intern("")  # a block no op output names (as the allocator source writes)
        d_ids = np.asarray([intern(x) for x in dtypes] + [unknown], np.int64)
        s_ids = np.asarray([intern(x) for x in shapes] + [unknown], np.int64)
        return d_ids[d], s_ids[s]  # index -1: the unknown string, at the end

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


class _Blocks:
    """The run's blocks: block id -> storage row, pointer and lifetime; native call id ->
    Python call row."""

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)
        self.sids = np.zeros(0, np.int64)
        self.ptr = np.zeros(0, np.int64)
        self.alloc = np.zeros(0, np.int64)
        self.free = np.zeros(0, np.int64)
        self.calls = _IdMap()

    def add(self, blocks: dict[str, np.ndarray], sids: np.ndarray) -> None:
        self.ids = np.concatenate([self.ids, blocks["block"]])
        self.sids = np.concatenate([self.sids, sids])
        self.ptr = np.concatenate([self.ptr, blocks["ptr"]])
        self.alloc = np.concatenate([self.alloc, blocks["alloc_ns"]])
        self.free = np.concatenate([self.free, blocks["free_ns"]])
        order = np.argsort(self.ids, kind="stable")  # block ids count up: sorted already
        if not (order[1:] > order[:-1]).all():
            self.ids, self.sids, self.ptr = self.ids[order], self.sids[order], self.ptr[order]
            self.alloc, self.free = self.alloc[order], self.free[order]

    def sid(self, block: np.ndarray) -> np.ndarray:
        """Storage row of each block id, -1 for a block of no step of this run."""
        if not len(self.ids):
            return np.full(len(block), -1, np.int64)
        at = np.minimum(np.searchsorted(self.ids, block), len(self.ids) - 1)
        return np.where(self.ids[at] == block, self.sids[at], -1)

    def freed(self, block: np.ndarray, when: np.ndarray) -> None:
        at = np.searchsorted(self.ids, block)
        self.free[at] = when

    def alive_at(self, ptr: np.ndarray, when: np.ndarray) -> np.ndarray:
        """Storage row of the block at ``ptr`` alive at ``when``, -1 if none."""
        order = np.lexsort((self.alloc, self.ptr))
        p, a = self.ptr[order], self.alloc[order]
        out = np.full(len(ptr), -1, np.int64)
        if not len(p):
            return out
        # the last block at that pointer allocated at or before the time
        lo = np.searchsorted(p, ptr, side="left")
        hi = np.searchsorted(p, ptr, side="right")
        for q in np.flatnonzero(hi > lo):  # one search per noted tensor, not per op
            i = lo[q] + np.searchsorted(a[lo[q] : hi[q]], when[q], side="right") - 1
            j = order[i] if i >= lo[q] else -1
            if j >= 0 and (self.free[j] < 0 or self.free[j] > when[q]):
                out[q] = self.sids[j]
        return out


class _IdMap:
    """Sorted int keys -> values, grown in batches."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)
        self.values = np.zeros(0, np.int64)

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        keys = np.concatenate([self.keys, keys])
        values = np.concatenate([self.values, values])
        order = np.argsort(keys, kind="stable")
        self.keys, self.values = keys[order], values[order]

    def get(self, query: np.ndarray) -> np.ndarray:
        if not len(self.keys):
            return np.full(len(query), NO_INDEX, np.int64)
        at = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
        return np.where((self.keys[at] == query) & (query >= 0), self.values[at], NO_INDEX)


class _CallMap:
    """Native call ids -> Python call rows, and the rows' modules."""

    def __init__(self, calls: _IdMap, modules: np.ndarray) -> None:
        self._calls = calls
        self._modules = modules

    def row(self, native: np.ndarray) -> np.ndarray:
        return self._calls.get(np.asarray(native, np.int64))

    def module(self, row: np.ndarray) -> np.ndarray:
        if not len(self._modules):
            return np.full(len(row), NO_INDEX, np.int64)
        return np.where(row >= 0, self._modules[np.maximum(row, 0)], NO_INDEX)


class _OpMap:
    """Native op ids of this step -> the run's op rows."""

    def __init__(self, ids: np.ndarray, rows: np.ndarray) -> None:
        self._map = _IdMap()
        self._map.add(ids.astype(np.int64), rows.astype(np.int64))

    def row(self, native: np.ndarray) -> np.ndarray:
        return self._map.get(np.asarray(native, np.int64))


def _spans(spans: list[list[int]], now: int) -> np.ndarray:
    if not spans:
        return np.zeros((0, 2), np.int64)
    out = np.asarray(spans, np.int64).reshape(-1, 2)
    out[out[:, 1] < 0, 1] = now
    return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
