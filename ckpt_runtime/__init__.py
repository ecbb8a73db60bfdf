"""The checkpointing runtime: checkpoint, checkpoint_sequential, bypass, markers, plans.

Imports torch only (never ckview), and only when a name that needs it is first used: the plan
format (:mod:`ckpt_runtime.plan`, ``load_plan``) and the plan rules (:mod:`ckpt_runtime.resolve`)
are torch-free, for ckview's analysis (NOTE [ Importing ckpt_runtime does not import torch ]).

- :func:`checkpoint`, :func:`checkpoint_sequential`: drop-ins for ``torch.utils.checkpoint``'s,
  which also keep running statistics (BatchNorm, ...) updated once per step, raise
  :class:`RecomputeMismatchError` when a recompute differs from its forward and warn
  (:class:`UnsafeRecomputeWarning`) about regions that cannot be recomputed faithfully.
- :func:`bypass` (and ``CKPT_RUNTIME_BYPASS=1``): run every checkpointed function plainly,
  torch's ``torch.utils.checkpoint`` included (the recorder's un-checkpointed baseline).
- :mod:`ckpt_runtime.markers`: :func:`add_listener` to hear when a region recomputes.
- :func:`apply_plan`, :func:`remove_plan`, :func:`resolve_plan` (:mod:`ckpt_runtime.apply`),
  :class:`Plan` and friends (:mod:`ckpt_runtime.plan`, docs/plan-format.md) and the presets
  ``none``, ``all``, ``every:K``, ``sqrt`` (:mod:`ckpt_runtime.resolve`, on a live model through
  :mod:`ckpt_runtime.presets`): checkpoint plans; op-level regions (save chosen ops, offload)
  run through :mod:`ckpt_runtime.oplevel`.
- :func:`compare_gradients`, :func:`gradients_of` (:mod:`ckpt_runtime.gradients`): the
  gradient gate of ``ckview verify``.

Note that the functions ``checkpoint`` and ``bypass`` shadow their submodules as attributes of
the package: reach the modules with ``from ckpt_runtime.checkpoint import ...`` or
``sys.modules``. The recorder cooperates with both this runtime and ``torch.utils.checkpoint``
(see recorder/ledger.py, NOTE [ Cooperating with other saved-tensor hooks ]).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from ckpt_runtime.plan import (
    ModuleRegion,
    Plan,
    PlanError,
    PlanOptions,
    SegmentRegion,
    load_plan,
    save_plan,
)

if TYPE_CHECKING:
    from ckpt_runtime.apply import AppliedPlan, apply_plan, remove_plan, resolve_plan
    from ckpt_runtime.bypass import bypass, is_bypassed
    from ckpt_runtime.checkpoint import (
        RecomputeMismatchError,
        UnsafeRecomputeWarning,
        checkpoint,
        checkpoint_sequential,
        register_module_names,
    )
    from ckpt_runtime.gradients import compare_gradients, gradients_of
    from ckpt_runtime.markers import add_listener, region_target
    from ckpt_runtime.presets import BlockChain, find_block_chain, resolve_preset

# NOTE [ Importing ckpt_runtime does not import torch ]
# The plan format (plan.py) and the plan rules (resolve.py) are torch-free, and ckview's
# analysis, which must not import torch, resolves plans with them. So the names that need torch
# are loaded on first use (PEP 562): ``import ckpt_runtime.plan`` imports no torch, and
# ``ckpt_runtime.apply_plan`` imports it then. ``checkpoint`` and ``bypass`` are functions that
# shadow their submodules; the import system sets a package attribute to the submodule whenever
# the submodule is imported, so those two are properties of the package's class, which win over
# that attribute (tests/test_ckpt_plan.py, test_core_imports_no_torch).
_LAZY = {
    "AppliedPlan": "apply",
    "apply_plan": "apply",
    "remove_plan": "apply",
    "resolve_plan": "apply",
    "bypass": "bypass",
    "is_bypassed": "bypass",
    "RecomputeMismatchError": "checkpoint",
    "UnsafeRecomputeWarning": "checkpoint",
    "checkpoint": "checkpoint",
    "checkpoint_sequential": "checkpoint",
    "register_module_names": "checkpoint",
    "compare_gradients": "gradients",
    "gradients_of": "gradients",
    "add_listener": "markers",
    "region_target": "markers",
    "BlockChain": "presets",
    "find_block_chain": "presets",
    "resolve_preset": "presets",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckpt_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ckpt_runtime.{module}"), name)
    if name not in ("checkpoint", "bypass"):
        globals()[name] = value
    return value


def _function(name: str) -> property:
    def get(self: types.ModuleType) -> Any:
        return getattr(importlib.import_module(f"ckpt_runtime.{name}"), name)

    def ignore(self: types.ModuleType, value: Any) -> None:
        pass  # the import system binding the submodule: the function stays the attribute

    return property(get, ignore)


class _Package(types.ModuleType):
    checkpoint = _function("checkpoint")
    bypass = _function("bypass")


sys.modules[__name__].__class__ = _Package

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
    "compare_gradients",
    "find_block_chain",
    "gradients_of",
    "is_bypassed",
    "load_plan",
    "region_target",
    "register_module_names",
    "remove_plan",
    "resolve_plan",
    "resolve_preset",
    "save_plan",
]
