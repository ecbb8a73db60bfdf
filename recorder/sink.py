"""Where recorded rows go: the trace (HDF5, written in batches) and the recording's journal
(one record per step, NOTE [ The recording journal ] in ckview/trace/journal.py).

NOTE [ When the trace cannot be written ]
A full disk, or a script that closed the trace's file descriptor and opened another file at its
number, makes writing the trace fail. The first failure is kept in ``write_error``, the HDF5
file is never written again (the script runs on, its steps still go to the journal while it can
be written) and at close the trace is rebuilt from the journal: every step journaled before the
failure is kept, in a trace marked incomplete.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ckview.trace import TraceWriter
from ckview.trace.errors import TraceError
from ckview.trace.journal import (
    RAW,
    ROWS,
    JournalWriter,
    discard_journal,
    journal_path,
    recover_journal,
    room_for,
)
from ckview.trace.staging import settle, staging_path
from recorder.tables import Flags, RunTables

_WRITE_ERRORS = (OSError, RuntimeError, TraceError)
"""What writing the trace raises when the disk is full or the file was closed under it."""
Columns = dict[str, np.ndarray]


class TraceSink:
    """The trace beside ``path`` and its journal, open from construction to :meth:`close`.

    Raises OSError when either cannot be created.
    """

    def __init__(self, path: Path, meta: Mapping[str, Any], flags: Flags) -> None:
        self.path = path
        self._flags = flags
        self._staging = staging_path(path)
        self.journal = journal_path(self._staging)
        """The recording's journal (NOTE [ The recording journal ]): removed once the trace is
        written; kept if the trace could not be rebuilt from it (a full disk)."""
        self.written: Path | None = None
        """Where the trace went once closed (NOTE [ Writing beside the target ])."""
        self.write_error: str | None = None
        """Why writing the trace failed (NOTE [ When the trace cannot be written ])."""
        self.recovered_steps: int | None = None
        """Steps of the trace rebuilt from the journal after a write failure."""
        self.writer: TraceWriter | None = TraceWriter(self._staging, meta=meta)
        try:
            self._journal: JournalWriter | None = JournalWriter(self.journal, meta)
        except OSError:
            self.writer.close(complete=False, error="cannot write the journal")
            self._staging.unlink(missing_ok=True)
            raise
        self._tables: RunTables | None = None
        self._run: Any = None
        self._journal_strings = 0
        self._journal_modules: Columns = {}

    def intern(self, s: str) -> int:
        assert self.writer is not None
        return self.writer.intern(s)

    def begin_run(self, name: str) -> None:
        """The trace's run ``name`` begins; :meth:`tables` hold its rows."""
        assert self.writer is not None
        self._run = self.writer.run(name)
        self._tables = RunTables(name, self.sink, self.intern, self.patch)

    @property
    def tables(self) -> RunTables:
        assert self._tables is not None, "no run begun"
        return self._tables

    def sink(self, table: str, columns: Columns) -> None:
        """Write a batch, turning absolute ``perf_counter_ns`` times into times since start."""
        self._since_start(columns)
        self.write(self._run.append, table, columns)

    def patch(self, table: str, rows: np.ndarray, columns: Columns) -> None:
        """Write rows ``rows`` of ``table`` again (NOTE [ Kept rows ] in
        recorder/storage_rows.py)."""
        self._since_start(columns)
        self.write(self._run.patch, table, rows, columns)

    def _since_start(self, columns: Columns) -> None:
        t0 = self.tables.t0
        for name, col in columns.items():
            if name.endswith("_ns"):
                np.subtract(col, t0, out=col, where=col >= 0)

    def write(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``write`` (a TraceWriter method) unless writing failed already; a failure is
        kept in ``write_error`` (NOTE [ When the trace cannot be written ])."""
        if self.write_error is not None or self.writer is None:
            return
        self._flags.busy, busy = True, self._flags.busy
        try:
            self.writer.check_file()
            write(*args, **kwargs)
        except _WRITE_ERRORS as exc:
            self.write_error = _describe_write_error(exc)
            self.writer.abandon()  # nothing more goes to it
        finally:
            self._flags.busy = busy

    def set_run_attrs(self, **attrs: Any) -> None:
        self.write(self._run.set_attrs, **attrs)

    def close_run(self, complete: bool) -> None:
        self.write(self._run.close, complete=complete)

    def flush_file(self) -> None:
        """Put what was written on disk (the journal keeps it too)."""
        if self.writer is not None:
            self.write(self.writer.flush)

    def fileno(self) -> int:
        """The trace's file descriptor, -1 once closed."""
        return self.writer.fileno() if self.writer is not None else -1

    # ------------------------------------------------------------------------- journal

    def journal_step(self, modules: Columns, attrs: dict[str, Any], meta: dict[str, Any]) -> None:
        """Append the step that just ended to the journal (NOTE [ The recording journal ]):
        the run's rows since the last record, raw (NOTE [ Raw rows in the journal ]), the
        ``modules`` table's changes, new strings."""
        journal, writer, tables = self._journal, self.writer, self.tables
        appended = {buf.table: buf.take_rows() for buf in tables.appended}  # taken also
        if journal is None or writer is None:  # without a journal: they are not kept then
            return
        blocks: dict[str, str] = {}
        arrays: Columns = {}
        for table, raw in appended.items():
            if len(raw):
                blocks[table] = "append-raw"
                arrays[f"{table}/{RAW}"] = raw
        for mutable in tables.editable:
            rows, raw = mutable.take_changes()
            if len(rows):
                blocks[mutable.table] = "rows-raw"
                arrays[f"{mutable.table}/{ROWS}"] = rows
                arrays[f"{mutable.table}/{RAW}"] = raw
        if modules is not self._journal_modules:  # the registry's table, unchanged: no rows
            _add_rows(blocks, arrays, "modules", *_changed(self._journal_modules, modules))
            self._journal_modules = modules
        strings = writer.strings_since(self._journal_strings)
        self._journal_strings += len(strings)
        header = {
            "kind": "step",
            "run": tables.name,
            "t0": tables.t0,
            "attrs": attrs,
            "meta": meta,
            "strings": strings,
            "blocks": blocks,
        }
        if self.write_error is not None:
            return  # the journal's last record is the last step kept: room to rebuild it
        try:
            journal.append(header, arrays)
        except OSError as exc:  # a full disk: the steps journaled so far are what is kept
            self._close_journal()
            self.write_error = _describe_write_error(exc)
            writer.abandon()

    def journal_timing(self, run: str, tables: dict[str, dict[str, list[int]]]) -> None:
        """Put a run's kept timing steps in the journal, whole (a few rows), so that a recording
        killed during its timing steps keeps those already timed."""
        journal = self._journal
        if journal is None or self.write_error is not None:
            return
        blocks: dict[str, str] = {}
        arrays: Columns = {}
        for table, columns in tables.items():
            data = {name: np.asarray(col, dtype=np.int64) for name, col in columns.items()}
            _add_rows(blocks, arrays, table, np.arange(_length(data)), data)
        header = {"kind": "timing", "run": run, "strings": [], "meta": {}, "blocks": blocks}
        try:
            journal.append(header, arrays)
        except OSError:  # a full disk: the recorded steps are in the journal already
            self._close_journal()

    # ------------------------------------------------------------------------- close

    def close(self, error: str) -> None:
        """Close the trace and settle it (NOTE [ Writing beside the target ] in
        ckview/trace/staging.py): incomplete with ``error``."""
        writer = self.writer
        if writer is None:
            return
        try:
            if self.write_error is None:
                self.write(writer.close, complete=not error, error=error)
        finally:
            self.writer = None
            self._settle(writer, error)

    def _settle(self, writer: TraceWriter, error: str) -> None:
        """Put the closed trace where it belongs; after a write failure, the trace rebuilt from
        the journal (NOTE [ When the trace cannot be written ])."""
        self._close_journal()
        if self.write_error is None:
            self.written = settle(self._staging, self.path, good=not error)
            discard_journal(self.journal)
            return
        writer.abandon()
        self._staging.unlink(missing_ok=True)  # frees the room the rebuilt trace needs
        why = f"{self.write_error}; the steps recorded before are kept"
        if not room_for(self.journal):
            return  # the journal stays, for ckview recover once there is room
        try:
            recovered = recover_journal(self.journal, self._staging, why)
        except (OSError, RuntimeError, TraceError):
            return  # the journal stays, for ckview recover once there is room
        self.recovered_steps = recovered.steps
        self.written = settle(self._staging, self.path, good=False)
        discard_journal(self.journal)

    def _close_journal(self) -> None:
        """No more records (NOTE [ Syncing the journal ] in ckview/trace/journal.py)."""
        journal, self._journal = self._journal, None
        if journal is not None:
            journal.close()

    def forget_in_child(self) -> None:
        """In a forked child (a DataLoader worker): the trace and the journal are the
        parent's (their sync thread too: it is not stopped here)."""
        if self.writer is not None:
            self.writer.forget_in_child()
        self.writer = None
        self._journal = None


def _describe_write_error(exc: BaseException) -> str:
    """One line: why the trace could not be written."""
    if isinstance(exc, TraceError):
        return str(exc)
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.ENOSPC or "errno = 28" in text or "No space left" in text:
        return "the disk is full (no space left on device)"
    if code == errno.EBADF or "errno = 9" in text:
        return "the script closed the trace's file"
    return f"writing the trace failed ({' '.join(text.split())[:200]})"


def _length(columns: Columns) -> int:
    return len(next(iter(columns.values())))


def _add_rows(
    blocks: dict[str, str], arrays: Columns, table: str, rows: np.ndarray, columns: Columns
) -> None:
    """Add a changed-rows block of ``table`` to a journal record, if any row changed."""
    if len(rows):
        blocks[table] = "rows"
        arrays[f"{table}/{ROWS}"] = rows
        arrays.update({f"{table}/{name}": col for name, col in columns.items()})


def _changed(before: Columns, now: Columns) -> tuple[np.ndarray, Columns]:
    """The rows of ``now`` that are new or differ from ``before``, and their columns."""
    seen = len(next(iter(before.values()))) if before else 0
    count = len(next(iter(now.values())))
    differs = np.zeros(seen, bool)
    for name, col in now.items() if seen else ():
        differs |= col[:seen] != before[name]
    rows = np.concatenate((np.flatnonzero(differs), np.arange(seen, count)))
    return rows, {name: col[rows] for name, col in now.items()}
