"""The incremental projection: ``ProjectionModel`` answers the peak and curve of any selection
of its candidates in milliseconds (NOTE [ Incremental peak ], NOTE [ Projected curve ])."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from ckview.analysis.projection.effects import (
    ALLOC,
    FREE,
    NEVER,
    Baseline,
    InstanceEffects,
    instance_effects,
    run_starts,
)
from ckview.analysis.projection.exact import Records, extra_range, project_active, replay_records
from ckview.analysis.projection.host import host_moves
from ckview.analysis.projection.oplevel import offloading, saved_ops
from ckview.analysis.projection.results import (
    ProjectedCurve,
    ProjectedPeak,
    Projection,
)
from ckview.analysis.regions import Region, outermost, region_instances
from ckview.analysis.timeline import (
    MemoryTimeline,
    memory_timeline,
)
from ckview.analysis.types import RunTables

Selection: TypeAlias = Collection[int] | np.ndarray
"""Candidate indices, or a boolean mask over the candidates."""

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
        kept_ops = saved_ops(tables, self.instances, self.candidates)
        offload = offloading(self.instances, self.candidates)
        self._base, self.effects = instance_effects(tables, self.instances, kept_ops, offload)
        self._index = _build_index(self.effects, self._base)
        moves = host_moves(self.effects, self._base)
        self._offloaded = np.bincount(moves.instance, moves.nbytes, len(self.instances))
        """(k,) float64: the bytes each instance offloads (whole bytes: exact below 2**53)."""
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

    def extra_compute_range_ns(self, selected: Selection) -> tuple[int, int]:
        """The lowest and highest extra compute of the ``selected`` candidates that the
        measurements allow (NOTE [ How sure the extra time is ] in timing.py)."""
        return extra_range(self.effects, self.checkpointed(selected))

    def project(self, selected: Selection) -> Projection:
        """The exact projection of the ``selected`` candidates (see ``project``)."""
        return project_active(self.effects, self._base, self.checkpointed(selected))

    def offloaded_bytes(self, selected: Selection) -> int:
        """Bytes the offload regions among the ``selected`` candidates move to host memory
        (NOTE [ Offloaded instances ])."""
        return int(self._offloaded[self.checkpointed(selected)].sum())

    def curve(self, selected: Selection) -> ProjectedCurve:
        """The projected total of the ``selected`` candidates at every baseline point, every
        inserted state and every recompute's highest point (NOTE [ Projected curve ]), with
        the host curve of those that offload (NOTE [ Host curve ]; a recompute's highest
        point holds what the state before it held)."""
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
    host_instance: np.ndarray
    host_arrive: np.ndarray
    host_leave: np.ndarray
    """Per ``host_moves`` tensor: the first state it is on the host at, and the first it is
    gone at (``c``: never), NOTE [ Host curve ]."""
    host_bytes: np.ndarray
    """Its bytes (int64)."""


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


def _build_index(eff: InstanceEffects, base: Baseline) -> _Index:
    curve = memory_timeline(base.storages, base.events)
    replays = replay_records(eff, base, np.ones(len(eff.instances), dtype=bool))
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
    eff: InstanceEffects, base: Baseline, curve: MemoryTimeline, union: np.ndarray
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
    moves = host_moves(eff, base)
    return _CurveIndex(
        base=curve.total[at],
        slot=np.searchsorted(union, keys, side="right"),
        time=times,
        point=at,
        order=2 * keys,
        host_instance=moves.instance,
        host_arrive=np.searchsorted(keys, moves.arrive_key, side="left"),
        host_leave=np.searchsorted(keys, moves.leave_key, side="left"),
        host_bytes=moves.nbytes,
    )


def _instance_steps(
    eff: InstanceEffects, base: Baseline, replays: Records, fixed: np.ndarray
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
    signs = np.where(replays.kind == ALLOC, 1, -1)
    delta = np.concatenate([-nbytes, nbytes[freed], signs * base.nbytes[replays.storage]])
    order = np.lexsort((key, inst))
    inst, key, delta = inst[order], key[order], delta[order]
    starts = np.flatnonzero(run_starts(inst, key))
    sums = np.add.reduceat(delta, starts) if starts.size else delta
    keep = sums != 0
    return inst[starts][keep], key[starts][keep], sums[keep]


def _spikes(
    base: Baseline, eff: InstanceEffects, replays: Records
) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, rise)``: the highest point of each replay above where it starts, with the
    frees the replay makes of originals an op-level instance kept (NOTE [ Op-level instances ])."""
    rec = replays.take(np.flatnonzero(replays.key == eff.replay_key[replays.instance]))
    held = np.flatnonzero(eff.drop_key == eff.replay_key[eff.drop_instance])
    if held.size:
        s, i = eff.drop_storage[held], eff.drop_instance[held]
        freed = Records.make(eff.replay_key[i], base.free_row[s], FREE, s, 0, i, False, -1)
        rec = Records.concat([rec, freed])
    rec = rec.take(np.lexsort((rec.sub, rec.instance)))
    delta = np.where(rec.kind == ALLOC, 1, -1) * base.nbytes[rec.storage]
    starts = np.flatnonzero(run_starts(rec.instance))
    running = np.cumsum(delta)
    before = np.repeat(running[starts] - delta[starts], np.diff(np.append(starts, len(delta))))
    rise = np.maximum.reduceat(running - before, starts) if starts.size else delta
    return rec.instance[starts], rise


