"""What a run's checkpointing was, and recompute where there should be none.

NOTE [ Recompute in a bypassed run ]
    Runs 'baseline' (the script's checkpointing bypassed) and 'plan:<name>' (bypassed, a plan
    in its place) are only what they say if ckpt_runtime.bypass reached all of the script's
    checkpointing. It reaches ``torch.utils.checkpoint``, HF's gradient checkpointing and
    ``ckpt_runtime``; it cannot reach a hand-written ``torch.autograd.Function`` whose
    backward re-runs the forward (the efficient DenseNet of csrhddlam/pytorch-checkpoint, or
    Megatron-style ``CheckpointFunction`` copies). The recorder sees such a recompute anyway: a
    recompute region, or module calls and ops that run forward code inside backward (phase
    RECOMPUTE). In a 'baseline' that is the whole recompute; in a plan run, what lies outside
    the plan's own regions (the plan's recomputes are ckpt_runtime's, marked as regions with an
    id). Either way the run is not the un-checkpointed baseline it claims to be, and the
    comparison says so instead of presenting it as one, once for all the runs that hold it.
    When a plan run holds the same recompute as its baseline (``LeftoverRecompute.same_as``),
    projection and measurement still describe the same step: the plan's regions on top of the
    script's recompute, which both runs hold (the projection keeps what such a Function holds
    outside autograd: NOTE [ Held from outside ] in projection/). That plan is compared like
    for like; what the output must still say is that the baseline is not un-checkpointed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.analysis.types import Table
from ckview.trace.schema import Phase

BYPASSED, PLAN, SCRIPT = "bypassed", "plan", "script"
_MEANING = {
    BYPASSED: "the script's checkpointing bypassed",
    PLAN: "the script's checkpointing bypassed, the plan in its place",
    SCRIPT: "the script's checkpointing as it runs",
}


def run_checkpointing(name: str, attr: str = "") -> str:
    """The run's ``checkpointing`` ("bypassed", "plan", "script"): its attribute (trace format
    v2), else what the recorder's run names mean ('baseline', 'plan:<name>', other)."""
    if attr:
        return attr
    if name == "baseline":
        return BYPASSED
    return PLAN if name.startswith("plan:") else SCRIPT


def describe_checkpointing(checkpointing: str) -> str:
    """A few words saying what a run's checkpointing was."""
    return _MEANING.get(checkpointing, checkpointing or "unknown")


@dataclass(frozen=True)
class LeftoverRecompute:
    """Recompute seen in a run whose checkpointing was bypassed (NOTE [ Recompute in a
    bypassed run ])."""

    regions: int
    """Recompute regions the script's own code ran (not ckpt_runtime's plan regions)."""
    ops: int
    """Ops run as recompute."""
    compute_ns: int
    names: tuple[str, ...]
    """Names of the recomputed regions (module paths or functions), first seen first."""

    def describe(self, *runs: str) -> str:
        """One sentence: what was seen in ``runs`` (this run's figures) and what it means."""
        names = ", ".join(self.names[:3]) + (", ..." if len(self.names) > 3 else "")
        which = f"run {runs[0]!r}" if len(runs) == 1 else f"runs {', '.join(map(repr, runs))}"
        these = "this run is" if len(runs) == 1 else "these runs are"
        return (
            f"{which} still recompute{'s' if len(runs) == 1 else ''} ({self.regions} "
            f"region(s): {names or 'unnamed'}; {self.ops} ops, {self.compute_ns / 1e6:.1f} ms) "
            "although the script's checkpointing was bypassed: the script checkpoints in a way "
            "ckview cannot switch off (a hand-written torch.autograd.Function that recomputes "
            f"in backward?), so {these} not an un-checkpointed baseline; remove that "
            "checkpointing from the script to see the step without it (if the script has none, "
            "a forward checkpointed before the run began was recomputed in it: its steps are "
            "not whole iterations)"
        )

    def same_as(self, other: LeftoverRecompute | None) -> bool:
        """Whether ``other`` is the same recompute (regions, ops, names): NOTE [ Recompute in
        a bypassed run ]."""
        return other is not None and (self.regions, self.ops, self.names) == (
            other.regions,
            other.ops,
            other.names,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "regions": self.regions,
            "ops": self.ops,
            "compute_ns": self.compute_ns,
            "names": list(self.names),
        }


def leftover_recompute(
    tables: Mapping[str, Table], strings: Sequence[str], plan_run: bool = False
) -> LeftoverRecompute | None:
    """The recompute in a bypassed run (``recompute_regions`` and ``ops``), None if there is
    none. In a plan run (``plan_run``) the regions ckpt_runtime marked with an id are the
    plan's and do not count."""
    regions = tables["recompute_regions"]
    ops = tables["ops"]
    region_id = np.asarray(regions["region"], dtype=np.int64)
    script = np.flatnonzero(region_id < 0) if plan_run else np.arange(len(region_id))
    recompute = np.asarray(ops["phase"]) == Phase.RECOMPUTE
    if plan_run:
        recompute &= _outside(regions, region_id >= 0, len(recompute))
    if not script.size and not recompute.any():
        return None
    duration = np.asarray(ops["end_ns"], dtype=np.int64) - np.asarray(ops["start_ns"])
    names = dict.fromkeys(strings[int(n)] for n in np.asarray(regions["name"])[script])
    return LeftoverRecompute(
        regions=int(script.size),
        ops=int(recompute.sum()),
        compute_ns=int(duration[recompute].sum()),
        names=tuple(n for n in names if n),
    )


