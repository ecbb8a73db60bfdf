"""ckpt_runtime.checkpoint / checkpoint_sequential: torch's checkpoint semantics, plus extras.

The first half mirrors the semantics covered by torch's own checkpoint tests (test_utils.py
TestCheckpoint, test_autograd.py): gradients bitwise equal to the plain step (CPU), RNG
preserved, kwargs, non-tensor arguments and outputs, nesting, inputs without requires_grad,
no_grad, autograd.grad, checkpoint_sequential; each for both ``use_reentrant`` values where torch
supports it. The second half covers what ckpt_runtime adds: running statistics updated once
(NOTE [ Running statistics ]), RecomputeMismatchError (NOTE [ Recompute mismatch ]),
UnsafeRecomputeWarning and the recompute markers.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils.checkpoint as tuc
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ckpt_runtime
from ckpt_runtime import (
    RecomputeMismatchError,
    UnsafeRecomputeWarning,
    add_listener,
    checkpoint,
    checkpoint_sequential,
)
from ckpt_runtime.checkpoint import _warned

pytestmark = pytest.mark.torch

REENTRANT = pytest.mark.parametrize(
    "use_reentrant", [False, True], ids=["nonreentrant", "reentrant"]
)


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    torch.manual_seed(0)
    _warned.clear()  # "once per region" must not leak between tests
    yield
    _warned.clear()


def mlp(depth: int = 4, width: int = 16, dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def grads(module: nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    out += [x.grad.clone() for x in inputs if x.grad is not None]
    return out


def step(
    module: nn.Module, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor], seed: int = 1
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One fwd+bwd from a fixed seed; returns the gradients and the RNG state after the step."""
    module.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(seed)
    (run(x) ** 2).sum().backward()
    return grads(module, x), torch.get_rng_state()


def assert_all_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and a
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)


# --------------------------------------------------------------------------- torch's semantics


