"""From one drain's rows to per-step facts, vectorised with numpy (no Python runs per op).

``Attribution`` holds what spans drains (blocks still allocated, module calls' modules, the
forward ops of the previous drain) and turns each drain's ``Rows`` into a ``StepFacts``:

- ``ops``: one row per RecordFunction range, with its phase, module call and backward node;
- ``blocks``: one row per allocation, with its free, top-level op, module (in backward through
  the autograd node's sequence number, NOTE [ Backward blocks and modules ]), whether autograd
  saved it, and its dtype and shape when op outputs were recorded;
- ``late_frees`` / ``late_op_ends``: blocks and ops of earlier drains that ended in this one;
- ``unknown_frees``: frees of blocks allocated before the reporter started (CUDA reports them;
  the CPU allocator knows no size for them and reports nothing);
- ``saved``: pack and unpack rows with the block they hit;
- ``calls``: module calls begun in this drain.

How these map onto the trace's run tables (``ckview/trace/schema.py``):

- ``storages``: ``nbytes``, ``alloc_ns``, ``free_ns``, ``op``, ``module_call``, ``module`` come
  from ``blocks``, with ids in the extension's numbering (op ids, call ids, module ids by
  address in ``calls``), which the sink renumbers into its rows. ``device`` is
  ``device_type``/``device_index``. ``dtype``/``shape`` are known only with op outputs recorded
  (``layout_texts`` gives the strings), else -1: a block is the allocator's, and nothing else
  says what tensor lives in it. ``category`` comes from ``categorize``: ACTIVATION for blocks
  autograd saved, PARAMETER/GRADIENT/OPTIMIZER_STATE for the pointers the caller reads at
  step boundaries (parameters, ``.grad``, optimizer state), TEMPORARY for blocks freed within
  the drain, else OTHER. INPUT and the FSDP categories need sources this module does not see.
  ``stack`` (``--stacks``) is another source's.
  The owner rule of ``module`` (a parameter's gradient and optimizer state belong to the
  parameter's module) also needs those pointer sets; ``blocks.module`` is the creating call's.
- ``ops``: ``start_ns``, ``end_ns``, ``module_call`` and ``seq_nr`` (the backward node's) are
  filled. ``name`` is RecordFunction's (``aten::mm``, a backward node's ``AddmmBackward0``),
  not the dispatch mode's ``aten.mm.default``; ranges nest (``parent``, ``top``), where the
  dispatch mode saw only the ops that reached it. ``phase`` is FORWARD, BACKWARD or OTHER:
  OPTIMIZER and RECOMPUTE need the optimizer's and checkpoint's markers, passed in as ``spans``.
- ``memory_events``: ALLOC rows from ``blocks`` (``alloc_ns``, ``op``), FREE rows from
  ``blocks``/``late_frees`` (``free_ns``, ``free_op``); SEEN rows from ``unknown_frees``.
- ``saved_events``: every column, from ``saved``.
- ``module_calls``: every column but ``phase`` and ``step``, from ``calls``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ckview.trace.schema import Category, Phase
from recorder.native.rows import DIMS, Rows

_BACKWARD_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION
Columns = dict[str, np.ndarray]


@dataclass
class StepFacts:
    """What one drain's rows say, as columns (see the module docstring)."""

    ops: Columns
    blocks: Columns
    late_frees: Columns
    late_op_ends: Columns
    unknown_frees: Columns
    saved: Columns
    calls: Columns
    ooms: Columns