def _outside(regions: Table, mask: np.ndarray, n_ops: int) -> np.ndarray:
    """(n_ops,) bool: ops outside the op ranges of the ``mask`` regions."""
    inside = np.zeros(n_ops + 1, dtype=np.int64)
    first = np.asarray(regions["first_op"], dtype=np.int64)[mask]
    end = np.asarray(regions["end_op"], dtype=np.int64)[mask]
    end = np.where(end < 0, n_ops, end)
    np.add.at(inside, np.clip(first, 0, n_ops), 1)
    np.add.at(inside, np.clip(end, 0, n_ops), -1)
    return np.cumsum(inside)[:n_ops] == 0


# ----------------------------------------------------------------------------- extra time


@dataclass(frozen=True)
class ExtraTime:
    """Projected vs measured extra time per step (NOTE [ Extra time, like for like ]).

    NOTE [ Extra time, like for like ]
        Measured: the plan run's step minus the baseline's, round by round (paired: the i-th
        kept step of each), and the median of those differences, with its 95% confidence
        interval as the spread (NOTE [ Enough plain steps ] in ckview/trace/precision.py).
        Plain steps are each run's unrecorded timing steps (NOTE [ Plain timing steps ] in
        recorder/timing.py): wall-clock time, everything the plan costs included, without the
        recorder's per-op cost. Projected: per baseline step, the plain forward time of each
        recomputed call (median over the baseline's timing steps, times the share of it the
        replay runs: NOTE [ Early stop ]) plus checkpoint's fixed cost per recomputed call
        (NOTE [ Fixed cost of a checkpoint call ]), measured on this machine. Without timing
        steps, both sides fall back to recorded steps and recorded op times (and say so). A
        projection is a miss when it lies outside the measured interval widened by a quarter of
        the median and 1 ms (timings are noisy on shared CPUs, not by a factor); recorded steps
        are never called a miss. ``rounds_needed`` says how many rounds would have measured it
        precisely enough (NOTE [ Enough plain steps ]).
    """

    projected_ns: int
    measured_ns: int
    low_ns: int
    high_ns: int
    steps: int
    """Rounds both runs have (paired differences)."""
    plain: bool
    """From plain timing steps (else from recorded steps, with the recorder's cost)."""
    rounds_needed: int = 0
    """Rounds that would bring the interval within the target (``steps`` if it is)."""
    projected_low_ns: int | None = None
    projected_high_ns: int | None = None
    """The range the projection's measurements allow, per step (NOTE [ How sure the extra
    time is ] in timing.py); None where unknown."""

    @property
    def precise(self) -> bool:
        """Whether the interval is within the target (NOTE [ Enough plain steps ])."""
        return self.rounds_needed <= self.steps

    @property
    def miss(self) -> bool:
        """Outside the measured spread (plain timing steps only: recorded ones carry the
        recorder's cost)."""
        if not self.plain:
            return False
        margin = max(abs(self.measured_ns) // 4, 1_000_000)
        return not self.low_ns - margin <= self.projected_ns <= self.high_ns + margin

    def to_json(self) -> dict[str, Any]:
        return {
            "projected_ns": self.projected_ns,
            "projected_low_ns": self.projected_low_ns,
            "projected_high_ns": self.projected_high_ns,
            "measured_median_ns": self.measured_ns,
            "measured_low_ns": self.low_ns,
            "measured_high_ns": self.high_ns,
            "spread": "95% confidence interval of the median of paired step differences",
            "steps": self.steps,
            "rounds_needed": self.rounds_needed,
            "precise": self.precise,
            "plain_steps": self.plain,
            "miss": self.miss,
        }


def step_durations(steps: Table) -> np.ndarray:
    """Durations of the run's complete steps: those with an end that ended at a step boundary.

    A step still open when the script ended or failed (``complete`` 0) is left out of every
    per-step figure: its time is only part of a step.
    """
    end = np.asarray(steps["end_ns"], dtype=np.int64)
    start = np.asarray(steps["start_ns"], dtype=np.int64)
    keep = end >= 0
    if "complete" in steps:
        keep &= np.asarray(steps["complete"]) != 0
    return (end - start)[keep]


def extra_time(
    baseline_steps: Sequence[int] | np.ndarray,
    plan_steps: Sequence[int] | np.ndarray,
    projected_ns: int,
    plain: bool,
    projected_range: tuple[int, int] | None = None,
) -> ExtraTime | None:
    """NOTE [ Extra time, like for like ]: ``projected_ns`` per step (with the range its
    measurements allow, if known) against the step times of the two runs, paired step by
    step; None if either has none."""
    from ckview.trace.precision import median, median_interval, paired, rounds_needed

    base = np.asarray(baseline_steps, dtype=np.int64).tolist()
    interval = median_interval(paired(base, np.asarray(plan_steps, dtype=np.int64).tolist()))
    if interval is None:
        return None
    return ExtraTime(
        projected_ns=int(projected_ns),
        measured_ns=round(interval.median),
        low_ns=round(interval.low),
        high_ns=round(interval.high),
        steps=interval.rounds,
        plain=plain,
        rounds_needed=rounds_needed(interval, median(base)),
        projected_low_ns=None if projected_range is None else int(projected_range[0]),
        projected_high_ns=None if projected_range is None else int(projected_range[1]),
    )
