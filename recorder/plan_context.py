"""A plan applied to the recorder's main model for one run (``plan_context``): the context of
the 'plan:<name>' runs and of the timing steps under plan all."""

from __future__ import annotations

import contextlib
from typing import Any


def plan_context(plan: Any) -> Any:
    """Apply ``plan`` to the recorder's main model for one run, in place of the script's own
    checkpointing, then remove it.

    A plan run means one thing: the script's checkpointing (``torch.utils.checkpoint``, HF's
    ``gradient_checkpointing_enable``, ``ckpt_runtime``) is bypassed, as in run 'baseline', and
    the plan's regions checkpoint (NOTE [ A plan that replaces the script's checkpointing ] in
    ckpt_runtime/bypass.py). So a plan projected over 'baseline' and the plan's run describe
    the same computation.
    """
    from ckpt_runtime import bypass
    from ckpt_runtime.apply import apply_plan, remove_plan

    @contextlib.contextmanager
    def applied(recorder: Any) -> Any:
        if plan.checks_nothing:  # no model needed (a loop without modules has none)
            with bypass():
                yield None
            return
        model = recorder.main_model()
        applied_plan = apply_plan(model, plan)
        try:
            with bypass(keep=_planned_modules(model, applied_plan)):
                yield applied_plan
        finally:
            remove_plan(model)

    return applied


def _planned_modules(model: Any, applied: Any) -> list[Any]:
    """The modules whose calls ``applied`` checkpoints: its module regions and the
    ``nn.Sequential`` of each segment."""
    paths = {*applied.modules, *(segment.sequential for segment in applied.segments)}
    return [model.get_submodule(path) for path in sorted(paths)]
