"""One recorded run, typed: read once from a trace, with the numbers every consumer needs.

``load_trace`` is the one reader: it reads each run's tables (``Trace.read_run``) and derives,
once, what the explorer, ``ckview export``, ``ckview summary``, ``project`` and ``plan`` show:
timeline, peak, step time, device scope, OOM, device figures. Qt-free and torch-free (numpy
arrays from ``ckview.analysis``), so tests and the CLI use it headless. Every number shown in
the GUI is derived here or in ``planning``; widgets only draw them.

NOTE [ Two x axes ]
    A timeline point is placed either by time (milliseconds since the run's first memory event)
    or by op index (the row in ``ops`` of the op that made the point's event; events outside any
    op take the previous op's index). Both are non-decreasing over points (NOTE [ Event order ]
    in ``ckview.analysis.timeline``), so a visible x range is a contiguous slice of points.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ckview.analysis import (
    MemoryTimeline,
    Peak,
    find_peak,
    format_bytes,
    live_storages,
    memory_timeline,
    module_paths,
)
from ckview.analysis.device import DeviceState, Oom, device_states, oom_event
from ckview.analysis.stacks import allocation_site
from ckview.analysis.timing import step_time_ns
from ckview.analysis.types import RunTables
from ckview.trace.schema import CATEGORY_PRIORITY, RUN_TABLES, Category, Phase

if TYPE_CHECKING:
    from ckview.trace import Trace, TraceMeta

Progress = Callable[[float, str], None]
"""``progress(fraction, what)``: called while a trace loads (fraction in [0, 1])."""

CATEGORY_LABELS: dict[Category, str] = {
    Category.PARAMETER: "parameters",
    Category.GRADIENT: "gradients",
    Category.OPTIMIZER_STATE: "optimizer state",
    Category.ACTIVATION: "activations",
    Category.TEMPORARY: "temporaries",
    Category.INPUT: "inputs",
    Category.OTHER: "other",
    Category.SHARDED_PARAMETER: "sharded parameters",
    Category.UNSHARDED_PARAMETER: "unsharded parameters",
    Category.COMM_BUFFER: "communication buffers",
    Category.UNKNOWN: "unknown",
}
STACK_ORDER: tuple[Category, ...] = CATEGORY_PRIORITY
"""Bottom to top: what stays all step at the bottom (parameters, gradients, optimizer state,
inputs), what comes and goes on top; the order that also settles a storage's category."""

SHOWN_PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE, Phase.OPTIMIZER)


class Axis(Enum):
    """How timeline points are placed along x (NOTE [ Two x axes ])."""

    TIME = "time"
    OP = "op"

    @property
    def label(self) -> str:
        return "time (ms)" if self is Axis.TIME else "op index"


@dataclass(frozen=True)
class Span:
    """A stretch of ops drawn as a band: a phase of a step, or a recorded recompute."""

    label: str
    kind: Phase
    first_op: int
    stop_op: int
    """One past the last op."""
    start_ms: float
    end_ms: float

    def x_range(self, axis: Axis) -> tuple[float, float]:
        if axis is Axis.TIME:
            return self.start_ms, self.end_ms
        return float(self.first_op), float(self.stop_op)


@dataclass(frozen=True)
class LiveTensor:
    """One storage live at a moment, as the inspector lists it."""

    storage: int
    nbytes: int
    category: str
    shape: str
    dtype: str
    op: str
    module: str
    device: str
    site: str = ""
    """Where the user's code made it, ``file:line (function)`` (traces recorded with
    ``--stacks``; NOTE [ The frame that names an allocation ]), '' if not recorded."""


NO_SITE = "(no source line: record with --stacks)"
"""The group of tensors whose source line the trace does not hold (recorded without stacks)."""
BEFORE_RECORDING = "(no source line: made before recording)"
"""The group of tensors without a stack in a trace recorded with stacks: made before it began
(parameters, optimizer state of the warmup steps)."""


@dataclass(frozen=True)
class SiteGroup:
    """The live tensors made at one source line, summed."""

    site: str
    nbytes: int
    count: int
    categories: str
    """'activations 3, temporaries 1': how many of each category, most first."""


