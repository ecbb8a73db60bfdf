"""``torch.compile`` as a source: compiled code runs eagerly while recorded, and the trace's
``compiled`` field says whether the script uses it (NOTE [ torch.compile under the recorder ] in
recorder/compiled.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recorder.compiled import EagerWhileRecording
from recorder.modules import ModuleRegistry
from recorder.sources.base import RunPart
from recorder.tables import RunTables


class CompiledSource:
    """Forces compiled code eager while installed; meta ``compiled``."""

    def __init__(self, registry: ModuleRegistry) -> None:
        self._registry = registry
        self._eager = EagerWhileRecording()

    def install(self) -> Callable[[], None]:
        self._eager.install()
        return self._eager.uninstall

    def begin_run(self, run: RunTables) -> None:
        pass

    def step_begins(self, now: int) -> None:
        pass

    def step_ends(self, now: int) -> None:
        pass

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        return RunPart()

    def meta(self) -> dict[str, Any]:
        """'eager' if the script uses ``torch.compile`` (its compiled code ran eagerly while
        recording), else 'no'."""
        used = self._eager.compile_used or self._registry.saw_compiled()
        return {"compiled": "eager" if used else "no"}
