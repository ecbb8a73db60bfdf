"""The exact projection of one selection: the baseline's events with the moved frees and the
recomputed copies inserted, replayed in key order (``project``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.analysis.projection.effects import (
    ALLOC,
    FREE,
    Baseline,
    InstanceEffects,
    instance_effects,
)
from ckview.analysis.projection.host import host_curve, host_moves
from ckview.analysis.projection.oplevel import offloading, saved_ops
from ckview.analysis.projection.results import (
    LiveStorages,
    ProjectedEvents,
    ProjectedPeak,
    Projection,
    Recompute,
)
from ckview.analysis.regions import Region, outermost, region_instances
from ckview.analysis.timeline import (
    Peak,
    births,
    find_peak,
    live_at_start,
    memory_timeline,
    point_stretches,
    stretch_offsets,
)
from ckview.analysis.types import RunTables

# ----------------------------------------------------------------------------- exact projection


@dataclass(frozen=True)
class Records:
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
    ) -> Records:
        """Records for ``storage``, broadcasting the scalar columns."""
        n = len(storage)

        def col(value: Any, dtype: type = np.int64) -> np.ndarray:
            return np.broadcast_to(np.asarray(value, dtype=dtype), (n,))

        return Records(
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
    def concat(parts: Sequence[Records]) -> Records:
        return Records(*(np.concatenate([getattr(p, f) for p in parts]) for f in _RECORD_FIELDS))

    def take(self, order: np.ndarray) -> Records:
        return Records(*(getattr(self, f)[order] for f in _RECORD_FIELDS))


_RECORD_FIELDS = ("key", "sub", "kind", "storage", "time", "instance", "copy", "source")


def _moved_frees(
    eff: InstanceEffects, base: Baseline, active: np.ndarray
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


def _baseline_records(eff: InstanceEffects, base: Baseline, active: np.ndarray) -> Records:
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
    kept = Records(
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
    added = Records.make(
        new_key[~freed], base.n + s, FREE, s, new_time[~freed], owner[~freed], False, -1
    )
    return Records.concat([kept, added])


def replay_records(eff: InstanceEffects, base: Baseline, active: np.ndarray) -> Records:
    """Events of the recomputed copies of the active instances (NOTE [ Recompute in backward ]):
    each copy's ALLOC, and its FREE inside the replay, at its baseline free or at the end."""
    pick = active[eff.copy_instance] & (eff.replay_key[eff.copy_instance] >= 0)
    inst, st, inner = eff.copy_instance[pick], eff.copy_storage[pick], eff.copy_free[pick]
    key, time, alloc = eff.replay_key[inst], eff.trigger_ns[inst], base.alloc_row[st]
    free = np.where(inner >= 0, inner, base.free_row[st])
    late = (inner < 0) & eff.copy_saved[pick] & (base.event_key(free) > key)
    at_end = (inner < 0) & ~late
    freed = ~late | (free >= 0)  # a saved copy the baseline never frees lives on
    return Records.concat(
        [
            Records.make(key, alloc, ALLOC, st, time, inst, True, alloc),
            Records.make(
                np.where(late, base.event_key(free), key)[freed],
                np.where(at_end, base.n + alloc, free)[freed],
                FREE,
                st[freed],
                np.where(late, base.times[np.maximum(free, 0)], time)[freed],
                inst[freed],
                True,
                np.where(at_end, -1, free)[freed],
            ),
        ]
    )


def project_active(eff: InstanceEffects, base: Baseline, active: np.ndarray) -> Projection:
    """The exact projection with the ``active`` instances checkpointed."""
    records = Records.concat(
        [
            _baseline_records(eff, base, active),
            replay_records(eff, base, active),
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
        extra_compute_range_ns=extra_range(eff, active),
        **_offloaded(eff, base, active, events),
    )


def _offloaded(
    eff: InstanceEffects, base: Baseline, active: np.ndarray, events: ProjectedEvents
) -> dict[str, Any]:
    """The bytes the ``active`` offload instances move to host memory, the host curve on the
    projected states and its peak (NOTE [ Host curve ])."""
    moves = host_moves(eff, base).of(active)
    if not moves.nbytes.size:
        return {}
    state_key = np.concatenate(([-1], events.key))
    host = host_curve(state_key, moves.arrive_key, moves.leave_key, moves.nbytes)
    return {
        "offloaded_bytes": int(moves.nbytes.sum()),
        "host_peak_bytes": int(host.max()),
        "host": host,
    }


def _projected_peak(
    eff: InstanceEffects, base: Baseline, events: ProjectedEvents, peak: Peak
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


def _live_at(base: Baseline, events: ProjectedEvents, after: int) -> LiveStorages:
    """Originals and copies live just after projected event ``after`` (-1: before any)."""
    kind, storage, copy = (a[: after + 1] for a in (events.kind, events.storage, events.copy))
    live = [live_at_start(base.storages), np.zeros(len(base.nbytes), dtype=bool)]
    born = births(base.storages, kind, storage)
    for flag, mask in enumerate(live):
        mine = copy == bool(flag)
        mask[storage[mine & born]] = True
        mask[storage[mine & (kind == FREE)]] = False
    rows = np.concatenate([np.flatnonzero(m) for m in live])
    flags = np.concatenate([np.full(int(m.sum()), bool(f)) for f, m in enumerate(live)])
    order = np.lexsort((flags, rows))
    return LiveStorages(storage=rows[order], copy=flags[order])


def extra_range(eff: InstanceEffects, active: np.ndarray) -> tuple[int, int]:
    """The lowest and highest extra compute of the ``active`` instances that backward reaches
    (NOTE [ How sure the extra time is ] in timing.py)."""
    low, high = eff.compute_range_ns[:, active & (eff.replay_key >= 0)].sum(axis=1)
    return int(low), int(high)


def _recomputes(
    eff: InstanceEffects, base: Baseline, active: np.ndarray, keys: np.ndarray
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
    kept_ops, offload = saved_ops(tables, instances, regions), offloading(instances, regions)
    base, eff = instance_effects(tables, instances, kept_ops, offload)
    return project_active(eff, base, outermost(instances, np.ones(len(instances), dtype=bool)))


def peak_from_state(projection: Projection, base: RunTables, run: RunTables) -> int:
    """The peak of ``projection`` (over ``base``) with the baseline's parameters, gradients and
    optimizer state exchanged for those of ``run``, a run of the same step that began from
    another training state: NOTE [ Runs that begin from another state ] in timeline.py."""
    offsets = stretch_offsets(base, run)
    stretch = point_stretches(base["ops"], base["memory_events"])
    points = np.concatenate(([0], projection.events.point))
    return int(np.max(projection.total + offsets[stretch[points]]))
