"""``ckview record``: run a training script unchanged and record its steps into a trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ckview.cli.distributed import is_launcher, run_launcher
from ckview.cli.errors import CLIError
from ckview.cli.recording import (
    ARGS_HELP,
    USAGE,
    add_record_options,
    check_command,
    check_target,
    compiled_plans_note,
    default_output,
    hint_misplaced,
    load_plans,
    record_script,
    report,
    unlike_step_warnings,
)
from ckview.cli.sizes import add_sizes_option, record_at_sizes
from ckview.trace.ranks import this_rank_path


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "record",
        help="record training steps of a script into a trace",
        usage=USAGE,
        description=f"Run a training script with its own arguments and record steps. {ARGS_HELP}",
    )
    add_record_options(p)
    add_sizes_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_command(args)
    if args.sizes is not None:  # NOTE [ One recording per size ]
        return record_at_sizes(args, default_output(args.target))
    if args.plan and args.warmup == 0:
        raise CLIError("--plan needs a warmup step to find the model in; use --warmup 1 or more")
    if is_launcher(args.target, args.module):  # NOTE [ Recording every rank ]
        return run_launcher(args, default_output)
    check_target(args.target, args.module)
    output = this_rank_path(args.output or default_output(args.target))
    from recorder.plans import plan_runs

    plans = load_plans(args.plan or [])
    runs = plan_runs(plans, args.compare, args.compare)
    ending = record_script(args, output, runs)
    exit_code = report(output, ending, args, len(runs))
    hint_misplaced(args, ending.exit_code)
    if ending.steps and ending.written == output and not ending.error:
        for line in unlike_step_warnings(output):
            print(f"ckview: warning: {line}", file=sys.stderr)
    if ending.steps and ending.written == output and len(runs) > 1:
        for line in leftover_warnings(output) + save_entry_warnings(output, plans):
            print(f"ckview: warning: {line}", file=sys.stderr)
        if note := compiled_plans_note(output):
            print(f"ckview: note: {note}", file=sys.stderr)
        if args.compare and never_checkpointed(output):
            print(
                "ckview: note: the script never checkpointed (nothing was recomputed in run "
                "'checkpointed'), so runs 'baseline' and 'checkpointed' are the same step and "
                "comparing them shows nothing; to see what checkpointing would change, add "
                "--plan sqrt or run: ckview plan " + str(output),
                file=sys.stderr,
            )
    return exit_code


def never_checkpointed(output: Path) -> bool:
    """Whether run 'checkpointed' was recorded and recomputed nothing (no checkpointed region,
    no recompute op): then it is the same step as run 'baseline'."""
    import numpy as np

    from ckview.trace import open_trace
    from ckview.trace.schema import Phase

    with open_trace(output) as trace:
        if "checkpointed" not in trace.run_names:
            return False
        run = trace.run("checkpointed")
        if run.steps_recorded == 0 or len(run.table("recompute_regions")):
            return False
        return not np.any(run.table("ops").column("phase") == Phase.RECOMPUTE)


def save_entry_warnings(output: Path, plans: list[tuple[str, Any]]) -> list[str]:
    """One line per save entry of ``plans`` that projects low over run 'baseline' (NOTE
    [ Saves the projection cannot hold ] in ckview/analysis/planner_ops.py); none without that
    run (a plan's run alone is not projected over)."""
    from ckview.cli.common import read_tables, save_warning_lines
    from ckview.trace import open_trace

    with open_trace(output) as trace:
        if not plans or "baseline" not in trace.run_names:
            return []
        if trace.run("baseline").steps_recorded == 0:
            return []
        tables = read_tables(trace, "baseline")
    lines = []
    for source, plan in plans:
        try:
            lines += save_warning_lines(tables, plan, source)
        except CLIError:  # fitted the live model; ckview project says why it does not here
            continue
    return lines


def leftover_warnings(output: Path) -> list[str]:
    """One line naming every run whose script checkpointing was bypassed and that still
    recomputed (NOTE [ Recompute in a bypassed run ] in ckview/analysis/recompute.py), with
    the first one's figures; none if there is none."""
    from ckview.analysis.recompute import PLAN, SCRIPT, leftover_recompute, run_checkpointing
    from ckview.trace import open_trace

    found = []
    with open_trace(output) as trace:
        strings = list(trace.strings)
        for name in trace.run_names:
            run = trace.run(name)
            kind = run_checkpointing(name, run.checkpointing)
            if kind == SCRIPT or run.steps_recorded == 0:
                continue
            tables = {t: run.table(t).read() for t in ("ops", "recompute_regions")}
            leftover = leftover_recompute(tables, strings, plan_run=kind == PLAN)
            if leftover is not None:
                found.append((name, leftover))
    return [found[0][1].describe(*(name for name, _ in found))] if found else []
