"""``ckview import SNAPSHOT.pickle [-o trace.h5]``: a PyTorch memory snapshot as a ckview trace.

The pickle is read without running any code in it (NOTE [ A pickle is code ] in
ckview/snapshot/reading.py), big ones a block at a time (NOTE [ Streaming a snapshot ] in
ckview/snapshot/stream.py), and converted by ``ckview.snapshot.SnapshotConverter``. The trace
is written beside the target and moved over it only once complete, so a failed import never
replaces an existing file.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any

from ckview.cli.errors import CLIError


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "import",
        help="convert a PyTorch memory snapshot (pickle) into a trace",
        description=(
            "Convert a torch.cuda.memory._dump_snapshot() pickle into a ckview trace: one run per "
            "device with every allocation and free of the allocator's history (and their Python "
            "frames), the reserved segments, and the blocks live when the history began. What a "
            "snapshot cannot say (what a block is for, its module) shows as unknown. The pickle "
            "is read as plain data: one that asks to run code is refused."
        ),
    )
    p.add_argument("snapshot", type=Path, metavar="SNAPSHOT", help="a snapshot .pickle file")
    p.add_argument(
        "-o", "--output", type=Path, help="the trace to write (default: SNAPSHOT with .h5)"
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress on stderr (default: when stderr is a terminal)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ckview.snapshot import SnapshotConverter, SnapshotError, read_snapshot

    source: Path = args.snapshot
    if source.is_dir():
        raise CLIError(f"{source} is a directory; pass a snapshot .pickle file")
    if not source.exists():
        raise CLIError(f"cannot read {source} (no such file); check the path")
    output: Path = args.output or source.with_suffix(".h5")
    _check_output(source, output)
    show = _stderr_is_tty() if args.progress is None else args.progress
    gc.disable()  # NOTE [ No cyclic GC while unpickling ]: conversion makes no cycles either
    try:
        converter = SnapshotConverter(str(source))
        rest = read_snapshot(source, converter, _Bar() if show else None)
        staging = _staging_path(output)
        try:
            runs = converter.to_trace(rest, staging, source=str(source))
            replaced = output.exists()
            os.replace(staging, output)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staging)
    except SnapshotError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"cannot write {output} ({exc.strerror or exc}); check the path") from None
    finally:
        gc.enable()
    print(_report(output, runs, replaced), file=sys.stderr)
    return 0


def _check_output(source: Path, output: Path) -> None:
    if output.suffix.lower() not in (".h5", ".hdf5"):
        raise CLIError(f"the trace {output} must end in .h5; pass -o NAME.h5")
    if source.exists() and output.exists() and os.path.samefile(source, output):
        raise CLIError(f"-o {output} is the snapshot itself; pass another -o NAME.h5")
    folder = output.parent
    if not folder.is_dir():
        raise CLIError(f"cannot write {output}: no directory {folder}")


def _staging_path(output: Path) -> str:
    """A new file beside ``output`` (same file system, so the final move is atomic)."""
    fd, path = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".partial", dir=output.parent)
    os.close(fd)
    return path


def _report(output: Path, runs: list[str], replaced: bool) -> str:
    from ckview.analysis import format_bytes, memory_timeline
    from ckview.trace import open_trace

    parts = []
    with open_trace(output) as trace:
        for name in runs:
            run = trace.run(name)
            tl = memory_timeline(run.table("storages").read(), run.table("memory_events").read())
            parts.append(f"{name}: peak {format_bytes(int(tl.total.max()))}")
    verb = "replaced" if replaced else "wrote"
    quoted = shlex.quote(str(output))
    return f"ckview: {verb} {output} ({'; '.join(parts)}); next: ckview summary {quoted}"


class _Bar:
    """A progress bar on stderr, one line per stage, redrawn at most ten times a second
    (``ckview.snapshot.stream.Stages``).

    The import verb runs no user code, so a redrawn line cannot collide with a script's output
    (NOTE [ Progress on its own line ] in recorder/progress.py does not apply)."""

    def __init__(self) -> None:
        self._last = 0.0
        self._drawn = False  # a line is drawn and not yet ended

    def stage(self, what: str, unit: str, scale: int) -> Callable[[int, int], None]:
        """The progress callback of one stage: ``(done, total)`` in units of ``scale`` (shown
        with a decimal when it is not 1)."""
        digits = 0 if scale == 1 else 1
        self._last = 0.0

        def update(done: int, total: int) -> None:
            now = perf_counter()
            if now - self._last < 0.1 and done < total:
                return
            self._last = now
            self._drawn = True
            share = min(done / total, 1.0) if total else 1.0
            text = f"{done / scale:,.{digits}f}/{total / scale:,.{digits}f} {unit}"
            print(
                f"\rckview: {what:<10} [{'#' * int(30 * share):<30}] {text}",
                end="",
                file=sys.stderr,
                flush=True,
            )

        return update

    def done(self) -> None:
        """End the current stage's line, if one is drawn."""
        if self._drawn:
            print(file=sys.stderr, flush=True)
            self._drawn = False


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