@REENTRANT
@pytest.mark.parametrize("as_lambda", [False, True], ids=["module", "lambda"])
def test_mlp_chain_gradients_bitwise_equal(use_reentrant: bool, as_lambda: bool) -> None:
    model = mlp()
    x = torch.randn(8, 16, requires_grad=True)
    plain, _ = step(model, x, model)
    blocks = [model[i : i + 2] for i in range(0, len(model), 2)]

    def run(t: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            fn = (lambda u, b=block: b(u)) if as_lambda else block
            t = checkpoint(fn, t, use_reentrant=use_reentrant)
        return t

    ours, _ = step(model, x, run)
    assert_all_equal(plain, ours)


@REENTRANT
def test_dropout_rng_preserved(use_reentrant: bool) -> None:
    model = mlp(dropout=0.5)
    x = torch.randn(8, 16, requires_grad=True)
    plain, rng_plain = step(model, x, model)
    ours, rng_ours = step(model, x, lambda t: checkpoint(model, t, use_reentrant=use_reentrant))
    assert_all_equal(plain, ours)
    # The recompute replays the forward's random numbers in a forked RNG: the global stream
    # after the step is as if nothing had been recomputed (as torch.utils.checkpoint).
    assert torch.equal(rng_plain, rng_ours)


def test_kwargs_nonreentrant() -> None:
    lin = nn.Linear(6, 6)
    x = torch.randn(3, 6, requires_grad=True)
    b = torch.randn(6, requires_grad=True)

    def fn(t: torch.Tensor, *, bias: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.sigmoid(lin(t) + bias) * scale

    plain, _ = step(lin, x, lambda t: fn(t, bias=b, scale=3.0))
    plain_b = b.grad.clone()
    b.grad = None
    ours, _ = step(lin, x, lambda t: checkpoint(fn, t, bias=b, scale=3.0))
    assert_all_equal(plain, ours)
    assert torch.equal(plain_b, b.grad)


def test_kwargs_reentrant_rejected_like_torch() -> None:
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        tuc.checkpoint(lambda t, scale: t * scale, x, scale=2.0, use_reentrant=True)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        checkpoint(lambda t, scale: t * scale, x, scale=2.0, use_reentrant=True)


@REENTRANT
def test_non_tensor_args_and_outputs(use_reentrant: bool) -> None:
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)

    def fn(t: torch.Tensor, power: int, tag: str, nothing: None) -> tuple[Any, ...]:
        assert nothing is None
        return lin(t) ** power, tag + "!", power

    out, tag, power = checkpoint(fn, x, 2, "hi", None, use_reentrant=use_reentrant)
    assert (tag, power) == ("hi!", 2)
    out.sum().backward()
    ours = grads(lin, x)
    lin.zero_grad(set_to_none=True)
    x.grad = None
    fn(x, 2, "hi", None)[0].sum().backward()
    assert_all_equal(grads(lin, x), ours)


@REENTRANT
def test_multiple_outputs_with_none(use_reentrant: bool) -> None:
    x = torch.randn(5, requires_grad=True)
    y = torch.randn(5, requires_grad=True)

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[Any, ...]:
        return a.sin() * b, None, (a * b).exp()

    def loss(outs: tuple[Any, ...]) -> torch.Tensor:
        assert outs[1] is None
        return outs[0].sum() + outs[2].sum()

    expected = torch.autograd.grad(loss(fn(x, y)), (x, y))
    loss(checkpoint(fn, x, y, use_reentrant=use_reentrant)).backward()
    assert x.grad is not None and y.grad is not None
    assert torch.equal(expected[0], x.grad) and torch.equal(expected[1], y.grad)


@REENTRANT
def test_nested_checkpoints(use_reentrant: bool) -> None:
    model = mlp(depth=6, dropout=0.2)
    x = torch.randn(4, 16, requires_grad=True)
    plain, _ = step(model, x, model)

    def ck(fn: Callable[..., Any], *args: Any) -> Any:
        return checkpoint(fn, *args, use_reentrant=use_reentrant)

    def innermost(t: torch.Tensor) -> torch.Tensor:
        return model[6:12](t)

    def middle(t: torch.Tensor) -> torch.Tensor:
        return ck(innermost, model[3:6](t))

    def outer(t: torch.Tensor) -> torch.Tensor:
        return model[12:](ck(middle, model[:3](t)))

    ours, _ = step(model, x, lambda t: ck(outer, t))
    assert_all_equal(plain, ours)


def test_nested_mixed_with_torch_checkpoint() -> None:
    model = mlp(depth=4)
    x = torch.randn(4, 16, requires_grad=True)
    plain, _ = step(model, x, model)

    def inner_torch(t: torch.Tensor) -> torch.Tensor:
        return tuc.checkpoint(model[2:6], t, use_reentrant=False)

    def outer(t: torch.Tensor) -> torch.Tensor:
        return inner_torch(model[:2](t))

    ours, _ = step(model, x, lambda t: model[6:](checkpoint(outer, t)))
    assert_all_equal(plain, ours)


def test_inputs_without_requires_grad_nonreentrant() -> None:
    model = mlp()
    x = torch.randn(4, 16)  # only the parameters need gradients
    plain, _ = step(model, x, model)
    ours, _ = step(model, x, lambda t: checkpoint(model, t))
    assert_all_equal(plain, ours)


def test_inputs_without_requires_grad_reentrant_like_torch() -> None:
    # torch's reentrant checkpoint warns and its output does not require grad (the parameters
    # inside get no gradient); ckpt_runtime mirrors that.
    model = mlp()
    x = torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_out = tuc.checkpoint(model, x, use_reentrant=True)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = checkpoint(model, x, use_reentrant=True)
    assert out.requires_grad is torch_out.requires_grad is False
    assert torch.equal(out, torch_out)


@REENTRANT
def test_no_grad_forward_just_runs(use_reentrant: bool) -> None:
    calls = []
    x = torch.randn(3, requires_grad=True)

    def fn(t: torch.Tensor) -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        return t * 2

    with torch.no_grad():
        out = checkpoint(fn, x, use_reentrant=use_reentrant)
    assert not out.requires_grad and calls == [False]


def test_autograd_grad_nonreentrant() -> None:
    model = mlp()
    x = torch.randn(4, 16, requires_grad=True)
    params = list(model.parameters())
    expected = torch.autograd.grad(model(x).pow(2).sum(), [x, *params])
    got = torch.autograd.grad(checkpoint(model, x).pow(2).sum(), [x, *params])
    assert_all_equal(list(expected), list(got))
    # A subset of inputs too (backward does not need all of the region's saved tensors).
    (gx,) = torch.autograd.grad(checkpoint(model, x).pow(2).sum(), [x])
    assert torch.equal(gx, expected[0])


def test_autograd_grad_reentrant_rejected_like_torch() -> None:
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        torch.autograd.grad(tuc.checkpoint(torch.sin, x, use_reentrant=True).sum(), x)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        torch.autograd.grad(checkpoint(torch.sin, x, use_reentrant=True).sum(), x)


def test_retain_graph_backward_twice_recomputes_each_time() -> None:
    calls = []
    x = torch.randn(5, requires_grad=True)

    def fn(t: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return t.sin().exp()

    out = checkpoint(fn, x).sum()
    (a,) = torch.autograd.grad(out, x, retain_graph=True)
    (b,) = torch.autograd.grad(out, x)
    assert torch.equal(a, b) and len(calls) == 3


def test_grad_inside_the_region() -> None:
    # torch's NOTE [ Nestable Checkpoint ] Rule 6: backward inside the checkpointed forward.
    x = torch.randn(5, requires_grad=True)

    def fn(t: torch.Tensor) -> torch.Tensor:
        z = t.sin().cos()
        (gt,) = torch.autograd.grad(z.sum(), t, create_graph=True)
        return t.cos() * gt

    (expected,) = torch.autograd.grad(fn(x).sum(), x)
    (got,) = torch.autograd.grad(checkpoint(fn, x).sum(), x)
    assert torch.equal(expected, got)


@REENTRANT
@pytest.mark.parametrize("segments", [1, 2, 8])
def test_checkpoint_sequential(use_reentrant: bool, segments: int) -> None:
    model = mlp(depth=4, dropout=0.1)  # 12 modules; 8 segments of 1 plus a plain tail of 4
    x = torch.randn(4, 16, requires_grad=True)
    plain, _ = step(model, x, model)
    for functions in (model, list(model)):
        ours, _ = step(
            model,
            x,
            lambda t, f=functions: checkpoint_sequential(
                f, segments, t, use_reentrant=use_reentrant
            ),
        )
        assert_all_equal(plain, ours)


@REENTRANT
def test_checkpoint_sequential_recomputes_all_but_last_segment(use_reentrant: bool) -> None:
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(4)))
    counts = [0] * 4
    for i, m in enumerate(model):
        # pre-hooks: with early stop a recompute ends inside the last op, before forward hooks
        m.register_forward_pre_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
    x = torch.randn(2, 4, requires_grad=True)
    checkpoint_sequential(model, len(model), x, use_reentrant=use_reentrant).sum().backward()
    assert counts == [2, 2, 2, 1]


