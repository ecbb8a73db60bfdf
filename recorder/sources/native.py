"""The native extension as the source of ops and allocator blocks (``CKVIEW_RECORDER=native``;
NOTE [ The native ledger ] in recorder/native_ledger.py): it replaces the dispatch mode and the
allocator's profiler windows. The extension's hooks come from ``NativeSource``; each step
boundary hands the drained rows to the ledger, which writes them into the run's tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from recorder.native.source import NativeSource
from recorder.oom import OomNote
from recorder.sources.base import RunPart
from recorder.tables import RunTables


class StepRows(Protocol):
    """What writes the drained rows into the run's tables (``NativeLedger``, a layer above)."""

    def step_begins(self) -> None: ...

    def step_ends(self, now: int) -> None: ...

    def failure(self, error: str) -> OomNote | None: ...


class NativeRowsSource:
    """Install the extension's hooks; drain and write its rows at each step boundary."""

    def __init__(self, ext: Any, ledger: StepRows, on_oom: Callable[[OomNote], None]) -> None:
        self._native = NativeSource(ext, lambda kind, facts: None, outputs=True)
        self._ledger = ledger
        self._on_oom = on_oom

    def install(self) -> Callable[[], None]:
        return self._native.install()

    def quiet(self) -> None:
        self._native.quiet()

    def begin_run(self, run: RunTables) -> None:
        self._native.begin_run()

    def step_begins(self, now: int) -> None:
        self._ledger.step_begins()

    def step_ends(self, now: int) -> None:
        self._ledger.step_ends(now)

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        """The rows since the last boundary (a step the script failed in) are written too,
        and an allocation failure that ended the run is handed to ``on_oom`` (NOTE [ OOM
        capture on the native path ] in recorder/native_ledger.py)."""
        self._ledger.step_ends(now)
        self._native.end_run()
        note = self._ledger.failure(error) if error else None
        if note is not None:
            self._on_oom(note)
        return RunPart()

    def meta(self) -> dict[str, Any]:
        return {**self._native.meta(), "allocator_events": "allocator"}
