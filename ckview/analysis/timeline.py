"""Live bytes over a recorded run: the memory timeline, its peak, what is live at an event.

Everything here is vectorised over the ``memory_events`` and ``storages`` columns (see
``ckview.trace.schema.RUN_TABLES``), so a trace with ten million events takes well under a second.

NOTE [ Pre-existing storages ]
    A storage with ``alloc_ns == -1`` was not allocated by an op the recorder saw: it existed
    before the recording began (parameters, gradients and optimizer state from earlier steps)
    or came from outside any op (a batch from a DataLoader worker process, rebuilt from shared
    memory). Parameters, gradients, optimizer state, activations and temporaries among them are
    live from point 0 until their FREE event, if any; their ``SEEN`` only marks the first time
    the recorder noticed them. INPUT and OTHER storages (batches, a batch a worker delivered
    early, a dataset, what the loop touches between steps) are live from their ``SEEN`` on
    (``arrives_when_seen``): a batch is an input from when it arrives. Counted from point 0,
    every batch of a run was live at once from the start (two batches at the peak), and "at
    start" depended on how many batches the workers had delivered. A FREE subtracts the bytes
    like any other FREE, since they were counted from point 0 or from the SEEN.

NOTE [ Event order ]
    ``memory_events`` are in recording order. ``time_ns`` is non-decreasing but several events
    may share a time, so everything here orders events by row, never by time.

NOTE [ One lifetime per storage row ]
    A storage row is one lifetime of one block of memory: at most one ALLOC (none if it
    pre-existed) and at most one FREE after it. A reused address gets a new row. This is what
    makes "live just after event e" a matter of which events of the prefix ``[0, e]`` touched
    the row, and what makes the live set agree with the running total of the timeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ckview.analysis.types import Table
from ckview.trace.schema import Category, MemoryEventKind, Phase


@dataclass(frozen=True)
class MemoryTimeline:
    """Live bytes after each memory event; point 0 is the state before the first event."""

    time_ns: np.ndarray
    """(n+1,) int64: time of each point; point 0 takes the time of the first event (0 if none)."""
    event: np.ndarray
    """(n+1,) int64: the ``memory_events`` row each point follows, -1 for point 0."""
    total: np.ndarray
    """(n+1,) int64: live bytes at each point."""
    by_category: np.ndarray
    """(len(Category), n+1) int64: live bytes per ``Category`` at each point."""


@dataclass(frozen=True)
class Peak:
    """The highest point of a timeline (or of a range of its points)."""

    point: int
    event: int
    time_ns: int
    bytes: int


def preexisting(storages: Table) -> np.ndarray:
    """Boolean mask of the storages that no recorded op allocated (``alloc_ns == -1``).

    See NOTE [ Pre-existing storages ].
    """
    return np.asarray(storages["alloc_ns"]) == -1


_ARRIVING = np.array([Category.INPUT, Category.OTHER])


def arrives_when_seen(storages: Table) -> np.ndarray:
    """Boolean mask of the pre-existing storages that are live from their SEEN event (inputs
    and others), not from point 0. See NOTE [ Pre-existing storages ]."""
    return preexisting(storages) & np.isin(np.asarray(storages["category"]), _ARRIVING)


def live_at_start(storages: Table) -> np.ndarray:
    """Boolean mask of the storages live at point 0. See NOTE [ Pre-existing storages ]."""
    return preexisting(storages) & ~arrives_when_seen(storages)


def births(storages: Table, kind: np.ndarray, storage: np.ndarray) -> np.ndarray:
    """Which of the events (``kind``, ``storage`` columns) make their storage live: ALLOCs, and
    the SEEN of a storage that arrives when seen."""
    seen = (kind == MemoryEventKind.SEEN) & arrives_when_seen(storages)[storage]
    return (kind == MemoryEventKind.ALLOC) | seen


def event_deltas(storages: Table, events: Table) -> np.ndarray:
    """Change of live bytes caused by each memory event: +nbytes for a birth (``births``),
    -nbytes for a FREE, else 0."""
    storage = np.asarray(events["storage"])
    nbytes = np.asarray(storages["nbytes"], dtype=np.int64)[storage]
    kind = np.asarray(events["kind"])
    sign = births(storages, kind, storage).astype(np.int64) - (kind == MemoryEventKind.FREE)
    return nbytes * sign


def memory_timeline(storages: Table, events: Table) -> MemoryTimeline:
    """Live bytes, in total and per category, after each memory event.

    Point 0 holds the pre-existing storages (NOTE [ Pre-existing storages ]); point ``i + 1``
    is the state just after event row ``i`` (NOTE [ Event order ]).
    """
    n = len(events["kind"])
    deltas = event_deltas(storages, events)
    categories = np.asarray(storages["category"])
    base = _baseline_by_category(storages)
    event_category = categories[events["storage"]]
    by_category = np.zeros((len(Category), n + 1), dtype=np.int64)
    for c in Category:
        # In place, into the output row: no (n,)-sized temporaries but the mask.
        row = by_category[c]
        np.multiply(deltas, event_category == c, out=row[1:])
        np.cumsum(row[1:], out=row[1:])
        row += base[c]
    total = np.empty(n + 1, dtype=np.int64)
    total[0] = base.sum()
    np.cumsum(deltas, out=total[1:])
    total[1:] += total[0]
    times = np.asarray(events["time_ns"], dtype=np.int64)
    time_ns = np.concatenate(([times[0] if n else 0], times))
    event = np.arange(-1, n, dtype=np.int64)
    return MemoryTimeline(time_ns=time_ns, event=event, total=total, by_category=by_category)


def _baseline_by_category(storages: Table) -> np.ndarray:
    """Bytes of the storages live at point 0, per category."""
    pre = live_at_start(storages)
    return np.bincount(
        np.asarray(storages["category"])[pre],
        weights=np.asarray(storages["nbytes"])[pre],
        minlength=len(Category),
    ).astype(np.int64)


def find_peak(tl: MemoryTimeline, start: int = 0, stop: int | None = None) -> Peak:
    """The first point with the most live bytes among points ``[start, stop)``.

    The first maximum is the moment memory reached its peak; later points at the same height
    only stay there. Raises ``ValueError`` on an empty range.
    """
    stop = len(tl.total) if stop is None else stop
    window = tl.total[start:stop]
    if window.size == 0:
        raise ValueError(
            f"no timeline points in [{start}, {stop}): the timeline has {len(tl.total)} points"
        )
    first, _, _ = slice(start, stop).indices(len(tl.total))
    point = first + int(np.argmax(window))
    return Peak(
        point=point,
        event=int(tl.event[point]),
        time_ns=int(tl.time_ns[point]),
        bytes=int(tl.total[point]),
    )


def live_storages(storages: Table, events: Table, after_event: int) -> np.ndarray:
    """Rows of the storages live just after event row ``after_event`` (ascending).

    ``after_event == -1`` means before any event: the storages live at start. Relies on
    NOTE [ One lifetime per storage row ]. Raises ``ValueError`` if the row is out of range.
    """
    n = len(events["kind"])
    if not -1 <= after_event < n:
        raise ValueError(f"after_event must be in [-1, {n - 1}], got {after_event}")
    kind = np.asarray(events["kind"])[: after_event + 1]
    storage = np.asarray(events["storage"])[: after_event + 1]
    live = live_at_start(storages)
    live[storage[births(storages, kind, storage)]] = True
    live[storage[kind == MemoryEventKind.FREE]] = False
    return np.flatnonzero(live)


def phase_at(ops: Table, events: Table, event: int) -> str:
    """The phase of the op at memory event ``event`` (the peak's, an OOM's), e.g. 'backward';
    'start' for an event before any op (or ``event`` -1)."""
    if event < 0:
        return "start"
    op = int(events["op"][event])
    return "start" if op < 0 else Phase(int(ops["phase"][op])).name.lower()


def step_segments(steps: Table, n_events: int) -> tuple[np.ndarray, np.ndarray]:
    """``(start, stop)`` event rows of each step: from its first event to the next step's first.

    Raises ``ValueError`` if the steps' first events are not non-decreasing rows in [0, n].
    """
    start = np.asarray(steps["first_memory_event"], dtype=np.int64)
    if start.size and (start[0] < 0 or start[-1] > n_events or np.any(np.diff(start) < 0)):
        raise ValueError(
            "steps.first_memory_event must be non-decreasing rows of memory_events "
            f"(0..{n_events}); got {start.tolist()}"
        )
    stop = np.append(start[1:], n_events)
    return start, stop


def step_allocated_peaks(storages: Table, events: Table, steps: Table) -> np.ndarray:
    """Per row of ``steps``: the peak of bytes allocated since the step began (int64, >= 0).

    NOTE [ Allocated since step start ]
        Within a step's events, ALLOC of a storage adds its bytes and FREE subtracts them only if
        the storage was allocated in that same step; frees of storages allocated before the step
        began (or pre-existing) are ignored. This mirrors the CPU allocator's profiler counter
        "Total Allocated", which only counts allocations it has seen, so the two can be compared.
        A step that allocates nothing has peak 0.
    """
    n = len(events["kind"])
    start, stop = step_segments(steps, n)
    if start.size == 0:
        return np.zeros(0, dtype=np.int64)
    kind = np.asarray(events["kind"])
    storage = np.asarray(events["storage"])
    # Step row of every event; events before the first step get -1 and are never counted.
    bounds = np.concatenate(([0], start, [n]))
    event_step = np.repeat(np.arange(-1, start.size), np.diff(bounds))
    alloc_step = np.full(len(storages["nbytes"]), -1, dtype=np.int64)
    is_alloc = kind == MemoryEventKind.ALLOC
    alloc_step[storage[is_alloc]] = event_step[is_alloc]
    same_step_free = (kind == MemoryEventKind.FREE) & (alloc_step[storage] == event_step)
    counted = (event_step >= 0) & (is_alloc | same_step_free)
    deltas = np.where(counted, event_deltas(storages, events), 0)
    running = np.concatenate(([0], np.cumsum(deltas)))  # running[i] = sum of deltas[:i]
    peaks = np.zeros(start.size, dtype=np.int64)
    nonempty = stop > start
    if nonempty.any():
        # running[start + 1 : stop + 1] are the sums after each event of the step.
        highs = np.maximum.reduceat(running[1:], start[nonempty])
        peaks[nonempty] = highs - running[start[nonempty]]
    return np.maximum(peaks, 0)


#: Categories that no checkpoint plan changes and that carry over from step to step.
PERSISTENT = (
    Category.PARAMETER,
    Category.GRADIENT,
    Category.OPTIMIZER_STATE,
    Category.SHARDED_PARAMETER,
)

# NOTE [ Runs that begin from another state ]
#     The runs of one ``verify`` are recorded one after another, so a run can begin from another
#     training state than the baseline: optimizer state that grows for a while (L-BFGS keeps up
#     to ``history_size`` pairs of vectors, one pair more per inner iteration) is larger in
#     every later run. No plan changes parameters, gradients or optimizer state (NOTE [ Fixed
#     categories ] in projection/), so the plan run's timeline is the projection over the
#     baseline with the baseline's persistent bytes exchanged for the plan run's own.
#     A difference taken once, at the start, is not enough: the state changes during the step
#     in a way that depends on the state. Once L-BFGS's history is full, every inner iteration
#     pops a pair before it appends one, while the baseline's growing history only appends:
#     the two runs differ by 4 pairs at their start but by 1 pair less at every later closure
#     call, so an offset taken at the start put sqrt/all 1.8% / 1.5% above measured.
#     So the two runs are aligned by their phase stretches (``phase_stretches``: maximal runs
#     of ops of one phase, RECOMPUTE counted as BACKWARD; the same sequence in both runs, since
#     a plan only inserts recompute into backward): the offset inside a stretch is the
#     difference of persistent bytes when that stretch begins (``stretch_offsets``). Within a
#     forward, backward or other stretch the state changes alike in both runs (gradients are
#     made and dropped by the same ops), so the offset is exact there, where activations peak;
#     within an optimizer stretch, what the optimizer frees and allocates may differ with its
#     state and the offset is that of the stretch's start. Runs whose stretch sequences differ
#     (another loop structure) fall back to the offset at the start.


def persistent_bytes(tl: MemoryTimeline) -> np.ndarray:
    """Bytes of parameters, gradients and optimizer state at each point of a timeline."""
    return np.asarray(sum(tl.by_category[c] for c in PERSISTENT), dtype=np.int64)


def phase_stretches(ops: Table, events: Table) -> tuple[np.ndarray, np.ndarray]:
    """``(stretch, phases)``: per memory event, the index of the phase stretch it falls in
    (NOTE [ Runs that begin from another state ]), non-decreasing, -1 before the first op;
    and the phase of each stretch. An event outside any op (``op == -1``) belongs to the
    stretch of the event before it."""
    phase = np.asarray(ops["phase"], dtype=np.int64).copy()
    phase[phase == Phase.RECOMPUTE] = Phase.BACKWARD
    begins = np.ones(phase.size, dtype=bool)
    begins[1:] = phase[1:] != phase[:-1]
    op_stretch = np.cumsum(begins) - 1
    op = np.asarray(events["op"], dtype=np.int64)
    last = np.maximum.accumulate(np.where(op >= 0, np.arange(op.size), -1))
    stretch = np.full(op.size, -1, dtype=np.int64)
    known = last >= 0
    stretch[known] = op_stretch[op[last[known]]]
    return stretch, phase[begins]


def stretch_offsets(base: Mapping[str, Table], run: Mapping[str, Table]) -> np.ndarray:
    """Persistent bytes of ``run`` minus those of ``base`` when each phase stretch begins,
    indexed by stretch + 1 (index 0: the start of the runs); NOTE [ Runs that begin from
    another state ]. ``base`` and ``run`` hold ``storages``, ``memory_events`` and ``ops``.
    Runs whose stretch sequences differ get the offset at the start for every stretch."""
    states = []
    for tables in (base, run):
        events = tables["memory_events"]
        stretch, phases = phase_stretches(tables["ops"], events)
        pers = persistent_bytes(memory_timeline(tables["storages"], events))
        begins = np.searchsorted(stretch, np.arange(-1, len(phases)), side="left")
        states.append((phases, pers[begins]))
    (base_phases, base_at), (run_phases, run_at) = states
    if not np.array_equal(base_phases, run_phases):
        return np.full(len(base_at), run_at[0] - base_at[0], dtype=np.int64)
    return run_at - base_at


def point_stretches(ops: Table, events: Table) -> np.ndarray:
    """Per timeline point (``memory_timeline``): its phase stretch + 1 (point 0 and the
    points before the first op: 0), for indexing ``stretch_offsets``."""
    stretch, _ = phase_stretches(ops, events)
    return np.concatenate(([0], stretch + 1))
