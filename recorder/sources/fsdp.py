"""FSDP's storage resizes as a source: FSDP frees and re-allocates unsharded parameters by
resizing their storages, without an op (NOTE [ FSDP's storages ] in recorder/ledger.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recorder._torch import follow_fsdp_resizes
from recorder.sources.base import RunPart
from recorder.tables import RunTables


class FsdpSource:
    """Calls ``resized(fsdp_param)`` after each resize, once FSDP is in use: the script has
    built its model by the first recorded step."""

    def __init__(self, resized: Callable[[Any], None]) -> None:
        self._resized = resized
        self._undo: Callable[[], None] | None = None
        self._tried = False

    def install(self) -> Callable[[], None]:
        return self._uninstall

    def _uninstall(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def begin_run(self, run: RunTables) -> None:
        pass

    def step_begins(self, now: int) -> None:
        if not self._tried:
            self._undo = follow_fsdp_resizes(self._resized)
            self._tried = self._undo is not None

    def step_ends(self, now: int) -> None:
        pass

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        return RunPart()

    def meta(self) -> dict[str, Any]:
        return {}
