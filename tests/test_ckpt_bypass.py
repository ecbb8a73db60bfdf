"""ckpt_runtime.bypass: checkpointing turned into plain calls, ours and torch's (NOTE [ Bypassing
torch's checkpoint ]), by context manager or CKPT_RUNTIME_BYPASS=1, restored on exit."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

from ckpt_runtime import bypass, checkpoint, checkpoint_sequential, is_bypassed

pytestmark = pytest.mark.torch

bypass_module = sys.modules["ckpt_runtime.bypass"]

# torch's functions captured the way libraries capture them (HF stores a partial at enable time)
captured_torch_checkpoint = tuc.checkpoint
captured_torch_sequential = tuc.checkpoint_sequential


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(bypass_module.BYPASS_ENV, raising=False)
    yield
    assert bypass_module._depth == 0


class Counted(nn.Module):
    """A small block that counts its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.drop(torch.tanh(self.lin(x)))


def run_step(
    block: Counted, ck: Callable[..., Any], seed: int = 0
) -> tuple[int, list[torch.Tensor]]:
    """One fwd+bwd through ``ck(block, x)``; returns block forward calls and the gradients."""
    block.zero_grad(set_to_none=True)
    block.calls = 0
    torch.manual_seed(seed)
    x = torch.randn(4, 8, requires_grad=True)
    ck(block, x).pow(2).sum().backward()
    assert x.grad is not None
    return block.calls, [p.grad.clone() for p in block.parameters() if p.grad is not None] + [
        x.grad.clone()
    ]


CHECKPOINTS: dict[str, Callable[..., Any]] = {
    "ckpt_runtime": lambda f, x: checkpoint(f, x),
    "ckpt_runtime-reentrant": lambda f, x: checkpoint(f, x, use_reentrant=True),
    "ckpt_runtime-sequential": lambda f, x: checkpoint_sequential([f, nn.Identity()], 2, x),
    "torch": lambda f, x: captured_torch_checkpoint(f, x, use_reentrant=False),
    "torch-reentrant": lambda f, x: captured_torch_checkpoint(f, x, use_reentrant=True),
    "torch-partial": functools.partial(captured_torch_checkpoint, use_reentrant=False),
    "torch-sequential": lambda f, x: captured_torch_sequential(
        [f, nn.Identity()], 2, x, use_reentrant=False
    ),
    "torch-sequential-reentrant": lambda f, x: captured_torch_sequential(
        [f, nn.Identity()], 2, x, use_reentrant=True
    ),
}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_bypass_context_runs_the_function_plainly(name: str) -> None:
    ck = CHECKPOINTS[name]
    block = Counted()
    calls, checkpointed = run_step(block, ck)
    assert calls == 2  # forward + recompute
    with bypass():
        assert is_bypassed()
        calls, bypassed = run_step(block, ck)
    assert calls == 1
    plain_calls, plain = run_step(block, lambda f, x: f(x))
    assert plain_calls == 1
    for a, b, c in zip(checkpointed, bypassed, plain, strict=True):
        assert torch.equal(a, b) and torch.equal(b, c)
    assert not is_bypassed()
    assert run_step(block, ck)[0] == 2  # checkpointing again after the block


