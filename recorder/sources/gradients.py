"""The gradients of a run's first recorded step, as a source: what the gradient gate of
``ckview verify`` compares (NOTE [ The gradient gate ] in recorder/gradient_gate.py).

NOTE [ When a step's gradients are final ]
A step's gradients are final just before its optimizer steps: every backward of the step
(gradient accumulation included) has run, and nothing has used them yet. So the source copies,
at the global optimizer step pre-hook, the gradients of that optimizer's parameters, the first
time each optimizer steps in the run's first recorded step (several optimizers: each its own
parameters, as a GAN's generator and discriminator step apart). The loss is what each backward
of that step starts from (its roots), in call order. The copies go to host memory, detached:
the source keeps no reference to a user tensor, and the device holds nothing more for the run.
Where that moment does not exist the step is marked unchecked, with why: a loop without an
optimizer (the script may use and clear the gradients itself), and an optimizer that steps
with a closure (L-BFGS, Lightning's automatic optimisation: the gradients are computed inside
its step, after the pre-hook).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from recorder._torch import bracket_backward
from recorder.compiled import skip_in_dynamo
from recorder.sources.base import RunPart
from recorder.tables import RunTables


@dataclass
class StepGradients:
    """One run's first recorded step: its losses and gradients (host copies), or why not."""

    losses: list[Tensor] = field(default_factory=list)
    gradients: dict[str, Tensor | None] = field(default_factory=dict)
    optimizers: int = 0
    """Optimizers that stepped in the step."""
    why_not: str = ""
    """Why the step's gradients cannot be compared; '' if they can."""
    complete: bool = False
    """The step ended (the script did not stop inside it)."""

    def compared(self) -> dict[str, Tensor | None]:
        """What the gate compares, in order: the losses (``loss``, ``loss.1``, ...), then the
        gradients by parameter name."""
        names = [f"loss.{i}" if i else "loss" for i in range(len(self.losses))]
        return {**dict(zip(names, self.losses, strict=True)), **self.gradients}

    def unchecked(self) -> str:
        """Why this step cannot be compared (NOTE [ When a step's gradients are final ]); ''
        if it can."""
        if self.why_not:
            return self.why_not
        if not self.complete:
            return "the script ended inside the step"
        if not self.optimizers:
            return (
                "the loop has no optimizer step, the moment where a step's gradients are compared"
            )
        return ""


class GradientSource:
    """The gradients of each run's first recorded step (NOTE [ When a step's gradients are
    final ]); ``captured`` maps run names to them. ``model()`` gives the script's model, whose
    parameter names name the gradients (others are named by optimizer and position)."""

    def __init__(self, model: Callable[[], torch.nn.Module]) -> None:
        self._model = model
        self.captured: dict[str, StepGradients] = {}
        self._step: StepGradients | None = None  # the step being captured
        self._seen: set[int] = set()  # ids of the optimizers that stepped in it

    def install(self) -> Callable[[], None]:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        handle = register_optimizer_step_pre_hook(self._before_optimizer)
        unbracket = bracket_backward(self._backward_begins, lambda: None)

        def undo() -> None:
            handle.remove()
            unbracket()

        return undo

    def begin_run(self, run: RunTables) -> None:
        self._step, self._seen = None, set()
        self._run = run.name

    def step_begins(self, now: int) -> None:
        if self._run not in self.captured:  # the run's first recorded step
            self._step = self.captured[self._run] = StepGradients()
            self._seen = set()

    def step_ends(self, now: int) -> None:
        if self._step is not None:
            self._step.complete = True
        self._step = None

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        self._step = None
        return RunPart()

    def meta(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------------- hooks

    def _backward_begins(self, roots: Any) -> None:
        step = self._step
        if step is None or step.optimizers:  # a backward after an optimizer: another step's
            return
        tensors = [roots] if isinstance(roots, Tensor) else list(roots or ())
        step.losses += [t.detach().to("cpu", copy=True) for t in tensors if isinstance(t, Tensor)]

    def _before_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        step = self._step
        if step is None or id(optimizer) in self._seen:
            return
        self._seen.add(id(optimizer))
        step.optimizers += 1
        closure = args[1] if len(args) > 1 else kwargs.get("closure")  # args[0]: the optimizer
        if closure is not None:
            step.why_not = (
                f"{type(optimizer).__name__} steps with a closure (the gradients are computed "
                "inside its step)"
            )
            return
        names = self._names()
        for g, group in enumerate(optimizer.param_groups):
            for j, p in enumerate(group["params"]):
                name = names.get(id(p), f"optimizer{step.optimizers - 1}.group{g}.param{j}")
                if name not in step.gradients:
                    step.gradients[name] = _host_copy(p.grad)

    def _names(self) -> dict[int, str]:
        """Parameter id -> qualified name in the script's model (none before a forward)."""
        try:
            model = self._model()
        except RuntimeError:  # no module ran forward
            return {}
        return {id(p): name for name, p in model.named_parameters()}


def _host_copy(grad: Tensor | None) -> Tensor | None:
    if grad is None:
        return None
    grad = grad.detach()
    if grad.is_sparse:
        grad = grad.to_dense()
    return grad.to("cpu", copy=True)


skip_in_dynamo(sys.modules[__name__])
