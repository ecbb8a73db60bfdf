"""The runs of a recording and the states a recording goes through."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from typing import Any


class State(Enum):
    WARMUP = "warmup"
    RECORDING = "recording"
    TIMING = "timing"  # unrecorded plain steps of each run, after all are recorded (timing.py)
    BETWEEN_RUNS = "between runs"  # a run ended, the next begins at once (same step boundary)
    DONE = "done"


@dataclass(frozen=True)
class RunSpec:
    """One run of the recording: its name and what to change while it is recorded.

    ``context(recorder)`` returns a context manager entered at the step boundary where the run
    begins and left where it ends (e.g. ``ckpt_runtime.bypass()`` for the baseline, or applying
    a checkpoint plan to the recorder's :meth:`Recorder.main_model`).
    """

    name: str
    context: Callable[[Any], AbstractContextManager[Any]] | None = None
    checkpointing: str = "script"
    """What the run does with the script's own checkpointing (schema.CHECKPOINTING)."""


class StopScript(BaseException):
    """Raised into the user's script when ``stop_after`` is set and all steps are recorded.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it. With
    arguments it is an abort with a reason, which ``run_script`` passes on to its caller.
    """
