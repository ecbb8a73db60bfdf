"""``ckview project``: what checkpoint plans would do to a recorded run's peak, without re-running.

Each PLAN (a plan file or a preset, read by the torch-free ``ckpt_runtime.plan.load_plan``) is
resolved over the trace's modules by the plan core that ``ckpt_runtime`` resolves it with over
the live model (``ckview.analysis.plans``), and projected over one run
(``ckview.analysis.project``). A region that cannot take effect in the recorded step (its
module, or its Sequential's forward, never ran) is stated with the reason and what to do.
Imports no torch.
``ckview verify`` reuses ``read_tables``, ``project_plan`` and ``run_peak`` below to compare
projections with measurements; the verbs share their helpers through ``ckview.cli.common``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.common import one_line, read_plan, read_run, times_line
from ckview.cli.errors import CLIError

if TYPE_CHECKING:
    from ckview.analysis import PlanRegions
    from ckview.analysis.cost import PlanCost
    from ckview.analysis.types import RunTables
    from ckview.app.run import Run

Tables = dict[str, Any]
"""A run's tables by name, plus the trace's ``modules`` table and ``strings`` list."""


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "project",
        help="project the peak memory and extra compute of checkpoint plans",
        description=(
            "Project what each PLAN would do to the peak memory of a recorded run, and what it "
            "would cost in recompute time, without running anything."
        ),
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.add_argument(
        "--plan",
        dest="plans",
        action="append",
        required=True,
        metavar="PLAN",
        help="a plan file or a preset (none, all, every:K, sqrt); repeatable",
    )
    p.add_argument("--run", help="run to project over (default: 'baseline' if any, else 'main')")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(handler=run)


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
    step_ns: int
    """Summed time of the run's recorded steps (``Run.step_ns``)."""
    plain_times: bool
    """Extra compute and step time come from plain timing steps (NOTE [ Extra compute from
    plain times ] in ckview/analysis/timing.py), else from recorded op times."""
    recomputes: tuple[RecomputeRow, ...]
    regions: PlanRegions
    """The plan's regions, each saying whether it takes effect in the run's step."""

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
            "extra_compute_percent": round(100 * self.extra_share, 3),
            "times": "plain" if self.plain_times else "recorded",
            "recomputes": [
                {"region": r.region, "count": r.count, "compute_ns": r.compute_ns}
                for r in self.recomputes
            ],
            "regions": self.regions.to_json(),
            "idle_regions": len(self.regions.idle),
            "notes": self.regions.notes(),
        }


# ----------------------------------------------------------------------------- the verb


def run(args: argparse.Namespace) -> int:
    base = read_run(args.trace, args.run)
    plans = [read_plan(source) for source in args.plans]
    results = [
        project_over(base, plan, source) for plan, source in zip(plans, args.plans, strict=True)
    ]
    if args.json:
        doc = {
            "trace": str(args.trace),
            "run": base.name,
            "run_peak_bytes": base.peak.bytes,
            "step_ns": base.step_ns,
            "times": "plain" if base.plain_times else "recorded",
            "plans": [r.to_json() for r in results],
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    print(_header(args.trace, base))
    for result in results:
        print()
        print(format_projection(result))
    return 0


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


def project_plan(tables: Tables, plan: Any, source: str) -> PlanProjection:
    """Project ``plan`` (a ``Plan``, a plan document or a preset) over the run ``tables``."""
    from ckview.app.run import build_run

    return project_over(build_run("", "", tables), plan, source)


def project_over(run: Run, plan: Any, source: str) -> PlanProjection:
    """Project ``plan`` (a ``Plan``, a plan document or a preset) over ``run``."""
    from ckview.analysis import project

    resolved = resolve_plan(plan, run.tables, source)
    projection = project(run.tables, list(resolved.regions))
    return PlanProjection(
        plan=resolved.name,
        source=source,
        peak_bytes=int(projection.peak.bytes),
        run_peak_bytes=run.peak.bytes,
        extra_compute_ns=int(projection.extra_compute_ns),
        step_ns=run.step_ns,
        plain_times=projection.plain_times and run.plain_times,
        recomputes=_recompute_rows(projection, resolved.labels),
        regions=resolved,
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


# ----------------------------------------------------------------------------- text


def _header(path: Path, run: Run) -> str:
    from ckview.analysis import format_bytes as fb

    return (
        f"{path}, run {run.name!r}: peak {fb(run.peak.bytes)}, "
        f"step time {run.step_ns / 1e6:.1f} ms\n{times_line(run.tables)}"
    )


def format_projection(p: PlanProjection) -> str:
    """One plan's projection as indented text lines."""
    from ckview.analysis import format_bytes as fb

    shown = p.plan if p.plan == p.source else f"{p.plan} ({p.source})"
    n = sum(r.count for r in p.recomputes)
    lines = [
        f"plan {shown}",
        f"  projected peak  {fb(p.peak_bytes):>11}   saves {fb(p.saving_bytes)} "
        f"({p.saving_share:.1%})",
        f"  extra compute   {p.extra_compute_ns / 1e6:>8.1f} ms   "
        f"({p.extra_share:.1%} of the step time)",
        f"  recomputes      {n} in {len(p.recomputes)} region(s)" + (":" if n else ""),
    ]
    width = max((len(r.region) for r in p.recomputes), default=0)
    lines += [
        f"    {r.region:<{width}}  {r.count:>3}x  {r.compute_ns / 1e6:8.1f} ms"
        for r in p.recomputes
    ]
    return "\n".join(lines + idle_lines(p.regions))


def idle_lines(regions: PlanRegions, indent: str = "  ") -> list[str]:
    """The plan's regions that cannot take effect, and why (NOTE [ Regions that cannot take
    effect ] in ckpt_runtime/resolve.py); nothing if every region takes effect."""
    idle, n = len(regions.idle), len(regions.regions)
    if not idle:
        return []
    head = f"{indent}not in effect   {idle} of {n} region{'s' if n != 1 else ''} will not run"
    head += " in this step, so the plan changes nothing:" if idle == n else " in this step:"
    lines = [head]
    return lines + [f"{indent}  {note}" for note in regions.notes()]
