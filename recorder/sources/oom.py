"""Allocation failures as a source: the run that an OOM ended says which op failed, in which
module, asking for how many bytes (NOTE [ OOM capture ] in recorder/oom.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recorder.oom import OomWatch
from recorder.sources.base import RunPart, nothing_to_undo
from recorder.tables import RunTables


class OomSource:
    """The ``oom_*`` attributes of a run that an allocation failure ended."""

    def __init__(self) -> None:
        self._watch = OomWatch()

    def install(self) -> Callable[[], None]:
        return nothing_to_undo

    def begin_run(self, run: RunTables) -> None:
        self._watch.clear()

    def step_begins(self, now: int) -> None:
        pass

    def step_ends(self, now: int) -> None:
        pass

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        return RunPart(attrs=self._watch.attrs(error, run.t0))

    def meta(self) -> dict[str, Any]:
        return {}

    def failed(self, exc: BaseException, op: str, module: Callable[[], str], now: int) -> bool:
        """Note ``exc`` if it is an allocation failure (OomWatch.failed); whether it was one."""
        return self._watch.failed(exc, op, module, now)