@pytest.mark.parametrize("name", list(CHECKPOINTS))
@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_bypass_env_var_read_at_call_time(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = CHECKPOINTS[name]
    block = Counted()
    monkeypatch.setenv("CKPT_RUNTIME_BYPASS", value)
    assert run_step(block, ck)[0] == 1
    monkeypatch.setenv("CKPT_RUNTIME_BYPASS", "0")
    assert run_step(block, ck)[0] == 2
    monkeypatch.delenv("CKPT_RUNTIME_BYPASS")
    assert run_step(block, ck)[0] == 2


def test_bypass_is_reentrant_and_leaves_no_saved_tensor_hooks() -> None:
    seen = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        # no saved-tensor hooks around the function: ops save tensors normally
        seen.append(torch._C._autograd._top_saved_tensors_default_hooks(False))
        return x.sin()

    x = torch.randn(3, requires_grad=True)
    with bypass():
        with bypass():
            out = captured_torch_checkpoint(fn, x, use_reentrant=False)
        assert is_bypassed()
        out2 = checkpoint(fn, x)
    assert not is_bypassed()
    assert seen == [None, None]
    assert type(out.grad_fn).__name__ == type(out2.grad_fn).__name__ == "SinBackward0"


def test_bypass_restored_after_exception() -> None:
    block = Counted()
    generator_hook = tuc._checkpoint_without_reentrant_generator
    with pytest.raises(ZeroDivisionError), bypass():
        run_step(block, CHECKPOINTS["torch"])
        raise ZeroDivisionError
    assert not is_bypassed() and bypass_module._depth == 0
    assert tuc._checkpoint_without_reentrant_generator is generator_hook
    for name in ("torch", "torch-reentrant", "ckpt_runtime"):
        assert run_step(block, CHECKPOINTS[name])[0] == 2

    def fails(x: torch.Tensor) -> torch.Tensor:
        raise KeyError("inside the checkpointed function")

    x = torch.randn(2, requires_grad=True)
    for reentrant in (False, True):
        with pytest.raises(KeyError), bypass():
            captured_torch_checkpoint(fails, x, use_reentrant=reentrant)
        assert not is_bypassed()
        assert run_step(block, CHECKPOINTS["torch"])[0] == 2


def test_regions_checkpointed_before_the_block_still_recompute() -> None:
    block = Counted()
    x = torch.randn(4, 8, requires_grad=True)
    out = checkpoint(block, x)
    with bypass():
        out.sum().backward()
    assert block.calls == 2


def test_hooks_can_be_removed_and_reinstalled() -> None:
    hook = tuc._checkpoint_without_reentrant_generator
    assert bypass_module.torch_checkpoint_hooked()
    bypass_module._uninstall()
    try:
        assert tuc._checkpoint_without_reentrant_generator is bypass_module._orig_generator
        assert "apply" not in tuc.CheckpointFunction.__dict__
        block = Counted()
        with bypass(torch_checkpoint=False):
            assert run_step(block, CHECKPOINTS["torch"])[0] == 2  # torch's is not bypassed
            assert run_step(block, CHECKPOINTS["ckpt_runtime"])[0] == 1
    finally:
        bypass_module._install()
    assert tuc._checkpoint_without_reentrant_generator is hook


def test_clear_error_when_torch_internals_are_renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    bypass_module._uninstall()
    try:
        monkeypatch.delattr(tuc, "_checkpoint_without_reentrant_generator")
        bypass_module._install()
        assert not bypass_module.torch_checkpoint_hooked()
        with pytest.raises(RuntimeError, match=r"cannot bypass torch\.utils\.checkpoint") as info:  # noqa: SIM117
            with bypass():
                pass
        assert "bypass(torch_checkpoint=False)" in str(info.value)
        assert not is_bypassed()
        with bypass(torch_checkpoint=False):
            assert run_step(Counted(), CHECKPOINTS["ckpt_runtime"])[0] == 1
    finally:
        monkeypatch.undo()
        bypass_module._install()
    assert bypass_module.torch_checkpoint_hooked()


# ---------------------------------------------------------------------- HF transformers (GPT-2)


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_hf_gradient_checkpointing_bypassed(use_reentrant: bool) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": use_reentrant}
    )
    if use_reentrant:  # reentrant checkpoint needs an input that requires grad (HF's own advice)
        model.enable_input_require_grads()
    blocks = list(model.transformer.h)
    calls = [0] * len(blocks)
    for i, block in enumerate(blocks):
        # HF checkpoints the block's forward (block hooks stay outside); its first submodule runs
        # in every forward and recompute of the block.
        block.ln_1.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    ids = torch.randint(0, 100, (2, 16))

    def step() -> tuple[list[int], list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        calls[:] = [0] * len(blocks)
        torch.manual_seed(1)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return list(calls), [p.grad.clone() for p in model.parameters()]

    checkpointed_calls, checkpointed = step()
    assert checkpointed_calls == [2, 2]
    with bypass():
        bypassed_calls, bypassed = step()
    assert bypassed_calls == [1, 1]
    for a, b in zip(checkpointed, bypassed, strict=True):
        assert torch.equal(a, b)
    assert step()[0] == [2, 2]  # restored


class ScriptCheckpointed(nn.Module):
    """A model that checkpoints an inner block itself (the script's checkpointing)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.inner = Counted()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return captured_torch_checkpoint(
            lambda y: self.inner(self.first(y)), x, use_reentrant=False
        )


@pytest.mark.parametrize("keep", [True, False], ids=["kept plan", "plan not kept"])
def test_bypass_keeps_the_regions_of_a_kept_plan(keep: bool) -> None:
    """NOTE [ A plan that replaces the script's checkpointing ]: under bypass(keep=[region]) the
    plan's region still checkpoints (it runs twice: forward and recompute), and the script's
    own checkpoint is bypassed; without keep the plan is bypassed like the script's
    checkpointing."""
    from ckpt_runtime import apply_plan, remove_plan

    first, second = Counted(), Counted()
    model = nn.Sequential(first, second)
    apply_plan(model, {"format": "ckview-plan", "version": 1, "regions": [{"module": "0"}]})
    try:
        with bypass(keep=[first] if keep else []):
            model(torch.randn(4, 8, requires_grad=True)).sum().backward()
            assert (first.calls, second.calls) == ((2, 1) if keep else (1, 1))
            assert not bypass_module.take_plan_mark()  # the mark never outlives its call
    finally:
        remove_plan(model)
    script = ScriptCheckpointed()
    with bypass(keep=[script, script.inner]):
        run_step(script.inner, lambda f, x: script(x))
        assert script.inner.calls == 1  # the script's torch checkpoint: bypassed
    assert not bypass_module._kept
