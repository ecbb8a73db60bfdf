"""``ckview project``: what checkpoint plans would do to a recorded run's peak, without re-running.

Each PLAN (a plan file or a preset, read by the torch-free ``ckpt_runtime.plan.load_plan``) is
resolved over the trace's modules by the plan core that ``ckpt_runtime`` resolves it with over
the live model (``ckview.analysis.plans``), and projected over one run
(``ckview.analysis.project``). A region that cannot take effect in the recorded step (its
module, or its Sequential's forward, never ran) is stated with the reason and what to do; a
save entry the projection cannot hold gets a warning on stderr (and in ``--json``).
Imports no torch.
The projection itself (``project_over``) is shared with ``ckview verify`` through
``ckview.cli.common``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.common import PlanProjection, project_over, read_plan, read_run, times_line

if TYPE_CHECKING:
    from ckview.analysis import PlanRegions
    from ckview.app.run import Run


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
    else:
        print(_header(args.trace, base))
        for result in results:
            print()
            print(format_projection(result))
    for result in results:  # NOTE [ Saves the projection cannot hold ] in planner_ops.py
        for line in result.warning_lines():
            print(f"ckview: warning: {line}", file=sys.stderr)
    return 0


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
    from ckview.analysis.timing import extra_range_text

    shown = p.plan if p.plan == p.source else f"{p.plan} ({p.source})"
    n = sum(r.count for r in p.recomputes)
    lines = [
        f"plan {shown}",
        f"  projected peak  {fb(p.peak_bytes):>11}   saves {fb(p.saving_bytes)} "
        f"({p.saving_share:.1%})",
        f"  extra compute   {p.extra_compute_ns / 1e6:>8.1f} ms   "
        f"({p.extra_share:.1%} of the step time{extra_range_text(p.extra_compute_range_ns)})",
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
