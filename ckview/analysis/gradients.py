"""The gradient gate's verdicts: does each plan keep the un-checkpointed step's loss and
gradients? (NOTE [ The gradient gate ] in recorder/gradient_gate.py, which compares them; this
module reads its result and words it.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GradientCheck:
    """One plan's step against the un-checkpointed one; ``equal`` None: not checked."""

    equal: bool | None
    max_abs_diff: float | None = None
    """The largest difference over the loss and every gradient; None where two values cannot be
    compared (a gradient on one side only, another shape or dtype), or not checked."""
    first_differing: str | None = None
    """The first entry (``loss``, then parameters in the model's order) that differs beyond the
    tolerance."""
    first_diff: float | None = None
    """That entry's own largest difference (None: cannot be compared)."""
    why_not: str = ""
    """Why the plan was not checked; '' if it was."""

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GradientCheck:
        """From a comparison of the gate's result (recorder/gradient_gate.py)."""
        if doc.get("why_not"):
            return cls(None, why_not=str(doc["why_not"]))
        return cls(
            bool(doc["equal"]),
            doc.get("max_abs_diff"),
            doc.get("first_differing"),
            doc.get("first_diff"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": self.equal is not None,
            "equal": self.equal,
            "max_abs_diff": self.max_abs_diff,
            "first_differing": self.first_differing,
            "first_differing_abs_diff": self.first_diff,
            "why_not": self.why_not or None,
        }

    def difference(self) -> str:
        """``layers.0.linear1.weight differs by 3.1e-05``, or how it cannot be compared."""
        name = self.first_differing or ""
        what = "the loss" if name.startswith("loss") else name
        if self.first_diff is None:
            return f"{what} cannot be compared (missing on one side, or another shape or dtype)"
        return f"{what} differs by {self.first_diff:.3g}"


@dataclass(frozen=True)
class GradientGate:
    """Every plan's :class:`GradientCheck`, or why the gate checked none."""

    tolerance: float
    checks: Mapping[str, GradientCheck]
    why_not: str = ""
    """Why no plan was checked; '' if the gate ran."""
    twin: GradientCheck | None = None
    """The second un-checkpointed step against the first (the step's reproducibility)."""

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], tolerance: float) -> GradientGate:
        """From the gate's result (recorder/gradient_gate.py ``run_gate``)."""
        twin = doc.get("reproducible")
        return cls(
            tolerance,
            {name: GradientCheck.from_json(c) for name, c in doc.get("plans", {}).items()},
            str(doc.get("why_not") or ""),
            None if twin is None else GradientCheck.from_json(twin),
        )

    @classmethod
    def not_checked(cls, why: str, tolerance: float = 0.0) -> GradientGate:
        return cls(tolerance, {}, why)

    def check(self, plan: str) -> GradientCheck:
        """The plan's check; not checked where the gate did not run or did not reach it."""
        return self.checks.get(plan) or GradientCheck(None, why_not=self.why_not or "not run")

    def failed(self) -> list[str]:
        """The plans that change the loss or the gradients."""
        return [name for name, c in self.checks.items() if c.equal is False]

    def exactness(self) -> str:
        return "bitwise" if self.tolerance == 0 else f"within {self.tolerance:g}"

    def failure_line(self, plan: str) -> str:
        """One line: the plan, what differs first and by how much, and what to do."""
        c = self.check(plan)
        what = "loss" if (c.first_differing or "").startswith("loss") else "gradients"
        largest = "" if c.max_abs_diff is None else f"largest difference {c.max_abs_diff:.3g}, "
        return (
            f"plan {plan} changes the step's {what}: {c.difference()} from the un-checkpointed "
            f"run ({largest}allowed {self.tolerance:g}); a plan must recompute exactly (keep "
            "its preserve_rng_state option true, no in-place writes to a region's inputs), or "
            "allow a difference with --grad-tolerance X"
        )

    def lines(self, plans: Sequence[str]) -> list[str]:
        """The gate's lines below verify's table: plans equal, plans not checked (a failure is
        one line on stderr: failure_line)."""
        if self.why_not:
            return [f"gradients: not checked ({self._why()})"]
        checked = [p for p in plans if self.check(p).equal is not None]
        lines = [
            f"gradients: plan {p} not checked ({self.check(p).why_not})"
            for p in plans
            if p not in checked
        ]
        equal = [p for p in checked if self.check(p).equal]
        if equal:
            lines.insert(
                0,
                f"gradients: the loss and gradients of plan(s) {', '.join(equal)} equal the "
                f"un-checkpointed run's ({self.exactness()}; a second un-checkpointed run "
                "matched the first)",
            )
        return lines

    def _why(self) -> str:
        twin = self.twin
        if twin is None or twin.equal is not False:
            return self.why_not
        return (
            f"{self.why_not}: two un-checkpointed runs of it differ, {twin.difference()}; seed "
            "it (torch.manual_seed before the model and the data are made, a fixed data order) "
            "to check the plans' gradients"
        )

    def to_json(self) -> dict[str, Any]:
        """The gate as a whole (each plan's check goes with the plan)."""
        return {
            "checked": not self.why_not,
            "why_not": self._why() if self.why_not else None,
            "tolerance": self.tolerance,
            "failed": self.failed(),
        }
