"""Pure functions over trace tables (numpy arrays in, numbers and arrays out).

No files, no widgets, no torch: the CLI, the GUI and the tests all drive these the same way.
"""

from ckview.analysis.breakdown import bytes_by_category, bytes_by_module, module_paths
from ckview.analysis.projection import (
    InstanceEffects,
    LiveStorages,
    ProjectedCurve,
    ProjectedEvents,
    ProjectedPeak,
    Projection,
    ProjectionModel,
    Recompute,
    project,
)
from ckview.analysis.regions import (
    ModuleRegion,
    Region,
    RegionInstances,
    SegmentRegion,
    region_instances,
    sequential_children,
)
from ckview.analysis.summary import (
    NO_MODULE,
    ActivationPeak,
    RunSummary,
    activation_peak,
    phase_time_ns,
    summarize_run,
)
from ckview.analysis.timeline import (
    MemoryTimeline,
    Peak,
    find_peak,
    live_storages,
    memory_timeline,
    step_allocated_peaks,
)
from ckview.analysis.units import Budget, format_bytes, parse_budget, parse_bytes

__all__ = [
    "NO_MODULE",
    "ActivationPeak",
    "Budget",
    "MemoryTimeline",
    "Peak",
    "RunSummary",
    "activation_peak",
    "bytes_by_category",
    "bytes_by_module",
    "find_peak",
    "format_bytes",
    "live_storages",
    "memory_timeline",
    "module_paths",
    "parse_budget",
    "parse_bytes",
    "phase_time_ns",
    "step_allocated_peaks",
    "summarize_run",
]

# Projection of checkpoint plans (projection/, regions.py).
__all__ += [
    "InstanceEffects",
    "LiveStorages",
    "ModuleRegion",
    "ProjectedCurve",
    "ProjectedEvents",
    "ProjectedPeak",
    "Projection",
    "ProjectionModel",
    "Recompute",
    "Region",
    "RegionInstances",
    "SegmentRegion",
    "chain_of_blocks",
    "module_rows_matching",
    "project",
    "region_instances",
    "sequential_children",
]

# Checkpoint plans against a trace's module tree (plans.py, over the plan core
# ckpt_runtime.resolve).
from ckview.analysis.plans import (  # noqa: E402
    PlanRegions,
    chain_of_blocks,
    module_rows_matching,
    plan_from_regions,
    plan_name,
    plan_on_trace,
    regions_from_plan,
    resolve_on_trace,
)

__all__ += [
    "PlanRegions",
    "plan_from_regions",
    "plan_name",
    "plan_on_trace",
    "regions_from_plan",
    "resolve_on_trace",
]

# The planner: the cheapest plan for a memory budget, and the peak / compute front (planner.py).
from ckview.analysis.planner import (  # noqa: E402
    ParetoPoint,
    Planner,
    PlannerResult,
    PresetPoint,
    already_checkpointed,
    budget_answer,
    chain_candidates,
    pareto,
    plan_for_budget,
)

__all__ += [
    "ParetoPoint",
    "Planner",
    "PlannerResult",
    "PresetPoint",
    "already_checkpointed",
    "budget_answer",
    "chain_candidates",
    "pareto",
    "plan_for_budget",
]
