"""The runs a recording makes of checkpoint plans: 'baseline', 'checkpointed', 'plan:<name>'.

Each run is a :class:`~recorder.runs.RunSpec` whose context changes what the script's step does
while the run is recorded (docs/recording.md "Runs").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from recorder.plan_context import plan_context
from recorder.runs import RunSpec, StopScript


def plan_runs(plans: list[tuple[str, Any]], baseline: bool, checkpointed: bool) -> list[RunSpec]:
    """The runs to record, in order (docs/recording.md "Runs"): 'baseline' (checkpointing
    bypassed), 'checkpointed' (the script as it is), then 'plan:<name>' per ``(source, Plan)``.
    The first run checks every plan against the script's model before it begins (PlanCheck)."""
    runs = []
    if baseline:
        runs.append(RunSpec("baseline", _bypassed, checkpointing="bypassed"))
    if checkpointed:
        runs.append(RunSpec("checkpointed", checkpointing="script"))
    runs += [
        RunSpec(f"plan:{plan.name}", plan_context(plan), checkpointing="plan") for _, plan in plans
    ]
    if plans:
        first = runs[0]
        runs[0] = RunSpec(first.name, PlanCheck(plans, first.context), first.checkpointing)
    return runs


def _bypassed(recorder: Any) -> Any:
    from ckpt_runtime import bypass

    return bypass()


class PlanCheck:
    """A run context that first resolves every plan against the script's model, so that a plan
    that does not fit it stops the script at once (``StopScript(reason)``) and is reported as
    one line, instead of failing inside the script when its run begins."""

    def __init__(self, plans: list[tuple[str, Any]], then: Any) -> None:
        self.plans = plans
        self.then = then

    @contextlib.contextmanager
    def __call__(self, recorder: Any) -> Iterator[Any]:
        from ckpt_runtime import PlanError, resolve_plan

        try:
            plans = [(s, p) for s, p in self.plans if not p.checks_nothing]
            for source, plan in plans:  # a plan that checkpoints nothing needs no model
                model = recorder.main_model()
                try:
                    resolve_plan(model, plan)
                except PlanError as exc:
                    raise PlanError(f"plan {source}: {exc}") from None
        except (PlanError, RuntimeError) as exc:
            raise StopScript(" ".join(str(exc).split())) from None
        with self.then(recorder) if self.then is not None else contextlib.nullcontext() as value:
            yield value