def _moving_keys(
    eff: InstanceEffects, base: Baseline, storages: np.ndarray, dropped: np.ndarray
) -> list[np.ndarray]:
    """Every key a moving storage's free can be at."""
    free_key = base.event_key(base.free_row[storages])
    keep_key = eff.keep_key[eff.keep_instance]
    return [
        free_key[free_key != NEVER],
        eff.drop_key[dropped],
        keep_key[keep_key >= 0],
    ]


def _moving(
    eff: InstanceEffects,
    base: Baseline,
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
    keep = keep[run_starts(mv.keep_index[keep])] if keep.size else keep
    index = mv.keep_index[keep]
    later = (mv.free_key[index] != NEVER) & (mv.keep_key[keep] > key[index])
    key[index[later]] = mv.keep_key[keep[later]]
    slot[index[later]] = mv.keep_slot[keep[later]]
    moved = np.flatnonzero(key != mv.free_key)
    # Alive until the new free instead of the baseline one: +bytes there, -bytes here.
    return (
        np.concatenate([mv.free_slot[moved], slot[moved]]),
        np.concatenate([mv.nbytes[moved], -mv.nbytes[moved]]),
    )


def _interval_tops(
    eff: InstanceEffects, base: Baseline, curve: MemoryTimeline, union: np.ndarray
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
    eff: InstanceEffects, base: Baseline, curve: MemoryTimeline, keys: np.ndarray
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
    host = _query_host(c, active)
    spike = np.flatnonzero(active[ix.spike_instance])
    if spike.size == 0:
        return ProjectedCurve(time_ns=c.time, point=c.point, total=total, host=host)
    # A spike's order (2 x key - 1) sorts it just before the states at its key.
    at = np.searchsorted(c.order, ix.spike_order[spike])
    high = np.rint(ix.spike_bytes[spike]).astype(np.int64) + level[ix.spike_slot[spike]]
    if host.size:  # the host holds at a spike what it held at the state before
        host = np.insert(host, at, np.where(at > 0, host[np.maximum(at - 1, 0)], 0))
    return ProjectedCurve(
        time_ns=np.insert(c.time, at, ix.spike_time[spike]),
        point=np.insert(c.point, at, ix.spike_point[spike]),
        total=np.insert(total, at, high),
        host=host,
    )


def _query_host(c: _CurveIndex, active: np.ndarray) -> np.ndarray:
    """(c,) int64: the host curve of the ``active`` offload instances on the curve's states,
    zero-length if none offloads (NOTE [ Host curve ])."""
    pick = np.flatnonzero(active[c.host_instance])
    if pick.size == 0:
        return np.zeros(0, dtype=np.int64)
    at = np.concatenate([c.host_arrive[pick], c.host_leave[pick]])
    change = np.concatenate([c.host_bytes[pick], -c.host_bytes[pick]])
    order = np.argsort(at, kind="stable")
    at, change = at[order], change[order]
    starts = np.flatnonzero(run_starts(at))
    level = np.concatenate(([0], np.cumsum(np.add.reduceat(change, starts))))
    # Few moves, many states: each level repeated over the states up to the next change.
    bounds = np.concatenate(([0], at[starts], [len(c.order)]))  # a leave at c: never
    return np.repeat(level, np.diff(bounds))
