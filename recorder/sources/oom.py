"""Allocation failures as a source: the run that an OOM ended says which op failed, in which
module, asking for how many bytes (NOTE [ OOM capture ] in recorder/oom.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recorder._torch import hear_cuda_oom
from recorder.oom import OomNote, OomWatch
from recorder.sources.base import RunPart
from recorder.tables import RunTables


class OomSource:
    """The ``oom_*`` attributes of a run that an allocation failure ended."""

    def __init__(self) -> None:
        self._watch = OomWatch()
        self._unhear: Callable[[], None] | None = None

    def install(self) -> Callable[[], None]:
        def undo() -> None:
            if self._unhear is not None:
                self._unhear()
                self._unhear = None

        self._hear()
        return undo

    def begin_run(self, run: RunTables) -> None:
        self._watch.clear()

    def step_begins(self, now: int) -> None:
        if self._unhear is None:  # the script may have initialised CUDA since
            self._hear()

    def _hear(self) -> None:
        """Take CUDA's exact bytes of a failed allocation (NOTE [ OOM capture ])."""
        self._unhear = hear_cuda_oom(self._watch.observed)

    def step_ends(self, now: int) -> None:
        pass

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        return RunPart(attrs=self._watch.attrs(error, run.t0))

    def meta(self) -> dict[str, Any]:
        return {}

    def failed(self, exc: BaseException, op: str, module: Callable[[], str], now: int) -> bool:
        """Note ``exc`` if it is an allocation failure (OomWatch.failed); whether it was one."""
        return self._watch.failed(exc, op, module, now)

    def noted(self, note: OomNote) -> None:
        """An allocation failure the native path found after the fact (OomWatch.noted)."""
        self._watch.noted(note)
