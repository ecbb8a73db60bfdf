"""Whether the recorded steps of a run are alike: a plan is judged on one step standing for all.

NOTE [ Steps that are not alike ]
    A projection replays one recorded step and ``verify`` measures another, in its own run; both
    stand for every step of training only if the steps are alike. Some are not: the first
    iterations of DDP rebuild its gradient buckets (the new ones allocated while the old ones
    are live), an optimizer creates its state lazily, a cache fills. Memory is deterministic on
    one device, so two steps of the same loop in steady state reach the same peak to the byte;
    steps whose peaks differ by more than ``STEADY_TOLERANCE`` (the projection's own bound) are
    reported, naming the steps and the difference, so that a user records with more warm-up
    instead of trusting a plan made on an unusual step. The peak of a step is the highest point
    of the run's timeline within the step's events (``step_segments``); steps marked incomplete
    are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .timeline import memory_timeline, step_segments
from .types import Table
from .units import format_bytes

STEADY_TOLERANCE = 0.005
"""Relative difference of two recorded steps' peaks beyond which they are not alike."""


@dataclass(frozen=True)
class UnlikeSteps:
    """Two recorded steps of a run whose peaks differ beyond ``STEADY_TOLERANCE``."""

    step: int
    """The step (its ``steps`` row) furthest from the last complete step."""
    last: int
    """The last complete step, taken as the steady one."""
    step_peak: int
    last_peak: int

    @property
    def relative(self) -> float:
        """``step_peak`` over ``last_peak``, less one."""
        return self.step_peak / self.last_peak - 1.0 if self.last_peak else float("inf")

    def to_json(self) -> dict[str, int | float]:
        return {
            "step": self.step,
            "last": self.last,
            "step_peak_bytes": self.step_peak,
            "last_peak_bytes": self.last_peak,
            "relative": round(self.relative, 6),
        }

    def describe(self) -> str:
        """One line: which steps differ, by how much, and what to do."""
        step, last = format_bytes(self.step_peak), format_bytes(self.last_peak)
        return (
            f"recorded steps are not alike: step {self.step} peaks at {step}, step {self.last} "
            f"at {last} ({self.relative:+.1%}); the training is not in a steady state yet "
            "(first iterations, lazily created state): record with more --warmup"
        )


def step_peaks(storages: Table, events: Table, steps: Table) -> np.ndarray:
    """The highest live bytes within each step's events (int64; -1 for a step without events)."""
    timeline = memory_timeline(storages, events)
    start, stop = step_segments(steps, len(events["kind"]))
    peaks = np.full(start.size, -1, dtype=np.int64)
    for row, (low, high) in enumerate(zip(start, stop, strict=True)):
        if high > low:  # points low+1 .. high follow the step's events
            peaks[row] = int(timeline.total[low + 1 : high + 1].max())
    return peaks


def unlike_steps(storages: Table, events: Table, steps: Table) -> UnlikeSteps | None:
    """The complete step whose peak differs most from the last complete step's, if beyond
    ``STEADY_TOLERANCE`` (NOTE [ Steps that are not alike ]); None when they are alike or
    fewer than two steps are complete."""
    peaks = step_peaks(storages, events, steps)
    rows = np.flatnonzero((np.asarray(steps["complete"]) != 0) & (peaks >= 0))
    if rows.size < 2:
        return None
    last = int(rows[-1])
    differences = np.abs(peaks[rows] - peaks[last])
    worst = int(rows[int(np.argmax(differences))])
    if differences.max() <= STEADY_TOLERANCE * max(int(peaks[last]), 1):
        return None
    return UnlikeSteps(
        step=worst, last=last, step_peak=int(peaks[worst]), last_peak=int(peaks[last])
    )