@dataclass
class Attribution:
    """Per-step attribution of native rows; one per recording (state spans drains)."""

    next_block: int = 0
    # blocks allocated and not yet freed: block id, ptr, device code, alloc time
    _open: Columns = field(default_factory=lambda: _empty(("block", "ptr", "device", "t")))
    # module of every call id seen (call ids count from 0 over the process)
    _call_module: np.ndarray = field(default_factory=lambda: np.full(0, -1, np.int32))
    # forward ops' sequence numbers -> module call, of the previous drain and this one
    _seq_call_prev: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0, np.int32))
    )

    def step(self, rows: Rows, spans: Sequence[tuple[Phase, np.ndarray]] = ()) -> StepFacts:
        """The facts of one drain. ``spans`` are ``(phase, (n, 2) start/end ns)`` intervals
        (the optimizer's step, a checkpoint's recompute) whose ops take that phase."""
        calls = self._calls(rows.modules)
        ops, late_ends = _ops(rows.ops, rows.op_ends)
        seq_keys, seq_calls = self._seq_to_call(ops)
        ops["phase"] = _phases(ops, spans)
        backward_call = _lookup(seq_keys, seq_calls, ops["seq_nr"], -1)
        ops["module_call"] = np.where(ops["seq_nr"] >= 0, backward_call, ops["call"]).astype(
            np.int32
        )
        blocks, late_frees, unknown = self._blocks(rows.memory, ops, seq_keys, seq_calls)
        saved = self._saved(rows.saved, blocks)
        if len(rows.outputs):
            _layouts(rows.outputs, blocks, self._open)
        ooms = _columns(rows.ooms)
        return StepFacts(ops, blocks, late_frees, late_ends, unknown, saved, calls, ooms)

    # -- module calls ------------------------------------------------------------------------
    def _calls(self, mods: np.ndarray) -> Columns:
        enter = mods[mods["enter"] == 1]
        exits = mods[mods["enter"] == 0]
        top = int(mods["call"].max(initial=-1)) + 1
        if top > len(self._call_module):
            grown = np.full(max(top, 2 * len(self._call_module)), -1, np.int32)
            grown[: len(self._call_module)] = self._call_module
            self._call_module = grown
        self._call_module[enter["call"]] = enter["module"]
        end = _lookup(
            exits["call"].astype(np.int64), exits["t"], enter["call"].astype(np.int64), -1
        )
        seq_end = _lookup(
            exits["call"].astype(np.int64), exits["seq"], enter["call"].astype(np.int64), -1
        )
        return {
            "call": enter["call"].copy(),
            "module": enter["module"].copy(),
            "address": enter["address"].copy(),
            "parent": enter["parent"].copy(),
            "start_ns": enter["t"].copy(),
            "end_ns": end,
            "seq_begin": enter["seq"].copy(),
            "seq_end": seq_end,
        }

    def module_of(self, call: np.ndarray) -> np.ndarray:
        """Module id of each call id (-1 for -1 or a call never seen)."""
        call = np.asarray(call, np.int64)
        known = (call >= 0) & (call < len(self._call_module))
        return _take(self._call_module, np.where(known, call, -1)).astype(np.int32)

    # NOTE [ Backward blocks and modules ]
    # A backward node's range carries the sequence number autograd gave the node when the
    # forward op that made it ran; that forward op's range recorded the same number (its seq
    # at start) inside the module call that ran it. So a block allocated under a backward node
    # belongs to the call of the first forward op with the node's number. Engine work between
    # nodes (gradient accumulation into input buffers) and AccumulateGrad have no number: they
    # keep the call that was open on the thread (none, on the CPU).
    def _seq_to_call(self, ops: Columns) -> tuple[np.ndarray, np.ndarray]:
        fwd = (ops["scope"] != _BACKWARD_SCOPE) & (ops["seq"] >= 0) & (ops["call"] >= 0)
        keys = np.concatenate([ops["seq"][fwd], self._seq_call_prev[0]])
        calls = np.concatenate([ops["call"][fwd], self._seq_call_prev[1]])
        keys, first = np.unique(keys, return_index=True)  # this drain's first op wins
        calls = calls[first]
        self._seq_call_prev = (ops["seq"][fwd], ops["call"][fwd])
        return keys, calls

    # -- blocks -----------------------------------------------------------------------------
    def _blocks(
        self, mem: np.ndarray, ops: Columns, seq_keys: np.ndarray, seq_calls: np.ndarray
    ) -> tuple[Columns, Columns, Columns]:
        mem = mem[np.argsort(mem["t"], kind="stable")]
        device = mem["device_type"].astype(np.int64) * 65536 + mem["device_index"].astype(np.int64)
        alloc = mem["bytes"] > 0
        n_alloc = int(alloc.sum())
        block_ids = self.next_block + np.arange(n_alloc, dtype=np.int64)
        self.next_block += n_alloc

        # Pair each free with the allocation before it at the same address and device: at one
        # address the allocator alternates allocation and free. Blocks still open from earlier
        # drains take part as allocations that come first.
        old = self._open
        n_old, n = len(old["block"]), len(mem)
        ptr = np.concatenate([old["ptr"], mem["ptr"]])
        dev = np.concatenate([old["device"], device])
        is_alloc = np.concatenate([np.ones(n_old, bool), alloc])
        order = np.lexsort((np.arange(n_old + n), dev, ptr))  # by address, then event order
        a, b = order[:-1], order[1:]
        pair = (ptr[a] == ptr[b]) & (dev[a] == dev[b]) & is_alloc[a] & ~is_alloc[b]
        freed_by = np.full(n_old + n, -1, np.int64)  # allocation event -> its free event
        freed_by[a[pair]] = b[pair] - n_old
        has_alloc = np.zeros(n_old + n, bool)
        has_alloc[b[pair]] = True

        free_t = _take(mem["t"], freed_by)
        free_op = _take(mem["op"], freed_by)
        late = freed_by[:n_old] >= 0
        late_frees = {
            "block": old["block"][late],
            "free_ns": free_t[:n_old][late],
            "free_op": free_op[:n_old][late],
        }
        new = np.flatnonzero(alloc)
        frees = np.flatnonzero(~alloc)
        unknown = frees[~has_alloc[n_old + frees]]
        unknown_frees = {
            "ptr": mem["ptr"][unknown],
            "nbytes": -mem["bytes"][unknown],
            "t": mem["t"][unknown],
            "op": mem["op"][unknown],
            "device_type": mem["device_type"][unknown],
            "device_index": mem["device_index"][unknown],
        }

        rows = mem[new]
        op, top, node_seq, phase = _block_ops(rows, ops)
        call = np.where(node_seq >= 0, _lookup(seq_keys, seq_calls, node_seq, -1), rows["call"])
        blocks: Columns = {
            "block": block_ids,
            "ptr": rows["ptr"].copy(),
            "nbytes": rows["bytes"].copy(),
            "device_type": rows["device_type"].copy(),
            "device_index": rows["device_index"].copy(),
            "alloc_ns": rows["t"].copy(),
            "free_ns": free_t[n_old + new],
            "free_op": free_op[n_old + new],
            "op": op,
            "top_op": top,
            "node_seq": node_seq,
            "phase": phase,
            "module_call": call.astype(np.int32),
            "module": self.module_of(call),
            "saved": np.zeros(len(new), bool),
            "dtype": np.full(len(new), -1, np.int8),
            "ndim": np.full(len(new), -1, np.int8),
            "dims": np.zeros((len(new), DIMS), np.int64),
        }
        still_old = ~late
        still_new = blocks["free_ns"] < 0
        self._open = {
            "block": np.concatenate([old["block"][still_old], block_ids[still_new]]),
            "ptr": np.concatenate([old["ptr"][still_old], rows["ptr"][still_new]]),
            "device": np.concatenate([old["device"][still_old], device[new][still_new]]),
            "t": np.concatenate([old["t"][still_old], rows["t"][still_new]]),
        }
        return blocks, late_frees, unknown_frees

    def _saved(self, saved: np.ndarray, blocks: Columns) -> Columns:
        """Pack and unpack rows, each with the block its storage lives in (-1: a block of no
        recorded allocation, e.g. a parameter made before recording). Marks saved blocks."""
        cand_block, cand_ptr, cand_t, cand_free = _candidates(blocks, self._open)
        hit = _last_at_or_before(cand_ptr, cand_t, saved["ptr"], saved["t"])
        alive = hit >= 0
        alive[alive] = (cand_free[hit[alive]] < 0) | (cand_free[hit[alive]] >= saved["t"][alive])
        block = np.where(alive, cand_block[np.maximum(hit, 0)], -1)
        packed = block[(saved["kind"] == 0) & (block >= 0)]
        blocks["saved"] |= np.isin(blocks["block"], packed)
        out = {
            name: np.ascontiguousarray(saved[name])
            for name in (
                "t",
                "ptr",
                "storage_nbytes",
                "nbytes",
                "op",
                "top",
                "call",
                "kind",
                "dtype",
                "ndim",
                "dims",
            )
        }
        out["block"] = block
        return out


