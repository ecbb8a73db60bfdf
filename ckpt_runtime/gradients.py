"""The gradient gate: do two runs of a step have the same gradients?

``ckview verify`` compares each plan's loss and gradients with the un-checkpointed run's through
:func:`compare_gradients`; a plan must not change them (NOTE [ Exact gradients under an op-level
plan ] in ckpt_runtime/oplevel.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["compare_gradients", "gradients_of"]


def gradients_of(model: torch.nn.Module) -> dict[str, Tensor | None]:
    """``name -> grad`` (a detached copy, or None) for ``model.named_parameters()``."""
    return {
        name: None if p.grad is None else p.grad.detach().clone()
        for name, p in model.named_parameters()
    }


def _diff(a: Tensor | None, b: Tensor | None) -> float:
    """The largest absolute difference of ``a`` and ``b``; inf if they cannot be compared
    (one is None, shapes or dtypes differ), 0 if both are None. NaN equals NaN."""
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    if a.shape != b.shape or a.dtype != b.dtype:
        return math.inf
    if a.numel() == 0:
        return 0.0
    x, y = a.detach().double().cpu(), b.detach().double().cpu()
    same_nan = x.isnan() & y.isnan()
    same_inf = x.isinf() & (x == y)
    delta = (x - y).abs().masked_fill(same_nan | same_inf, 0.0)
    if delta.isnan().any():  # NaN on one side only
        return math.inf
    return float(delta.max())


def compare_gradients(
    model_a_grads: Mapping[str, Tensor | None],
    model_b_grads: Mapping[str, Tensor | None],
    tolerance: float = 0.0,
) -> dict[str, Any]:
    """Compare two runs' gradients, name by name.

    Returns ``{"equal": bool, "max_abs_diff": float, "first_differing": name | None}``:
    ``equal`` if every gradient differs by at most ``tolerance`` (0: bitwise equal values,
    NaN matching NaN), ``max_abs_diff`` the largest difference over all (``inf`` where a name is
    missing on one side, a gradient is None on one side only, or shapes or dtypes differ), and
    ``first_differing`` the first name, in ``model_a_grads`` order then the names only in
    ``model_b_grads``, whose difference exceeds ``tolerance``. Loss values compare the same way
    (pass ``{"loss": loss}``).
    """
    if not (isinstance(tolerance, int | float) and tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    names = list(model_a_grads) + [n for n in model_b_grads if n not in model_a_grads]
    worst, first = 0.0, None
    for name in names:
        if name not in model_a_grads or name not in model_b_grads:
            diff = math.inf
        else:
            diff = _diff(model_a_grads[name], model_b_grads[name])
        worst = max(worst, diff)
        if first is None and diff > tolerance:
            first = name
    return {"equal": first is None, "max_abs_diff": worst, "first_differing": first}
