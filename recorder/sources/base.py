"""The protocol every event source of the recorder follows.

NOTE [ Sources ]
A source adds rows or fields to the trace around the recorder's own op, storage and module
rows. The Recorder calls every source at the same moments, in the order they were given:
``install`` once when recording is set up (it returns its undo, called when the recorder is
removed); ``begin_run`` when a run's tables are fresh; ``step_begins`` and ``step_ends`` at each
recorded step's boundaries; ``end_run`` when the run is written (it returns the run's tables and
attributes the source adds); ``meta`` for the trace's meta fields, journaled with each step and
written when recording ends. A new source needs no edit in the Recorder: pass it in
``Recorder(sources=...)``. A source whose hooks run on every module call or saved tensor also
has ``quiet`` (``HooksEveryCall``), called once every run is recorded (NOTE [ Quiet timing
steps ] in recorder/timing.py). Per-op work stays out of the protocol (the hot path calls what
it needs directly: NOTE [ Hot-path buffers ] in recorder/buffers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from recorder.tables import RunTables


@dataclass
class RunPart:
    """What a source adds to a run when it ends: whole tables and run attributes."""

    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


class Source(Protocol):
    """An event source (NOTE [ Sources ])."""

    def install(self) -> Callable[[], None]:
        """Start listening; returns the undo."""
        ...

    def begin_run(self, run: RunTables) -> None: ...

    def step_begins(self, now: int) -> None: ...

    def step_ends(self, now: int) -> None: ...

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        """The run ends (``error``: why it is incomplete, '' if it is not) at ``now``."""
        ...

    def meta(self) -> dict[str, Any]:
        """The trace's meta fields this source fills."""
        ...


@runtime_checkable
class HooksEveryCall(Protocol):
    """A source whose hooks run on every module call or saved tensor: they come off when the
    plain timing steps begin (NOTE [ Quiet timing steps ] in recorder/timing.py)."""

    def quiet(self) -> None: ...


def nothing_to_undo() -> None:
    """The undo of a source that patches nothing."""
