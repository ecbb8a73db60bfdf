"""The checkpointing runtime: checkpoint, checkpoint_sequential, bypass, markers, plans.

Imports torch only (never ckview).

- :func:`checkpoint`, :func:`checkpoint_sequential`: drop-ins for ``torch.utils.checkpoint``'s,
  which also keep running statistics (BatchNorm, ...) updated once per step, raise
  :class:`RecomputeMismatchError` when a recompute differs from its forward and warn
  (:class:`UnsafeRecomputeWarning`) about regions that cannot be recomputed faithfully.
- :func:`bypass` (and ``CKPT_RUNTIME_BYPASS=1``): run every checkpointed function plainly,
  torch's ``torch.utils.checkpoint`` included (the recorder's un-checkpointed baseline).
- :mod:`ckpt_runtime.markers`: :func:`add_listener` to hear when a region recomputes.
- :func:`apply_plan`, :func:`remove_plan`, :func:`resolve_plan` (:mod:`ckpt_runtime.apply`),
  :class:`Plan` and friends (:mod:`ckpt_runtime.plan`, docs/plan-format.md) and the presets
  ``none``, ``all``, ``every:K``, ``sqrt`` (:mod:`ckpt_runtime.presets`): checkpoint plans.

Note that the functions ``checkpoint`` and ``bypass`` shadow their submodules as attributes of
the package: reach the modules with ``from ckpt_runtime.checkpoint import ...`` or
``sys.modules``. The recorder cooperates with both this runtime and ``torch.utils.checkpoint``
(see recorder/session.py, NOTE [ Cooperating with other saved-tensor hooks ]).
"""

from ckpt_runtime.apply import AppliedPlan, apply_plan, remove_plan, resolve_plan
from ckpt_runtime.bypass import bypass, is_bypassed
from ckpt_runtime.checkpoint import (
    RecomputeMismatchError,
    UnsafeRecomputeWarning,
    checkpoint,
    checkpoint_sequential,
    register_module_names,
)
from ckpt_runtime.markers import add_listener, region_target
from ckpt_runtime.plan import (
    ModuleRegion,
    Plan,
    PlanError,
    PlanOptions,
    SegmentRegion,
    load_plan,
    save_plan,
)
from ckpt_runtime.presets import BlockChain, find_block_chain, resolve_preset

__all__ = [
    "AppliedPlan",
    "BlockChain",
    "ModuleRegion",
    "Plan",
    "PlanError",
    "PlanOptions",
    "RecomputeMismatchError",
    "SegmentRegion",
    "UnsafeRecomputeWarning",
    "add_listener",
    "apply_plan",
    "bypass",
    "checkpoint",
    "checkpoint_sequential",
    "find_block_chain",
    "is_bypassed",
    "load_plan",
    "region_target",
    "register_module_names",
    "remove_plan",
    "resolve_plan",
    "resolve_preset",
    "save_plan",
]
