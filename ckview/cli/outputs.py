"""What a verb may write to: never one of its inputs, never a file that is not its own kind.

NOTE [ Never destroy a user's file ]
A verb's output path is checked before anything runs:
- it must not be one of the verb's inputs (the script, a plan file, a trace read): writing
  there would replace the user's file with ours (``ckview record -o train.py train.py`` once
  replaced the script with the trace);
- ``record``/``verify`` write traces: an existing file there must be a ckview trace (or empty);
  any other file is refused, the user deletes or moves it first (there is no ``--force``: a
  flag that destroys a file is one typo away from destroying the wrong one).
The trace itself is written beside the target and replaces it only if it is at least as good
(NOTE [ Writing beside the target ] in ckview/trace/staging.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ckview.cli.errors import CLIError


def refuse_inputs(output: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]]) -> None:
    """CLIError if ``output`` names the same file as one of ``inputs`` (NOTE [ Never destroy a
    user's file ])."""
    for given in inputs:
        if _same_file(Path(output), Path(given)):
            raise CLIError(
                f"-o {output} is {given}, an input of this command; writing there would "
                "destroy it: choose another output path"
            )


def refuse_non_trace(output: Path) -> None:
    """CLIError if ``output`` exists and is neither empty nor an HDF5 file (a trace)."""
    import h5py

    if not output.exists() or output.is_dir():
        if output.is_dir():
            raise CLIError(f"-o {output} is a folder; give the path of the trace file to write")
        return
    try:
        if output.stat().st_size == 0 or h5py.is_hdf5(output):
            return
    except OSError as exc:
        raise CLIError(f"cannot read {output}: {exc.strerror or exc}") from None
    raise CLIError(
        f"-o {output} exists and is not a ckview trace; ckview will not overwrite it: "
        "move it away or choose another output path"
    )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()
