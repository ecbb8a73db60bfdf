"""The native extension as the source of ops and allocator blocks (``CKVIEW_RECORDER=native``;
NOTE [ The native ledger ] in recorder/native_ledger.py): it replaces the dispatch mode and the
allocator's profiler windows. The extension's hooks come from ``NativeSource``; each step
boundary hands the drained rows to the ledger, which writes them into the run's tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from recorder.native.source import NativeSource
from recorder.sources.base import RunPart
from recorder.tables import RunTables


class StepRows(Protocol):
    """What writes the drained rows into the run's tables (``NativeLedger``, a layer above)."""

    def step_begins(self) -> None: ...

    def step_ends(self, now: int) -> None: ...


class NativeRowsSource:
    """Install the extension's hooks; drain and write its rows at each step boundary."""

    def __init__(self, ext: Any, ledger: StepRows) -> None:
        self._native = NativeSource(ext, lambda kind, facts: None, outputs=True)
        self._ledger = ledger

    def install(self) -> Callable[[], None]:
        return self._native.install()

    def begin_run(self, run: RunTables) -> None:
        self._native.begin_run()

    def step_begins(self, now: int) -> None:
        self._ledger.step_begins()

    def step_ends(self, now: int) -> None:
        self._ledger.step_ends(now)

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        self._native.end_run()  # the ledger drained the rows at the last step's end
        return RunPart()

    def meta(self) -> dict[str, Any]:
        return {**self._native.meta(), "allocator_events": "allocator"}
