"""A checkpoint plan on a ``torch.compile``'d model (NOTE [ Checkpoint inside a compiled graph ]
in ckpt_runtime/checkpoint.py): it used to stop with RecomputeMismatchError, with or without
ckview. ``aot_eager`` runs dynamo and AOTAutograd's partitioner, as inductor does, without
building kernels."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ckpt_runtime import apply_plan, checkpoint

pytestmark = [
    pytest.mark.torch,
    # torch warns on a compiled module's calls while any global module hook is installed (an
    # earlier test's in the same process may be).
    pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global"),
]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        *(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU()) for _ in range(3))
    )


def _gradients(plan: str | None) -> list[torch.Tensor]:
    torch._dynamo.reset()
    model = _model()
    compiled = torch.compile(model, backend="aot_eager")
    if plan is not None:
        apply_plan(compiled, plan)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    compiled(x).square().mean().backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("plan", ["all", "sqrt"])
def test_a_plan_on_a_compiled_model_trains_as_without_it(plan: str) -> None:
    plain, planned = _gradients(None), _gradients(plan)
    assert len(planned) == len(plain) == 12
    for a, b in zip(plain, planned, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_the_compiled_region_is_torchs_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the compiled graph the region is torch's checkpoint (which dynamo turns into a
    recompute of the compiled backward), not ckpt_runtime's saved-tensor hooks."""
    import torch.utils.checkpoint as tuc

    called: list[bool] = []
    original = tuc.checkpoint

    def spy(*args: object, **kwargs: object) -> object:
        called.append(bool(kwargs.get("use_reentrant") is False))
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tuc, "checkpoint", spy)
    torch._dynamo.reset()
    layer = nn.Linear(8, 8)

    def step(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(layer, x)

    torch.compile(step, backend="aot_eager")(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert called == [True]
    called.clear()
    checkpoint(layer, torch.randn(2, 8, requires_grad=True)).sum().backward()  # eager: its own
    assert called == []
