"""Entry point of the ``ckview`` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ckview import __version__
from ckview.cli import (
    diff,
    export,
    fit,
    import_,
    plan,
    project,
    record,
    recover,
    summary,
    validate,
    verify,
    view,
)
from ckview.cli.command import split_command
from ckview.cli.errors import EXIT_USAGE, CLIError

VERBS = (
    record,
    summary,
    diff,
    view,
    export,
    import_,
    validate,
    project,
    verify,
    plan,
    fit,
    recover,
)
SCRIPT_VERBS = ("record", "verify")
"""Verbs that run a script: NOTE [ The script's arguments are the script's ] in command.py."""
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
    for sub in verbs.choices.values():
        sub.allow_abbrev = False  # `--step 3` is not `--steps 3`: say so instead of guessing
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; for a verb that runs a script, only ckview's options go to argparse and
    the script's arguments are kept apart, unchanged (``args.target``, ``args.module``,
    ``args.args``)."""
    sub = _verb_parsers(parser).get(argv[0]) if argv and argv[0] in SCRIPT_VERBS else None
    if sub is None:
        return parser.parse_args(argv)
    command = split_command(argv[1:], sub)
    args = parser.parse_args([argv[0], *command.options])
    args.target, args.module, args.args = command.target, command.module, command.args
    return args


def _verb_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ckview`` command line; return the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 0
    args = parse_args(parser, _with_verb(argv))
    from ckview.trace.errors import TraceError
    from ckview.trace.text import printable

    try:
        _recover_what_is_read(args)
        return int(args.handler(args))
    except (CLIError, TraceError) as exc:
        # Messages may quote names from a trace: NOTE [ Strings from a trace are escaped once,
        # by the reader ] covers what the reader hands out; this covers the rest (HDF5 names).
        print(f"ckview: error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # ClosingInterrupted says what is kept and how to get it
        detail = f" {exc}" if str(exc) else ""
        print(f"ckview: interrupted{detail}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `ckview summary t.h5 | head`: the reader left; say nothing more (Python docs' recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _recover_what_is_read(args: argparse.Namespace) -> None:
    """A trace about to be read that a killed recording left as a journal is rebuilt first
    (ckview/cli/recover.py)."""
    if args.verb in ("record", "verify", "recover"):
        return
    if getattr(args, "trace", None) is not None:
        args.trace = recover.recover_stale(args.trace)
    if getattr(args, "traces", None):
        args.traces = [recover.recover_stale(path) for path in args.traces]


def _with_verb(argv: list[str]) -> list[str]:
    """``ckview TRACE…`` means ``ckview view TRACE…`` (a first argument that names a trace)."""
    if argv and argv[0].lower().endswith(TRACE_SUFFIXES):
        return ["view", *argv]
    return argv


if __name__ == "__main__":
    sys.exit(main())
