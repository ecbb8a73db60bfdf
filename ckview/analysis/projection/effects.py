"""The baseline and what each region instance changes in it, computed once per set of
candidates: the moments its frees move to, its recompute, its extra compute (NOTE [ Event
keys ] and the other NOTEs in ``ckview.analysis.projection``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ckview.analysis.regions import RegionInstances, region_instances
from ckview.analysis.timing import PlainTimes, plain_instance_ns, plain_times
from ckview.analysis.types import RunTables, Table
from ckview.trace.schema import Category, IOKind, MemoryEventKind, Phase, SavedEventKind

NEVER = np.iinfo(np.int64).max
FIXED = np.asarray(  # what no checkpoint plan changes (FSDP gathers and reshards as before)
    [
        Category.PARAMETER,
        Category.GRADIENT,
        Category.OPTIMIZER_STATE,
        Category.SHARDED_PARAMETER,
        Category.UNSHARDED_PARAMETER,
        Category.COMM_BUFFER,
    ]
)
ALLOC, FREE = int(MemoryEventKind.ALLOC), int(MemoryEventKind.FREE)

# ----------------------------------------------------------------------------- baseline


@dataclass(frozen=True)
class Baseline:
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
        """Keys of baseline event ``rows`` (-1 rows, never freed, give ``NEVER``)."""
        return np.where(rows >= 0, rows * self.width + self.width - 1, NEVER)

    def point_of_key(self, keys: np.ndarray) -> np.ndarray:
        """Baseline point each key stands at: after baseline event e -> e + 1, inserted before
        baseline event p -> p."""
        return keys // self.width + (keys % self.width == self.width - 1)


def baseline_of(tables: RunTables) -> Baseline:
    """The baseline columns; ``width`` is set by ``instance_effects`` once the moments are known."""
    storages, events = tables["storages"], tables["memory_events"]
    kind = np.asarray(events["kind"])
    storage = np.asarray(events["storage"], dtype=np.int64)
    rows = np.arange(len(kind), dtype=np.int64)
    n_storages = len(storages["nbytes"])
    alloc_row = np.full(n_storages, -1, dtype=np.int64)
    free_row = np.full(n_storages, -1, dtype=np.int64)
    first = kind != FREE
    alloc_row[storage[first]] = rows[first]
    free_row[storage[~first]] = rows[~first]
    return Baseline(
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
    compute_range_ns: np.ndarray
    """(2, k) the lowest and highest extra compute the measurements allow (NOTE [ How sure the
    extra time is ] in timing.py)."""
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
    offload: np.ndarray
    """(k,) bool: the instance offloads (its copies come back from host memory, NOTE
    [ Offloaded instances ])."""


def instance_effects(
    tables: RunTables,
    inst: RegionInstances,
    kept_ops: tuple[np.ndarray, np.ndarray] | None = None,
    offload: np.ndarray | None = None,
) -> tuple[Baseline, InstanceEffects]:
    """The baseline (with its key width) and every instance's effects on it. ``kept_ops``
    (``(instance, op row)``) are the ops op-level instances save (NOTE [ Op-level instances ]);
    ``offload`` flags the instances that offload (NOTE [ Offloaded instances ])."""
    base = baseline_of(tables)
    end_point = np.searchsorted(base.times, inst.end_ns, side="right")
    c_inst, c_storage = _created_inside(tables, inst)
    out_inst, out_storage = _io_pairs(tables["module_io"], inst, IOKind.OUTPUT)
    saved_inst, saved_storage = _saved_pairs(tables["saved_events"], inst)
    saved = _pair_in(c_inst, c_storage, saved_inst, saved_storage)
    made_by = np.asarray(tables["storages"]["op"], dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    k_inst, k_op = kept_ops if kept_ops is not None else (empty, empty)
    kept = _pair_in(c_inst, made_by[c_storage], k_inst, k_op) & _outlives_op(base, c_storage)
    released = _released_outputs(
        base, tables, inst, _unique_pairs(out_inst, out_storage), (saved_inst, saved_storage)
    )
    if k_inst.size:  # a kept output is held by the cache: not released (NOTE [ Op-level ...])
        rel_kept = _pair_in(released[0], made_by[released[1]], k_inst, k_op)
        released = (released[0][~rel_kept], released[1][~rel_kept], released[2][~rel_kept])
    free = base.free_row[c_storage]
    alive_at_end = (free >= end_point[c_inst]) | (free < 0)
    unsaved = ~np.isin(c_storage, _packed(tables["saved_events"]))  # NOTE [ Held from outside ]
    output = _pair_in(c_inst, c_storage, out_inst, out_storage)
    off = offload if offload is not None else np.zeros(len(inst), dtype=bool)
    moved = off[c_inst] & saved
    if moved.any():
        moved &= _on_device(tables, c_storage)
    drop = ~output & alive_at_end & ~unsaved & ~kept & (~off[c_inst] | moved)
    local_point = _local_ends(base, tables, c_storage)
    early = drop & (local_point < end_point[c_inst])  # NOTE [ Locals die with their frame ]
    drop &= ~early
    rel_inst, rel_storage, rel_point = (column[~off[released[0]]] for column in released)
    released = (
        np.concatenate([rel_inst, c_inst[early]]),
        np.concatenate([rel_storage, c_storage[early]]),
        np.concatenate([rel_point, local_point[early]]),
    )
    base = replace(base, width=3 * len(inst) + len(released[0]) + 2)
    last_op, stop = _recompute_stop(base, tables, inst)
    moments = _moments(base, tables, inst, end_point, released)
    order = np.lexsort((base.alloc_row[c_storage], c_inst))
    recomputed = base.alloc_row[c_storage[order]] < stop[c_inst[order]]
    replayed = order[np.where(off[c_inst[order]], moved[order], recomputed)]
    inner = ~saved & ~alive_at_end & (free < stop[c_inst])
    held = _held(base, moments, c_inst, c_storage, kept, stop)
    replayed = replayed[~kept[replayed]]  # a saved op is not rerun: the cache hands it back
    keep_inst, keep_storage = _kept_inputs(tables, inst, c_inst, c_storage)
    keep_inst, keep_storage = keep_inst[~off[keep_inst]], keep_storage[~off[keep_inst]]
    release_key, release_ns = moments.pop("release_key"), moments.pop("release_ns")
    saved_bytes = _saved_bytes(base, len(inst), saved_inst, saved_storage)
    compute, plain = _compute_ns(base, tables, inst, last_op, (k_inst, k_op), saved_bytes)
    compute[:, off] = 0
    return base, InstanceEffects(
        instances=inst,
        **moments,
        compute_ns=compute[0],
        compute_range_ns=compute[1:],
        plain_times=plain,
        drop_instance=np.concatenate([c_inst[drop], released[0], held[0]]),
        drop_storage=np.concatenate([c_storage[drop], released[1], held[1]]),
        drop_key=np.concatenate([moments["end_key"][c_inst[drop]], release_key, held[2]]),
        drop_ns=np.concatenate([inst.end_ns[c_inst[drop]], release_ns, held[3]]),
        copy_instance=c_inst[replayed],
        copy_storage=c_storage[replayed],
        copy_saved=saved[replayed],
        copy_free=np.where(inner, free, -1)[replayed],
        keep_instance=keep_inst,
        keep_storage=keep_storage,
        offload=off,
    )


def _on_device(tables: RunTables, storage: np.ndarray) -> np.ndarray:
    """Per storage: on a device whose tensors an offload region moves to host memory (CUDA;
    CPU tensors are in host memory already, NOTE [ Offloaded instances ])."""
    strings = tables["strings"]
    device = np.asarray(tables["storages"]["device"], dtype=np.int64)
    ids = np.unique(device)
    cuda = np.array([strings[int(i)].startswith("cuda") for i in ids], dtype=bool)
    return cuda[np.searchsorted(ids, device[storage])] if ids.size else np.zeros(0, dtype=bool)


def _outlives_op(base: Baseline, storage: np.ndarray) -> np.ndarray:
    """Per storage: not freed by the op that made it (an op's output, not its scratch)."""
    free = base.free_row[storage]
    free_op = np.asarray(base.events["op"], dtype=np.int64)[np.maximum(free, 0)]
    made_by = np.asarray(base.storages["op"], dtype=np.int64)[storage]
    return (free < 0) | (free_op != made_by)


def _held(
    base: Baseline,
    moments: dict[str, np.ndarray],
    c_inst: np.ndarray,
    c_storage: np.ndarray,
    kept: np.ndarray,
    stop: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(instance, storage, key, time)``: the outputs of saved ops (the instance's outputs
    too) whose free the selective checkpoint's cache moves later (NOTE [ Op-level instances ]): to
    the recompute when it reaches the op, else to the end of the instance's backward; never
    earlier than the baseline free. At the recompute's key the free keeps its baseline row as
    its order among the replay's events: where the replay frees its copy would be."""
    i, s = c_inst[kept], c_storage[kept]
    reached = base.alloc_row[s] < stop[i]
    key = np.where(reached, moments["replay_key"][i], moments["keep_key"][i])
    time = np.where(reached, moments["trigger_ns"][i], moments["backward_end_ns"][i])
    later = (key >= 0) & (key > base.event_key(base.free_row[s]))
    return i[later], s[later], key[later], time[later]


def _moments(
    base: Baseline,
    tables: RunTables,
    inst: RegionInstances,
    end_point: np.ndarray,
    released: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> dict[str, np.ndarray]:
    """Keys and times of each instance's end, recompute and end of backward, and of each
    released output's free (NOTE [ Released outputs ])."""
    trigger_ns = _trigger_ns(tables, inst)
    backward_end = _op_times(tables["ops"], inst, Phase.BACKWARD, "end_ns", np.maximum)
    has_trigger = trigger_ns != NEVER
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
    base: Baseline,
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


@dataclass(frozen=True)
class _CallIO:
    """What the forward life of a storage needs from the module calls and their I/O."""

    parent: np.ndarray
    end: np.ndarray
    out_codes: np.ndarray
    """``call * scale + storage`` of every OUTPUT row, sorted."""
    scale: int
    used_until: np.ndarray
    """Per storage: the end of the last forward call that takes it as an input, -1 if none."""

    @classmethod
    def of(cls, tables: RunTables, storage: np.ndarray) -> _CallIO:
        calls, io = tables["module_calls"], tables["module_io"]
        end = np.asarray(calls["end_ns"], dtype=np.int64)
        io_call = np.asarray(io["call"], dtype=np.int64)
        io_storage = np.asarray(io["storage"], dtype=np.int64)
        kind = np.asarray(io["kind"])
        scale = int(max(io_storage.max(initial=0), storage.max(initial=0))) + 1
        inputs = (kind == IOKind.INPUT) & (np.asarray(calls["phase"])[io_call] == Phase.FORWARD)
        used_until = np.full(scale, -1, dtype=np.int64)
        np.maximum.at(used_until, io_storage[inputs], end[io_call[inputs]])
        return cls(
            parent=np.asarray(calls["parent"], dtype=np.int64),
            end=end,
            out_codes=np.unique((io_call * scale + io_storage)[kind == IOKind.OUTPUT]),
            scale=scale,
            used_until=used_until,
        )

    def returns(self, call: np.ndarray, storage: np.ndarray) -> np.ndarray:
        """Whether each ``call`` (>= 0) returns the ``storage`` beside it."""
        return (call >= 0) & np.isin(np.maximum(call, 0) * self.scale + storage, self.out_codes)

    def climb(self, call: np.ndarray, storage: np.ndarray, active: np.ndarray) -> np.ndarray:
        """From ``call``, where ``active``, up through the callers that return the storage too
        (as many rounds as the module tree is deep)."""
        while True:
            up = self.parent[np.maximum(call, 0)]
            more = active & (call >= 0) & self.returns(up, storage)
            if not more.any():
                return call
            call = np.where(more, up, call)


def _forward_life(
    tables: RunTables, last_call: np.ndarray, storage: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(end_ns, known)`` per output: when its forward life ends (NOTE [ Released outputs ]);
    not known for the output of a top-level call or of a call that never returned."""
    io = _CallIO.of(tables, storage)
    call = io.climb(last_call.copy(), storage, np.ones(len(storage), dtype=bool))
    life = io.end[call]
    known = (io.parent[call] >= 0) & (life >= 0)
    return np.maximum(life, io.used_until[storage]), known


def _local_ends(base: Baseline, tables: RunTables, storage: np.ndarray) -> np.ndarray:
    """Per storage made in forward: the baseline point after which no Python reference holds it
    (NOTE [ Locals die with their frame ]); ``base.n + 1`` where that is not known."""
    io = _CallIO.of(tables, storage)
    made_in = np.asarray(tables["storages"]["module_call"], dtype=np.int64)[storage]
    returned = io.returns(made_in, storage)
    call = io.climb(made_in, storage, returned)
    holder = np.where(returned, io.parent[np.maximum(call, 0)], call)
    used = io.used_until[storage]
    module = np.asarray(tables["module_calls"]["module"], dtype=np.int64)[np.maximum(holder, 0)]
    loop = np.asarray(tables["modules"]["sequential_forward"])[module] != 0
    rebound = returned & loop & (used >= 0)  # the next child took it and returned
    life = np.where(rebound, used, np.maximum(io.end[np.maximum(holder, 0)], used))
    known = (holder >= 0) & (life >= 0)
    point = np.searchsorted(base.times, life, side="right")
    return np.where(known, point, base.n + 1)


def _holder_points(
    base: Baseline, tables: RunTables, inst: RegionInstances, ci: np.ndarray, cs: np.ndarray
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
    keep = ~_pair_in(in_inst, in_storage, c_inst, c_storage) & ~np.isin(category, FIXED)
    return _unique_pairs(in_inst[keep], in_storage[keep])


def _moment_keys(base: Baseline, *moments: tuple[np.ndarray, ...]) -> list[np.ndarray]:
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
    starts = np.flatnonzero(run_starts(point[rows])) if rows.size else rows
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
    movable = forward & ~np.isin(np.asarray(storages["category"]), FIXED)
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
    """When backward first needs each instance (NOTE [ Recompute in backward ]); NEVER if not."""
    saved = tables["saved_events"]
    unpack = np.asarray(saved["kind"]) == SavedEventKind.UNPACK
    owner, rows = _calls_in(saved["module_call"], unpack, inst)
    first = np.full(len(inst), NEVER, dtype=np.int64)
    np.minimum.at(first, owner, np.asarray(saved["time_ns"], dtype=np.int64)[rows])
    first_op = _op_times(tables["ops"], inst, Phase.BACKWARD, "start_ns", np.minimum)
    return np.where(first == NEVER, first_op, first)


def _op_times(
    ops: Table, inst: RegionInstances, phase: Phase, column: str, reduce: np.ufunc
) -> np.ndarray:
    """Per instance, ``reduce`` (np.minimum or np.maximum) of ``column`` over its ``phase`` ops;
    NEVER (minimum) or -1 (maximum) where it has none."""
    owner, rows = _calls_in(ops["module_call"], np.asarray(ops["phase"]) == phase, inst)
    out = np.full(len(inst), NEVER if reduce is np.minimum else -1, dtype=np.int64)
    reduce.at(out, owner, np.asarray(ops[column], dtype=np.int64)[rows])
    return out


def _recompute_stop(
    base: Baseline, tables: RunTables, inst: RegionInstances
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


def _last_op_run(tables: RunTables, inst: RegionInstances, last_op: np.ndarray) -> np.ndarray:
    """(k,) int64: the last op each instance's recompute runs to its end, for its time (NOTE
    [ Early stop, in time ]): ``last_op`` where it packs a tensor it made or a PACK stamped with
    it comes in its second half (it ran: in place), else the op before it."""
    saved = tables["saved_events"]
    owner, rows = _calls_in(
        saved["module_call"], np.asarray(saved["kind"]) == SavedEventKind.PACK, inst
    )
    op = np.asarray(saved["op"], dtype=np.int64)[rows]
    mine = (op >= 0) & (op == last_op[owner])
    owner, rows, op = owner[mine], rows[mine], op[mine]
    storage = np.asarray(saved["storage"], dtype=np.int64)[rows]
    made_by = np.asarray(tables["storages"]["op"], dtype=np.int64)
    made = (storage >= 0) & (made_by[np.maximum(storage, 0)] == op)
    ops = tables["ops"]
    at = np.asarray(saved["time_ns"], dtype=np.int64)[rows]
    start = np.asarray(ops["start_ns"], dtype=np.int64)[op]
    end = np.asarray(ops["end_ns"], dtype=np.int64)[op]
    ran = np.zeros(len(inst), dtype=bool)
    ran[owner[made | (at - start > end - at)]] = True
    packed = np.zeros(len(inst), dtype=bool)
    packed[owner] = True
    return np.where(packed & ~ran, last_op - 1, last_op)


def _saved_bytes(
    base: Baseline, instances: int, saved_inst: np.ndarray, saved_storage: np.ndarray
) -> np.ndarray:
    """(k,) int64: bytes of the distinct storages each instance saves for backward (PACKs
    inside it): what checkpoint's cost per call is read at (NOTE [ Checkpoint's cost grows
    with the data around it ] in recorder/timing.py)."""
    known = saved_storage >= 0
    inst, storage = _unique_pairs(saved_inst[known], saved_storage[known])
    return np.bincount(inst, base.nbytes[storage], minlength=instances).astype(np.int64)


def _compute_ns(
    base: Baseline,
    tables: RunTables,
    inst: RegionInstances,
    last_op: np.ndarray,
    kept_ops: tuple[np.ndarray, np.ndarray],
    saved_bytes: np.ndarray,
) -> tuple[np.ndarray, bool]:
    """(3, k): each instance's extra compute with the lowest and highest the measurements
    allow, and whether it comes from plain times (NOTE [ Extra compute from plain times ],
    NOTE [ How sure the extra time is ] and NOTE [ Extra time measured under plan all ] in
    timing.py); ops an op-level instance saves are not rerun."""
    times = plain_times(tables)
    last_op = _last_op_run(tables, inst, last_op)
    recompute = _recompute_ns(tables, times, inst, last_op, kept_ops)
    if recompute is None:
        replayed = _forward_ns(tables["ops"], inst, last_op, kept_ops)
        cost = np.stack(times.cost_per_call(saved_bytes)) if times else np.zeros((3, len(inst)))
        return (replayed + cost).astype(np.int64), False
    assert times is not None
    if times.plan_all is not None:
        basis = _plan_all_per_step(base, tables, times)
        if basis is not None:
            return times.plan_all.compose(recompute, saved_bytes, *basis), True
    return recompute + np.stack(times.cost_per_call(saved_bytes)).astype(np.int64), True


def _recompute_ns(
    tables: RunTables,
    times: PlainTimes | None,
    inst: RegionInstances,
    last_op: np.ndarray,
    kept_ops: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray | None:
    """(3, k) int64: the plain time of what each instance's recompute replays (median, lowest,
    highest: NOTE [ Extra compute from plain times ] in timing.py), None without plain times
    for every call."""
    if times is None:
        return None
    plain = plain_instance_ns(tables, times, inst.top_instance, inst.top_call, len(inst))
    if plain is None:
        return None
    replayed = _forward_ns(tables["ops"], inst, last_op, kept_ops)
    whole = _forward_ns(tables["ops"], inst, np.full(len(inst), np.iinfo(np.int64).max))
    share = np.divide(replayed, whole, out=np.ones(len(inst)), where=whole > 0)
    return np.round(plain * share).astype(np.int64)


def _plan_all_per_step(
    base: Baseline, tables: RunTables, times: PlainTimes
) -> tuple[tuple[float, float, float], tuple[float, float]] | None:
    """The summed plain recompute time, the number and the summed saved bytes of the instances
    of plan all in this run, per recorded step, and the recompute's shape fitted over them by
    module (NOTE [ Extra time measured under plan all ] in timing.py); None where plan all has
    no instance here or a call has no plain time."""
    from ckview.analysis.plans import resolve_on_trace
    from ckview.analysis.recompute import step_durations

    try:
        regions = resolve_on_trace("all", tables["modules"], tables["strings"]).regions
        inst = region_instances(tables["module_calls"], tables["modules"], tables["strings"],
                                list(regions))  # fmt: skip
    except ValueError:  # no chain of blocks, no module
        return None
    if not len(inst):
        return None
    last_op, _ = _recompute_stop(base, tables, inst)
    recompute = _recompute_ns(tables, times, inst, _last_op_run(tables, inst, last_op))
    if recompute is None:
        return None
    steps = max(len(step_durations(tables["steps"])), 1)
    saved = _saved_bytes(base, len(inst), *_saved_pairs(tables["saved_events"], inst))
    per_step = float(recompute[0].sum()) / steps, len(inst) / steps, float(saved.sum()) / steps
    module = np.zeros(len(inst), dtype=np.int64)
    module[inst.top_instance] = np.asarray(tables["module_calls"]["module"])[inst.top_call]
    rows = np.unique(module[saved > 0]).tolist()  # without a PACK, its replay is a guess
    calls = {m: float((module == m).sum()) / steps for m in rows}
    compute = {m: float(recompute[0][module == m].sum()) / steps for m in rows}
    assert times.plan_all is not None
    return per_step, times.plan_all.recompute_shape(calls, compute)


def _forward_ns(
    ops: Table,
    inst: RegionInstances,
    last_op: np.ndarray,
    kept_ops: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Summed duration of the forward ops of each instance that its recompute runs (all up to
    ``last_op`` but the ``kept_ops`` pairs)."""
    owner, rows = _calls_in(ops["module_call"], np.asarray(ops["phase"]) == Phase.FORWARD, inst)
    replayed = rows <= last_op[owner]
    if kept_ops is not None and kept_ops[0].size:
        replayed &= ~_pair_in(owner, rows, *kept_ops)
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


def run_starts(*columns: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows where any of the (sorted) ``columns`` changes value."""
    n = len(columns[0])
    new = np.zeros(n, dtype=bool)
    new[:1] = True
    for column in columns:
        new[1:] |= column[1:] != column[:-1]
    return new
