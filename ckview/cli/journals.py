"""The journals that recordings leave beside their target, found by name and process.

A recording of ``NAME.h5`` writes ``NAME.recording-PID.h5`` and its journal
``NAME.recording-PID.journal`` (NOTE [ The recording journal ] in ckview/trace/journal.py): a
journal whose process is gone is a killed recording's (``ckview recover`` and every reading
verb rebuild it), one whose process runs is a recording under way (``record`` refuses to
record into the same file)."""

from __future__ import annotations

import os
import re
from pathlib import Path

JOURNAL = re.compile(r"^(?P<stem>.*)\.recording-(?P<pid>\d+)\.journal$")


def stale_journals(trace: Path) -> list[Path]:
    """Journals of recordings of ``trace`` whose process is gone, oldest first."""
    if trace.suffix == ".journal" or ".recording-" in trace.name:
        match = JOURNAL.match(trace.with_suffix(".journal").name)
        found = [trace.with_suffix(".journal")] if match else []
    else:
        folder = trace.parent if str(trace.parent) else Path(".")
        try:
            found = list(folder.glob(pattern(trace)))
        except OSError:
            return []
    stale = [j for j in found if j.exists() and not alive(pid_of(j))]
    return sorted(stale, key=lambda j: j.stat().st_mtime)


def recording_now(trace: Path) -> Path | None:
    """The journal of a recording of ``trace`` whose process still runs, if any: a second
    recording into the same file would replace the first one's trace when both settle."""
    folder = trace.parent if str(trace.parent) else Path(".")
    try:
        found = sorted(folder.glob(pattern(trace)))
    except OSError:
        return None
    return next((j for j in found if alive(pid_of(j))), None)


def pattern(trace: Path) -> str:
    stem = trace.stem if trace.suffix else trace.name
    return f"{glob_escape(stem)}.recording-*.journal"


def glob_escape(text: str) -> str:
    """``text`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def pid_of(journal: Path) -> int:
    match = JOURNAL.match(journal.name)
    return int(match["pid"]) if match else -1


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()