_NONE = np.zeros(0, np.int64)


def categorize(
    blocks: Columns,
    parameters: np.ndarray = _NONE,
    gradients: np.ndarray = _NONE,
    optimizer_state: np.ndarray = _NONE,
) -> np.ndarray:
    """Category of each block (``CATEGORY_PRIORITY`` order), from the storage pointers the
    caller read at the step boundary and what the rows say (saved, freed within the drain)."""
    ptr = blocks["ptr"]
    category = np.full(len(ptr), int(Category.OTHER), np.uint8)
    category[blocks["free_ns"] >= 0] = Category.TEMPORARY
    category[blocks["saved"]] = Category.ACTIVATION
    # later assignments win: lowest priority first
    for cat, ptrs in (
        (Category.OPTIMIZER_STATE, optimizer_state),
        (Category.GRADIENT, gradients),
        (Category.PARAMETER, parameters),
    ):
        category[np.isin(ptr, ptrs)] = cat
    return category


def layout_texts(
    dtype: np.ndarray, ndim: np.ndarray, dims: np.ndarray, dtype_names: dict[int, str]
) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """Dtype and shape strings as the Python recorder writes them ('float32', '64x128',
    'scalar'), formatted once per distinct value: (dtype texts, index per row, shape texts,
    index per row); index -1 where unknown (ndim < 0)."""
    known = ndim >= 0
    codes, dtype_index = np.unique(dtype[known], return_inverse=True)
    dtypes = [dtype_names.get(int(c), f"dtype{int(c)}") for c in codes]
    key = np.concatenate([ndim[known, None].astype(np.int64), dims[known]], axis=1)
    shapes_u, shape_index = np.unique(key, axis=0, return_inverse=True)
    shapes = [_shape_text(int(row[0]), row[1:]) for row in shapes_u]
    d = np.full(len(ndim), -1, np.int64)
    s = np.full(len(ndim), -1, np.int64)
    d[known] = dtype_index.reshape(-1)
    s[known] = shape_index.reshape(-1)
    return dtypes, d, shapes, s


