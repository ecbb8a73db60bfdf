"""``ckview recover``: turn the journal of a killed recording into a trace.

A recording killed without a chance to close its trace (SIGKILL, the OOM killer, a power cut)
leaves ``NAME.recording-PID.h5`` and its journal ``NAME.recording-PID.journal`` beside the
target (NOTE [ The recording journal ] in ckview/trace/journal.py). ``ckview recover NAME.h5``
rebuilds the trace from the journal (every completed step, marked incomplete) and puts it
where a failed recording goes (NOTE [ Writing beside the target ] in ckview/trace/staging.py).
The verbs that read traces do the same on their own when they are given such a target.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ckview.cli.errors import CLIError
from ckview.cli.journals import JOURNAL, alive, pattern, stale_journals


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "recover",
        help="rebuild the trace of a killed recording from its journal",
        description="Rebuild the trace of a recording that was killed (SIGKILL, out of memory, "
        "power cut) from the journal it left beside the trace: every completed step, marked "
        "incomplete.",
    )
    p.add_argument(
        "traces",
        type=Path,
        nargs="+",
        metavar="TRACE",
        help="the trace the recording was writing (its -o), or the .journal file",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    for path in args.traces:
        journals = [path] if path.suffix == ".journal" else stale_journals(path)
        if path.suffix == ".journal" and not path.exists():
            raise CLIError(f"{path} not found; give the .journal file a killed recording left")
        if not journals:
            raise CLIError(
                f"no killed recording of {path} to recover (no {pattern(path)} beside it)"
            )
        for journal in journals:
            print(recover_one(journal)[0], file=sys.stderr)
    return 0


def recover_stale(trace: Path) -> Path:
    """Recover the journals that killed recordings of ``trace`` left, saying so (one line
    each): a verb about to read ``trace`` calls this first. The path to read then: ``trace``,
    or where the recovered trace went if ``trace`` named a killed recording's own file."""
    read = trace
    for journal in stale_journals(trace):
        try:
            line, written = recover_one(journal)
        except CLIError as exc:
            print(f"ckview: warning: {exc}", file=sys.stderr)
            continue
        print(line, file=sys.stderr)
        if ".recording-" in trace.name:
            read = written
    return read


def recover_one(journal: Path) -> tuple[str, Path]:
    """Rebuild the trace of ``journal`` and settle it; the line that says so, and where."""
    from ckview.trace.errors import TraceError
    from ckview.trace.journal import recover_journal, room_for
    from ckview.trace.staging import settle

    match = JOURNAL.match(journal.name)
    if match is None:
        raise CLIError(f"{journal} is not named like a recording's journal (NAME.recording-PID)")
    pid = int(match["pid"])
    if alive(pid):
        raise CLIError(f"the recording of {journal} is still running (process {pid}); wait for it")
    if not room_for(journal):
        raise CLIError(
            f"no room on the disk of {journal} for the trace rebuilt from it; free some space"
        )
    staging = _staging(journal)
    target = journal.with_name(match["stem"] + staging.suffix)
    rebuilt = staging.with_name(f"{match['stem']}.recovering-{os.getpid()}{staging.suffix}")
    why = f"the recording (process {pid}) ended without closing the trace; recovered"
    try:
        recovery = recover_journal(journal, rebuilt, why)
    except (TraceError, OSError) as exc:
        rebuilt.unlink(missing_ok=True)
        raise CLIError(f"cannot recover {journal}: {exc}") from None
    written = settle(rebuilt, target, good=False)
    staging.unlink(missing_ok=True)
    journal.unlink()
    steps = f"{recovery.steps} step" + ("" if recovery.steps == 1 else "s")
    kept = "" if written == target else f"; {target}, a complete trace, was left as it was"
    line = (
        f"ckview: recovered {steps} of a killed recording (process {pid}) into {written}, "
        f"marked incomplete{kept}"
    )
    return line, written


def _staging(journal: Path) -> Path:
    """The staging trace beside ``journal`` (suffix .h5 unless one with another is there)."""
    others = [p for p in journal.parent.glob(journal.stem + ".*") if p.suffix != ".journal"]
    return others[0] if others else journal.with_suffix(".h5")
