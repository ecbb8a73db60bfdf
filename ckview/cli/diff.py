"""``ckview diff``: two runs side by side, and where their peak difference comes from.

ckview diff trace.h5                      the trace's first two runs (baseline vs checkpointed)
ckview diff trace.h5 --runs none all      two runs of one trace (here, two plans' runs)
ckview diff before.h5 after.h5            the main runs of two traces (two ranks, two commits)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ckview.cli.errors import CLIError, no_such_run


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "diff",
        help="two runs side by side: the peak difference by category, module and tensor",
        description=(
            "Compare run B with run A: their peaks, what differs there by category, module and "
            "kind of tensor, and for a checkpointed run what kept its peak up."
        ),
    )
    p.add_argument("traces", type=Path, nargs="+", metavar="TRACE", help="one trace, or two")
    p.add_argument(
        "--runs",
        nargs=2,
        metavar=("A", "B"),
        help="the runs to compare (a plan's run by its plan name too: 'all' for 'plan:all'); "
        "default: a trace's first two runs, or each trace's first",
    )
    p.add_argument("--top", type=int, default=8, help="modules and tensors to list (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ckview.analysis.diff import diff_runs
    from ckview.trace import open_trace

    if len(args.traces) > 2:
        raise CLIError("give one trace (two of its runs) or two traces to compare")
    if args.top < 1:
        raise CLIError("--top must be 1 or more")
    paths = args.traces if len(args.traces) == 2 else [args.traces[0]] * 2
    sides = []
    for side, path in enumerate(paths):
        with open_trace(path) as trace:
            name = _run_name(trace, side, args.runs, same=len(args.traces) == 1)
            sides.append((path, name, trace.read_run(name)))
    (path_a, name_a, a), (path_b, name_b, b) = sides
    diff = diff_runs(a, b, top=args.top)
    label_a, label_b = f"{path_a}:{name_a}", f"{path_b}:{name_b}"
    if args.json:
        print(json.dumps({"run_a": label_a, "run_b": label_b, **diff.to_json()}, indent=2))
    else:
        print("\n".join(_text(diff, label_a, label_b, args.top)))
    return 0


def _run_name(trace: Any, side: int, wanted: list[str] | None, same: bool) -> str:
    names = trace.run_names
    if wanted is not None:
        name = wanted[side]
        for candidate in (name, f"plan:{name}"):
            if candidate in names:
                return str(candidate)
        raise no_such_run(trace.path, name, names)
    if not same:
        return str(names[0])
    if len(names) < 2:
        raise CLIError(
            f"{trace.path} has one run ({names[0]}): give a second trace, or record two runs "
            "(ckview record --compare, or --plan)"
        )
    return str(names[side])


def _text(diff: Any, label_a: str, label_b: str, top: int) -> list[str]:
    from ckview.analysis import format_bytes as fb
    from ckview.analysis.diff import describe_kind, describe_moment, held_lines
    from ckview.analysis.units import format_signed_bytes as signed

    share = f" ({100 * diff.delta / diff.a.bytes:+.1f}%)" if diff.a.bytes else ""
    lines = [
        f"A: {label_a}",
        f"B: {label_b}",
        f"peak  A {fb(diff.a.bytes):>10}  {describe_moment(diff.a)}",
        f"      B {fb(diff.b.bytes):>10}  {describe_moment(diff.b)}",
        f"      B - A {signed(diff.delta)}{share}",
        "at the peaks, by category:              A           B       B - A",
    ]
    for name, a, b in diff.by_category:
        if a or b:
            lines.append(f"  {name:<24} {fb(a):>11} {fb(b):>11} {signed(b - a):>11}")
    if diff.by_module:
        lines.append("by module (largest changes):")
        for path, a, b in diff.by_module:
            lines.append(f"  {signed(b - a):>11}  {path}  ({fb(a)} -> {fb(b)})")
    if diff.tensors:
        lines.append("by kind of tensor (largest changes; module, op, category, dtype, shape):")
        for t in diff.tensors:
            counts = f"{t.a_count} -> {t.b_count}"
            lines.append(f"  {signed(t.delta):>11}  {describe_kind(t)}  ({counts})")
    for side, held in (("A", diff.held_a), ("B", diff.held_b)):
        if held is not None:
            lines.append(f"what {side} holds at its peak (it has checkpointed regions):")
            lines.extend(held_lines(held, fb, top))
    return lines
