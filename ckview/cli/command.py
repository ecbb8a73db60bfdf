"""Split a launcher's command line as ``python`` splits ``python [OPTIONS] script.py [ARGS...]``.

NOTE [ The script's arguments are the script's ]
``ckview record [OPTIONS] script.py [ARGS...]`` and ``ckview record [OPTIONS] -m module
[ARGS...]`` read like ``python``, ``memray run``, ``torchrun`` and ``python -m cProfile``: the
launcher's options come first, and the first positional (the script), ``-m module`` or a ``--``
followed by the script ends them. Everything after the script goes to it unchanged, ``--``
included, even when it is named like one of the launcher's options (``--steps``, ``-o``, ``-m``).
argparse cannot say this by itself (``nargs=REMAINDER`` swallows a leading ``--`` and lets
options after the script through), so the line is split here, before argparse sees only the
launcher's part. An option that this parser does not know is left among the options (it takes
no value here) for argparse to report.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A command line split at its target."""

    options: list[str]
    """The launcher's own options, as given (for ``argparse``); they include ``-m MODULE``."""
    target: str | None
    """The script, or the module after ``-m``; None if the line names neither."""
    module: bool
    """Whether ``target`` came from ``-m``."""
    args: list[str]
    """Everything after the target, unchanged."""


def split_command(
    argv: Sequence[str], parser: argparse.ArgumentParser, module_options: Collection[str] = ("-m",)
) -> Command:
    """Split ``argv`` (without the program and verb) into the options ``parser`` parses, the
    target and the target's arguments (NOTE [ The script's arguments are the script's ]).

    ``module_options``: options of ``parser`` whose value is a module to run; they end the
    options too. Anything else that takes a value (per ``parser``) consumes the next token.
    """
    argv = list(argv)
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            target = argv[i + 1] if i + 1 < len(argv) else None
            return Command(argv[:i], target, False, argv[i + 2 :])
        if not token.startswith("-") or token == "-":
            return Command(argv[:i], token, False, argv[i + 1 :])
        name, value = _option(token, parser)
        action = parser._option_string_actions.get(name)
        takes_value = action is not None and action.nargs != 0
        if takes_value and value is None and i + 1 < len(argv):
            i += 1
            value = argv[i]
        if name in module_options and value is not None:
            return Command(argv[: i + 1], value, True, argv[i + 1 :])
        i += 1
    return Command(argv, None, False, [])


def _option(token: str, parser: argparse.ArgumentParser) -> tuple[str, str | None]:
    """(option name, value given in the same token or None): ``--out=x``, ``-ox``, ``-mpkg``."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name, value if eq else None
    short = token[:2]
    action = parser._option_string_actions.get(short)
    if len(token) > 2 and action is not None and action.nargs != 0:
        return short, token[2:]
    return token, None


def misplaced_options(script_args: Sequence[str], names: Collection[str]) -> list[str]:
    """The script's arguments named like one of ``names`` (``--steps=3`` too)."""
    ours = set(names) - {"-h", "--help"}
    return [a for a in script_args if a.partition("=")[0] in ours]
