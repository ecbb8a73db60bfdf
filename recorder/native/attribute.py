"""From one drain's rows to per-step facts, vectorised with numpy (no Python runs per op).

``Attribution`` holds what spans drains (each module call's module, the forward ops of the
previous drain; the extension itself knows which block lives where, NOTE [ Blocks by address ]
in ckrec.cpp) and turns each drain's ``Rows`` into a ``StepFacts``:

- ``ops``: one row per RecordFunction range, with its phase, module call (in backward, the
  forward call that made its node), module and backward node;
- ``blocks``: one row per allocation, with its free, top-level op, module (in backward through
  the autograd node's sequence number, NOTE [ Backward blocks and modules ]), whether autograd
  saved it, and its dtype and shape when op outputs were recorded;
- ``late_frees`` / ``late_op_ends`` / ``late_saved``: blocks and ops of earlier drains that
  were freed, ended or saved in this one;
- ``unknown_frees``: frees of blocks allocated before the reporter started (CUDA reports them;
  the CPU allocator knows no size for them and reports nothing);
- ``saved``: pack and unpack rows with the block they hit;
- ``notes``: tensors Python saw on blocks of the run (NOTE [ Notes ] in ckrec.cpp);
- ``calls``: module calls begun in this drain (a call that ends in a later drain has
  ``end_ns`` -1 here; drains happen at step boundaries, outside module calls).

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
  filled. ``name`` is the dispatcher's op and overload (``aten.mm.default``) or
  RecordFunction's (a backward node's ``AddmmBackward0``); ranges nest (``parent``, ``top``),
  and ``outer`` picks the ops a dispatch mode sees (NOTE [ Outermost ops ]). ``phase`` is
  FORWARD, BACKWARD or OTHER: OPTIMIZER and RECOMPUTE need the optimizer's and checkpoint's
  markers, passed in as ``spans``.
- ``memory_events``: ALLOC rows from ``blocks`` (``alloc_ns``, ``op``), FREE rows from
  ``blocks``/``late_frees`` (``free_ns``, ``free_op``); SEEN rows from ``unknown_frees``.
- ``saved_events``: every column, from ``saved``.
- ``module_calls``: every column but ``phase`` and ``step``, from ``calls``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.ma  # np.unique imports it at its first call: 10-15 ms inside a recorded step

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
    late_saved: np.ndarray
    unknown_frees: Columns
    saved: Columns
    calls: Columns
    ooms: Columns
    notes: Columns


@dataclass
class Attribution:
    """Per-step attribution of native rows; one per recording (state spans drains)."""

    # module of every call id seen (call ids count from 0 over the process)
    _call_module: np.ndarray = field(default_factory=lambda: np.full(0, -1, np.int32))
    # the previous drain's forward calls (NOTE [ Backward blocks and modules ])
    _forward_calls: Columns = field(
        default_factory=lambda: {
            k: np.zeros(0, np.int64) for k in ("call", "parent", "seq_begin", "seq_end")
        }
    )

    def step(
        self,
        rows: Rows,
        spans: Sequence[tuple[Phase, np.ndarray]] = (),
        nested: bool = False,
    ) -> StepFacts:
        """The facts of one drain. ``spans`` are ``(phase, (n, 2) start/end ns)`` intervals
        (the optimizer's step, a checkpoint's recompute) whose ops take that phase; with
        ``nested``, ``ops['outer']`` is each range's outermost op as the extension found it
        (NOTE [ Outermost ops ]), else every range is its own."""
        calls = self._calls(rows.modules)
        ops, late_ends = _ops(rows.ops, rows.op_ends)
        if not nested:
            ops["outer"] = ops["id"].copy()
        call_of_seq = self._call_of_seq(calls, spans)
        ops["phase"] = _phases(ops, spans)
        backward_call = call_of_seq(ops["seq_nr"])
        backward = ops["seq_nr"] >= 0
        ops["module_call"] = np.where(backward, backward_call, ops["call"]).astype(np.int32)
        ops["module"] = self.module_of(ops["module_call"])
        blocks, late_frees, unknown = self._blocks(rows.memory, ops, call_of_seq)
        saved = _columns(rows.saved)
        # a pack's call is the one open; an unpack's, the forward call of the node unpacking
        unpack_call = _lookup(ops["id"], ops["module_call"], saved["op"], -1)
        saved["module_call"] = np.where(saved["kind"] == 0, saved["call"], unpack_call)
        packed = saved["block"][saved["kind"] == 0]
        here, row = _rows_of(blocks["block"], packed)
        blocks["saved"][row[here]] = True
        late_saved = np.unique(packed[~here & (packed >= 0)])
        if len(rows.outputs):
            _layouts(rows.outputs, blocks)
        ooms = _columns(rows.ooms)
        notes = _columns(rows.notes)
        return StepFacts(
            ops, blocks, late_frees, late_ends, late_saved, unknown, saved, calls, ooms, notes
        )

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
        calls = enter["call"].astype(np.int64)
        exit_calls = exits["call"].astype(np.int64)
        return {
            "call": enter["call"].copy(),
            "module": enter["module"].copy(),
            "address": enter["address"].copy(),
            "parent": enter["parent"].copy(),
            "start_ns": enter["t"].copy(),
            "end_ns": _lookup(exit_calls, exits["t"], calls, -1),
            "seq_begin": enter["seq"].copy(),
            "seq_end": _lookup(exit_calls, exits["seq"], calls, -1),
        }

    def module_of(self, call: np.ndarray) -> np.ndarray:
        """Module id of each call id (-1 for -1 or a call never seen)."""
        call = np.asarray(call, np.int64)
        known = (call >= 0) & (call < len(self._call_module))
        return _take(self._call_module, np.where(known, call, -1)).astype(np.int32)

    # NOTE [ Backward blocks and modules ]
    # A backward node's range carries the sequence number autograd gave the node when the
    # forward op that made it ran. A module call's hooks read autograd's next number when it
    # begins and when it returns, so the node belongs to the innermost forward call whose
    # [begin, end) holds its number, as the Python recorder's ``PhaseState.backward_call``
    # has it (recompute calls are left out: their nodes are the recompute's own). Engine work
    # between nodes takes the number of the node that ran last (NOTE [ Engine work between
    # nodes ] in ckrec.cpp); AccumulateGrad has no number and keeps the call open on the thread.
    def _call_of_seq(
        self, calls: Columns, spans: Sequence[tuple[Phase, np.ndarray]]
    ) -> Callable[[np.ndarray], np.ndarray]:
        forward = ~_inside(calls["start_ns"], [i for p, i in spans if p == Phase.RECOMPUTE])
        now = {k: calls[k][forward] for k in ("call", "parent", "seq_begin", "seq_end")}
        both = {k: np.concatenate([self._forward_calls[k], now[k]]) for k in now}
        self._forward_calls = now
        order = np.argsort(both["seq_begin"], kind="stable")
        begin, call = both["seq_begin"][order], both["call"][order].astype(np.int64)
        by_id = np.argsort(both["call"], kind="stable")  # sorted once for every lookup below
        ids = both["call"][by_id].astype(np.int64)
        ends, parents = both["seq_end"][by_id].astype(np.int64), both["parent"][by_id]

        def call_of(seq: np.ndarray) -> np.ndarray:
            if not len(begin):
                return np.full(len(seq), -1, np.int64)
            at = np.searchsorted(begin, seq, side="right") - 1
            found = np.where((at >= 0) & (seq >= 0), call[np.maximum(at, 0)], -1)
            while True:  # out of a call that ended before the number: its parent
                here, row = _rows_of(ids, found)
                past = here & (found >= 0) & (ends[row] >= 0) & (seq >= ends[row])
                if not past.any():
                    return found
                found = np.where(past, parents[row], found)

        return call_of

    # -- blocks -----------------------------------------------------------------------------
    def _blocks(
        self, mem: np.ndarray, ops: Columns, call_of_seq: Callable[[np.ndarray], np.ndarray]
    ) -> tuple[Columns, Columns, Columns]:
        """Blocks allocated in the drain, with their frees (NOTE [ Blocks by address ] in
        ckrec.cpp: every free names its block); frees of earlier drains' blocks; frees of
        blocks from before recording."""
        cols = _columns(mem)  # then columns are indexed: structured rows copy slowly
        alloc = cols["bytes"] > 0
        rows = _in_order(_select(cols, alloc), "block")
        frees = _select(cols, ~alloc)
        here, row = _rows_of(rows["block"], frees["block"])
        n = len(rows["block"])
        free_ns = np.full(n, -1, np.int64)
        free_op = np.full(n, -1, np.int64)
        free_ns[row[here]] = frees["t"][here]
        free_op[row[here]] = frees["op"][here]
        late = ~here & (frees["block"] >= 0)
        late_frees = {
            "block": frees["block"][late],
            "free_ns": frees["t"][late],
            "free_op": frees["op"][late],
        }
        unknown = _select(frees, frees["block"] < 0)
        unknown_frees = {
            "ptr": unknown["ptr"],
            "nbytes": -unknown["bytes"],
            "t": unknown["t"],
            "op": unknown["op"],
            "device_type": unknown["device_type"],
            "device_index": unknown["device_index"],
        }
        op, top, node_seq, phase = _block_ops(rows, ops)
        call = np.where(node_seq >= 0, call_of_seq(node_seq), rows["call"])
        blocks: Columns = {
            "block": rows["block"],
            "ptr": rows["ptr"],
            "nbytes": rows["bytes"],
            "device_type": rows["device_type"],
            "device_index": rows["device_index"],
            "alloc_ns": rows["t"],
            "free_ns": free_ns,
            "free_op": free_op,
            "op": op,
            "top_op": top,
            "node_seq": node_seq,
            "phase": phase,
            "module_call": call.astype(np.int32),
            "call": rows["call"],  # the innermost open call (a recompute's own)
            "module": self.module_of(call),
            "saved": np.zeros(n, bool),
            "dtype": np.full(n, -1, np.int8),
            "ndim": np.full(n, -1, np.int8),
            "dims": np.zeros((n, DIMS), np.int64),
        }
        return blocks, late_frees, unknown_frees


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


# Odd 64-bit multipliers of (ndim, dims...): a shape's hash is their dot product (mod 2^64).
_MIX = np.array(
    [(0x9E3779B97F4A7C15 + 2 * 0x632BE59BD9B4E019 * i) % 2**64 for i in range(DIMS + 1)],
    np.uint64,
)


class LayoutIds:
    """String ids of dtype and shape texts, per row, kept across steps: most blocks of a step
    have the layouts of the step before. A shape is found by a 64-bit hash of (ndim, dims) in a
    sorted table of the hashes seen so far, and every row's dims are compared with those its
    hash was first seen with, so a collision falls back to ``layout_texts`` (exact). Only new
    hashes and dtype codes run Python code: a step's lookup is a few numpy calls, however many
    distinct layouts it has."""

    def __init__(self, intern: Callable[[str], int], dtype_names: dict[int, str]) -> None:
        self._intern = intern
        self._dtype_names = dtype_names
        self._dtype_ids = np.full(256, -1, np.int64)  # string id of dtype code c at c + 128
        self._hashes = np.zeros(0, np.uint64)  # shape hashes seen, sorted
        self._keys = np.zeros((0, DIMS + 1), np.int64)  # the (ndim, dims...) of each
        self._ids = np.zeros(0, np.int64)  # and its string id
        self._unknown = intern("")  # a block no op output names (as the allocator source writes)

    def ids(self, dtype: np.ndarray, ndim: np.ndarray, dims: np.ndarray) -> tuple[Any, Any]:
        """(dtype string id, shape string id) of each row; the empty string's where unknown."""
        known = ndim >= 0
        key = np.concatenate([ndim[:, None].astype(np.int64), dims], axis=1)
        hashes = key.view(np.uint64) @ _MIX  # wraps mod 2^64, as intended (no warning)
        at = self._find(hashes)
        new = at < 0
        if new.any():
            self._learn_shapes(hashes[new], key[new])
            at = self._find(hashes)
        if not (self._keys[at] == key).all():  # two shapes with one hash
            return self._exact(dtype, ndim, dims)
        code = dtype.astype(np.int64) + 128
        if (self._dtype_ids[code] < 0).any():
            for c in np.unique(code[self._dtype_ids[code] < 0]).tolist():
                name = self._dtype_names.get(c - 128, f"dtype{c - 128}")
                self._dtype_ids[c] = self._intern(name)
        d = np.where(known, self._dtype_ids[code], self._unknown)
        s = np.where(known, self._ids[at], self._unknown)
        return d, s

    def _find(self, hashes: np.ndarray) -> np.ndarray:
        """Row of each hash in the table, -1 where it is new."""
        if not len(self._hashes):
            return np.full(len(hashes), -1, np.int64)
        at = np.minimum(np.searchsorted(self._hashes, hashes), len(self._hashes) - 1)
        return np.where(self._hashes[at] == hashes, at, -1)

    def _learn_shapes(self, hashes: np.ndarray, keys: np.ndarray) -> None:
        """Intern the shape text of each new hash (the first row's), in hash order."""
        unique, first = np.unique(hashes, return_index=True)
        ids = [
            self._intern(_shape_text(int(keys[row, 0]), keys[row, 1:])) for row in first.tolist()
        ]
        order = np.argsort(np.concatenate([self._hashes, unique]), kind="stable")
        self._hashes = np.concatenate([self._hashes, unique])[order]
        self._keys = np.concatenate([self._keys, keys[first]])[order]
        self._ids = np.concatenate([self._ids, np.asarray(ids, np.int64)])[order]

    def _exact(self, dtype: np.ndarray, ndim: np.ndarray, dims: np.ndarray) -> tuple[Any, Any]:
        dtypes, d, shapes, s = layout_texts(dtype, ndim, dims, self._dtype_names)
        d_ids = np.asarray([self._intern(x) for x in dtypes] + [self._unknown], np.int64)
        s_ids = np.asarray([self._intern(x) for x in shapes] + [self._unknown], np.int64)
        return d_ids[d], s_ids[s]  # index -1: the unknown string, at the end