def _shape_text(ndim: int, dims: np.ndarray) -> str:
    if ndim == 0:
        return "scalar"
    text = "x".join(str(int(v)) for v in dims[: min(ndim, DIMS)])
    return text + "x..." if ndim > DIMS else text


# -- helpers ---------------------------------------------------------------------------------
def _empty(names: Sequence[str]) -> Columns:
    return {name: np.zeros(0, np.int64) for name in names}


def _columns(rows: np.ndarray) -> Columns:
    """A structured array's fields as contiguous columns (padding left out)."""
    names = rows.dtype.names or ()
    return {name: np.ascontiguousarray(rows[name]) for name in names if "pad" not in name}


def _take(values: np.ndarray, index: np.ndarray, missing: int = -1) -> np.ndarray:
    """``values[index]``, and ``missing`` where index < 0."""
    if len(values) == 0:
        return np.full(len(index), missing, np.int64)
    return np.where(index >= 0, values[np.maximum(index, 0)], missing)


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray, missing: int) -> np.ndarray:
    """``values[keys == q]`` for each q, or ``missing``; keys unique."""
    if len(keys) == 0:
        return np.full(len(query), missing, values.dtype if len(values) else np.int64)
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order]
    i = np.minimum(np.searchsorted(k, query), len(k) - 1)
    return np.where(k[i] == query, v[i], missing)


def _ops(ops: np.ndarray, ends: np.ndarray) -> tuple[Columns, Columns]:
    """This drain's op rows as columns, with the ends that arrived for them applied; ends of
    ops of earlier drains come back as late ends (NOTE [ Op ends ] in ckrec.cpp)."""
    ops = ops[np.argsort(ops["id"], kind="stable")]
    cols = _columns(ops)
    cols["t1"] = cols["t1"].copy()
    i = np.searchsorted(cols["id"], ends["id"])
    here = (i < len(cols["id"])) & (cols["id"][np.minimum(i, len(cols["id"]) - 1)] == ends["id"])
    cols["t1"][i[here]] = ends["t1"][here]
    cols["start_ns"], cols["end_ns"] = cols["t0"], cols["t1"]
    cols["seq_nr"] = np.where(cols["node_seq"] >= 0, cols["node_seq"], -1)
    return cols, {"id": ends["id"][~here], "end_ns": ends["t1"][~here]}


def _phases(ops: Columns, spans: Sequence[tuple[Phase, np.ndarray]]) -> np.ndarray:
    backward = (ops["graph_task"] >= 0) | (ops["node_seq"] >= 0)
    phase = np.where(
        backward, Phase.BACKWARD, np.where(ops["call"] >= 0, Phase.FORWARD, Phase.OTHER)
    )
    for which, intervals in spans:
        intervals = np.asarray(intervals, np.int64).reshape(-1, 2)
        if len(intervals) == 0:
            continue
        intervals = intervals[np.argsort(intervals[:, 0])]
        i = np.searchsorted(intervals[:, 0], ops["t0"], side="right") - 1
        inside = (i >= 0) & (ops["t0"] <= intervals[np.maximum(i, 0), 1])
        phase[inside] = which
    return phase.astype(np.uint8)


