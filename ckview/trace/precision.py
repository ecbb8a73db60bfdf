"""How precise a trace's plain timing steps are: the rule the recorder follows while it takes
them and the readers that show their figures check (``ckview verify``). Pure Python: the
recorder imports it without numpy's help, and ``ckview.trace`` is below both.

NOTE [ Enough plain steps ]
    Plain timing steps come in rounds, each run once per round (NOTE [ Plain timing steps ] in
    recorder/timing.py). What verify reads from them is a difference: a plan run's step minus
    the baseline's (the first run's). It is taken round by round, paired, so that a slow moment
    of the machine, which hits both steps of a round alike, cancels out; the measured extra time
    is the median of the paired differences, and its spread is the median's 95% confidence
    interval from order statistics (distribution-free: the ranks n/2 -/+ 0.98 sqrt(n), widened
    to whole ranks; with 5 rounds or fewer that is the lowest to the highest difference, which
    holds the median with a probability of 1 - 2**(1 - n): 94% with 5 rounds, only 75% with 3,
    so fewer than ``MIN_ROUNDS`` rounds never count as precise).

    A run is timed precisely enough when half that interval is within ``TARGET_SHARE`` of its
    median difference or ``FLOOR_SHARE`` of the baseline's median step, whichever is wider (the
    floor lets a plan that costs nothing, and the baseline itself, settle). The recorder takes
    the rounds asked for, then one more round at a time until every run is precise enough or
    ``MAX_ROUNDS`` are taken; a script that ends first keeps what was timed, and verify says how
    many rounds the target would need: the interval narrows as 1/sqrt(rounds), so about
    ``rounds * (half / allowed)**2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TARGET_SHARE = 0.10
"""Half the interval of a measured extra time, as a share of it."""
FLOOR_SHARE = 0.02
"""... or as a share of the baseline's median step, whichever allows more."""
MIN_ROUNDS = 5
"""Fewer rounds are never precise enough: their interval is not one of 95% (NOTE)."""
MAX_ROUNDS = 15
"""The recorder takes no more rounds than this, precise or not."""
NEEDED_CAP = 1000
"""``rounds_needed`` says no more than this (a spread far off its target needs "many")."""


@dataclass(frozen=True)
class Interval:
    """The median of paired differences, with its 95% confidence interval."""

    median: float
    low: float
    high: float
    rounds: int

    @property
    def half(self) -> float:
        return (self.high - self.low) / 2


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (the mean of the two middle ones for an even count)."""
    v = sorted(values)
    n = len(v)
    return float(v[n // 2]) if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def median_interval(values: Sequence[float]) -> Interval | None:
    """NOTE [ Enough plain steps ]: the median of ``values`` and its 95% interval; None if
    there are none."""
    v = sorted(values)
    n = len(v)
    if not n:
        return None
    low, high = interval_ranks(n)
    return Interval(median(v), float(v[low]), float(v[high]), n)


def interval_ranks(n: int) -> tuple[int, int]:
    """The ranks (0-based, in sorted order) that bound the 95% interval of the median of ``n``
    values (NOTE [ Enough plain steps ]); ``n`` is at least 1."""
    reach = 0.98 * math.sqrt(n)
    return max(0, math.floor(n / 2 - reach)), min(n - 1, math.ceil(n / 2 + reach) - 1)


def paired(base: Sequence[float], run: Sequence[float]) -> list[float]:
    """``run - base`` round by round, over the rounds both have."""
    return [r - b for b, r in zip(base, run, strict=False)]


def allowed_half(interval: Interval, base_step: float) -> float:
    """The widest half-interval that counts as precise (NOTE [ Enough plain steps ])."""
    return max(TARGET_SHARE * abs(interval.median), FLOOR_SHARE * base_step)


def rounds_needed(interval: Interval, base_step: float) -> int:
    """Rounds that would bring ``interval`` within the target (its own count if it is)."""
    allowed = allowed_half(interval, base_step)
    if interval.half <= allowed:
        return max(interval.rounds, MIN_ROUNDS)
    if allowed <= 0:
        return NEEDED_CAP
    needed = math.ceil(interval.rounds * (interval.half / allowed) ** 2)
    return min(NEEDED_CAP, max(MIN_ROUNDS, needed))


def precise_enough(steps: Sequence[Sequence[float]]) -> bool:
    """Whether the kept timing steps of each run (by round; the first run is the baseline) are
    precise enough to stop (NOTE [ Enough plain steps ])."""
    if not steps or not steps[0]:
        return False
    base_step = median(steps[0])
    diffs = [paired(steps[0], run) for run in steps[1:]] or [
        [s - base_step for s in steps[0]]  # a single run: its own steps around their median
    ]
    for d in diffs:
        interval = median_interval(d)
        if interval is None or rounds_needed(interval, base_step) > interval.rounds:
            return False
    return True
