"""The explorer's size field, Qt-free: a run shown at another size (batch, sequence length)
from two recordings of its step at two sizes (``ckview.analysis.fit``), and whether that size
fits a budget with the plan being built.

The run at size N is a ``Run`` like a recorded one (``build_run`` over ``SizeFit.tables_at``):
the timeline, the plan panel, Compare and Diff take it unchanged, so the current plan is
projected over the step at N exactly as over the recording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ckview.analysis import format_bytes, parse_budget, project
from ckview.analysis.allocator import AllocatorSettings, settings_from_meta
from ckview.analysis.device import DeviceState
from ckview.analysis.fit import SizeFit, fit_sizes
from ckview.analysis.regions import Region
from ckview.analysis.reserved import reserved_over, reserved_peak
from ckview.app.run import Run, build_run

_NAMED = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*?)(\d+)$")

PROJECTED = "projected"
"""The last word of a sized run's name: it was never recorded."""


def size_of_path(path: str) -> tuple[str, int] | None:
    """The size a trace's name says it was recorded at (``ckview record --sizes``:
    ``train.batch4.h5`` -> ``('batch', 4)``), None if it says none."""
    match = _NAMED.search(Path(path).stem)
    return (match.group(1), int(match.group(2))) if match else None


def allocator_settings(settings_json: str) -> AllocatorSettings:
    """A trace's meta ``allocator_settings`` for the model (torch's defaults where they are
    not understood: the figures are then an estimate, as for any unknown setting)."""
    try:
        return settings_from_meta(settings_json)
    except ValueError:
        return AllocatorSettings()


@dataclass(frozen=True)
class SizedRuns:
    """A run recorded at two sizes, and the run at any size projected from them."""

    base: Run
    """The run at ``sizes[0]`` (the one shown when the second trace was opened)."""
    fit: SizeFit
    name: str
    """What the size is: 'batch', 'seq', or 'size' when the file names do not say."""
    settings: AllocatorSettings

    @classmethod
    def pair(
        cls,
        run_a: Run,
        run_b: Run,
        sizes: tuple[int, int],
        name: str = "size",
        settings: AllocatorSettings | None = None,
    ) -> SizedRuns:
        """The fit of ``run_a`` (at ``sizes[0]``) and ``run_b`` (at ``sizes[1]``); ``StreamsPart``
        (a ValueError) if they are not the same step, ValueError for bad sizes."""
        fit = fit_sizes(run_a.tables, run_b.tables, sizes)
        return cls(run_a, fit, name, settings or AllocatorSettings())

    def run_at(self, n: int) -> Run:
        """The run at size ``n``, named ``'<run> at batch 16, projected'``."""
        return build_run(
            self.base.source,
            f"{self.base.name} at {self.name} {n}, {PROJECTED}",
            self.fit.tables_at(n),
            devices=tuple(_unmeasured(d) for d in self.base.devices),
            device_total_bytes=self.base.device_total_bytes,
            checkpointing=self.base.checkpointing,
        )


def _unmeasured(state: DeviceState) -> DeviceState:
    """A device's state for a run that was never recorded: its capacity and what CUDA and
    libraries took stay (they do not grow with the step), the allocator's figures are unknown."""
    return replace(state, reserved=-1, allocated=-1, fragmentation=-1, largest_free=-1)


@dataclass(frozen=True)
class SizeVerdict:
    """A run at a size with a plan, against a budget."""

    peak_bytes: int
    """The projected peak of live bytes (with the plan)."""
    reserved_bytes: int | None
    """What the caching allocator would reserve (model), on a CUDA run; else None."""
    budget_bytes: int | None
    """The budget in the units it counts (live bytes, or reserved + outside PyTorch for
    'device'); None without one."""
    used_bytes: int
    """What the budget is compared with."""
    text: str

    @property
    def fits(self) -> bool | None:
        """Whether the size fits the budget (None without a budget)."""
        return None if self.budget_bytes is None else self.used_bytes <= self.budget_bytes


def size_verdict(
    run: Run, regions: list[Region], budget: str, sizes: SizedRuns, label: str
) -> SizeVerdict:
    """The run at a size (``label``: 'batch 16') with ``regions`` checkpointed, against
    ``budget`` (the plan panel's budget field: a size, a share of the recorded run's peak,
    'device'; '' for none). ValueError for a budget that cannot be read."""
    projection = project(run.tables, regions)
    peak = int(projection.peak.bytes)
    t = run.tables
    curve = reserved_over(
        t["storages"],
        t["strings"],
        projection.events.table(),
        projection.events.copy,
        sizes.settings,
    )
    reserved = None if curve is None else reserved_peak(curve)
    plan = f"with {len(regions)} checkpointed region(s)" if regions else "without checkpointing"
    head = f"{label}: projected peak {format_bytes(peak)} {plan}"
    if reserved is not None:
        head += f", reserved {format_bytes(reserved)} (allocator model)"
    if not budget.strip():
        return SizeVerdict(peak, reserved, None, peak, head + "; give a budget to check it")
    wanted = parse_budget(budget)
    used = peak
    if wanted.device:
        if reserved is None:
            raise ValueError("the budget 'device' needs a CUDA trace")
        wanted = wanted.on_device(run.device_total_bytes)
        outside = max(run.device.not_by_pytorch, 0) if run.device is not None else 0
        used = reserved + outside
    limit = wanted.bytes(sizes.base.peak.bytes)
    shown = wanted.describe(sizes.base.peak.bytes, "the recorded peak")
    if wanted.device:
        shown = f"{shown} with {format_bytes(used - (reserved or 0))} outside PyTorch"
    if used <= limit:
        verdict = f"fits the budget {shown}"
    else:
        verdict = f"does NOT fit the budget {shown}: {format_bytes(used - limit)} over"
    return SizeVerdict(peak, reserved, limit, used, f"{head}; {verdict}")