def _block_ops(rows: np.ndarray, ops: Columns) -> tuple[np.ndarray, ...]:
    """Op, top-level op, backward node seq and phase of each allocation. An allocation outside
    any op (a Python scalar wrapped before dispatch) takes the next op to start."""
    op, top, node_seq = rows["op"].copy(), rows["top"].copy(), rows["node_seq"].copy()
    n = len(ops["id"])
    phase = np.full(len(rows), int(Phase.OTHER), np.uint8)
    if n == 0:
        return op, top, node_seq, phase
    by_start = np.argsort(ops["t0"], kind="stable")
    nxt = by_start[np.minimum(np.searchsorted(ops["t0"][by_start], rows["t"], side="right"), n - 1)]
    outside = op < 0
    op[outside] = ops["id"][nxt[outside]]
    top[outside] = ops["top"][nxt[outside]]
    node_seq[outside] = ops["node_seq"][nxt[outside]]
    i = np.minimum(np.searchsorted(ops["id"], op), n - 1)
    here = ops["id"][i] == op
    phase[here] = ops["phase"][i[here]]
    return op, top, node_seq, phase


def _candidates(blocks: Columns, open_: Columns) -> tuple[np.ndarray, ...]:
    """Blocks a storage pointer may live in: this drain's and those open from earlier ones."""
    old = ~np.isin(open_["block"], blocks["block"])
    return (
        np.concatenate([blocks["block"], open_["block"][old]]),
        np.concatenate([blocks["ptr"], open_["ptr"][old]]),
        np.concatenate([blocks["alloc_ns"], open_["t"][old]]),
        np.concatenate([blocks["free_ns"], np.full(int(old.sum()), -1, np.int64)]),
    )


def _last_at_or_before(
    ptr: np.ndarray, t: np.ndarray, q_ptr: np.ndarray, q_t: np.ndarray
) -> np.ndarray:
    """For each query, the index of the candidate at the same address allocated last at or
    before the query's time, or -1."""
    n = len(ptr)
    all_ptr = np.concatenate([ptr, q_ptr])
    all_t = np.concatenate([t, q_t])
    is_query = np.concatenate([np.zeros(n, bool), np.ones(len(q_ptr), bool)])
    order = np.lexsort((is_query, all_t, all_ptr))  # by address, time; candidates first
    position = np.where(is_query[order], -1, np.arange(len(order)))
    last = np.maximum.accumulate(position) if len(order) else position
    at = np.empty(len(order), np.int64)
    at[order] = last  # for each event, the sorted position of the last candidate up to it
    found = at[n:]
    cand = np.where(found >= 0, order[np.maximum(found, 0)], -1)
    same = (cand >= 0) & (all_ptr[np.maximum(cand, 0)] == q_ptr)
    return np.where(same, cand, -1)


def _layouts(outputs: np.ndarray, blocks: Columns, open_: Columns) -> None:
    """Dtype and shape of each new block: those of the first op output on it (NOTE [ New
    storage = unknown output storage ] in session.py: the tensor an op returned first)."""
    cand_block, cand_ptr, cand_t, cand_free = _candidates(blocks, open_)
    outputs = outputs[np.argsort(outputs["t"], kind="stable")]
    hit = _last_at_or_before(cand_ptr, cand_t, outputs["ptr"], outputs["t"])
    ok = hit >= 0
    ok[ok] = (cand_free[hit[ok]] < 0) | (cand_free[hit[ok]] >= outputs["t"][ok])
    block = np.where(ok, cand_block[np.maximum(hit, 0)], -1)
    first_block, first = np.unique(block, return_index=True)
    keep = first_block >= 0
    first_block, first = first_block[keep], first[keep]
    row = np.searchsorted(blocks["block"], first_block)
    mine = (row < len(blocks["block"])) & (
        blocks["block"][np.minimum(row, len(blocks["block"]) - 1)] == first_block
    )
    row, first = row[mine], first[mine]
    blocks["dtype"][row] = outputs["dtype"][first]
    blocks["ndim"][row] = outputs["ndim"][first]
    blocks["dims"][row] = outputs["dims"][first]
