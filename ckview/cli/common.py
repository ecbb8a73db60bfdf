"""What several verbs share: reading the run and the plans they work on, projecting a plan
over a run (``project`` and ``verify``), and wording that several verbs print. Verbs import this
module, never one another."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.errors import CLIError, pick_run

if TYPE_CHECKING:
    from ckpt_runtime.plan import Plan
    from ckview.analysis import PlanRegions
    from ckview.analysis.cost import PlanCost
    from ckview.analysis.planner_ops import SaveWarning
    from ckview.analysis.types import RunTables
    from ckview.app.run import Run

Tables = dict[str, Any]
"""A run's tables by name, plus the trace's ``modules`` table and ``strings`` list."""


def read_run(path: Path, wanted: str | None) -> Run:
    """The run to plan or project over (``wanted``, else 'baseline', else 'main'), read as a
    ``Run`` (``ckview.app.run.read_run``)."""
    from ckview.app.run import read_run as read
    from ckview.trace import open_trace

    with open_trace(path) as trace:
        return read(trace, pick_run(path, trace.run_names, wanted))


def read_plan(source: str) -> Plan:
    """The plan ``source`` names: a preset, or a plan file (``ckpt_runtime.load_plan``, which
    imports no torch: a string that starts like a preset is one, anything else a file, ``./sqrt``
    for a file named ``sqrt``; a file without a ``name`` is named after its stem)."""
    from ckpt_runtime.plan import PlanError, load_plan

    try:
        return load_plan(source)
    except PlanError as exc:
        raise CLIError(str(exc)) from None


def times_line(tables: RunTables) -> str:
    """Where the step time and extra compute come from (NOTE [ Extra compute from plain
    times ] in ckview/analysis/timing.py)."""
    from ckview.analysis.timing import plain_times

    times = plain_times(tables)
    if times is None:
        return (
            "times: recorded op times, with the recorder's per-op cost (record with "
            "--timing-steps 3 for plain times)"
        )
    s, cost = times.step, times.call_cost
    line = (
        f"times: plain, median of {s.count} unrecorded steps: {s.median_ns / 1e6:.1f} ms a step "
        f"({s.low_ns / 1e6:.1f}..{s.high_ns / 1e6:.1f})"
    )
    if times.plan_all is not None:  # NOTE [ Extra time measured under plan all ]
        line += (
            f"; recompute speed and checkpoint's cost measured in {len(times.plan_all.extra_ns)} "
            "steps under plan all"
        )
    elif times.call_costs is not None:
        by_size = times.call_costs.at(times.call_costs.nbytes)[0]
        line += (
            f"; checkpoint's cost {by_size[0] / 1e3:.0f}..{by_size[-1] / 1e3:.0f} us a call by the "
            "bytes it saves included"
        )
    elif cost is not None:
        line += f"; checkpoint's cost {cost.median_ns / 1e3:.0f} us a call included"
    return line


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (for a ``CLIError`` that quotes it)."""
    return " ".join(str(exc).split())


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class RecomputeRow:
    """One checkpointed region that the projected backward recomputes."""

    region: str
    """The region as a plan names it: a module path, or ``path[start:stop]`` for a segment."""
    count: int
    """Instances of the region recomputed (one per call)."""
    compute_ns: int
    """Their summed forward time: the extra compute."""


