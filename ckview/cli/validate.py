"""``ckview validate``: check that a file is a well-formed ckview trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "validate",
        help="check a trace against the format spec",
        description="Check TRACE against docs/trace-format.md; exit 1 if it breaks the spec.",
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ckview.trace import validate_trace

    report = validate_trace(args.trace)
    for note in report.notes:
        print(f"note: {note}")
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stderr)
    if not report.ok:
        print(
            f"ckview: {args.trace} is not a valid trace ({len(report.problems)} problems)",
            file=sys.stderr,
        )
        return 1
    print(f"{args.trace}: valid ckview trace")
    return 0
