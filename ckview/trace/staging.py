"""Where a recording is written, and where it ends up.

NOTE [ Writing beside the target ]
A recording never destroys a good trace at its target path. It is written to a file beside the
target (same folder, so that the final move is an atomic ``os.replace``), named
``NAME.recording-PID.h5`` (with its journal, NOTE [ The recording journal ] in journal.py).
When the recorder closes:
- a good recording (complete, at least one step, and valid per ``validate_trace``) replaces the
  target;
- a failed one (the script failed or was interrupted, or no step was recorded) takes the
  target's place only if there is no trace there at least as good: none, an unreadable file,
  or an incomplete trace with fewer steps; otherwise it is kept beside as
  ``NAME.incomplete.h5`` and the target is left as it was. ``Recorder.written`` says where it
  went. (A file there that is not a trace at all is refused before recording: NOTE [ Never
  destroy a user's file ] in ckview/cli/outputs.py.)
- With no file at the target, the recording goes there whatever it holds, so it is neither
  validated nor opened (validating a 200-step small-op recording cost about 0.15 s at its end,
  0.08x of its all-in time per step).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import TraceError
from .reader import open_trace
from .validate import validate_trace


def staging_path(target: Path) -> Path:
    """The file a recording for ``target`` is written to until it is settled."""
    return target.with_name(f"{_stem(target)}.recording-{os.getpid()}{_suffix(target)}")


def incomplete_path(target: Path) -> Path:
    """Where a failed recording goes when ``target`` holds a good trace."""
    return target.with_name(f"{_stem(target)}.incomplete{_suffix(target)}")


def settle(staging: Path, target: Path, good: bool) -> Path:
    """Move the closed recording at ``staging`` to where it belongs (NOTE [ Writing beside the
    target ]); return that path."""
    if not target.exists():  # the recording goes there, whatever it holds: nothing to compare
        os.replace(staging, target)
        return target
    if good and not _is_valid(staging):
        good = False
    better_there = not good and (_is_good(target) or _steps(target) > _steps(staging))
    destination = incomplete_path(target) if better_there else target
    os.replace(staging, destination)
    return destination


def _is_valid(path: Path) -> bool:
    try:
        return validate_trace(path).ok
    except TraceError:
        return False


def _steps(path: Path) -> int:
    """Steps recorded in the trace at ``path``; -1 if there is none or it does not open."""
    if not path.exists():
        return -1
    try:
        with open_trace(path) as trace:
            return int(trace.meta.steps_recorded)
    except (TraceError, OSError):
        return -1


def _is_good(path: Path) -> bool:
    """Whether ``path`` holds a complete, readable trace (one a failed recording must keep)."""
    if not path.exists():
        return False
    try:
        with open_trace(path) as trace:
            return bool(trace.meta.complete) and trace.meta.steps_recorded > 0
    except (TraceError, OSError):
        return False


def _stem(target: Path) -> str:
    return target.stem if target.suffix else target.name


def _suffix(target: Path) -> str:
    return target.suffix or ".h5"