@dataclass(frozen=True)
class PlanProjection:
    """A plan projected over one run, with the run's own numbers to compare against."""

    plan: str
    """The plan's name (a run recorded with it is ``plan:<name>``)."""
    source: str
    """The plan as given on the command line."""
    peak_bytes: int
    run_peak_bytes: int
    extra_compute_ns: int
    extra_compute_range_ns: tuple[int, int]
    """The lowest and highest extra compute the measurements allow (NOTE [ How sure the extra
    time is ] in ckview/analysis/timing.py)."""
    step_ns: int
    """Summed time of the run's recorded steps (``Run.step_ns``)."""
    plain_times: bool
    """Extra compute and step time come from plain timing steps (NOTE [ Extra compute from
    plain times ] in ckview/analysis/timing.py), else from recorded op times."""
    recomputes: tuple[RecomputeRow, ...]
    regions: PlanRegions
    """The plan's regions, each saying whether it takes effect in the run's step."""
    warnings: tuple[SaveWarning, ...] = ()
    """Save entries the projection cannot hold (NOTE [ Saves the projection cannot hold ] in
    ckview/analysis/planner_ops.py)."""

    @property
    def cost(self) -> PlanCost:
        """The projection's saving and extra compute, and their shares."""
        from ckview.analysis.cost import PlanCost

        return PlanCost(self.peak_bytes, self.run_peak_bytes, self.extra_compute_ns, self.step_ns)

    @property
    def saving_bytes(self) -> int:
        return self.cost.saving_bytes

    @property
    def saving_share(self) -> float:
        return self.cost.saving_share

    @property
    def extra_share(self) -> float:
        return self.cost.extra_share

    def to_json(self) -> dict[str, Any]:
        """The projection as a JSON-ready dict (shares in percent)."""
        return {
            "plan": self.plan,
            "source": self.source,
            "projected_peak_bytes": self.peak_bytes,
            "saving_bytes": self.saving_bytes,
            "saving_percent": round(100 * self.saving_share, 3),
            "extra_compute_ns": self.extra_compute_ns,
            "extra_compute_low_ns": self.extra_compute_range_ns[0],
            "extra_compute_high_ns": self.extra_compute_range_ns[1],
            "extra_compute_percent": round(100 * self.extra_share, 3),
            "times": "plain" if self.plain_times else "recorded",
            "recomputes": [
                {"region": r.region, "count": r.count, "compute_ns": r.compute_ns}
                for r in self.recomputes
            ],
            "regions": self.regions.to_json(),
            "idle_regions": len(self.regions.idle),
            "notes": self.regions.notes(),
            "warnings": [w.to_json() for w in self.warnings],
        }

    def warning_lines(self) -> list[str]:
        """One line per save warning, naming the plan."""
        return [f"plan {self.plan}: {w.line()}" for w in self.warnings]


def read_tables(trace: Any, name: str) -> Tables:
    """All tables of run ``name``, plus the trace's ``modules`` and ``strings`` (``read_run``)."""
    return trace.read_run(name)


# ----------------------------------------------------------------------------- plans


def resolve_plan(plan: Any, tables: RunTables, source: str) -> PlanRegions:
    """``plan`` resolved over the trace's model, each region saying whether it takes effect in
    the run's step; CLIError if the plan does not fit the model."""
    from ckview.analysis import resolve_on_trace

    try:
        return resolve_on_trace(plan, tables["modules"], tables["strings"], tables["module_calls"])
    except ValueError as exc:
        raise CLIError(f"plan {source}: {one_line(exc)}") from None


def save_warning_lines(tables: RunTables, plan: Any, source: str) -> list[str]:
    """One line per save entry of ``plan`` that the projection over ``tables`` cannot hold,
    naming the plan (NOTE [ Saves the projection cannot hold ] in
    ckview/analysis/planner_ops.py); CLIError if the plan does not fit the model."""
    from ckview.analysis.planner_ops import save_warnings

    regions = resolve_plan(plan, tables, source)
    return [f"plan {regions.name}: {w.line()}" for w in save_warnings(tables, regions.regions)]


def project_plan(tables: Tables, plan: Any, source: str) -> PlanProjection:
    """Project ``plan`` (a ``Plan``, a plan document or a preset) over the run ``tables``."""
    from ckview.app.run import build_run

    return project_over(build_run("", "", tables), plan, source)


def project_over(run: Run, plan: Any, source: str) -> PlanProjection:
    """Project ``plan`` (a ``Plan``, a plan document or a preset) over ``run``."""
    from ckview.analysis import project
    from ckview.analysis.planner_ops import save_warnings

    resolved = resolve_plan(plan, run.tables, source)
    projection = project(run.tables, list(resolved.regions))
    return PlanProjection(
        plan=resolved.name,
        source=source,
        peak_bytes=int(projection.peak.bytes),
        run_peak_bytes=run.peak.bytes,
        extra_compute_ns=int(projection.extra_compute_ns),
        extra_compute_range_ns=projection.extra_compute_range_ns,
        step_ns=run.step_ns,
        plain_times=projection.plain_times and run.plain_times,
        recomputes=_recompute_rows(projection, resolved.labels),
        regions=resolved,
        warnings=tuple(save_warnings(run.tables, resolved.regions)),
    )


def _recompute_rows(projection: Any, labels: Sequence[str]) -> tuple[RecomputeRow, ...]:
    """The recomputed regions, in plan order, with their count and summed forward time."""
    counts: Counter[int] = Counter()
    times: Counter[int] = Counter()
    for r in projection.recomputes:
        counts[r.region] += 1
        times[r.region] += r.compute_ns
    return tuple(RecomputeRow(labels[i], counts[i], int(times[i])) for i in sorted(counts))


# ----------------------------------------------------------------------------- run numbers


def run_peak(tables: Tables) -> int:
    """The run's measured peak (first maximum of its memory timeline)."""
    from ckview.analysis import find_peak, memory_timeline

    return int(find_peak(memory_timeline(tables["storages"], tables["memory_events"])).bytes)
