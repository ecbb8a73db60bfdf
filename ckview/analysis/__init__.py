"""Pure functions over trace tables (numpy arrays in, numbers and arrays out).

No files, no widgets, no torch: the CLI, the GUI and the tests all drive these the same way.
The face below gathers timelines, peaks, breakdowns and summaries (timeline, breakdown,
summary), the projection of checkpoint plans (projection/, regions), plans against a trace's
module tree (plans, over the plan core ckpt_runtime.resolve) and the planner (planner).
"""

from ckview.analysis.breakdown import bytes_by_category, bytes_by_module, module_paths
from ckview.analysis.planner import (
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
from ckview.analysis.plans import (
    PlanRegions,
    chain_of_blocks,
    module_rows_matching,
    plan_from_regions,
    plan_name,
    plan_on_trace,
    regions_from_plan,
    resolve_on_trace,
)
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
    "InstanceEffects",
    "LiveStorages",
    "MemoryTimeline",
    "ModuleRegion",
    "ParetoPoint",
    "Peak",
    "PlanRegions",
    "Planner",
    "PlannerResult",
    "PresetPoint",
    "ProjectedCurve",
    "ProjectedEvents",
    "ProjectedPeak",
    "Projection",
    "ProjectionModel",
    "Recompute",
    "Region",
    "RegionInstances",
    "RunSummary",
    "SegmentRegion",
    "activation_peak",
    "already_checkpointed",
    "budget_answer",
    "bytes_by_category",
    "bytes_by_module",
    "chain_candidates",
    "chain_of_blocks",
    "find_peak",
    "format_bytes",
    "live_storages",
    "memory_timeline",
    "module_paths",
    "module_rows_matching",
    "pareto",
    "parse_budget",
    "parse_bytes",
    "phase_time_ns",
    "plan_for_budget",
    "plan_from_regions",
    "plan_name",
    "plan_on_trace",
    "project",
    "region_instances",
    "regions_from_plan",
    "resolve_on_trace",
    "sequential_children",
    "step_allocated_peaks",
    "summarize_run",
]