def _shape_text(ndim: int, dims: np.ndarray) -> str:
    if ndim == 0:
        return "scalar"
    text = "x".join(str(int(v)) for v in dims[: min(ndim, DIMS)])
    return text + "x..." if ndim > DIMS else text


# -- helpers ---------------------------------------------------------------------------------
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
    cols = _sorted(ops, "id")
    cols["t1"] = cols["t1"].copy()  # a column may be a view of the drained bytes
    here, row = _rows_of(cols["id"], ends["id"])
    cols["t1"][row[here]] = ends["t1"][here]
    cols["start_ns"], cols["end_ns"] = cols["t0"], cols["t1"]
    cols["seq_nr"] = np.where(cols["node_seq"] >= 0, cols["node_seq"], -1)
    return cols, {"id": ends["id"][~here], "end_ns": ends["t1"][~here]}


# NOTE [ Outermost ops ]
# RecordFunction ranges nest: aten.linear holds aten.t and aten.addmm, a backward node's range
# holds the ops it runs, Optimizer.step holds the optimizer's. The trace's ops do not nest
# (analyses add up op times per phase and per region), so a run's ops are the outermost
# dispatcher ops: ranges of an op the dispatcher runs with no such op around them, or only a
# decomposing one (NOTE [ Ops as a dispatch mode sees them ] in ckrec.cpp). Other
# ranges (backward nodes, the engine's, record_function labels) are not ops of the trace, and
# what they hold is (a checkpoint's recompute runs inside a backward node). Every range maps to
# its outermost dispatcher op (``outer``; -1 when none holds it), which blocks allocated in it
# are attributed to. The extension finds it when the range begins, from the thread's open
# ranges (``on_start`` in ckrec.cpp); the compiled regions count as ops (``mark_ops``).


