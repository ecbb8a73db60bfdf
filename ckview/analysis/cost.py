"""What a plan does to a run, in the shares every reader words it in: one home for the arithmetic
of ``saving_share`` and ``extra_share`` (the explorer's readout, ``ckview project`` and
``ckview export`` all show them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlanCost:
    """A plan's projected peak against the run's peak, and its extra compute against the step."""

    peak_bytes: int
    """Projected peak with the plan."""
    baseline_peak_bytes: int
    """The run's peak with nothing more checkpointed."""
    extra_compute_ns: int
    """Summed forward time of the recomputes the plan adds."""
    step_ns: int
    """Summed time of the run's recorded steps (plain where it has timing steps)."""

    @property
    def saving_bytes(self) -> int:
        return self.baseline_peak_bytes - self.peak_bytes

    @property
    def saving_share(self) -> float:
        """``saving_bytes`` over the run's peak (0 for an empty run)."""
        return share(self.saving_bytes, self.baseline_peak_bytes)

    @property
    def extra_share(self) -> float:
        """``extra_compute_ns`` over the step time (0 without a timed step)."""
        return share(self.extra_compute_ns, self.step_ns)


def share(part: float, whole: float) -> float:
    """``part / whole``, 0 where ``whole`` is 0."""
    return part / whole if whole else 0.0
