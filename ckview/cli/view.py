"""``ckview view`` (and plain ``ckview TRACE``): open traces in the desktop explorer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.errors import CLIError

if TYPE_CHECKING:
    from ckpt_runtime.plan import Plan


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "view",
        help="open traces in the desktop explorer",
        description=(
            "Open TRACE files in the explorer: memory over time by category, recompute regions, "
            "the tensors live at any moment, and checkpoint plans projected as you click."
        ),
    )
    p.add_argument("traces", type=Path, nargs="*", metavar="TRACE")
    p.add_argument("--theme", choices=("light", "dark"), help="colour theme (default: last used)")
    p.add_argument("--x", dest="axis", choices=("time", "op"), help="x axis (default: time)")
    p.add_argument(
        "--plan",
        metavar="PLAN",
        help="open with this plan applied (a plan file or a preset: none, all, every:K, sqrt): "
        "ticked in the plan panel, its projected curve shown",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ckview.trace.ranks import expand_rank_paths, rank_of

    traces = readable_traces(expand_rank_paths(args.traces))  # run.h5: every rank of a run
    plan = None if args.plan is None else (checked_plan(args.plan, traces), args.plan)
    from ckview.gui.display import display_problem

    problem = display_problem()
    if problem is not None:
        raise CLIError(problem)
    try:
        from ckview.gui.app import run as run_app
    except ImportError as exc:
        raise CLIError(
            f"the explorer needs PyQt6 and pyqtgraph ({exc}); install them: "
            "pip install 'ckview[gui]'"
        ) from None
    ranks = sum(rank_of(p) is not None for p in traces) > 1
    return run_app(
        [str(p) for p in traces], theme=args.theme, axis=args.axis, compare=ranks, plan=plan
    )


def checked_plan(source: str, traces: list[Path]) -> Plan:
    """The plan ``source`` names, resolved over the model of the one trace it is for as
    ``ckview project`` resolves it; CLIError (one line) before any window if it cannot apply."""
    from ckview.cli.common import read_plan, resolve_plan
    from ckview.trace import open_trace

    if len(traces) != 1:
        raise CLIError(f"--plan applies to one trace, got {len(traces)}: open one TRACE with it")
    plan = read_plan(source)
    with open_trace(traces[0]) as trace:
        model = {"modules": trace.modules.read(), "strings": list(trace.strings)}
    resolve_plan(plan, {**model, "module_calls": None}, source)
    return plan


def readable_traces(paths: list[Path]) -> list[Path]:
    """The paths that are readable traces; for each other one, a warning line saying what is
    wrong with it. If none of several is readable, the first one's error (one line)."""
    from ckview.trace.errors import TraceError

    good: list[Path] = []
    problems: list[TraceError] = []
    for path in paths:
        try:
            check_trace(path)
            good.append(path)
        except TraceError as exc:
            problems.append(exc)
    if paths and not good:
        raise problems[0]
    for problem in problems:
        print(f"ckview: warning: not opened: {problem}", file=sys.stderr)
    return good


def check_trace(path: Path) -> None:
    """Fail before any window opens if ``path`` is not a readable trace (one-line error)."""
    from ckview.trace import open_trace

    with open_trace(path):
        pass
