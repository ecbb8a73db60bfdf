"""Projection: the memory timeline of a recorded run as if some regions were checkpointed.

One recorded baseline step answers "what would checkpointing these regions do to my peak, and
what would it cost?" without re-running: ``project`` replays the memory events under the model
below, exactly; ``ProjectionModel`` precomputes each candidate region's effect so that the GUI
gets the projected peak of any selection in well under a millisecond.

A region instance is one forward call of a checkpointed module, or the calls of one segment
(``ckview.analysis.regions``). "Created inside" means allocated by a FORWARD op attributed to
a call inside the instance. The model, as NOTE blocks the code and tests cite:

NOTE [ Checkpointed forward ]
    A checkpointed instance keeps only its inputs. Every storage created inside it that is not
    among its OUTPUTs (``module_io``) is freed by the end of the instance at the latest: its FREE
    moves to the instance's end if the baseline freed it later (or never). Temporaries the
    baseline already freed inside the instance keep their recorded free. An activation the
    baseline kept for backward would, under checkpointing, be freed after its last forward use,
    which is never later than the end of the instance (nothing outside references it: it is no
    output, and checkpoint's pack hook drops the saved reference), so freeing it at the end
    over-estimates memory inside the instance, never under-estimates it. A storage that
    nothing saved and that still outlived the instance is held from outside and keeps its
    free (NOTE [ Held from outside ]).

NOTE [ Held from outside ]
    A storage created inside an instance that the baseline kept beyond the instance's end,
    although it is no OUTPUT and autograd never saved it (no PACK anywhere in the run), was
    kept by a reference that checkpointing does not take away: a hand-written
    ``autograd.Function`` that keeps its inputs on ``ctx`` (``ctx.input_tensors = ...``, as
    the efficient DenseNet's ``CheckpointFunction`` does; saved-tensor hooks never see those),
    a cache on a module, a tensor nested too deep in an output for the recorder to list it.
    Its free stays where the baseline has it. (Freed at the instance's end, the efficient
    DenseNet's features that each layer's Function keeps put sqrt 9.6% and all 4.7% below the
    measured peak; kept, both are exact.) Its recomputed copy, if the replay makes one, dies
    with the replay: the recompute's own Function nodes are dropped when it ends.

NOTE [ Released outputs ]
    An OUTPUT of an instance stays alive, but checkpointing takes away one of its holders: an op
    inside the instance that saved it for backward (Tanh, ReLU, GELU, sigmoid and softmax save
    their own result; BatchNorm and cat results are saved by what follows). Checkpoint's pack
    hook keeps nothing, so the storage lives only as long as its other holders: Python
    references in the forward, ops outside the instance that saved it, and checkpointed
    instances that keep it as an input (NOTE [ Kept inputs ]). When the baseline freed it
    inside the instance's backward (its FREE ran in a BACKWARD op of a call inside the
    instance: the instance's hold was the last), it is released at the latest of
        - its forward life: the end of the outermost call that returns it (counting up from the
          instance's last call through the callers that return it too) and of every forward
          call that takes it as an input (a Python local dies when its forward returns; an
          output of a top-level call is the script's, whose references are unknown: those keep
          their baseline free), and
        - after the last BACKWARD op of every call outside the instance that saved it (its
          autograd node lets go once it has run; a save outside any module call, or by a call
          that never runs backward, keeps the baseline free),
    if that is earlier than its baseline free, and checkpointed consumers keep it later still
    (NOTE [ Kept inputs ]). Without this, the projection kept one block output per recompute
    too many: the tensor that the next block kept, then freed, before this block's recompute.

NOTE [ Kept inputs ]
    The checkpoint holds the instance's INPUT storages (arguments of its top-level calls that
    existed before it) until the instance's backward is done: their free becomes the later of
    the baseline free and the end of the last BACKWARD op attributed to a call inside the
    instance. An input kept by several instances is freed after the last of them. This is the
    only way checkpointing can raise memory before backward: a baseline that freed an input
    during the forward (it was not saved for backward) now keeps it.

NOTE [ Recompute in backward ]
    When backward first needs the instance (its first UNPACK attributed to a call inside it;
    without one, its first BACKWARD op), its forward is recomputed: the ALLOC and FREE events of
    the storages created inside it are replayed in recorded order as *copies* of those
    storages, up to its last PACK (NOTE [ Early stop ]). A copy of a storage the instance saved
    for backward (a PACK inside it) lives until the later of the original's baseline free and
    the end of the replay; any other copy the replay did not free is freed at the end of the
    replay. An instance that backward never reaches is not recomputed. The extra compute of a
    recompute is the summed duration of the forward ops it replays.

NOTE [ Early stop ]
    Non-reentrant checkpoint (ckpt_runtime's, which plans use, and torch's by default) stops a
    recompute as soon as the last tensor saved in forward is back: the ops after the
    instance's last PACK never run again, and the recompute's other locals die with it. An
    op's inputs are saved before it runs and its outputs after, and the recorder stamps a PACK
    with the last op that ran, so the replay takes the events of the ops up to that one. (A
    DenseNet layer's final concatenation, or the last op of a block whose result nobody inside
    saves, is never recomputed.) An instance without a PACK inside (its saves are hidden, as in
    a run that checkpoints it already) is replayed whole: an upper bound.

NOTE [ Fixed categories ]
    Parameters, gradients and optimizer state never move: they are never shortened, copied or
    kept, so the projection cannot lower them (a property the tests check).

NOTE [ Event keys ]
    Projected events are ordered by an int64 key. Baseline event row ``e`` has key
    ``e * W + W - 1``; an event inserted before baseline row ``p`` gets ``p * W + slot``, where
    ``W = 3 * n_instances + n_released + 2`` leaves a slot for each instance's three moments:
    its end (the frees of NOTE [ Checkpointed forward ]), its recompute, the end of its backward
    (the frees of NOTE [ Kept inputs ]), and one for each released output (NOTE [ Released
    outputs ]). Moments at one point are ordered by time, then by that kind, then by first
    call row (then by storage): an order that does not depend on the selection, so ``project``
    and ``ProjectionModel`` agree. Events at one key keep their baseline order (a replay's frees of
    copies it did not free come last). Inserted events take the time of their moment (the
    instance's end, the first need in backward, the end of its backward), which lies between
    the times of the baseline events around them, so times never go back. The replay takes no
    time: its ops' duration is reported as extra compute, the timeline is not stretched.

NOTE [ What the projection leaves out ]
    It replays live bytes of storages (what the recorder sees), not the allocator: caching,
    fragmentation and rounding are not modelled. A storage created inside an instance that
    autograd saved and that is reachable from outside too (other than through the instance's
    outputs) is freed at the instance's end although it lives on; unsaved ones keep their
    free (NOTE [ Held from outside ]).
    Reentrant checkpoint runs the whole forward again; the replay stops early as
    non-reentrant checkpoint does (NOTE [ Early stop ]), a lower bound for reentrant plans.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

import numpy as np

from ckview.analysis.regions import Region, RegionInstances, outermost, region_instances
from ckview.analysis.timeline import (
    MemoryTimeline,
    Peak,
    births,
    find_peak,
    live_at_start,
    memory_timeline,
    point_stretches,
    stretch_offsets,
)
from ckview.analysis.timing import plain_instance_ns, plain_times
from ckview.analysis.types import RunTables, Table
from ckview.trace.schema import Category, IOKind, MemoryEventKind, Phase, SavedEventKind

Selection: TypeAlias = Collection[int] | np.ndarray
"""Candidate indices, or a boolean mask over the candidates."""

_NEVER = np.iinfo(np.int64).max
_FIXED = np.asarray(  # what no checkpoint plan changes (FSDP gathers and reshards as before)
    [
        Category.PARAMETER,
        Category.GRADIENT,
        Category.OPTIMIZER_STATE,
        Category.SHARDED_PARAMETER,
        Category.UNSHARDED_PARAMETER,
        Category.COMM_BUFFER,
    ]
)
_ALLOC, _FREE = int(MemoryEventKind.ALLOC), int(MemoryEventKind.FREE)

# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ProjectedPeak:
    """Where a projected timeline peaks, comparable between ``project`` and ``ProjectionModel``."""

    bytes: int
    time_ns: int
    baseline_point: int
    """Baseline timeline point the peak stands at (a recompute's: the point it is inserted at)."""
    recompute_call: int
    """First call row of the instance whose recompute holds the peak (rows of ``module_calls``
    name an instance whatever list it was resolved from); -1 outside any recompute."""


@dataclass(frozen=True)
class ProjectedEvents:
    """The projected memory events, in order (the columns ``memory_timeline`` reads, and more)."""

    kind: np.ndarray
    """(m,) uint8: MemoryEventKind."""
    storage: np.ndarray
    """(m,) int64: row in ``storages`` (of the original, for a recomputed copy)."""
    time_ns: np.ndarray
    """(m,) int64: time of the event (NOTE [ Event keys ])."""
    instance: np.ndarray
    """(m,) int64: region instance that moved or inserted the event, -1 for a baseline event."""
    copy: np.ndarray
    """(m,) bool: the event allocates or frees a recomputed copy."""
    source: np.ndarray
    """(m,) int64: baseline event row the event is, moves or replays; -1 for a new free."""
    key: np.ndarray
    """(m,) int64: the sort key (NOTE [ Event keys ])."""
    point: np.ndarray
    """(m,) int64: baseline timeline point the event stands at (after baseline event e: e + 1;
    inserted before baseline event p: p)."""

    def __len__(self) -> int:
        return len(self.kind)

    def table(self) -> dict[str, np.ndarray]:
        """The events as a ``memory_events``-like table (``kind``, ``storage``, ``time_ns``)."""
        return {"kind": self.kind, "storage": self.storage, "time_ns": self.time_ns}


@dataclass(frozen=True)
class LiveStorages:
    """Storages live at one moment, recomputed copies flagged."""

    storage: np.ndarray
    """(l,) int64: storage rows, ascending (a row may appear twice: original and copy)."""
    copy: np.ndarray
    """(l,) bool: True for a recomputed copy of the storage."""


@dataclass(frozen=True)
class Recompute:
    """One recompute of a region instance in the projected backward."""

    instance: int
    region: int
    """Index of the instance's region in the list it was resolved from."""
    call: int
    """Row in ``module_calls`` of the instance's first call."""
    time_ns: int
    """When backward first needs the instance (NOTE [ Recompute in backward ])."""
    baseline_point: int
    """Baseline timeline point the replay is inserted at."""
    point: int
    """Projected timeline point the replay starts from (its first event makes point+1)."""
    compute_ns: int
    """The extra compute of the recompute (NOTE [ Extra compute from plain times ] in
    timing.py): from plain times with checkpoint's cost per call, or recorded op times."""


@dataclass(frozen=True)
class ProjectedCurve:
    """The projected total at display resolution (NOTE [ Projected curve ]), in key order."""

    time_ns: np.ndarray
    """(c,) int64: time of each state."""
    point: np.ndarray
    """(c,) int64: baseline timeline point each state stands at (to place it by op index)."""
    total: np.ndarray
    """(c,) int64: projected live bytes."""

    def __len__(self) -> int:
        return len(self.total)


@dataclass(frozen=True)
class Projection:
    """The projected timeline of a baseline run with some region instances checkpointed."""

    events: ProjectedEvents
    timeline: MemoryTimeline
    """Live bytes after each projected event (``timeline.event`` are rows of ``events``)."""
    peak: Peak
    """First maximum of the projected timeline (point, projected event row, time, bytes)."""
    projected_peak: ProjectedPeak
    live: LiveStorages
    """Storages live at the projected peak."""
    recomputes: tuple[Recompute, ...]
    extra_compute_ns: int
    plain_times: bool
    """``extra_compute_ns`` comes from plain timing steps (else from recorded op times, with
    the recorder's per-op cost: NOTE [ Extra compute from plain times ] in timing.py)."""
    instances: RegionInstances
    checkpointed: np.ndarray
    """(k,) bool: the instances checkpointed (the selected ones, outermost only)."""

    @property
    def total(self) -> np.ndarray:
        """(m+1,) int64: live bytes at each projected point."""
        return self.timeline.total

    @property
    def by_category(self) -> np.ndarray:
        """(len(Category), m+1) int64: live bytes per category at each projected point."""
        return self.timeline.by_category


# ----------------------------------------------------------------------------- baseline


@dataclass(frozen=True)
class _Baseline:
    """The baseline columns the projection reads, with each storage's event rows."""

    storages: Table
    events: Table
    times: np.ndarray
    nbytes: np.ndarray
    alloc_row: np.ndarray
    """Row of each storage's ALLOC (or SEEN) event, -1 if none."""
    free_row: np.ndarray
    """Row of each storage's FREE event, -1 if never freed."""
    width: int
    """Keys per baseline event (NOTE [ Event keys ])."""

    @property
    def n(self) -> int:
        return len(self.times)

    def event_key(self, rows: np.ndarray) -> np.ndarray:
        """Keys of baseline event ``rows`` (-1 rows, never freed, give ``_NEVER``)."""
        return np.where(rows >= 0, rows * self.width + self.width - 1, _NEVER)

    def point_of_key(self, keys: np.ndarray) -> np.ndarray:
        """Baseline point each key stands at: after baseline event e -> e + 1, inserted before
        baseline event p -> p."""
        return keys // self.width + (keys % self.width == self.width - 1)


def _baseline(tables: RunTables) -> _Baseline:
    """The baseline columns; ``width`` is set by ``_effects`` once the moments are known."""
    storages, events = tables["storages"], tables["memory_events"]
    kind = np.asarray(events["kind"])
    storage = np.asarray(events["storage"], dtype=np.int64)
    rows = np.arange(len(kind), dtype=np.int64)
    n_storages = len(storages["nbytes"])
    alloc_row = np.full(n_storages, -1, dtype=np.int64)
    free_row = np.full(n_storages, -1, dtype=np.int64)
    first = kind != _FREE
    alloc_row[storage[first]] = rows[first]
    free_row[storage[~first]] = rows[~first]
    return _Baseline(
        storages=storages,
        events=events,
        times=np.asarray(events["time_ns"], dtype=np.int64),
        nbytes=np.asarray(storages["nbytes"], dtype=np.int64),
        alloc_row=alloc_row,
        free_row=free_row,
        width=2,
    )


# ----------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class InstanceEffects:
    """What checkpointing each instance changes in the baseline, computed once per instance.

    Pairs ``(*_instance, *_storage)`` list storages per instance. Keys follow
    NOTE [ Event keys ]; -1 where the instance has no such moment.
    """

    instances: RegionInstances
    end_key: np.ndarray
    """(k,) key of the frees at the instance's end (NOTE [ Checkpointed forward ])."""
    replay_key: np.ndarray
    """(k,) key of the recompute, -1 if backward never reaches the instance."""
    keep_key: np.ndarray
    """(k,) key by which kept inputs are freed, -1 without backward (NOTE [ Kept inputs ])."""
    end_ns: np.ndarray
    trigger_ns: np.ndarray
    backward_end_ns: np.ndarray
    compute_ns: np.ndarray
    """(k,) extra compute of the instance's recompute (NOTE [ Extra compute from plain times ]
    in timing.py)."""
    plain_times: bool
    """``compute_ns`` comes from plain timing steps."""
    drop_instance: np.ndarray
    drop_storage: np.ndarray
    """Storages whose free moves earlier: created inside, no output, alive at the instance's
    end (NOTE [ Checkpointed forward ]), then the released outputs (NOTE [ Released outputs ])."""
    drop_key: np.ndarray
    drop_ns: np.ndarray
    """Per drop pair: key and time of the earlier free."""
    copy_instance: np.ndarray
    copy_storage: np.ndarray
    """Storages created inside, recomputed as copies (by instance, then allocation order)."""
    copy_saved: np.ndarray
    """Per copy pair: saved for backward inside the instance (lives to its baseline free)."""
    copy_free: np.ndarray
    """Per copy pair: baseline FREE row replayed inside the recompute, -1 if none."""
    keep_instance: np.ndarray
    keep_storage: np.ndarray
    """Input storages the checkpoint keeps."""


def _effects(tables: RunTables, inst: RegionInstances) -> tuple[_Baseline, InstanceEffects]:
    """The baseline (with its key width) and every instance's effects on it."""
    base = _baseline(tables)
    end_point = np.searchsorted(base.times, inst.end_ns, side="right")
    c_inst, c_storage = _created_inside(tables, inst)
    out_inst, out_storage = _io_pairs(tables["module_io"], inst, IOKind.OUTPUT)
    saved_inst, saved_storage = _saved_pairs(tables["saved_events"], inst)
    saved = _pair_in(c_inst, c_storage, saved_inst, saved_storage)
    released = _released_outputs(
        base, tables, inst, _unique_pairs(out_inst, out_storage), (saved_inst, saved_storage)
    )
    base = replace(base, width=3 * len(inst) + len(released[0]) + 2)
    last_op, stop = _recompute_stop(base, tables, inst)
    moments = _moments(base, tables, inst, end_point, released)
    free = base.free_row[c_storage]
    alive_at_end = (free >= end_point[c_inst]) | (free < 0)
    unsaved = ~np.isin(c_storage, _packed(tables["saved_events"]))  # NOTE [ Held from outside ]
    drop = ~_pair_in(c_inst, c_storage, out_inst, out_storage) & alive_at_end & ~unsaved
    order = np.lexsort((base.alloc_row[c_storage], c_inst))
    replayed = order[base.alloc_row[c_storage[order]] < stop[c_inst[order]]]
    keep_inst, keep_storage = _kept_inputs(tables, inst, c_inst, c_storage)
    release_key, release_ns = moments.pop("release_key"), moments.pop("release_ns")
    compute_ns, plain = _compute_ns(tables, inst, last_op)
    return base, InstanceEffects(
        instances=inst,
        **moments,
        compute_ns=compute_ns,
        plain_times=plain,
        drop_instance=np.concatenate([c_inst[drop], released[0]]),
        drop_storage=np.concatenate([c_storage[drop], released[1]]),
        drop_key=np.concatenate([moments["end_key"][c_inst[drop]], release_key]),
        drop_ns=np.concatenate([inst.end_ns[c_inst[drop]], release_ns]),
        copy_instance=c_inst[replayed],
        copy_storage=c_storage[replayed],
        copy_saved=saved[replayed],
        copy_free=np.where(~saved & ~alive_at_end & (free < stop[c_inst]), free, -1)[replayed],
        keep_instance=keep_inst,
        keep_storage=keep_storage,
    )


def _moments(
    base: _Baseline,
    tables: RunTables,
    inst: RegionInstances,
    end_point: np.ndarray,
    released: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> dict[str, np.ndarray]:
    """Keys and times of each instance's end, recompute and end of backward, and of each
    released output's free (NOTE [ Released outputs ])."""
    trigger_ns = _trigger_ns(tables, inst)
    backward_end = _op_times(tables["ops"], inst, Phase.BACKWARD, "end_ns", np.maximum)
    has_trigger = trigger_ns != _NEVER
    trigger_ns = np.where(has_trigger, trigger_ns, -1)
    rel_inst, rel_storage, rel_point = released
    release_ns = base.times[rel_point - 1]  # the time of the event it follows
    every = np.ones(len(inst), dtype=bool)
    first = inst.first_call
    end_key, replay_key, keep_key, release_key = _moment_keys(
        base,
        (end_point, inst.end_ns, every, first, np.zeros_like(first)),
        (
            np.searchsorted(base.times, trigger_ns, side="left"),
            trigger_ns,
            has_trigger,
            first,
            np.zeros_like(first),
        ),
        (
            np.searchsorted(base.times, backward_end, side="right"),
            backward_end,
            backward_end >= 0,
            first,
            np.zeros_like(first),
        ),
        (rel_point, release_ns, np.ones(len(rel_point), dtype=bool), first[rel_inst], rel_storage),
    )
    return {
        "end_key": end_key,
        "replay_key": replay_key,
        "keep_key": keep_key,
        "end_ns": inst.end_ns,
        "trigger_ns": trigger_ns,
        "backward_end_ns": backward_end,
        "release_key": release_key,
        "release_ns": release_ns,
    }


def _released_outputs(
    base: _Baseline,
    tables: RunTables,
    inst: RegionInstances,
    outputs: tuple[np.ndarray, np.ndarray],
    saved: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(instance, storage, point)``: the outputs each instance releases, and the baseline
    point their free moves to (inserted before that row); NOTE [ Released outputs ]."""
    ops = tables["ops"]
    o_inst, o_storage = outputs
    pick = _pair_in(o_inst, o_storage, *saved) & (base.free_row[o_storage] >= 0)
    ci, cs = o_inst[pick], o_storage[pick]
    free_op = np.asarray(base.events["op"], dtype=np.int64)[base.free_row[cs]]
    at = np.maximum(free_op, 0)
    call = np.asarray(ops["module_call"], dtype=np.int64)[at]
    in_backward = (free_op >= 0) & (np.asarray(ops["phase"])[at] == Phase.BACKWARD)
    pick = in_backward & (call >= inst.first_call[ci]) & (call < inst.call_stop[ci])
    ci, cs = ci[pick], cs[pick]
    bound, known = _forward_life(tables, inst.last_call[ci], cs)
    point = np.searchsorted(base.times, bound, side="right")
    held, known_holders = _holder_points(base, tables, inst, ci, cs)
    point = np.maximum(point, held)
    ok = known & known_holders & (point <= base.free_row[cs])
    return ci[ok], cs[ok], point[ok]


def _forward_life(
    tables: RunTables, last_call: np.ndarray, storage: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(end_ns, known)`` per output: when its forward life ends (NOTE [ Released outputs ]);
    not known for the output of a top-level call or of a call that never returned."""
    calls, io = tables["module_calls"], tables["module_io"]
    parent = np.asarray(calls["parent"], dtype=np.int64)
    end = np.asarray(calls["end_ns"], dtype=np.int64)
    io_call = np.asarray(io["call"], dtype=np.int64)
    io_storage = np.asarray(io["storage"], dtype=np.int64)
    kind = np.asarray(io["kind"])
    scale = int(max(io_storage.max(initial=0), storage.max(initial=0))) + 1
    out_codes = np.unique((io_call * scale + io_storage)[kind == IOKind.OUTPUT])
    call = last_call.copy()
    while True:  # up through the callers that return it too (depth of the module tree)
        up = parent[call]
        returned = (up >= 0) & np.isin(np.maximum(up, 0) * scale + storage, out_codes)
        if not returned.any():
            break
        call = np.where(returned, up, call)
    life = end[call]
    known = (parent[call] >= 0) & (life >= 0)
    inputs = (kind == IOKind.INPUT) & (np.asarray(calls["phase"])[io_call] == Phase.FORWARD)
    used_until = np.full(scale, -1, dtype=np.int64)
    np.maximum.at(used_until, io_storage[inputs], end[io_call[inputs]])
    return np.maximum(life, used_until[storage]), known


def _holder_points(
    base: _Baseline, tables: RunTables, inst: RegionInstances, ci: np.ndarray, cs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(point, known)`` per output: the baseline point after the last BACKWARD op of every
    call outside the instance that saved it (0 if none); not known if a save has no such op."""
    saved, ops = tables["saved_events"], tables["ops"]
    pack = np.flatnonzero(np.asarray(saved["kind"]) == SavedEventKind.PACK)
    p_storage = np.asarray(saved["storage"], dtype=np.int64)
    owner, rows = _members(p_storage, pack, cs, cs + 1)
    p_call = np.asarray(saved["module_call"], dtype=np.int64)[rows]
    outside = (p_call < inst.first_call[ci[owner]]) | (p_call >= inst.call_stop[ci[owner]])
    owner, p_call = owner[outside], p_call[outside]
    op_call = np.asarray(ops["module_call"], dtype=np.int64)
    backward = np.flatnonzero((np.asarray(ops["phase"]) == Phase.BACKWARD) & (op_call >= 0))
    last_op = np.full(len(tables["module_calls"]["module"]), -1, dtype=np.int64)
    np.maximum.at(last_op, op_call[backward], backward)
    last = np.where(p_call >= 0, last_op[np.maximum(p_call, 0)], -1)
    known = np.ones(len(ci), dtype=bool)
    known[owner[last < 0]] = False
    event_op = np.maximum.accumulate(np.asarray(base.events["op"], dtype=np.int64))
    point = np.zeros(len(ci), dtype=np.int64)
    np.maximum.at(point, owner, np.searchsorted(event_op, last, side="right"))
    return point, known


def _kept_inputs(
    tables: RunTables, inst: RegionInstances, c_inst: np.ndarray, c_storage: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, storage)``: INPUTs of the top-level calls not created inside the instance,
    except the fixed categories (NOTE [ Kept inputs ], NOTE [ Fixed categories ])."""
    in_inst, in_storage = _io_pairs(tables["module_io"], inst, IOKind.INPUT)
    category = np.asarray(tables["storages"]["category"])[in_storage]
    keep = ~_pair_in(in_inst, in_storage, c_inst, c_storage) & ~np.isin(category, _FIXED)
    return _unique_pairs(in_inst[keep], in_storage[keep])


def _moment_keys(base: _Baseline, *moments: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """Keys of each kind of moment ``(baseline point, time, exists, first call, storage)``; -1
    where it does not exist. At one point, moments are ordered by time, then kind, then first
    call, then storage (NOTE [ Event keys ]), an order that does not depend on which instances
    are selected."""
    point, time, exists, lo, storage = (
        np.concatenate(column).astype(np.int64) for column in zip(*moments, strict=True)
    )
    sizes = [len(m[0]) for m in moments]
    kind = np.repeat(np.arange(len(moments)), sizes)
    rows = np.flatnonzero(exists)
    rows = rows[np.lexsort((rows, storage[rows], lo[rows], kind[rows], time[rows], point[rows]))]
    starts = np.flatnonzero(_run_starts(point[rows])) if rows.size else rows
    first = np.repeat(starts, np.diff(np.append(starts, len(rows))))
    keys = np.full(len(point), -1, dtype=np.int64)
    keys[rows] = point[rows] * base.width + np.arange(len(rows)) - first
    return np.split(keys, np.cumsum(sizes)[:-1])


def _members(
    keys: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, row)`` pairs: for each range ``i``, the ``rows`` whose key is in [lo[i], hi[i])."""
    rows = rows[np.argsort(keys[rows], kind="stable")]
    sorted_keys = keys[rows]
    first = np.searchsorted(sorted_keys, lo, side="left")
    counts = np.searchsorted(sorted_keys, hi, side="left") - first
    owner = np.repeat(np.arange(len(lo), dtype=np.int64), counts)
    offset = np.repeat(first - (np.cumsum(counts) - counts), counts)
    return owner, rows[np.arange(owner.size) + offset]


def _calls_in(
    column: np.ndarray, mask: np.ndarray, inst: RegionInstances
) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, row)`` for the rows in ``mask`` attributed to a call inside each instance."""
    keys = np.asarray(column, dtype=np.int64)
    return _members(keys, np.flatnonzero(mask & (keys >= 0)), inst.first_call, inst.call_stop)


def _created_inside(tables: RunTables, inst: RegionInstances) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, storage)``: storages a FORWARD op inside the instance allocated, except the
    fixed categories (NOTE [ Fixed categories ])."""
    storages, ops = tables["storages"], tables["ops"]
    op = np.asarray(storages["op"], dtype=np.int64)
    forward = np.zeros(op.shape, dtype=bool)
    made = np.flatnonzero(op >= 0)  # a run without ops has no storage made by one
    forward[made] = np.asarray(ops["phase"])[op[made]] == Phase.FORWARD
    movable = forward & ~np.isin(np.asarray(storages["category"]), _FIXED)
    return _calls_in(storages["module_call"], movable, inst)


def _io_pairs(io: Table, inst: RegionInstances, kind: IOKind) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, storage)``: INPUTs of the instance's top-level calls, or OUTPUTs of its last
    call (a segment's inner results are created inside it)."""
    calls = np.asarray(io["call"], dtype=np.int64)
    rows = np.flatnonzero(np.asarray(io["kind"]) == kind)
    if kind == IOKind.OUTPUT:
        owner, rows = _members(calls, rows, inst.last_call, inst.last_call + 1)
    else:
        top, rows = _members(calls, rows, inst.top_call, inst.top_call + 1)
        owner = inst.top_instance[top]
    return owner, np.asarray(io["storage"], dtype=np.int64)[rows]


def _packed(saved: Table) -> np.ndarray:
    """Storages autograd saved anywhere in the run (a PACK); NOTE [ Held from outside ]."""
    return np.asarray(saved["storage"], dtype=np.int64)[
        np.asarray(saved["kind"]) == SavedEventKind.PACK
    ]


def _saved_pairs(saved: Table, inst: RegionInstances) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, storage)``: storages PACKed by a call inside the instance."""
    pack = np.asarray(saved["kind"]) == SavedEventKind.PACK
    owner, rows = _calls_in(saved["module_call"], pack, inst)
    return owner, np.asarray(saved["storage"], dtype=np.int64)[rows]


def _trigger_ns(tables: RunTables, inst: RegionInstances) -> np.ndarray:
    """When backward first needs each instance (NOTE [ Recompute in backward ]); _NEVER if not."""
    saved = tables["saved_events"]
    unpack = np.asarray(saved["kind"]) == SavedEventKind.UNPACK
    owner, rows = _calls_in(saved["module_call"], unpack, inst)
    first = np.full(len(inst), _NEVER, dtype=np.int64)
    np.minimum.at(first, owner, np.asarray(saved["time_ns"], dtype=np.int64)[rows])
    first_op = _op_times(tables["ops"], inst, Phase.BACKWARD, "start_ns", np.minimum)
    return np.where(first == _NEVER, first_op, first)


def _op_times(
    ops: Table, inst: RegionInstances, phase: Phase, column: str, reduce: np.ufunc
) -> np.ndarray:
    """Per instance, ``reduce`` (np.minimum or np.maximum) of ``column`` over its ``phase`` ops;
    _NEVER (minimum) or -1 (maximum) where it has none."""
    owner, rows = _calls_in(ops["module_call"], np.asarray(ops["phase"]) == phase, inst)
    out = np.full(len(inst), _NEVER if reduce is np.minimum else -1, dtype=np.int64)
    reduce.at(out, owner, np.asarray(ops[column], dtype=np.int64)[rows])
    return out


def _recompute_stop(
    base: _Baseline, tables: RunTables, inst: RegionInstances
) -> tuple[np.ndarray, np.ndarray]:
    """``(last_op, stop)`` per instance: the last op its recompute runs (the op stamped on its
    last PACK; without one, its last forward op) and the baseline event row the replay stops
    before (NOTE [ Early stop ])."""
    saved = tables["saved_events"]
    owner, rows = _calls_in(
        saved["module_call"], np.asarray(saved["kind"]) == SavedEventKind.PACK, inst
    )
    last_op = np.full(len(inst), -1, dtype=np.int64)
    np.maximum.at(last_op, owner, np.asarray(saved["op"], dtype=np.int64)[rows])
    ops = tables["ops"]
    owner, rows = _calls_in(ops["module_call"], np.asarray(ops["phase"]) == Phase.FORWARD, inst)
    last_forward = np.full(len(inst), -1, dtype=np.int64)
    np.maximum.at(last_forward, owner, rows)
    last_op = np.where(last_op >= 0, last_op, last_forward)
    event_op = np.maximum.accumulate(np.asarray(base.events["op"], dtype=np.int64))
    stop = np.searchsorted(event_op, last_op, side="right")
    return last_op, np.where(last_op >= 0, stop, 0)


def _compute_ns(
    tables: RunTables, inst: RegionInstances, last_op: np.ndarray
) -> tuple[np.ndarray, bool]:
    """Each instance's extra compute, and whether it comes from plain times (NOTE [ Extra
    compute from plain times ] in timing.py)."""
    replayed = _forward_ns(tables["ops"], inst, last_op)
    times = plain_times(tables)
    cost = times.call_cost.median_ns if times and times.call_cost else 0
    plain = None
    if times is not None:
        plain = plain_instance_ns(tables, times, inst.top_instance, inst.top_call, len(inst))
    if plain is None:
        return replayed + cost, False
    whole = _forward_ns(tables["ops"], inst, np.full(len(inst), np.iinfo(np.int64).max))
    share = np.divide(replayed, whole, out=np.ones(len(inst)), where=whole > 0)
    return np.round(plain * share).astype(np.int64) + cost, True


def _forward_ns(ops: Table, inst: RegionInstances, last_op: np.ndarray) -> np.ndarray:
    """Summed duration of the forward ops of each instance that its recompute runs."""
    owner, rows = _calls_in(ops["module_call"], np.asarray(ops["phase"]) == Phase.FORWARD, inst)
    replayed = rows <= last_op[owner]
    owner, rows = owner[replayed], rows[replayed]
    duration = np.asarray(ops["end_ns"], dtype=np.int64) - np.asarray(ops["start_ns"])
    out = np.zeros(len(inst), dtype=np.int64)
    np.add.at(out, owner, duration[rows])
    return out


def _pair_in(
    a_inst: np.ndarray, a_st: np.ndarray, b_inst: np.ndarray, b_st: np.ndarray
) -> np.ndarray:
    """For each pair of ``a``: is it among the pairs of ``b``?"""
    scale = int(max(a_st.max(initial=0), b_st.max(initial=0))) + 1
    return np.isin(a_inst * scale + a_st, b_inst * scale + b_st)


def _unique_pairs(inst: np.ndarray, storage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = int(storage.max(initial=0)) + 1
    codes = np.unique(inst * scale + storage)
    return codes // scale, codes % scale


# ----------------------------------------------------------------------------- exact projection


@dataclass(frozen=True)
class _Records:
    """Projected events before sorting (columns of equal length)."""

    key: np.ndarray
    sub: np.ndarray
    kind: np.ndarray
    storage: np.ndarray
    time: np.ndarray
    instance: np.ndarray
    copy: np.ndarray
    source: np.ndarray

    @staticmethod
    def make(
        key: Any,
        sub: Any,
        kind: int,
        storage: np.ndarray,
        time: Any,
        instance: Any,
        copy: bool,
        source: Any,
    ) -> _Records:
        """Records for ``storage``, broadcasting the scalar columns."""
        n = len(storage)

        def col(value: Any, dtype: type = np.int64) -> np.ndarray:
            return np.broadcast_to(np.asarray(value, dtype=dtype), (n,))

        return _Records(
            col(key),
            col(sub),
            col(kind, np.uint8),
            col(storage),
            col(time),
            col(instance),
            col(copy, bool),
            col(source),
        )

    @staticmethod
    def concat(parts: Sequence[_Records]) -> _Records:
        return _Records(*(np.concatenate([getattr(p, f) for p in parts]) for f in _RECORD_FIELDS))

    def take(self, order: np.ndarray) -> _Records:
        return _Records(*(getattr(self, f)[order] for f in _RECORD_FIELDS))


_RECORD_FIELDS = ("key", "sub", "kind", "storage", "time", "instance", "copy", "source")


def _moved_frees(
    eff: InstanceEffects, base: _Baseline, active: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(storage, key, time, instance)`` of every original storage whose FREE moves.

    Shortening first (NOTE [ Checkpointed forward ]), then the latest kept-input free
    (NOTE [ Kept inputs ]) if that is later still.
    """
    key = base.event_key(base.free_row)
    owner = np.full(len(key), -1, dtype=np.int64)
    time = np.full(len(key), -1, dtype=np.int64)
    drop = np.flatnonzero(active[eff.drop_instance])
    s, i = eff.drop_storage[drop], eff.drop_instance[drop]
    key[s], owner[s], time[s] = eff.drop_key[drop], i, eff.drop_ns[drop]
    s, i = _latest_keep(eff, active)
    later = (base.free_row[s] >= 0) & (eff.keep_key[i] > key[s])
    s, i = s[later], i[later]
    key[s], owner[s], time[s] = eff.keep_key[i], i, eff.backward_end_ns[i]
    moved = np.flatnonzero(owner >= 0)
    return moved, key[moved], time[moved], owner[moved]


def _latest_keep(eff: InstanceEffects, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(storage, instance)``: per kept storage, the active instance that keeps it longest."""
    mask = active[eff.keep_instance] & (eff.keep_key[eff.keep_instance] >= 0)
    s, i = eff.keep_storage[mask], eff.keep_instance[mask]
    order = np.lexsort((eff.keep_key[i], s))
    s, i = s[order], i[order]
    last = np.append(s[1:] != s[:-1], True) if s.size else np.zeros(0, dtype=bool)
    return s[last], i[last]


def _baseline_records(eff: InstanceEffects, base: _Baseline, active: np.ndarray) -> _Records:
    """The baseline events, with moved FREEs at their new keys, plus FREEs of shortened storages
    the baseline never freed."""
    rows = np.arange(base.n, dtype=np.int64)
    events = base.events
    key, time = base.event_key(rows), base.times.copy()
    instance = np.full(base.n, -1, dtype=np.int64)
    storage, new_key, new_time, owner = _moved_frees(eff, base, active)
    freed = base.free_row[storage] >= 0
    f = base.free_row[storage[freed]]
    key[f], time[f], instance[f] = new_key[freed], new_time[freed], owner[freed]
    kept = _Records(
        key,
        rows,
        np.asarray(events["kind"], dtype=np.uint8),
        np.asarray(events["storage"], dtype=np.int64),
        time,
        instance,
        np.zeros(base.n, dtype=bool),
        rows,
    )
    s = storage[~freed]
    added = _Records.make(
        new_key[~freed], base.n + s, _FREE, s, new_time[~freed], owner[~freed], False, -1
    )
    return _Records.concat([kept, added])


def _replay_records(eff: InstanceEffects, base: _Baseline, active: np.ndarray) -> _Records:
    """Events of the recomputed copies of the active instances (NOTE [ Recompute in backward ]):
    each copy's ALLOC, and its FREE inside the replay, at its baseline free or at the end."""
    pick = active[eff.copy_instance] & (eff.replay_key[eff.copy_instance] >= 0)
    inst, st, inner = eff.copy_instance[pick], eff.copy_storage[pick], eff.copy_free[pick]
    key, time, alloc = eff.replay_key[inst], eff.trigger_ns[inst], base.alloc_row[st]
    free = np.where(inner >= 0, inner, base.free_row[st])
    late = (inner < 0) & eff.copy_saved[pick] & (base.event_key(free) > key)
    at_end = (inner < 0) & ~late
    freed = ~late | (free >= 0)  # a saved copy the baseline never frees lives on
    return _Records.concat(
        [
            _Records.make(key, alloc, _ALLOC, st, time, inst, True, alloc),
            _Records.make(
                np.where(late, base.event_key(free), key)[freed],
                np.where(at_end, base.n + alloc, free)[freed],
                _FREE,
                st[freed],
                np.where(late, base.times[np.maximum(free, 0)], time)[freed],
                inst[freed],
                True,
                np.where(at_end, -1, free)[freed],
            ),
        ]
    )


def _project(eff: InstanceEffects, base: _Baseline, active: np.ndarray) -> Projection:
    """The exact projection with the ``active`` instances checkpointed."""
    records = _Records.concat(
        [
            _baseline_records(eff, base, active),
            _replay_records(eff, base, active),
        ]
    )
    rec = records.take(np.lexsort((records.sub, records.key)))
    events = ProjectedEvents(
        rec.kind,
        rec.storage,
        rec.time,
        rec.instance,
        rec.copy,
        rec.source,
        rec.key,
        base.point_of_key(rec.key),
    )
    timeline = memory_timeline(base.storages, events.table())
    peak = find_peak(timeline)
    recomputes = _recomputes(eff, base, active, rec.key)
    return Projection(
        events=events,
        timeline=timeline,
        peak=peak,
        projected_peak=_projected_peak(eff, base, events, peak),
        live=_live_at(base, events, peak.event),
        recomputes=recomputes,
        extra_compute_ns=sum(r.compute_ns for r in recomputes),
        plain_times=eff.plain_times,
        instances=eff.instances,
        checkpointed=active,
    )


def _projected_peak(
    eff: InstanceEffects, base: _Baseline, events: ProjectedEvents, peak: Peak
) -> ProjectedPeak:
    if peak.event < 0:
        return ProjectedPeak(peak.bytes, peak.time_ns, 0, -1)
    key = events.key[peak.event]
    instance = int(events.instance[peak.event])
    in_replay = events.copy[peak.event] and key == eff.replay_key[instance]
    return ProjectedPeak(
        bytes=peak.bytes,
        time_ns=peak.time_ns,
        baseline_point=int(base.point_of_key(key)),
        recompute_call=int(eff.instances.first_call[instance]) if in_replay else -1,
    )


def _live_at(base: _Baseline, events: ProjectedEvents, after: int) -> LiveStorages:
    """Originals and copies live just after projected event ``after`` (-1: before any)."""
    kind, storage, copy = (a[: after + 1] for a in (events.kind, events.storage, events.copy))
    live = [live_at_start(base.storages), np.zeros(len(base.nbytes), dtype=bool)]
    born = births(base.storages, kind, storage)
    for flag, mask in enumerate(live):
        mine = copy == bool(flag)
        mask[storage[mine & born]] = True
        mask[storage[mine & (kind == _FREE)]] = False
    rows = np.concatenate([np.flatnonzero(m) for m in live])
    flags = np.concatenate([np.full(int(m.sum()), bool(f)) for f, m in enumerate(live)])
    order = np.lexsort((flags, rows))
    return LiveStorages(storage=rows[order], copy=flags[order])


def _recomputes(
    eff: InstanceEffects, base: _Baseline, active: np.ndarray, keys: np.ndarray
) -> tuple[Recompute, ...]:
    inst = np.flatnonzero(active & (eff.replay_key >= 0))
    inst = inst[np.argsort(eff.replay_key[inst], kind="stable")]
    points = np.searchsorted(keys, eff.replay_key[inst], side="left")
    return tuple(
        Recompute(
            instance=int(i),
            region=int(eff.instances.region[i]),
            call=int(eff.instances.first_call[i]),
            time_ns=int(eff.trigger_ns[i]),
            baseline_point=int(base.point_of_key(eff.replay_key[i])),
            point=int(p),
            compute_ns=int(eff.compute_ns[i]),
        )
        for i, p in zip(inst, points, strict=True)
    )


def project(tables: RunTables, regions: Sequence[Region]) -> Projection:
    """The baseline run ``tables`` projected with every instance of ``regions`` checkpointed.

    Exact under the model of this module's NOTE blocks; nested instances follow
    NOTE [ Nesting: the outer region wins ]. With no regions it is the baseline timeline.
    """
    instances = region_instances(
        tables["module_calls"], tables["modules"], tables["strings"], regions
    )
    base, eff = _effects(tables, instances)
    return _project(eff, base, outermost(instances, np.ones(len(instances), dtype=bool)))


def peak_from_state(projection: Projection, base: RunTables, run: RunTables) -> int:
    """The peak of ``projection`` (over ``base``) with the baseline's parameters, gradients and
    optimizer state exchanged for those of ``run``, a run of the same step that began from
    another training state: NOTE [ Runs that begin from another state ] in timeline.py."""
    offsets = stretch_offsets(base, run)
    stretch = point_stretches(base["ops"], base["memory_events"])
    points = np.concatenate(([0], projection.events.point))
    return int(np.max(projection.total + offsets[stretch[points]]))


# ----------------------------------------------------------------------------- incremental


class ProjectionModel:
    """The projected peak of any selection of candidate regions, fast enough for every click.

    Built once per baseline run and candidate list; ``peak(selected)`` then costs
    O(steps + kept inputs) vectorised work, independent of the number of events.

    NOTE [ Incremental peak ]
        Each candidate instance's effect on the baseline curve is a few steps (its shortened
        storages drop at its end and come back where the baseline freed them; the copies its
        recompute leaves go at their own free) plus a spike: the highest point of its replay
        above the curve where it is inserted. The keys of all candidates' steps cut the
        baseline into intervals on which any selection's change is constant, and the baseline
        maximum of each interval is precomputed. A query sums the selected steps per interval
        (one bincount and one cumsum), adds the interval maxima and the spikes and takes the
        largest.

        Storages whose free two instances can move, the kept inputs (NOTE [ Kept inputs ]),
        possibly also shortened by another instance, are resolved per query with ``project``'s
        rule, and nesting is resolved first (NOTE [ Nesting: the outer region wins ]); no other
        storage is touched by two checkpointed instances. So the answer (bytes, time, baseline
        point, recompute call) equals ``project``'s ``projected_peak`` for every selection, up
        to float64 sums of bytes (exact below 2**53 = 8 PiB). It does not give the projected
        event row: only the full projection numbers the events.

    NOTE [ Projected curve ]
        ``curve(selected)`` draws the projection without numbering its events: one state per
        baseline point (the state after every projected event up to that point's key), one per
        inserted moment any candidate can make (the state after it), and for each recompute its
        highest point, placed just before the recompute's key. Each state is the baseline at
        its point plus the selection's level for its interval, so the curve's maximum is
        ``peak(selected).bytes`` and a query is one gather over the states, with no sort. What
        it leaves out lies between two of its states and below the higher of them, except
        inside a recompute, whose highest point it keeps.
    """

    def __init__(self, tables: RunTables, candidates: Sequence[Region]) -> None:
        self.candidates = tuple(candidates)
        self.instances = region_instances(
            tables["module_calls"], tables["modules"], tables["strings"], self.candidates
        )
        self._base, self.effects = _effects(tables, self.instances)
        self._index = _build_index(self.effects, self._base)
        self._curve: _CurveIndex | None = None  # built by the first ``curve`` (the GUI's)

    def checkpointed(self, selected: Selection) -> np.ndarray:
        """(k,) bool: the instances checkpointed when the ``selected`` candidates are (indices or
        a boolean mask over ``candidates``), outermost only."""
        chosen = _candidate_mask(selected, len(self.candidates))
        return outermost(self.instances, chosen[self.instances.region])

    def peak(self, selected: Selection) -> ProjectedPeak:
        """The projected peak with the ``selected`` candidates checkpointed
        (NOTE [ Incremental peak ])."""
        return _query_peak(self._index, self.checkpointed(selected))

    def extra_compute_ns(self, selected: Selection) -> int:
        """Summed forward time of the instances the ``selected`` candidates recompute."""
        active = self.checkpointed(selected) & (self.effects.replay_key >= 0)
        return int(self.effects.compute_ns[active].sum())

    def project(self, selected: Selection) -> Projection:
        """The exact projection of the ``selected`` candidates (see ``project``)."""
        return _project(self.effects, self._base, self.checkpointed(selected))

    def curve(self, selected: Selection) -> ProjectedCurve:
        """The projected total of the ``selected`` candidates at every baseline point, every
        inserted state and every recompute's highest point (NOTE [ Projected curve ])."""
        if self._curve is None:
            timeline = memory_timeline(self._base.storages, self._base.events)
            self._curve = _curve_index(self.effects, self._base, timeline, self._index.union)
        return _query_curve(self._index, self._curve, self.checkpointed(selected))


def _candidate_mask(selected: Selection, n: int) -> np.ndarray:
    chosen: np.ndarray = np.asarray(selected)
    if chosen.dtype == bool:
        if chosen.shape != (n,):
            raise ValueError(
                f"a selection mask needs one flag per candidate ({n}), got shape {chosen.shape}"
            )
        return chosen
    mask = np.zeros(n, dtype=bool)
    mask[chosen.astype(np.int64)] = True
    return mask


@dataclass(frozen=True)
class _Index:
    """What ``ProjectionModel.peak`` reads. Union keys (every key a candidate can change the
    curve at) cut the keys into intervals; slot ``u`` is the interval after union key ``u - 1``
    (slot 0: before the first), and a change "at slot u" holds from interval u on."""

    top: np.ndarray
    """(u+1,) float64: baseline maximum in each interval."""
    top_order: np.ndarray
    """(u+1,) int64: 2 x the key of that maximum (a spike's order is just before its key's)."""
    top_time: np.ndarray
    top_point: np.ndarray
    step_instance: np.ndarray
    step_slot: np.ndarray
    step_bytes: np.ndarray
    """Every instance's fixed changes (float64 for bincount; exact below 2**53)."""
    spike_instance: np.ndarray
    spike_slot: np.ndarray
    """Slot of the interval just before the replay."""
    spike_bytes: np.ndarray
    """Baseline bytes where the replay is inserted plus the replay's highest rise (float64)."""
    spike_order: np.ndarray
    spike_time: np.ndarray
    spike_point: np.ndarray
    spike_call: np.ndarray
    moving: _Moving
    union: np.ndarray
    """Every key a candidate can change the curve at, sorted (the intervals' bounds)."""


@dataclass(frozen=True)
class _CurveIndex:
    """Per state of the curve (baseline points and inserted union keys, in key order): what
    ``_query_curve`` adds the selection's level to."""

    base: np.ndarray
    """(c,) int64: baseline live bytes at the state."""
    slot: np.ndarray
    """(c,) int64: the interval (of ``_Index``) the state is in."""
    time: np.ndarray
    point: np.ndarray
    order: np.ndarray
    """(c,) int64: 2 x key, comparable with ``_Index.spike_order``."""


@dataclass(frozen=True)
class _Moving:
    """The storages whose free depends on the selection: kept inputs (NOTE [ Incremental peak ]).
    Pairs ``(*_index, *_instance, *_key, *_slot)`` point into the per-storage arrays."""

    nbytes: np.ndarray
    free_key: np.ndarray
    free_slot: np.ndarray
    """Slot of the baseline free; one past the last slot if never freed."""
    drop_index: np.ndarray
    drop_instance: np.ndarray
    drop_key: np.ndarray
    drop_slot: np.ndarray
    keep_index: np.ndarray
    keep_instance: np.ndarray
    keep_key: np.ndarray
    keep_slot: np.ndarray
    """Keep pairs sorted by storage, then latest first."""


def _build_index(eff: InstanceEffects, base: _Baseline) -> _Index:
    curve = memory_timeline(base.storages, base.events)
    replays = _replay_records(eff, base, np.ones(len(eff.instances), dtype=bool))
    storages = np.unique(eff.keep_storage[eff.keep_key[eff.keep_instance] >= 0])
    fixed = ~np.isin(eff.drop_storage, storages)
    steps = _instance_steps(eff, base, replays, fixed)
    spike_inst, spike_rise = _spikes(base, eff, replays)
    union = np.unique(
        np.concatenate(
            [
                steps[1],
                eff.replay_key[eff.replay_key >= 0],
                *_moving_keys(eff, base, storages, ~fixed),
            ]
        )
    )
    top, order, time, point = _interval_tops(eff, base, curve, union)
    replay_key = eff.replay_key[spike_inst]
    at = base.point_of_key(replay_key)
    return _Index(
        top=top.astype(np.float64),
        top_order=order,
        top_time=time,
        top_point=point,
        step_instance=steps[0],
        step_slot=np.searchsorted(union, steps[1]) + 1,
        step_bytes=steps[2].astype(np.float64),
        spike_instance=spike_inst,
        spike_slot=np.searchsorted(union, replay_key),
        spike_bytes=(curve.total[at] + spike_rise).astype(np.float64),
        spike_order=2 * replay_key - 1,
        spike_time=eff.trigger_ns[spike_inst],
        spike_point=at,
        spike_call=eff.instances.first_call[spike_inst],
        moving=_moving(eff, base, storages, ~fixed, union),
        union=union,
    )


def _curve_index(
    eff: InstanceEffects, base: _Baseline, curve: MemoryTimeline, union: np.ndarray
) -> _CurveIndex:
    """The states NOTE [ Projected curve ] draws: every baseline point, then every union key
    that is an inserted moment (baseline keys are baseline points already), merged by key."""
    points = np.arange(base.n + 1, dtype=np.int64)
    point_keys = (points - 1) * base.width + base.width - 1  # point 0: key -1
    inserted = union[union % base.width != base.width - 1]
    keys = np.concatenate([point_keys, inserted])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    at = base.point_of_key(np.maximum(keys, 0))
    at[keys < 0] = 0
    times = np.concatenate([curve.time_ns, _key_times(eff, base, curve, inserted)])[order]
    return _CurveIndex(
        base=curve.total[at],
        slot=np.searchsorted(union, keys, side="right"),
        time=times,
        point=at,
        order=2 * keys,
    )


def _instance_steps(
    eff: InstanceEffects, base: _Baseline, replays: _Records, fixed: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(instance, key, bytes)`` of each instance's own changes, summed per key, zeros dropped:
    the ``fixed`` shortened storages drop at its end and come back at their baseline free; the
    copies come at the replay and go at their own free."""
    drop_inst, drop_storage = eff.drop_instance[fixed], eff.drop_storage[fixed]
    freed = base.free_row[drop_storage] >= 0
    nbytes = base.nbytes[drop_storage]
    inst = np.concatenate([drop_inst, drop_inst[freed], replays.instance])
    key = np.concatenate(
        [
            eff.drop_key[fixed],
            base.event_key(base.free_row[drop_storage[freed]]),
            replays.key,
        ]
    )
    signs = np.where(replays.kind == _ALLOC, 1, -1)
    delta = np.concatenate([-nbytes, nbytes[freed], signs * base.nbytes[replays.storage]])
    order = np.lexsort((key, inst))
    inst, key, delta = inst[order], key[order], delta[order]
    starts = np.flatnonzero(_run_starts(inst, key))
    sums = np.add.reduceat(delta, starts) if starts.size else delta
    keep = sums != 0
    return inst[starts][keep], key[starts][keep], sums[keep]


def _run_starts(*columns: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows where any of the (sorted) ``columns`` changes value."""
    n = len(columns[0])
    new = np.zeros(n, dtype=bool)
    new[:1] = True
    for column in columns:
        new[1:] |= column[1:] != column[:-1]
    return new


def _spikes(
    base: _Baseline, eff: InstanceEffects, replays: _Records
) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, rise)``: the highest point of each replay above where it starts."""
    rec = replays.take(np.flatnonzero(replays.key == eff.replay_key[replays.instance]))
    rec = rec.take(np.lexsort((rec.sub, rec.instance)))
    delta = np.where(rec.kind == _ALLOC, 1, -1) * base.nbytes[rec.storage]
    starts = np.flatnonzero(_run_starts(rec.instance))
    running = np.cumsum(delta)
    before = np.repeat(running[starts] - delta[starts], np.diff(np.append(starts, len(delta))))
    rise = np.maximum.reduceat(running - before, starts) if starts.size else delta
    return rec.instance[starts], rise


def _moving_keys(
    eff: InstanceEffects, base: _Baseline, storages: np.ndarray, dropped: np.ndarray
) -> list[np.ndarray]:
    """Every key a moving storage's free can be at."""
    free_key = base.event_key(base.free_row[storages])
    keep_key = eff.keep_key[eff.keep_instance]
    return [
        free_key[free_key != _NEVER],
        eff.drop_key[dropped],
        keep_key[keep_key >= 0],
    ]


def _moving(
    eff: InstanceEffects,
    base: _Baseline,
    storages: np.ndarray,
    dropped: np.ndarray,
    union: np.ndarray,
) -> _Moving:
    free_key = base.event_key(base.free_row[storages])
    keeps = np.flatnonzero(eff.keep_key[eff.keep_instance] >= 0)
    keep_index = np.searchsorted(storages, eff.keep_storage[keeps])
    keep_inst = eff.keep_instance[keeps]
    keep_key = eff.keep_key[keep_inst]
    order = np.lexsort((-keep_key, keep_index))
    drop_inst = eff.drop_instance[dropped]
    drop_key = eff.drop_key[dropped]
    return _Moving(
        nbytes=base.nbytes[storages].astype(np.float64),
        free_key=free_key,
        free_slot=np.searchsorted(union, free_key) + 1,
        drop_index=np.searchsorted(storages, eff.drop_storage[dropped]),
        drop_instance=drop_inst,
        drop_key=drop_key,
        drop_slot=np.searchsorted(union, drop_key) + 1,
        keep_index=keep_index[order],
        keep_instance=keep_inst[order],
        keep_key=keep_key[order],
        keep_slot=np.searchsorted(union, keep_key[order]) + 1,
    )


def _moving_steps(mv: _Moving, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(slot, bytes)`` changes of the moving storages, by ``_moved_frees``' rule: shortened
    by an active instance first, then kept by the active instance that keeps it longest."""
    key, slot = mv.free_key.copy(), mv.free_slot.copy()
    drop = np.flatnonzero(active[mv.drop_instance])  # nesting leaves one dropper per storage
    key[mv.drop_index[drop]] = mv.drop_key[drop]
    slot[mv.drop_index[drop]] = mv.drop_slot[drop]
    keep = np.flatnonzero(active[mv.keep_instance])
    keep = keep[_run_starts(mv.keep_index[keep])] if keep.size else keep
    index = mv.keep_index[keep]
    later = (mv.free_key[index] != _NEVER) & (mv.keep_key[keep] > key[index])
    key[index[later]] = mv.keep_key[keep[later]]
    slot[index[later]] = mv.keep_slot[keep[later]]
    moved = np.flatnonzero(key != mv.free_key)
    # Alive until the new free instead of the baseline one: +bytes there, -bytes here.
    return (
        np.concatenate([mv.free_slot[moved], slot[moved]]),
        np.concatenate([mv.nbytes[moved], -mv.nbytes[moved]]),
    )


def _interval_tops(
    eff: InstanceEffects, base: _Baseline, curve: MemoryTimeline, union: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per interval between union keys: the baseline maximum, and the order (2 x key), time and
    baseline point of its first occurrence."""
    total, n = curve.total, base.n
    start = np.concatenate(([0], base.point_of_key(union)))
    stop = np.concatenate((base.point_of_key(union - 1), [n]))  # inclusive
    bounds = np.empty(2 * len(start), dtype=np.int64)
    bounds[0::2], bounds[1::2] = start, stop + 1
    top = np.maximum.reduceat(np.append(total, 0), bounds)[0::2]
    point = _first_at_least(total, start, stop, top)
    opens = np.concatenate(([-1], union))  # the key each interval begins with (-1: point 0)
    at_open = (start == point) & ((opens >= 0) | (point == 0))
    key = np.where(at_open, opens, (point - 1) * base.width + base.width - 1)
    time = np.where(at_open, _key_times(eff, base, curve, opens), curve.time_ns[point])
    return top, 2 * key, time, point


def _first_at_least(
    total: np.ndarray, start: np.ndarray, stop: np.ndarray, top: np.ndarray
) -> np.ndarray:
    """First point of each interval [start, stop] where ``total`` reaches ``top``.

    Consecutive intervals share at most their boundary point, so each interval is its own cell
    [start, next start) plus possibly that shared point.
    """
    cell = np.repeat(np.arange(len(start)), np.diff(np.append(start, len(total))))
    hits = np.flatnonzero(total >= top[cell])
    found, first = np.unique(cell[hits], return_index=True)
    point = stop.copy()
    point[found] = hits[first]
    return point


def _key_times(
    eff: InstanceEffects, base: _Baseline, curve: MemoryTimeline, keys: np.ndarray
) -> np.ndarray:
    """Time of the projected state at each key (-1: point 0): its baseline event's, or the
    moment an inserted event stands for (NOTE [ Event keys ])."""
    known = np.concatenate([eff.end_key, eff.replay_key, eff.keep_key, eff.drop_key])
    times = np.concatenate([eff.end_ns, eff.trigger_ns, eff.backward_end_ns, eff.drop_ns])
    order = np.argsort(known)
    at = np.searchsorted(known[order], keys).clip(0, max(len(known) - 1, 0))
    inserted = times[order][at] if known.size else np.zeros(len(keys), dtype=np.int64)
    event = (keys < 0) | (keys % base.width == base.width - 1)
    return np.where(event, curve.time_ns[base.point_of_key(np.maximum(keys, 0))], inserted)


def _levels(ix: _Index, active: np.ndarray) -> np.ndarray:
    """(u+1,) float64: the change of the ``active`` instances to the baseline, per interval."""
    step = active[ix.step_instance]
    moving_slot, moving_bytes = _moving_steps(ix.moving, active)
    shifts = np.bincount(
        np.concatenate([ix.step_slot[step], moving_slot]),
        weights=np.concatenate([ix.step_bytes[step], moving_bytes]),
        minlength=len(ix.top) + 1,  # the last bin collects "never freed"
    )[: len(ix.top)]
    return np.cumsum(shifts)  # float64 sums of whole bytes: exact below 2**53 (8 PiB)


def _query_peak(ix: _Index, active: np.ndarray) -> ProjectedPeak:
    """The projected peak with the ``active`` instances checkpointed (NOTE [ Incremental peak ])."""
    level = _levels(ix, active)
    spike = np.flatnonzero(active[ix.spike_instance])
    values = np.concatenate([ix.top + level, ix.spike_bytes[spike] + level[ix.spike_slot[spike]]])
    orders = np.concatenate([ix.top_order, ix.spike_order[spike]])
    best = values.max()
    tied = np.flatnonzero(values == best)
    i = int(tied[np.argmin(orders[tied])])
    if i < len(ix.top):
        return ProjectedPeak(round(best), int(ix.top_time[i]), int(ix.top_point[i]), -1)
    s = spike[i - len(ix.top)]
    return ProjectedPeak(
        round(best), int(ix.spike_time[s]), int(ix.spike_point[s]), int(ix.spike_call[s])
    )


def _query_curve(ix: _Index, c: _CurveIndex, active: np.ndarray) -> ProjectedCurve:
    """See NOTE [ Projected curve ]."""
    level = np.rint(_levels(ix, active)).astype(np.int64)
    total = c.base + level[c.slot]
    spike = np.flatnonzero(active[ix.spike_instance])
    if spike.size == 0:
        return ProjectedCurve(time_ns=c.time, point=c.point, total=total)
    # A spike's order (2 x key - 1) sorts it just before the states at its key.
    at = np.searchsorted(c.order, ix.spike_order[spike])
    high = np.rint(ix.spike_bytes[spike]).astype(np.int64) + level[ix.spike_slot[spike]]
    return ProjectedCurve(
        time_ns=np.insert(c.time, at, ix.spike_time[spike]),
        point=np.insert(c.point, at, ix.spike_point[spike]),
        total=np.insert(total, at, high),
    )