def group_by_site(rows: Sequence[LiveTensor], unknown: str = NO_SITE) -> list[SiteGroup]:
    """``rows`` grouped by source line (``LiveTensor.site``; ``unknown`` without one),
    largest sum of bytes first (ties: by line)."""
    groups: dict[str, list[LiveTensor]] = {}
    for row in rows:
        groups.setdefault(row.site or unknown, []).append(row)
    out = []
    for site, members in groups.items():
        counts: dict[str, int] = {}
        for m in members:
            counts[m.category] = counts.get(m.category, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        cats = ", ".join(f"{name} {n}" for name, n in ranked)
        out.append(SiteGroup(site, sum(m.nbytes for m in members), len(members), cats))
    out.sort(key=lambda g: (-g.nbytes, g.site))
    return out


@dataclass(frozen=True)
class Run:
    """One run of a trace: its tables, and what is derived from them once (timeline, peak,
    step time, device scope, OOM, device figures, the geometry the timeline draws)."""

    source: str
    """Path of the trace file."""
    name: str
    """Run name inside the trace ('main', 'baseline', 'checkpointed', 'plan:...')."""
    tables: RunTables
    """All run tables plus the trace's root tables and ``strings`` (``Trace.read_run``: the
    ``ckview.analysis`` input), on the run's main device."""
    timeline: MemoryTimeline
    peak: Peak
    x_time: np.ndarray
    """(n+1,) float64: ms since the first event, per timeline point (NOTE [ Two x axes ])."""
    x_op: np.ndarray
    """(n+1,) float64: op index per timeline point."""
    phases: list[Span]
    recomputes: list[Span]
    paths: list[str]
    """Display path of every module row."""
    step_ns: int
    """Summed time of the recorded steps: plain where the run has timing steps (NOTE [ Extra
    compute from plain times ] in ckview/analysis/timing.py), else recorded."""
    plain_times: bool
    """``step_ns`` (and extra compute projected over this run) come from plain timing steps."""
    oom: Oom | None = None
    """The allocation failure the run ended in, None if it did not."""
    devices: tuple[DeviceState, ...] = ()
    """Allocator and NVML figures of each CUDA device the run used, main device first; none
    on a CPU run."""
    device_total_bytes: int = -1
    """The trace's meta ``device_total_bytes``: the capacity of the device it was recorded on,
    -1 if unknown (the budget ``'device'`` plans for it, as ``ckview plan --budget device``)."""
    checkpointing: str = ""
    """How the script's checkpointing ran: 'script', 'bypassed', 'plan', '' if unknown."""

    @property
    def device(self) -> DeviceState | None:
        """The run's main CUDA device (allocator and NVML figures), None on a CPU run."""
        return self.devices[0] if self.devices else None

    @property
    def timeline_device(self) -> str | None:
        """The device the figures count, when the run held storages on several (NOTE [ One
        device per timeline ] in ckview/trace/devices.py); None when it held them on one."""
        device: str | None = self.tables.get("timeline_device")
        return device

    @property
    def left_out(self) -> dict[str, int]:
        """Storages left out of the figures (on other devices than ``timeline_device``)."""
        left_out: dict[str, int] = self.tables.get("left_out") or {}
        return left_out

    @property
    def oom_point(self) -> int | None:
        """The timeline point the OOM met (after the last event before it), None without one."""
        if self.oom is None:
            return None
        return oom_event(self.tables["memory_events"], self.oom.time_ns) + 1

    @property
    def initial_point(self) -> int | None:
        """Where the explorer opens: on the OOM if the run ended in one, else None (all)."""
        return self.oom_point

    def device_lines(self) -> list[tuple[str, int]]:
        """Horizontal lines for the timeline: ``(label, bytes)`` of the device's capacity and
        of the most the allocator reserved; none on a CPU run."""
        d = self.device
        if d is None:
            return []
        lines = []
        if d.reserved >= 0:  # unknown for a run projected at another size (app/sizing.py)
            lines.append((f"reserved {format_bytes(d.reserved)} (at most)", d.reserved))
        if d.total >= 0:
            lines.insert(0, (f"device {d.device} {format_bytes(d.total)}", d.total))
        return lines

    @property
    def scope(self) -> str:
        """What the figures count when the run held storages on several devices: ``'on cuda:0;
        left out: 12 storages on cpu'`` (NOTE [ One device per timeline ] in
        ckview/trace/devices.py; ``ckview summary`` says it too); '' when nothing was left out."""
        if not self.left_out:
            return ""
        others = ", ".join(
            f"{n:,} storage{'' if n == 1 else 's'} on {device}"
            for device, n in self.left_out.items()
        )
        return f"on {self.timeline_device}; left out: {others}"

    @property
    def label(self) -> str:
        """``file.h5 · run``."""
        return f"{os.path.basename(self.source)} · {self.name}"

    @property
    def n_events(self) -> int:
        return len(self.timeline.total) - 1

    def x(self, axis: Axis) -> np.ndarray:
        return self.x_time if axis is Axis.TIME else self.x_op

    def x_of_time_ns(self, time_ns: np.ndarray) -> np.ndarray:
        """Times (ns, as in the tables) in the ms of ``x_time``."""
        return (np.asarray(time_ns, dtype=np.float64) - self.t0_ns) / 1e6

    @property
    def t0_ns(self) -> int:
        return int(self.timeline.time_ns[0])

    @cached_property
    def stacked(self) -> np.ndarray:
        """(len(STACK_ORDER), n+1) float64: cumulative live bytes, bottom layer first."""
        layers = self.timeline.by_category[list(STACK_ORDER)].astype(np.float64)
        return np.cumsum(layers, axis=0)

    def point_at(self, axis: Axis, x: float) -> int:
        """The last timeline point at or before ``x`` (point 0 before the first)."""
        xs = self.x(axis)
        return int(np.clip(np.searchsorted(xs, x, side="right") - 1, 0, len(xs) - 1))

    def point_under(self, axis: Axis, x: float, half_width: float = 0.0) -> int:
        """The point a pointer at ``x`` shows: the highest of the points drawn within
        ``half_width`` of ``x`` (one pixel, in x units; events can share a time), as the
        peak-preserving curve draws them; ``point_at(x)`` if none is that close."""
        xs = self.x(axis)
        first = int(np.searchsorted(xs, x - half_width, side="left"))
        last = self.point_at(axis, x + half_width)
        if first > last:
            return self.point_at(axis, x)
        return first + int(np.argmax(self.timeline.total[first : last + 1]))

    def op_at(self, point: int) -> int:
        """Row in ``ops`` of the op behind a timeline point, -1 for point 0 or none."""
        if point <= 0:
            return -1
        return int(self.tables["memory_events"]["op"][point - 1])

    def op_name(self, op: int) -> str:
        if op < 0:
            return "(no op)"
        return self._string(int(self.tables["ops"]["name"][op]))

    def module_of_op(self, op: int) -> str:
        call = int(self.tables["ops"]["module_call"][op]) if op >= 0 else -1
        if call < 0:
            return "(no module)"
        return self.paths[int(self.tables["module_calls"]["module"][call])]

    def phase_of_op(self, op: int) -> str:
        return Phase(int(self.tables["ops"]["phase"][op])).name.lower() if op >= 0 else "-"

    def describe_point(self, point: int) -> str:
        """A few lines about a timeline point: time, op, module, phase, live bytes by category."""
        op = self.op_at(point)
        lines = [
            f"{self.x_time[point]:.3f} ms · op {op}  {self.op_name(op)}",
            f"{self.phase_of_op(op)} · {self.module_of_op(op)}",
            f"live {format_bytes(int(self.timeline.total[point]))}",
        ]
        for category in reversed(STACK_ORDER):
            value = int(self.timeline.by_category[category, point])
            if value:
                lines.append(f"  {CATEGORY_LABELS[category]}: {format_bytes(value)}")
        site = self.source_line(point)
        if site:
            lines.append(f"made at {site}")
        return "\n".join(lines)

    def live_tensors(self, point: int) -> list[LiveTensor]:
        """The storages live at a timeline point, largest first (ties: lowest row first)."""
        rows = live_storages(self.tables["storages"], self.tables["memory_events"], point - 1)
        st = self.tables["storages"]
        nbytes = np.asarray(st["nbytes"])[rows]
        rows = rows[np.lexsort((rows, -nbytes))]
        return [self._live_tensor(int(r)) for r in rows]

    def _live_tensor(self, row: int) -> LiveTensor:
        st = self.tables["storages"]
        module = int(st["module"][row])
        return LiveTensor(
            storage=row,
            nbytes=int(st["nbytes"][row]),
            category=CATEGORY_LABELS[Category(int(st["category"][row]))],
            shape=self._string(int(st["shape"][row])),
            dtype=self._string(int(st["dtype"][row])),
            op=self.op_name(int(st["op"][row])),
            module=self.paths[module] if module >= 0 else self.site(row) or "(no module)",
            device=self._string(int(st["device"][row])),
            site=self.site(row),
        )

    def site(self, row: int) -> str:
        """Where storage ``row`` was allocated (its stack's innermost Python frame,
        NOTE [ The frame that names an allocation ]), '' if the trace does not say."""
        t = self.tables
        if "stacks" not in t or "stack" not in t["storages"]:
            return ""
        return allocation_site(
            t["frames"], t["stacks"], t["strings"], int(t["storages"]["stack"][row])
        )

    @property
    def no_site(self) -> str:
        """What a tensor without a source line is grouped as: ``BEFORE_RECORDING`` in a trace
        recorded with stacks, else ``NO_SITE``."""
        stack = self.tables["storages"].get("stack") if "stacks" in self.tables else None
        recorded = stack is not None and bool((np.asarray(stack) >= 0).any())
        return BEFORE_RECORDING if recorded else NO_SITE

    def source_line(self, point: int) -> str:
        """Where the storage allocated or freed at timeline ``point`` was made, '' if the
        trace does not say (no ``--stacks``) or at point 0."""
        if point <= 0:
            return ""
        return self.site(int(self.tables["memory_events"]["storage"][point - 1]))

    def _string(self, sid: int) -> str:
        strings: Sequence[str] = self.tables["strings"]
        return strings[sid] if 0 <= sid < len(strings) else "?"


@dataclass(frozen=True)
class TraceData:
    """A trace file opened for viewing: its metadata and every run, read into memory."""

    path: str
    meta: TraceMeta
    runs: list[Run]

    @property
    def names(self) -> list[str]:
        """The run names, in the trace's order."""
        return [run.name for run in self.runs]

    def run(self, name: str) -> Run:
        """The run called ``name`` (``KeyError`` if there is none: check ``names`` first)."""
        for run in self.runs:
            if run.name == name:
                return run
        raise KeyError(name)


def load_trace(path: str | os.PathLike[str], progress: Progress | None = None) -> TraceData:
    """Read every run of the trace at ``path`` (``read_run``). Raises
    ``ckview.trace.TraceError`` (one-line message) for a file that is not a readable trace."""
    from ckview.trace import open_trace

    report = progress or (lambda fraction, what: None)
    path = os.fspath(path)
    report(0.0, f"opening {os.path.basename(path)}")
    with open_trace(path) as trace:
        names = trace.run_names
        runs = []
        per_run = len(RUN_TABLES) + 1
        steps = max(len(names), 1) * per_run
        for i, name in enumerate(names):
            read = iter(range(per_run))

            def on_table(table: str, i: int = i, name: str = name, read: Any = read) -> None:
                report((i * per_run + next(read)) / steps, f"run {name!r}: {table}")

            def on_curves(i: int = i, name: str = name) -> None:
                report((i + 1) * per_run / steps - 0.5 / steps, f"run {name!r}: curves")

            runs.append(read_run(trace, name, on_table, on_curves))
        meta = trace.meta
    report(1.0, "done")
    return TraceData(path=path, meta=meta, runs=runs)


def read_run(
    trace: Trace,
    name: str,
    on_table: Callable[[str], None] | None = None,
    on_curves: Callable[[], None] | None = None,
) -> Run:
    """Run ``name`` of an open trace, the one way every reader reads a run: its tables
    (``Trace.read_run``, on its main device) and what the trace says of it beside them (OOM,
    checkpointing, the device's figures and capacity). ``on_table(table)`` is called before
    each table is read, ``on_curves()`` before the timeline is built (for progress)."""
    tables = trace.read_run(name, on_table)
    if on_curves is not None:
        on_curves()
    total = trace.meta.device_total_bytes
    run = trace.run(name)
    return build_run(
        trace.path,
        name,
        tables,
        oom=Oom.of_run(run),
        devices=tuple(device_states(tables["device_samples"], tables["strings"], total)),
        device_total_bytes=total,
        checkpointing=run.checkpointing,
    )


def build_run(
    source: str,
    name: str,
    tables: RunTables,
    oom: Oom | None = None,
    devices: tuple[DeviceState, ...] = (),
    device_total_bytes: int = -1,
    checkpointing: str = "",
) -> Run:
    """A ``Run`` from a run's tables (what ``load_trace`` reads for each run), with its OOM
    and CUDA devices if it has them, its trace's device capacity if known, and how the
    script's checkpointing ran."""
    timeline = memory_timeline(tables["storages"], tables["memory_events"])
    ops = tables["ops"]
    t0 = int(timeline.time_ns[0])
    step_ns, plain = step_time_ns(tables)
    return Run(
        source=source,
        name=name,
        tables=tables,
        timeline=timeline,
        peak=find_peak(timeline),
        x_time=(timeline.time_ns - t0) / 1e6,
        x_op=_op_index(tables["memory_events"]["op"]),
        phases=_phase_spans(ops, t0),
        recomputes=_recompute_spans(tables, t0),
        paths=module_paths(tables["modules"], tables["strings"]),
        step_ns=step_ns,
        plain_times=plain,
        oom=oom,
        devices=devices,
        device_total_bytes=device_total_bytes,
        checkpointing=checkpointing,
    )


def _op_index(event_op: np.ndarray) -> np.ndarray:
    """Op index of every timeline point, forward-filled over events without an op
    (NOTE [ Two x axes ])."""
    ops = np.asarray(event_op, dtype=np.int64)
    known = np.where(ops >= 0, ops, -1)
    filled = np.maximum.accumulate(np.concatenate(([0], known)))
    return filled.astype(np.float64)


def _phase_spans(ops: Mapping[str, np.ndarray], t0: int) -> list[Span]:
    """Runs of consecutive ops of one shown phase and step, as bands."""
    phase = np.asarray(ops["phase"], dtype=np.int64)
    step = np.asarray(ops["step"], dtype=np.int64)
    if phase.size == 0:
        return []
    change = np.flatnonzero((np.diff(phase) != 0) | (np.diff(step) != 0)) + 1
    starts = np.concatenate(([0], change))
    stops = np.append(change, phase.size)
    start_ns, end_ns = np.asarray(ops["start_ns"]), np.asarray(ops["end_ns"])
    spans = []
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        kind = Phase(int(phase[a]))
        if kind in SHOWN_PHASES:
            spans.append(
                Span(
                    label=f"{kind.name.lower()} {int(step[a])}",
                    kind=kind,
                    first_op=a,
                    stop_op=b,
                    start_ms=(int(start_ns[a]) - t0) / 1e6,
                    end_ms=(int(end_ns[b - 1]) - t0) / 1e6,
                )
            )
    return spans


def _recompute_spans(tables: RunTables, t0: int) -> list[Span]:
    """The recorded recompute regions (runs recorded with checkpointing)."""
    rr = tables["recompute_regions"]
    strings = tables["strings"]
    n_ops = len(tables["ops"]["phase"])
    spans = []
    for i in range(len(rr["name"])):
        end = int(rr["end_ns"][i])
        first, stop = int(rr["first_op"][i]), int(rr["end_op"][i])
        if stop < 0:
            stop = n_ops
        spans.append(
            Span(
                label=f"recompute {strings[int(rr['name'][i])]}",
                kind=Phase.RECOMPUTE,
                first_op=first,
                stop_op=stop,
                start_ms=(int(rr["start_ns"][i]) - t0) / 1e6,
                end_ms=((end if end >= 0 else int(rr["start_ns"][i])) - t0) / 1e6,
            )
        )
    return spans