def _inside(times: np.ndarray, intervals: Sequence[np.ndarray]) -> np.ndarray:
    """Whether each time lies in one of the (start, end) rows of ``intervals``."""
    inside = np.zeros(len(times), bool)
    for rows in intervals:
        rows = np.asarray(rows, np.int64).reshape(-1, 2)
        rows = rows[np.argsort(rows[:, 0])]
        i = np.searchsorted(rows[:, 0], times, side="right") - 1
        inside |= (i >= 0) & (times <= rows[np.maximum(i, 0), 1]) if len(rows) else False
    return inside


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


def _block_ops(rows: Columns, ops: Columns) -> tuple[np.ndarray, ...]:
    """Op, top-level op, backward node seq and phase of each allocation. An allocation outside
    any op (a Python scalar wrapped before dispatch) takes the next op to start."""
    op, top, node_seq = rows["op"].copy(), rows["top"].copy(), rows["node_seq"].copy()
    n = len(ops["id"])
    phase = np.full(len(op), int(Phase.OTHER), np.uint8)
    if n == 0:
        return op, top, node_seq, phase
    t0 = ops["t0"]
    by_start = None if (t0[1:] >= t0[:-1]).all() else np.argsort(t0, kind="stable")
    outside = np.flatnonzero(op < 0)
    if by_start is None:
        nxt = np.minimum(np.searchsorted(t0, rows["t"][outside], side="right"), n - 1)
    else:
        starts = t0[by_start]
        nxt = by_start[np.minimum(np.searchsorted(starts, rows["t"][outside], side="right"), n - 1)]
    op[outside] = ops["id"][nxt]
    top[outside] = ops["top"][nxt]
    node_seq[outside] = ops["node_seq"][nxt]
    here, row = _rows_of(ops["id"], op)
    phase[here] = ops["phase"][row[here]]
    return op, top, node_seq, phase


