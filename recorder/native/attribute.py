"""From one drain's rows to per-step facts, computed by the extension (ckattr.cpp, and
ckattr_write.cpp for the rows of the run's tables; no Python runs per op or per block).

``Attribution`` holds what spans drains (each module call's module, the forward ops of the
previous drain; the extension itself knows which block lives where, NOTE [ Blocks by address ]
in ckrec_ops.cpp) and turns each drain's ``Rows`` into a ``StepFacts``:

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
- ``notes``: tensors Python saw on blocks of the run (NOTE [ Notes ] in ckrec_hooks.cpp);
- ``calls``: module calls begun in this drain (a call that ends in a later drain has
  ``end_ns`` -1 here; drains happen at step boundaries, outside module calls).
- ``op_row`` (``blocks``, ``saved``), ``free_op_row`` (``blocks``, ``late_frees``): the op row
  each names, as an offset from the step's first op row (NOTE [ Op rows of a step ] in
  ckattr.cpp).

How these map onto the trace's run tables (``ckview/trace/schema.py``):

- ``storages``: ``nbytes``, ``alloc_ns``, ``free_ns``, ``op``, ``module_call``, ``module`` come
  from ``blocks``, with ids in the extension's numbering (op ids, call ids, module ids by
  address in ``calls``), which the sink renumbers into its rows. ``device`` is
  ``device_type``/``device_index``. ``dtype``/``shape`` are known only with op outputs recorded
  (NOTE [ Layout strings ] in ckattr_write.cpp), else the empty string: a block is the allocator's,
  and nothing else says what tensor lives in it. ``category`` starts TEMPORARY for a block of
  a phase and OTHER for one between steps; the ledger strengthens it from what Python saw
  (NOTE [ Notes ] in ckrec_hooks.cpp: blocks autograd saved, parameters, ``.grad``, optimizer
  state, inputs). ``stack`` (``--stacks``) is another source's. ``blocks.module`` is the
  creating call's; a mark's module (a gradient's or optimizer state's parameter) fills an
  empty one.
- ``ops``: ``start_ns``, ``end_ns``, ``module_call`` and ``seq_nr`` (the backward node's) are
  filled. ``name`` is the dispatcher's op and overload (``aten.mm.default``) or
  RecordFunction's (a backward node's ``AddmmBackward0``); ranges nest (``parent``, ``top``),
  and ``outer`` picks the ops a dispatch mode sees (NOTE [ Outermost ops ]). ``phase`` is
  FORWARD, BACKWARD or OTHER: OPTIMIZER and RECOMPUTE need the optimizer's and checkpoint's
  markers, passed in as ``spans``.
- ``memory_events``: ALLOC rows from ``blocks`` (``alloc_ns``, ``op_row``), FREE rows from
  ``blocks``/``late_frees`` (``free_ns``, ``free_op_row``); SEEN rows from ``unknown_frees``.
- ``saved_events``: every column, from ``saved``.
- ``module_calls``: every column but ``phase`` and ``step``, from ``calls``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.ma  # np.unique imports it at its first call: 10-15 ms inside a recorded step

from ckview.trace.schema import Phase
from recorder.native.rows import Rows

Columns = dict[str, np.ndarray]


@dataclass
class StepFacts:
    """What one drain's rows say, as columns (see the module docstring); ``ops``, ``blocks``
    and ``saved`` are made when first read (NOTE [ Columns on demand ] in ckattr.cpp)."""

    tables: Any
    raised: int  # ops an exception left
    late_frees: Columns
    late_op_ends: Columns
    late_saved: np.ndarray
    unknown_frees: Columns
    calls: Columns
    ooms: Columns
    notes: Columns

    @cached_property
    def ops(self) -> Columns:
        return self.tables.ops()

    @cached_property
    def blocks(self) -> Columns:
        return self.tables.blocks()

    @cached_property
    def saved(self) -> Columns:
        return self.tables.saved()


class Attribution:
    """Per-step attribution of native rows, one per recording (its state spans drains: each
    module call's module, the forward calls of the previous drain), computed by the extension's
    ``Attributor`` (NOTE [ Attribution in the extension ])."""

    def __init__(self, ext: Any) -> None:
        self._native = ext.Attributor()

    def step(
        self,
        rows: Rows,
        spans: Sequence[tuple[Phase, Any]] = (),
        nested: bool = False,
    ) -> StepFacts:
        """The facts of one drain. ``spans`` are ``(phase, (n, 2) start/end ns)`` intervals
        (the optimizer's step, a checkpoint's recompute) whose ops take that phase; with
        ``nested``, ``ops['outer']`` is each range's outermost op as the extension found it
        (NOTE [ Outermost ops ]), else every range is its own."""
        intervals = [(int(p), np.asarray(i, np.int64).reshape(-1, 2)) for p, i in spans]
        facts = self._native.step(
            rows.ops, rows.op_ends, rows.memory, rows.saved, rows.outputs,
            rows.modules, rows.ooms, rows.notes, intervals, nested,
        )  # fmt: skip
        return StepFacts(**facts)

    # NOTE [ Rows of the run's tables ]
    # The last drain's facts become rows of the run's tables in the extension too (``write``):
    # ops, storages and their addresses, memory events, saved events, as int64 rows in schema
    # order, ids in the run's numbering. For that it keeps, per run, what maps ids across
    # steps: each live block's storage row (NOTE [ Freed blocks leave the map ] in
    # ckattr_write.cpp), each native call id's Python call row and each such row's module (the
    # call rows leave it with the call table's, ``forget_calls``), and the string ids of the
    # layouts and devices it has seen (NOTE [ Layout strings ] in ckattr_write.cpp). What it cannot
    # know comes back for Python to finish: a saved tensor on a block from before the run has
    # storage -1 (the Python ledger's row, by pointer), and earlier blocks freed now are
    # ``late_sid``/``late_free_ns`` (their rows' free_ns).

    def use_strings(
        self,
        intern: Callable[[str], int],
        dtype_names: dict[int, str],
        device_id: Callable[[int, int], int],
        cpu_id: int,
    ) -> None:
        """Intern strings through ``intern`` (dtype codes name as ``dtype_names`` says; a
        device other than the CPU, by type and index, through ``device_id``)."""
        self._native.use_strings(intern, dtype_names, device_id, cpu_id)

    def write(self, ids: RowIds, stacks: np.ndarray | None) -> StepRows:
        """The last drain's rows of the run's tables (NOTE [ Rows of the run's tables ]);
        ``stacks``: each block's stack row, if stacks are recorded."""
        rows = self._native.write(
            ids.step, ids.now, ids.first_op, ids.first_sid, ids.first_call,
            ids.call_starts, ids.call_modules, ids.name_ids, stacks,
        )  # fmt: skip
        return StepRows(**rows)

    def sids(self, blocks: np.ndarray) -> np.ndarray:
        """Storage row of each block id; -1 for a block of no step of this run, or freed
        before the last drain (NOTE [ Freed blocks leave the map ] in ckattr_write.cpp)."""
        return self._native.sids(np.asarray(blocks, np.int64))

    def call_rows(self, native: np.ndarray) -> np.ndarray:
        """The Python call row of each native call id; -1 for none."""
        return self._native.call_rows(np.asarray(native, np.int64))

    def live_blocks(self) -> int:
        """Blocks in the storage-row map (NOTE [ Freed blocks leave the map ] in
        ckattr_write.cpp)."""
        return int(self._native.live_blocks())

    def known_calls(self) -> int:
        """Entries of the call maps (native id -> call row, call row -> module)."""
        return int(self._native.known_calls())

    def forget_calls(self, base: int, kept: np.ndarray) -> None:
        """Call rows below ``base`` but ``kept`` left memory (NOTE [ Kept rows ] in
        storage_rows.py): the native ids that name them name none now."""
        self._native.forget_calls(base, np.asarray(kept, np.int64))


@dataclass(frozen=True)
class RowIds:
    """Where a drain's rows go in the run's tables: its step, the time it was drained, the
    first op and storage rows it writes, the Python call rows begun in it (``first_call`` on,
    their starts and modules) and the string id of each extension name index."""

    step: int
    now: int
    first_op: int
    first_sid: int
    first_call: int
    call_starts: np.ndarray
    call_modules: np.ndarray
    name_ids: np.ndarray


@dataclass(frozen=True)
class StepRows:
    """A drain's rows of the run's tables, int64 in schema column order (NOTE [ Rows of the
    run's tables ])."""

    ops: np.ndarray
    storages: np.ndarray
    address: np.ndarray
    memory: np.ndarray
    late_sid: np.ndarray
    late_free_ns: np.ndarray
    saved_sids: np.ndarray
    saved: np.ndarray
    saved_ptr: np.ndarray  # each saved row's tensor's data pointer


# NOTE [ Attribution in the extension ]
# A drain's rows are joined (frees to their blocks, ends to their ops, packs to the blocks they
# save, outputs to the blocks they live on) and looked up (an allocation outside any op takes
# the next op to start; a backward row its forward call by sequence number) in C++
# (``Attributor`` in ckattr.cpp): as some 400 numpy calls on arrays of a few thousand rows
# this cost about 0.9 ms of a small-op step, almost all of it per call. The rules are those of
# the NOTE blocks below; where rows tie, the first in drain order wins, as a stable sort has
# it (the exit row of a call, the first output on a block by time), and a free or an end that
# comes twice takes the last.


# NOTE [ Backward blocks and modules ]
# A backward node's range carries the sequence number autograd gave the node when the
# forward op that made it ran. A module call's hooks read autograd's next number when it
# begins and when it returns, so the node belongs to the innermost forward call whose
# [begin, end) holds its number, as the Python recorder's ``PhaseState.backward_call``
# has it (recompute calls are left out: their nodes are the recompute's own). Engine work
# between nodes takes the number of the node that ran last (NOTE [ Engine work between
# nodes ] in ckrec_ops.cpp); AccumulateGrad has no number and keeps the call open on the thread.

# NOTE [ Outermost ops ]
# RecordFunction ranges nest: aten.linear holds aten.t and aten.addmm, a backward node's range
# holds the ops it runs, Optimizer.step holds the optimizer's. The trace's ops do not nest
# (analyses add up op times per phase and per region), so a run's ops are the outermost
# dispatcher ops: ranges of an op the dispatcher runs with no such op around them, or only a
# decomposing one (NOTE [ Ops as a dispatch mode sees them ] in ckrec_ops.cpp). Other
# ranges (backward nodes, the engine's, record_function labels) are not ops of the trace, and
# what they hold is (a checkpoint's recompute runs inside a backward node). Every range maps to
# its outermost dispatcher op (``outer``; -1 when none holds it), which blocks allocated in it
# are attributed to. The extension finds it when the range begins, from the thread's open
# ranges (``on_start`` in ckrec_ops.cpp); the compiled regions count as ops (``mark_ops``).

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