def test_checkpoint_sequential_argument_errors() -> None:
    model = mlp(depth=1)
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: foo"):
        checkpoint_sequential(model, 1, x, foo=1)
    with pytest.raises(ValueError, match="segments must be between 1 and"):
        checkpoint_sequential(model, 3, x)


def test_saved_input_fallback_without_make_saved_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch < 2.8 has no torch._C._autograd._make_saved_tensor: inputs are held and
    # version-checked by ckpt_runtime itself.
    monkeypatch.setattr(sys.modules["ckpt_runtime.checkpoint"], "_make_saved_tensor", None)
    model = mlp(dropout=0.2)
    x = torch.randn(4, 16, requires_grad=True)
    plain, _ = step(model, x, model)
    ours, _ = step(model, x, lambda t: checkpoint(lambda u: checkpoint(model, u), t))
    assert_all_equal(plain, ours)


def test_recomputed_tensors_dropped_once_backward_took_them() -> None:
    # torch's Rule 4: a recomputed tensor is handed to backward once and not kept by the
    # region, even with retain_graph=True; a second backward recomputes.
    import gc

    from ckpt_runtime.checkpoint import _Holder

    x = torch.randn(64, requires_grad=True)
    out = checkpoint(lambda t: t.sin().exp().cos(), x).sum()
    holders = [o for o in gc.get_objects() if type(o) is _Holder]
    assert holders and all(h.value is None and h.gid is None for h in holders)
    (a,) = torch.autograd.grad(out, x, retain_graph=True)
    assert all(h.value is None and h.gid is not None for h in holders)
    (b,) = torch.autograd.grad(out, x)
    assert torch.equal(a, b)


