"""Entry point of the ``ckview`` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ckview import __version__
from ckview.cli import export, plan, project, record, summary, validate, verify, view
from ckview.cli.errors import EXIT_USAGE, CLIError

VERBS = (record, summary, view, export, validate, project, verify, plan)
TRACE_SUFFIXES = (".h5", ".hdf5")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckview",
        description="Record a PyTorch training step, see what fills memory, plan checkpointing.",
    )
    parser.add_argument("--version", action="version", version=f"ckview {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        verb.add_parser(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ckview`` command line; return the process exit code."""
    args = build_parser().parse_args(_with_verb(sys.argv[1:] if argv is None else list(argv)))
    from ckview.trace.errors import TraceError

    try:
        return int(args.handler(args))
    except (CLIError, TraceError) as exc:
        print(f"ckview: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ckview: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `ckview summary t.h5 | head`: the reader left; say nothing more (Python docs' recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _with_verb(argv: list[str]) -> list[str]:
    """``ckview TRACE…`` means ``ckview view TRACE…`` (a first argument that names a trace)."""
    if argv and argv[0].lower().endswith(TRACE_SUFFIXES):
        return ["view", *argv]
    return argv


if __name__ == "__main__":
    sys.exit(main())
