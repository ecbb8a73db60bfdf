"""Writing one drained step into the run's tables: the half of the native ledger (NOTE [ The
native ledger ] in recorder/native_ledger.py) that runs at each step boundary, once the
extension's rows are drained and attributed (recorder/native/attribute.py). ``StepWriting`` is a
mixin of ``NativeLedger``: its methods read and write the ledger's tables."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

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
from recorder.compiled import COMPILED_REGIONS
from recorder.ledger import StorageRef
from recorder.native.attribute import Attribution, Columns, RowIds, StepFacts, StepRows
from recorder.native.rows import Rows
from recorder.phases import FORWARD, OTHER
from recorder.storage_rows import KeptRows
from recorder.tables import ST_CATEGORY, ST_MODULE, ST_WIDTH, RunTables

if TYPE_CHECKING:
    from recorder.buffers import RowBuffer
    from recorder.stacks import Stacks

_RANK = np.zeros(len(Category), np.int64)
for _rank, _cat in enumerate(CATEGORY_PRIORITY):
    _RANK[_cat] = _rank

_ALLOC, _FREE = int(MemoryEventKind.ALLOC), int(MemoryEventKind.FREE)
_PACK = int(SavedEventKind.PACK)
_TEMPORARY, _OTHER = int(Category.TEMPORARY), int(Category.OTHER)
_ACTIVATION = int(Category.ACTIVATION)
_BACKWARD_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION, the scope of a backward node's range


class StepWriting:
    """The step-boundary methods of :class:`NativeLedger` (NOTE [ The native ledger ])."""

    if TYPE_CHECKING:  # what the ledger holds (NativeLedger, StorageLedger); no runtime stubs
        _ext: Any
        _tables: RunTables
        _st_data: array[int]
        _ops: RowBuffer
        _mem: RowBuffer
        _saved: RowBuffer
        _io: RowBuffer
        _calls: KeptRows
        _known: dict[int, StorageRef]
        _attribution: Attribution
        _backward_starts: list[int]
        _calls_at_step: int
        _cpu_id: int
        _stacks: Stacks | None
        _regions_at_step: int
        _name_ids: np.ndarray
        _compiled_name: int
        _mem_mark: int
        _last_op: tuple[int, int, int, int] | None
        _calls_t: array[int]
        _calls_stack: array[int]
        _sources: dict[int, list[int]]
        _python_sids: tuple[np.ndarray, np.ndarray] | None

        def _apply_python(self, sid: int, what: int, value: int, module: int) -> None: ...

        def _promote_input(self, sid: int) -> None: ...

        def _seen_input(self, t: torch.Tensor | None, phase: int, now: int) -> int: ...

    def _forward_spans(self, rows: Rows, calls: np.ndarray, now: int) -> np.ndarray:
        """From each top-level forward call's start to the next backward (or the step's end):
        ops outside modules there (the loss) are FORWARD, as on the Python path. A compiled
        forward graph run outside backward begins a forward too: compiled around the model
        (``torch.compile(step_fn)``), no module call runs (NOTE [ Compiled code on the native
        path ] in compiled.py). ``calls``: the Python call rows begun in the step."""
        table = self._calls
        root = (calls[:, table.index("parent")] == NO_INDEX) & (
            calls[:, table.index("phase")] == FORWARD
        )
        starts = calls[root, table.index("start_ns")]
        if self._compiled_name >= 0:
            ops = rows.ops
            compiled = (ops["name"] == self._compiled_name) & (ops["graph_task"] < 0)
            starts = np.concatenate([starts, ops["t0"][compiled]])
        backward = np.asarray([*self._backward_starts, now], np.int64)
        ends = backward[np.minimum(np.searchsorted(backward, starts), len(backward) - 1)]
        return np.stack([starts, ends], axis=1)

    def _step_calls(self) -> np.ndarray:
        """The Python call rows begun in the step under way (in memory: NOTE [ Kept rows ])."""
        return _rows_from(self._calls, self._calls_at_step)

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

    def _recompute_spans(self, now: int) -> np.ndarray:
        regions = self._tables.regions
        if not len(regions):
            return np.zeros((0, 2), np.int64)
        cols = regions.as_columns()
        ends = np.where(cols["end_ns"] < 0, now, cols["end_ns"])
        return np.stack([cols["start_ns"], ends], axis=1).astype(np.int64)

    def _remember_last_op(self, facts: StepFacts) -> None:
        """The step's failing op, for ``failure`` (NOTE [ OOM capture on the native path ])."""
        ooms = facts.ooms
        if not len(ooms["t"]) and not facts.raised:
            return
        ops = facts.ops
        if len(ooms["t"]):  # the allocator's own row names the op it failed in
            failed = np.flatnonzero(ops["id"] == ooms["op"][-1])
        else:
            failed = np.flatnonzero(ops["raised"])
        if not len(failed):
            return
        row = int(failed[-1])  # ops come in id order: the last raised began last
        nbytes = int(ooms["bytes"][-1]) if len(ooms["t"]) else -1
        call = int(self._attribution.call_rows(ops["module_call"][row : row + 1])[0])
        module = NO_INDEX if call == NO_INDEX else self._calls.get(call, "module")
        self._last_op = (int(ops["name"][row]), module, int(ops["start_ns"][row]), nbytes)

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

    def _write_rows(self, facts: StepFacts, calls: np.ndarray, now: int) -> StepRows:
        """The step's rows of the run's tables, from the extension (NOTE [ Rows of the run's
        tables ] in native/attribute.py); the op rows are written here, the others by their
        own steps. ``calls``: the Python call rows begun in the step."""
        table = self._calls
        stacks = None if self._stacks is None else self._stacks_at(facts.blocks["alloc_ns"])
        ids = RowIds(
            step=self._tables.step,
            now=now,
            first_op=self._ops.rows,
            first_sid=len(self._tables.storages),
            first_call=self._calls_at_step,
            call_starts=calls[:, table.index("start_ns")],
            call_modules=calls[:, table.index("module")],
            name_ids=self._name_ids,
        )
        rows = self._attribution.write(ids, stacks)
        self._ops.append_rows(rows.ops)  # NOTE [ Blocks of rows ] in buffers.py
        return rows

    def _place_regions(self, facts: StepFacts, now: int) -> None:
        """The first and end op rows of this step's recompute regions, now that its ops are
        rows: the Python phases opened them before the step's ops were written."""
        regions = self._tables.regions
        count = len(regions)
        if count > self._regions_at_step:
            ops = facts.ops
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

    def _learn_names(self, count: int) -> None:
        """Fetch the extension's op names up to index ``count``."""
        known = len(self._name_ids)
        if count > known:
            texts = self._ext.names(known)
            new = [self._tables.intern(text) for text in texts]
            self._name_ids = np.concatenate([self._name_ids, np.asarray(new, np.int64)])
            if COMPILED_REGIONS[0] in texts:
                self._compiled_name = known + texts.index(COMPILED_REGIONS[0])

    def _write_blocks(self, rows: StepRows) -> np.ndarray:
        """Write the step's storage rows and memory events; returns the storage rows autograd
        saved."""
        storages = self._tables.storages
        _append(storages.data, rows.storages)
        _append(storages.address, rows.address)
        self._set_storages(rows.late_sid, "free_ns", rows.late_free_ns)
        self._mem.append_rows(rows.memory)
        return rows.saved_sids  # promoted once the step's op inputs are known

    def _apply_inputs(self, rows: Rows, facts: StepFacts) -> None:
        """The rules of NOTE [ Inputs and their sources ] (ledger.py) from the tensors ops
        outside modules read (NOTE [ Op inputs outside modules ] in ckrec_hooks.cpp): a storage from
        before the run is registered (SEEN) at its first read; an op between steps links its
        new blocks to what it read; an op of the forward (the loss) makes what it reads that was
        made outside the forward an input."""
        inputs = rows.inputs
        if not len(inputs):
            return
        # a few rows a step (the loss's ops): plain Python, not numpy calls of microseconds
        phases = facts.tables.phases(inputs["op"]).tolist()  # OTHER: an op between steps
        blocks = inputs["block"]
        sids = np.where(blocks >= 0, self._attribution.sids(blocks), inputs["sid"]).tolist()
        for row, tensor in enumerate(inputs["tensor"].tolist()):
            if sids[row] < 0 and tensor >= 0:
                phase = FORWARD if phases[row] == Phase.FORWARD else OTHER
                sids[row] = self._seen_input(
                    rows.input_tensors[tensor], phase, int(inputs["t"][row])
                )
        between: dict[int, list[int]] = {}
        forward: set[int] = set()
        for op, phase, sid in zip(inputs["op"].tolist(), phases, sids, strict=True):
            if sid >= 0 and phase == Phase.OTHER:
                between.setdefault(op, []).append(sid)
            elif sid >= 0 and phase == Phase.FORWARD:
                forward.add(sid)
        if between:
            made = self._attribution.sids(facts.blocks["block"])
            for op in sorted(between):
                sources = between[op]
                for out in made[facts.blocks["top_op"] == op].tolist():
                    self._sources.setdefault(out, []).extend(s for s in sources if s != out)
                self._tables.storages.pinned.update(sources)  # NOTE [ Kept rows ]
        storages = self._tables.storages
        for s in sorted(forward):
            if self._st_data[storages.slot(s) * ST_WIDTH + ST_CATEGORY] == _OTHER:
                self._promote_input(s)

    def _write_saved(self, rows: StepRows) -> None:
        table = rows.saved
        old = table[:, 1] < 0  # a block from before the run (a parameter): its SEEN row
        if old.any():
            table[old, 1] = self._python_sid(rows.saved_ptr[old])
        table = table[table[:, 1] >= 0]
        self._saved.append_rows(table)
        self._promote_saved(np.unique(table[table[:, 0] == _PACK, 1]))

    def _promote_saved(self, sids: np.ndarray) -> None:
        """Saved by autograd: an activation; made outside the forward (a batch), an input
        (``StorageLedger.on_saved``)."""
        at = self._slots(sids) * ST_WIDTH + ST_CATEGORY
        category = np.frombuffer(self._st_data, np.int64)[at]
        for sid in sids[category == _OTHER].tolist():
            self._promote_input(sid)
        self._promote_all(sids[category != _OTHER], _ACTIVATION)

    def _python_sid(self, ptr: np.ndarray) -> np.ndarray:
        """Storage rows the Python ledger registered (alive), by data pointer; -1 if none.
        Their sorted addresses are kept (``_python_sids``) until it registers or lets go of a
        storage: most steps register none (a step saves its parameters again)."""
        if self._python_sids is None:
            sids = np.fromiter((r.sid for r in self._known.values() if r.sid >= 0), np.int64)
            address = np.frombuffer(self._tables.storages.address, np.int64)[self._slots(sids)]
            order = np.argsort(address)
            self._python_sids = address[order], sids[order]
        address, sids = self._python_sids
        if not len(ptr) or not len(sids):
            return np.full(len(ptr), -1, np.int64)
        at = np.minimum(np.searchsorted(address, ptr), len(address) - 1)
        return np.where(address[at] == ptr, sids[at], -1)

    def _apply_notes(self, notes: Columns) -> None:
        """The step's note rows (NOTE [ Notes ] in ckrec_hooks.cpp), each on a block of the run.
        Storages still OTHER take them one by one, in time order, as ``_apply_python`` does
        (being used as an input or saved makes them inputs); for the others the order does not
        matter (categories only strengthen; a mark's module fills an empty one, first wins)."""
        sid = np.where(notes["block"] >= 0, self._attribution.sids(notes["block"]), notes["sid"])
        keep = sid >= 0
        sid, what, value, module = (
            sid[keep],
            notes["what"][keep],
            notes["value"][keep],
            notes["module"][keep].astype(np.int64),
        )
        view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
        other = view[self._slots(sid), ST_CATEGORY] == _OTHER
        del view
        for row in np.flatnonzero(other).tolist():
            self._apply_python(int(sid[row]), int(what[row]), int(value[row]), int(module[row]))
        rest = ~other
        io = rest & (what >= 2)
        if io.any():
            rows = np.stack([value[io], sid[io], what[io].astype(np.int64) - 2], axis=1)
            self._io.append_rows(rows)
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
        while True:
            count = mem.rows
            tail = mem.since(self._mem_mark)
            times = tail[:, mem.width - 1]
            if (times[1:] >= times[:-1]).all():  # the extension's rows come in time order
                self._mem_mark = mem.rows  # (and a free appended meanwhile is later still)
                return
            ordered = tail[np.argsort(times, kind="stable")]
            if mem.rows == count:  # no free callback appended meanwhile
                break
        mem.replace_since(self._mem_mark, ordered)
        self._mem_mark = mem.rows

    def _promote_all(self, sids: np.ndarray, category: int) -> None:
        if not len(sids):
            return
        view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
        slots = self._slots(sids)
        stronger = _RANK[category] < _RANK[view[slots, ST_CATEGORY]]
        view[slots[stronger], ST_CATEGORY] = category
        del view

    def _set_modules(self, sids: np.ndarray, modules: np.ndarray) -> None:
        """Give each storage its module where it has none."""
        if len(sids):
            view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
            slots = self._slots(sids)
            empty = view[slots, ST_MODULE] == NO_INDEX
            view[slots[empty], ST_MODULE] = modules[empty]
            del view, empty

    def _set_storages(self, sids: np.ndarray, column: str, values: np.ndarray) -> None:
        if len(sids):
            view = np.frombuffer(self._st_data, np.int64).reshape(-1, ST_WIDTH)
            view[self._slots(sids), self._tables.storages.index(column)] = values
            del view

    def _slots(self, sids: np.ndarray) -> np.ndarray:
        """Where storage rows ``sids`` are in ``_st_data`` (NOTE [ Kept rows ])."""
        return self._tables.storages.slots(sids)

    def _accelerator_id(self, kind: int, index: int) -> int:
        """The string id of a device other than the CPU (the extension asks once per run)."""
        if kind == 1:
            self.saw_cuda = True
        return self._tables.intern(f"cuda:{index}")


def _append(buffer: array[int], rows: np.ndarray) -> None:
    """Append ``rows`` (any integer dtype) to an int64 row buffer: one copy, through a view."""
    if rows.size:
        buffer.frombytes(np.ascontiguousarray(rows, np.int64).data.cast("B"))


def _rows_from(table: KeptRows, first: int) -> np.ndarray:
    """A copy of ``table``'s rows from row ``first`` on, all in memory (NOTE [ Kept rows ]:
    the current step's rows are); slicing the array copies just them and exports no buffer,
    so a free callback may append meanwhile."""
    assert first >= table.base, "rows dropped from memory were asked for"
    tail = table.data[table.slot(first) * table.width :]
    return np.frombuffer(tail, np.int64).reshape(-1, table.width)


def _op_rows(offsets: np.ndarray, first: int) -> np.ndarray:
    """The run's op rows of offsets from the step's first (NOTE [ Op rows of a step ] in
    ckattr.cpp); NO_INDEX for none."""
    return np.where(offsets >= 0, offsets + first, NO_INDEX)