def _sorted(rows: np.ndarray, key: str) -> Columns:
    """Columns of ``rows`` in ``key`` order."""
    return _in_order(_columns(rows), key)


def _in_order(cols: Columns, key: str) -> Columns:
    """``cols`` in ``key`` order (rows of one thread come sorted: no sort then)."""
    values = cols[key]
    if len(values) > 1 and not (values[1:] >= values[:-1]).all():
        order = np.argsort(values, kind="stable")
        return {name: col[order] for name, col in cols.items()}
    return cols


def _select(cols: Columns, mask: np.ndarray) -> Columns:
    """The rows where ``mask`` holds (one index array, then ``take``: boolean indexing per
    column costs several times more on the interleaved masks of allocations and frees)."""
    index = np.flatnonzero(mask)
    return {name: col.take(index, axis=0) for name, col in cols.items()}


def _rows_of(keys: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each query, whether it is in the sorted ``keys`` and at which row."""
    if len(keys) == 0:
        return np.zeros(len(query), bool), np.zeros(len(query), np.int64)
    row = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return keys[row] == query, row


# NOTE [ Block sizes on CUDA ]
# CUDA's caching allocator reports a block's size, and a cached block it reuses without
# splitting (a large block whose rest would be under 1 MiB) is reported whole: the same tensor
# of the same step is a block of 1,049,600 B in one run and 1,146,880 B in the next (seen on an
# H200), as the cache happens to hold. Sizes that depend on the cache make two runs of one step
# differ, and no projection can be exact. So a block an op returned a tensor on takes the size
# the allocator rounds that storage to (``round_size``: a multiple of 512 B, at least 512 B)
# instead; a block with no tensor (a library's workspace) keeps the reported size. The
# allocator's own totals, slack included, are in ``device_samples``. The CPU allocator
# reports the bytes asked for, so CPU blocks are left as they are.
CUDA_BLOCK = 512


def _layouts(outputs: np.ndarray, blocks: Columns) -> None:
    """Dtype and shape of each new block: those of the first op output on it (NOTE [ New
    storage = unknown output storage ] in session.py: the tensor an op returned first); on
    CUDA its size, from that storage (NOTE [ Block sizes on CUDA ])."""
    outputs = outputs[np.argsort(outputs["t"], kind="stable")]
    first_block, first = np.unique(outputs["block"], return_index=True)
    here, row = _rows_of(blocks["block"], first_block)
    row, first = row[here], first[here]
    blocks["dtype"][row] = outputs["dtype"][first]
    blocks["ndim"][row] = outputs["ndim"][first]
    blocks["dims"][row] = outputs["dims"][first]
    asked = outputs["storage_nbytes"][first]
    cuda = (blocks["device_type"][row] == 1) & (asked > 0)
    if cuda.any():
        rounded = np.maximum(-(-asked[cuda] // CUDA_BLOCK) * CUDA_BLOCK, CUDA_BLOCK)
        nbytes = blocks["nbytes"].copy()  # a column may be a view of the drained bytes
        nbytes[row[cuda]] = np.minimum(nbytes[row[cuda]], rounded)
        blocks["nbytes"] = nbytes
