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
    comparison says so instead of presenting it as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.trace.schema import Phase

Table = Mapping[str, np.ndarray]

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

    def describe(self, run: str) -> str:
        """One sentence: what was seen and what it means."""
        names = ", ".join(self.names[:3]) + (", ..." if len(self.names) > 3 else "")
        return (
            f"run {run!r} still recomputes ({self.regions} region(s): {names or 'unnamed'}; "
            f"{self.ops} ops, {self.compute_ns / 1e6:.1f} ms) although the script's "
            "checkpointing was bypassed: the script checkpoints in a way ckview cannot switch "
            "off (a hand-written torch.autograd.Function that recomputes in backward?), so this "
            "run is not an un-checkpointed baseline; remove that checkpointing from the script "
            "to compare like for like"
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
