"""Errors that the CLI reports as one line and exit code 2."""

from collections.abc import Sequence
from os import PathLike


class CLIError(Exception):
    """Bad input from the user: the message says what is wrong and what to do."""


def no_such_run(path: str | PathLike[str], name: str, names: Sequence[str]) -> CLIError:
    """The error for a run ``name`` that the trace at ``path`` (with runs ``names``) lacks."""
    return CLIError(f"{path} has no run {name!r}; runs: {', '.join(names) or 'none'}")


def pick_run(path: str | PathLike[str], names: Sequence[str], wanted: str | None) -> str:
    """The run to plan or project on: ``wanted``, else 'baseline', else 'main'."""
    if wanted is not None:
        if wanted not in names:
            raise no_such_run(path, wanted, names)
        return wanted
    for name in ("baseline", "main"):
        if name in names:
            return name
    raise CLIError(
        f"{path} has neither a 'baseline' nor a 'main' run; runs: {', '.join(names) or 'none'} "
        "(pick one with --run)"
    )


EXIT_USAGE = 2