@REENTRANT
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_autocast_state_of_the_forward_is_replayed(use_reentrant: bool, where: str) -> None:
    # The recompute runs under the forward's autocast state, whatever the backward runs under.
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)

    def run(fn: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        x.grad = None
        fwd = torch.autocast("cpu", dtype=torch.bfloat16, enabled=where == "forward")
        bwd = torch.autocast("cpu", dtype=torch.bfloat16, enabled=where == "backward")
        with fwd:
            out = fn(x)
        with bwd:
            out.float().sum().backward()
        return grads(model, x)

    assert_all_equal(run(model), run(lambda t: checkpoint(model, t, use_reentrant=use_reentrant)))


@settings(max_examples=12, deadline=None)
@given(
    depth=st.integers(1, 5),
    segments=st.integers(1, 5),
    use_reentrant=st.booleans(),
    dropout=st.sampled_from([0.0, 0.5]),
)
def test_checkpoint_sequential_property(
    depth: int, segments: int, use_reentrant: bool, dropout: float
) -> None:
    model = mlp(depth=depth, width=6, dropout=dropout)
    segments = min(segments, len(model))
    x = torch.randn(3, 6, requires_grad=True)
    plain, _ = step(model, x, model)
    ours, _ = step(
        model, x, lambda t: checkpoint_sequential(model, segments, t, use_reentrant=use_reentrant)
    )
    assert_all_equal(plain, ours)


@REENTRANT
def test_transformer_layer_with_dropout_bitwise(use_reentrant: bool) -> None:
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.2, batch_first=True) for _ in range(2)
    )
    x = torch.randn(2, 5, 16, requires_grad=True)

    def run(ck: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        def f(t: torch.Tensor) -> torch.Tensor:
            for layer in layers:
                t = checkpoint(layer, t, use_reentrant=use_reentrant) if ck else layer(t)
            return t

        return f

    plain, _ = step(layers, x, run(False))
    ours, _ = step(layers, x, run(True))
    assert_all_equal(plain, ours)


def test_hf_gpt2_with_ckpt_runtime_checkpoint() -> None:
    # HF calls the checkpoint function as f(partial(Block.forward, block, **kwargs), *args):
    # keyword arguments, non-tensor ones, and a module hidden in a partial (markers' target).
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 50, (2, 8))

    def run() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain = run()
    model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=checkpoint)
    listener = Recorder()
    with add_listener(listener):
        ours = run()
    assert_all_equal(plain, ours)
    begins = [e[2] for e in listener.events if e[0] == "begin"]
    assert begins == [model.transformer.h[1], model.transformer.h[0]]


# ------------------------------------------------------------------------ running statistics


def bn_model(width_in: int = 6) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(width_in, 8),
        nn.BatchNorm1d(8),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.BatchNorm1d(8, momentum=None),  # cumulative average: counts num_batches_tracked
    )


def stats(model: nn.Module) -> list[torch.Tensor]:
    return [
        b.clone()
        for n, b in model.named_buffers()
        if n.rsplit(".", 1)[-1] in ("running_mean", "running_var", "num_batches_tracked")
    ]


@REENTRANT
@pytest.mark.parametrize("wrap", ["module", "lambda", "bound_method", "partial"])
def test_running_stats_updated_once(use_reentrant: bool, wrap: str) -> None:
    import functools

    model = bn_model()
    reference = copy.deepcopy(model)
    x = torch.randn(10, 6, requires_grad=True)
    fn: Callable[..., Any] = {
        "module": model,
        "lambda": lambda t: model(t),
        "bound_method": model.forward,
        "partial": functools.partial(model.__call__),
    }[wrap]
    for _ in range(2):  # two steps: stats after each equal the plain steps'
        reference(x).sum().backward()
        checkpoint(fn, x, use_reentrant=use_reentrant).sum().backward()
        assert_all_equal(stats(reference), stats(model))
    assert model[1].num_batches_tracked.item() == 2


@REENTRANT
def test_torch_checkpoint_double_counts_running_stats(use_reentrant: bool) -> None:
    # What NOTE [ Running statistics ] fixes: torch.utils.checkpoint updates the statistics
    # again during the recompute.
    model = bn_model()
    reference = copy.deepcopy(model)
    x = torch.randn(10, 6, requires_grad=True)
    reference(x).sum().backward()
    tuc.checkpoint(model, x, use_reentrant=use_reentrant).sum().backward()
    assert model[1].num_batches_tracked.item() == 2
    assert not torch.equal(model[1].running_mean, reference[1].running_mean)


