"""``ckview project``: what checkpoint plans would do to a recorded run's peak, without re-running.

Each PLAN (a plan file or a preset) is resolved against the trace's modules the way
``ckpt_runtime`` resolves it (``ckview.analysis.plans``) and projected over one run
(``ckview.analysis.project``). Imports no torch: plan files are read here as plain JSON.
``ckview verify`` reuses the helpers below to compare projections with measurements.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckview.cli.errors import CLIError

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
    """Summed duration of the run's recorded steps."""
    recomputes: tuple[RecomputeRow, ...]

    @property
    def saving_bytes(self) -> int:
        return self.run_peak_bytes - self.peak_bytes

    @property
    def saving_share(self) -> float:
        return self.saving_bytes / self.run_peak_bytes if self.run_peak_bytes else 0.0

    @property
    def extra_share(self) -> float:
        return self.extra_compute_ns / self.step_ns if self.step_ns else 0.0

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
            "recomputes": [
                {"region": r.region, "count": r.count, "compute_ns": r.compute_ns}
                for r in self.recomputes
            ],
        }


# ----------------------------------------------------------------------------- the verb


def run(args: argparse.Namespace) -> int:
    from ckview.trace import open_trace

    with open_trace(args.trace) as trace:
        name = pick_run(trace.run_names, args.run, args.trace)
        tables = read_tables(trace, name)
    plans = [read_plan(source) for source in args.plans]
    results = [
        project_plan(tables, plan, source) for plan, source in zip(plans, args.plans, strict=True)
    ]
    if args.json:
        doc = {
            "trace": str(args.trace),
            "run": name,
            "run_peak_bytes": run_peak(tables),
            "step_ns": step_ns(tables),
            "plans": [r.to_json() for r in results],
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    print(_header(args.trace, name, tables))
    for result in results:
        print()
        print(format_projection(result))
    return 0


def pick_run(names: Sequence[str], wanted: str | None, path: Path) -> str:
    """``wanted`` if the trace has it, else 'baseline', else 'main'; CLIError otherwise."""
    if wanted is None:
        wanted = "baseline" if "baseline" in names else "main"
    if wanted not in names:
        raise CLIError(
            f"{path} has no run {wanted!r}; runs: {', '.join(names) or 'none'} (pick one with "
            "--run)"
        )
    return wanted


def read_tables(trace: Any, name: str) -> Tables:
    """All tables of run ``name``, plus the trace's ``modules`` and ``strings``."""
    from ckview.trace.schema import RUN_TABLES

    tables: Tables = {t: trace.run(name).table(t).read() for t in RUN_TABLES}
    tables["modules"] = trace.modules.read()
    tables["strings"] = list(trace.strings)
    return tables


# ----------------------------------------------------------------------------- plans


def read_plan(source: str) -> Mapping[str, Any] | str:
    """The plan ``source`` names: a preset string as is, or a plan file's JSON document.

    The rule of ``ckpt_runtime.load_plan``: a string that starts like a preset (``none``,
    ``all``, ``sqrt``, ``every``, then nothing, ``:`` or ``@``) is a preset, checked when it is
    resolved; anything else is a file (``./sqrt`` for a file named ``sqrt``). A file without a
    ``name`` is named after its stem.
    """
    if _looks_like_preset(source):
        return source
    path = Path(source)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CLIError(
            f"no plan file {source!r}; pass a plan file (JSON) or a preset: {', '.join(_presets())}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"cannot read plan file {source!r}: {_one_line(exc)}") from None
    except json.JSONDecodeError as exc:
        raise CLIError(f"plan file {source!r} is not valid JSON ({exc}); fix the syntax") from None
    if not isinstance(doc, dict):
        raise CLIError(f"plan file {source!r}: a plan is a JSON object, got {type(doc).__name__}")
    return doc if "name" in doc else {**doc, "name": path.stem or "plan"}


def _presets() -> tuple[str, ...]:
    from ckview.analysis.plans import PRESETS

    return tuple(PRESETS)


def _looks_like_preset(source: str) -> bool:
    """True if ``source`` starts like a preset: ``none``, ``all``, ``sqrt``, ``every:K``..."""
    head = re.split(r"[:@]", source, maxsplit=1)[0]
    return head in {p.split(":")[0] for p in _presets()} and (
        source == head or source[len(head)] in ":@"
    )


def resolve_regions(plan: Mapping[str, Any] | str, tables: Tables, source: str) -> list[Any]:
    """The analysis regions of ``plan`` in the trace's model; CLIError if it does not apply."""
    from ckview.analysis.plans import regions_from_plan

    try:
        return list(regions_from_plan(plan, tables["modules"], tables["strings"]))
    except ValueError as exc:
        raise CLIError(f"plan {source}: {_one_line(exc)}") from None


def project_plan(tables: Tables, plan: Mapping[str, Any] | str, source: str) -> PlanProjection:
    """Project ``plan`` over the run ``tables``."""
    from ckview.analysis import project
    from ckview.analysis.plans import plan_name

    regions = resolve_regions(plan, tables, source)
    try:
        name = plan_name(plan)
    except ValueError as exc:
        raise CLIError(f"plan {source}: {_one_line(exc)}") from None
    projection = project(tables, regions)
    return PlanProjection(
        plan=name,
        source=source,
        peak_bytes=int(projection.peak.bytes),
        run_peak_bytes=run_peak(tables),
        extra_compute_ns=int(projection.extra_compute_ns),
        step_ns=step_ns(tables),
        recomputes=_recompute_rows(projection, regions, tables),
    )


def _recompute_rows(
    projection: Any, regions: Sequence[Any], tables: Tables
) -> tuple[RecomputeRow, ...]:
    """The recomputed regions, in plan order, with their count and summed forward time."""
    counts: Counter[int] = Counter()
    times: Counter[int] = Counter()
    for r in projection.recomputes:
        counts[r.region] += 1
        times[r.region] += r.compute_ns
    return tuple(
        RecomputeRow(region_label(regions[i], tables), counts[i], int(times[i]))
        for i in sorted(counts)
    )


def region_label(region: Any, tables: Tables) -> str:
    """A region as a plan writes it: ``path`` or ``path[start:stop]``."""
    from ckview.analysis import SegmentRegion

    path = tables["strings"][int(tables["modules"]["path"][region.module])]
    if isinstance(region, SegmentRegion):
        return f"{path}[{region.start}:{region.stop}]"
    return path or "(the model)"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# ----------------------------------------------------------------------------- run numbers


def run_peak(tables: Tables) -> int:
    """The run's measured peak (first maximum of its memory timeline)."""
    from ckview.analysis import find_peak, memory_timeline

    return int(find_peak(memory_timeline(tables["storages"], tables["memory_events"])).bytes)


def step_ns(tables: Tables) -> int:
    """Summed duration of the run's recorded steps."""
    import numpy as np

    steps = tables["steps"]
    return int(np.sum(np.asarray(steps["end_ns"]) - np.asarray(steps["start_ns"])))


# ----------------------------------------------------------------------------- text


def _header(path: Path, name: str, tables: Tables) -> str:
    from ckview.analysis import format_bytes as fb

    return (
        f"{path}, run {name!r}: peak {fb(run_peak(tables))}, "
        f"step time {step_ns(tables) / 1e6:.1f} ms"
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
    return "\n".join(lines)