def test_running_stats_other_modules_and_eval_mode() -> None:
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3),
        nn.BatchNorm2d(3),
        nn.InstanceNorm2d(3, track_running_stats=True),
        nn.InstanceNorm2d(3),  # no running stats: nothing to guard
    )
    reference = copy.deepcopy(model)
    x = torch.randn(2, 2, 6, 6, requires_grad=True)
    reference(x).sum().backward()
    checkpoint(model, x).sum().backward()
    assert_all_equal(stats(reference), stats(model))
    model.eval()
    reference.eval()
    reference(x).sum().backward()
    checkpoint(model, x).sum().backward()
    assert_all_equal(stats(reference), stats(model))


def test_running_stats_with_nested_checkpoints_and_sequential() -> None:
    model = nn.Sequential(*(bn_model(8) for _ in range(3)))
    reference = copy.deepcopy(model)
    x = torch.randn(10, 8, requires_grad=True)
    reference(x).sum().backward()
    checkpoint(lambda t: model[2](checkpoint(model[:2], t)), x).sum().backward()
    assert_all_equal(stats(reference), stats(model))
    reference(x).sum().backward()
    checkpoint_sequential(model, 3, x).sum().backward()
    assert_all_equal(stats(reference), stats(model))


# --------------------------------------------------------------------------- mismatch error


class Shifty(nn.Module):
    """Output shape depends on a global counter: the recompute differs from the forward."""

    calls = 0

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        Shifty.calls += 1
        return t[: Shifty.calls + 1].sin().exp()


@REENTRANT
def test_recompute_mismatch_names_the_region(use_reentrant: bool) -> None:
    Shifty.calls = 0
    model = nn.Sequential(nn.Identity(), Shifty())
    ckpt_runtime.register_module_names(model, prefix="net")
    x = torch.randn(6, requires_grad=True)
    out = checkpoint(model[1], x, use_reentrant=use_reentrant)
    with pytest.raises(RecomputeMismatchError) as info:
        out.sum().backward()
    message = str(info.value)
    assert "module 'net.1' (Shifty)" in message
    assert "(2,)" in message and "(3,)" in message
    assert "deterministic" in message and "exclude it from the checkpoint plan" in message
    assert isinstance(info.value, RuntimeError)


def test_recompute_mismatch_plain_function_and_opt_out() -> None:
    state = {"n": 2}

    def grows(t: torch.Tensor) -> torch.Tensor:
        state["n"] += 1
        return t[: state["n"]].sin()

    x = torch.randn(6, requires_grad=True)
    out = checkpoint(grows, x)
    with pytest.raises(RecomputeMismatchError, match=r"function .*grows \(.*test_ckpt_checkpoint"):
        out.sum().backward()


def test_determinism_check_none_skips_the_metadata_check() -> None:
    # torch's spelling: determinism_check="none". Here the recompute saves a float32 tensor where
    # the forward saved a float64 one; autograd casts the gradient back, so it runs through.
    state = {"double": False}

    def flips(t: torch.Tensor) -> torch.Tensor:
        state["double"] = not state["double"]
        return (t.double() if state["double"] else t.float()).sin().float()

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(RecomputeMismatchError, match="float32 on cpu in the recompute"):
        checkpoint(flips, x).sum().backward()
    state["double"] = False
    checkpoint(flips, x, determinism_check="none").sum().backward()
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint(flips, x, determinism_check="strict")


def test_mismatch_in_fewer_saved_tensors() -> None:
    flag = {"first": True}

    def fn(t: torch.Tensor) -> torch.Tensor:
        if flag["first"]:
            flag["first"] = False
            return t.sin().cos()
        return t * 2  # saves nothing

    x = torch.randn(3, requires_grad=True)
    out = checkpoint(fn, x)
    with pytest.raises(RecomputeMismatchError, match="fewer tensors"):
        out.sum().backward()


def test_running_stats_restored_even_when_recompute_fails() -> None:
    Shifty.calls = 0
    bn = nn.BatchNorm1d(1)
    model = nn.Sequential(Shifty(), nn.Unflatten(0, (-1, 1)), bn)
    x = torch.randn(6, requires_grad=True)
    out = checkpoint(model, x)
    after_forward = stats(bn)
    with pytest.raises(RecomputeMismatchError):
        out.sum().backward()
    assert_all_equal(after_forward, stats(bn))


# ------------------------------------------------------------------------------ warnings


@REENTRANT
def test_warns_once_for_dropout_without_preserved_rng(use_reentrant: bool) -> None:
    model = mlp(dropout=0.5)
    x = torch.randn(4, 16, requires_grad=True)
    with pytest.warns(UnsafeRecomputeWarning, match="consumes random numbers") as record:
        for _ in range(3):
            checkpoint(model, x, use_reentrant=use_reentrant, preserve_rng_state=False)
    assert len(record) == 1 and "Sequential module" in str(record[0].message)
    assert record[0].filename == __file__  # points at the caller's checkpoint(...) line
    # No RNG, no warning; preserved RNG, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint(mlp(), x, use_reentrant=use_reentrant, preserve_rng_state=False)
        checkpoint(mlp(dropout=0.5), x, use_reentrant=use_reentrant)


@REENTRANT
def test_inplace_input_modification_warns_then_fails_clearly(use_reentrant: bool) -> None:
    def bumps(t: torch.Tensor) -> torch.Tensor:
        t.mul_(2)
        return t.sin()

    x = torch.randn(4, requires_grad=True)
    with pytest.warns(UnsafeRecomputeWarning, match="modified its input #0 in place") as record:
        outs = [checkpoint(bumps, x * 1, use_reentrant=use_reentrant) for _ in range(2)]
    assert len(record) == 1
    with pytest.raises(RecomputeMismatchError, match="modified in place"):
        outs[0].sum().backward()


# ------------------------------------------------------------------------------ markers


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, object]] = []

    def on_region_forward(self, region_id: int, target: object) -> None:
        self.events.append(("forward", region_id, target))

    def on_recompute_begin(self, region_id: int, target: object) -> None:
        self.events.append(("begin", region_id, target))

    def on_recompute_end(self, region_id: int, target: object) -> None:
        self.events.append(("end", region_id, target))


@REENTRANT
def test_markers_pair_forward_and_recompute(use_reentrant: bool) -> None:
    model = mlp(depth=3)
    blocks = [model[i : i + 2] for i in range(0, 6, 2)]
    x = torch.randn(2, 16, requires_grad=True)
    listener = Recorder()
    handle = add_listener(listener)
    try:
        t = x
        for b in blocks:
            t = checkpoint(b, t, use_reentrant=use_reentrant)
        forwards = list(listener.events)
        t.sum().backward()
    finally:
        handle.remove()
    assert [e[0] for e in forwards] == ["forward"] * 3
    ids = [e[1] for e in forwards]
    assert len(set(ids)) == 3
    assert [e[2] for e in forwards] == blocks
    recompute = listener.events[3:]
    # backward runs the regions last to first, each as a begin/end pair
    expected = []
    for rid, b in zip(reversed(ids), reversed(blocks), strict=True):
        expected += [("begin", rid, b), ("end", rid, b)]
    assert recompute == expected
    checkpoint(blocks[0], x, use_reentrant=use_reentrant).sum().backward()
    assert len(listener.events) == 9  # removed: nothing more


def test_markers_target_unwraps_partial_and_bound_methods_and_ids_are_unique() -> None:
    import functools

    lin = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)

    class OnlyRequired:  # on_region_forward is optional
        def __init__(self) -> None:
            self.seen: list[tuple[int, object]] = []

        def on_recompute_begin(self, region_id: int, target: object) -> None:
            self.seen.append((region_id, target))

        def on_recompute_end(self, region_id: int, target: object) -> None:
            pass

    def plain(t: torch.Tensor) -> torch.Tensor:
        return lin(t).tanh()

    listener = OnlyRequired()
    with add_listener(listener):
        for fn in (
            functools.partial(lin.__call__),
            lin.forward,
            functools.partial(nn.Linear.forward, lin),  # HF's GradientCheckpointingLayer
            plain,
            lin,
        ):
            checkpoint(fn, x).sum().backward()
    assert [t for _, t in listener.seen] == [lin, lin, lin, plain, lin]
    assert len({rid for rid, _ in listener.seen}) == 5
    with pytest.raises(TypeError, match="on_recompute_begin"):
        add_listener(object())  # type: ignore[arg-type]
