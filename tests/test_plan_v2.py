"""Plan format version 2 (op-level regions: ``save``, ``offload``) and its runtime.

The format half is torch-free (ckpt_runtime/plan.py, NOTE [ Op-level regions ]); the runtime
half applies op-level plans to a TransformerEncoder training step with dropout and checks that
loss and gradients stay bitwise those of the plain step (NOTE [ Exact gradients under an op-level
plan ] in ckpt_runtime/oplevel.py), and that a broken plan fails the gradient gate.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ckpt_runtime import (
    ModuleRegion,
    Plan,
    PlanError,
    apply_plan,
    compare_gradients,
    gradients_of,
    load_plan,
    save_plan,
)
from ckpt_runtime.plan import op_auto_name
from tests.conftest import ROOT

pytestmark = pytest.mark.torch


def doc(regions: list[Any], version: int = 2, **extra: Any) -> dict[str, Any]:
    return {"format": "ckview-plan", "version": version, "name": "p", "regions": regions, **extra}


# ----------------------------------------------------------------------------- the format


def test_v2_round_trip_and_v1_stays_v1(tmp_path: Path) -> None:
    plan = Plan.from_json(
        doc(
            [
                {"module": "layers.*", "save": ["aten.mm*", "layers.0.self_attn.bmm_1"]},
                {"module": "head", "save": ["*"], "offload": True},
            ]
        )
    )
    assert plan.version == 2
    assert plan.regions[0] == ModuleRegion("layers.*", ("aten.mm*", "layers.0.self_attn.bmm_1"))
    assert plan.regions[1] == ModuleRegion("head", ("*",), offload=True)
    save_plan(plan, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == plan
    assert json.loads((tmp_path / "p.json").read_text())["version"] == 2
    # A v1 document migrates to regions that recompute everything, and is written back as v1.
    old = Plan.from_json(doc([{"module": "layers.0"}], version=1))
    assert old.regions == (ModuleRegion("layers.0"),) and old.regions[0].save is None
    assert old.version == 1 and old.to_json()["version"] == 1
    assert old.to_json()["regions"] == [{"module": "layers.0"}]


BAD_V2 = [
    (doc([{"module": "a", "save": ["aten.mm"]}], version=1), "need plan format version 2"),
    (doc([{"module": "a", "save": []}]), "'save' must be a non-empty list"),
    (doc([{"module": "a", "save": "aten.mm"}]), "'save' must be a non-empty list"),
    (doc([{"module": "a", "save": ["aten mm"]}]), "'save' entry 'aten mm'"),
    (doc([{"module": "a", "save": [3]}]), "'save' entry 3"),
    (doc([{"module": "a", "offload": "yes"}]), "'offload' must be true or false"),
    (doc([{"module": "a", "save": ["aten.mm"], "offload": True}]), "'offload' needs 'save'"),
    (doc([{"module": "a", "offload": True}]), "'offload' needs 'save'"),
    (doc([{"module": "a", "save": ["*"]}]), "changes nothing"),
    (doc([{"module": "a", "keep": ["x"]}]), "unknown key(s) ['keep'] in module region"),
    (doc([{"sequential": "a", "start": 0, "stop": 1, "save": ["*"]}]), "unknown key(s)"),
]


@pytest.mark.parametrize(("document", "match"), BAD_V2)
def test_bad_v2_documents_fail_in_one_line(document: dict[str, Any], match: str) -> None:
    with pytest.raises(PlanError) as caught:
        Plan.from_json(document)
    assert match in str(caught.value) and "\n" not in str(caught.value)


def test_auto_names() -> None:
    assert op_auto_name("layers.0.self_attn", "aten.mm", 0) == "layers.0.self_attn.mm_0"
    assert op_auto_name("", "aten.addmm", 2) == "addmm_2"


def test_plan_core_still_imports_no_torch() -> None:
    code = (
        "import sys, ckpt_runtime.plan, ckpt_runtime.resolve\n"
        "from ckpt_runtime.plan import Plan\n"
        "Plan.from_json({'format': 'ckview-plan', 'version': 2,"
        " 'regions': [{'module': 'a', 'save': ['aten.mm*']}]})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- resolving


def encoder(layers: int = 2) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def test_conflicting_and_nesting_op_level_regions_are_refused() -> None:
    model = encoder()
    clash = doc([{"module": "layers.*", "save": ["aten.mm"]}, {"module": "layers.0"}])
    with pytest.raises(PlanError, match="different 'save' or 'offload'"):
        apply_plan(model, clash)
    nest = doc([{"module": "layers.0", "save": ["aten.mm"]}, {"module": "layers.0.linear1"}])
    with pytest.raises(PlanError, match="nest"):
        apply_plan(model, nest)
    # Two patterns that agree select a module once.
    same = doc(
        [{"module": "layers.*", "save": ["aten.mm"]}, {"module": "layers.1", "save": ["aten.mm"]}]
    )
    applied = apply_plan(model, same)
    assert applied.modules == ("layers.0", "layers.1")
    assert str(applied).splitlines()[1:] == [
        "  layers.0 (save aten.mm)",
        "  layers.1 (save aten.mm)",
    ]
    applied.remove()


# ----------------------------------------------------------------------------- the runtime

Grads = dict[str, torch.Tensor | None]


def train_step(model: nn.Module, plan: dict[str, Any] | None = None) -> Grads:
    """One step of a copy of ``model`` (with ``plan`` applied): its gradients and loss."""
    twin = copy.deepcopy(model)
    if plan is not None:
        apply_plan(twin, plan)
    torch.manual_seed(1)
    x = torch.randn(3, 5, 16)
    loss = twin(x).square().mean()
    loss.backward()
    return {"loss": loss.detach(), **gradients_of(twin)}


@pytest.fixture(scope="module")
def baseline() -> tuple[nn.Module, Grads]:
    model = encoder()
    return model, train_step(model)


EXACT_PLANS = {
    "matmuls": doc([{"module": "layers.*", "save": ["aten.mm*", "aten.addmm"]}]),
    "auto-names": doc([{"module": "layers.*", "save": ["layers.*.self_attn.bmm_1", "*linear1*"]}]),
    "one-block-names": doc([{"module": "layers.*", "save": ["layers.1.self_attn.bmm_0"]}]),
    "layer-norms": doc([{"module": "layers.*", "save": ["aten.native_layer_norm"]}]),
    "offload": doc([{"module": "layers.*", "save": ["*"], "offload": True}]),
}


@pytest.mark.parametrize("name", EXACT_PLANS)
def test_op_level_plans_keep_gradients_bitwise(
    baseline: tuple[nn.Module, Grads], name: str
) -> None:
    model, plain = baseline
    result = compare_gradients(plain, train_step(model, EXACT_PLANS[name]))
    assert result == {"equal": True, "max_abs_diff": 0.0, "first_differing": None}


def test_policy_saves_exactly_the_named_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spy on the policy: auto-names pick one call of an op, names pick them all."""
    import ckpt_runtime.oplevel as oplevel

    decisions: list[tuple[str, str]] = []
    policy_call: Callable[..., Any] = oplevel.SavePolicy.__call__

    def spy(self: Any, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        decision = policy_call(self, ctx, op, *args, **kwargs)
        decisions.append((str(op), decision.name))
        return decision

    monkeypatch.setattr(oplevel.SavePolicy, "__call__", spy)
    train_step(encoder(1), doc([{"module": "layers.0", "save": ["layers.0.self_attn.bmm_1"]}]))
    bmm = [d for op, d in decisions if op == "aten.bmm.default"]
    assert bmm == ["PREFER_RECOMPUTE", "MUST_SAVE"]
    saved = {op for op, d in decisions if d == "MUST_SAVE"}
    assert saved == {"aten.bmm.default"}  # dropout's bernoulli_ writes its own fresh tensor


def test_recomputing_dropout_without_rng_state_fails_the_gate(
    baseline: tuple[nn.Module, Grads],
) -> None:
    model, plain = baseline
    broken = doc(
        [{"module": "layers.*", "save": ["aten.mm*"]}], options={"preserve_rng_state": False}
    )
    result = compare_gradients(plain, train_step(model, broken))
    assert not result["equal"] and result["max_abs_diff"] > 0
    assert result["first_differing"] == "layers.0.self_attn.in_proj_weight"  # loss is equal
    assert result["first_differing"] in plain


class Block(nn.Module):
    seen: torch.Tensor

    def __init__(self, write: str) -> None:
        super().__init__()
        self.linear, self.norm, self.write = nn.Linear(4, 4), nn.BatchNorm1d(4), write
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.write == "input":
            x.add_(1)
        if self.write == "buffer":
            self.seen.add_(1)
        y = self.linear(x)
        if self.write == "saved":
            y.mul_(2)
        if self.write == "fresh":
            y = y * 2
            y.mul_(2)  # a tensor of this call, recomputed exactly
        return self.norm(y).relu()


def block_step(write: str, plan: dict[str, Any] | None) -> tuple[Grads, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Block(write))
    if plan is not None:
        apply_plan(model, plan)
    model(torch.randn(6, 4)).sum().backward()
    return gradients_of(model), {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("write", ["none", "fresh"])
def test_in_place_writes_of_state_and_fresh_tensors_stay_exact(write: str) -> None:
    """BatchNorm writes running stats and num_batches_tracked in place: saved, so written once."""
    plan = doc([{"module": "1", "save": ["aten.addmm"]}])
    grads, state = block_step(write, None)
    planned_grads, planned_state = block_step(write, plan)
    assert compare_gradients(grads, planned_grads)["equal"]
    assert compare_gradients(state, planned_state)["equal"]  # buffers updated once
    assert int(planned_state["1.norm.num_batches_tracked"]) == 1


@pytest.mark.parametrize(
    ("write", "match"),
    [
        ("input", "aten.add_.Tensor (1.add__0) writes in place an input of the region"),
        ("buffer", "writes in place a parameter or buffer"),
        ("saved", "output of 1.linear.addmm_0"),
    ],
)
def test_in_place_writes_that_cannot_be_exact_are_refused(write: str, match: str) -> None:
    with pytest.raises(PlanError, match=re.escape(match)) as caught:
        block_step(write, doc([{"module": "1", "save": ["aten.addmm"]}]))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("save", "match"),
    [
        (["aten.nosuch"], "unknown op 'aten.nosuch'"),
        (["aten.mm.nosuch"], "unknown op 'aten.mm.nosuch'"),
        (["aten.conv*"], re.escape("'aten.conv*' matches no op")),
    ],
)
def test_bad_op_names_fail_in_one_line(save: list[str], match: str) -> None:
    with pytest.raises(PlanError, match=match) as caught:
        train_step(encoder(1), doc([{"module": "layers.0", "save": save}]))
    assert "\n" not in str(caught.value)


def test_old_torch_and_reentrant_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = doc([{"module": "layers.0", "save": ["aten.mm"]}])
    with pytest.raises(PlanError, match="needs non-reentrant"):
        apply_plan(encoder(1), {**plan, "options": {"use_reentrant": True}})
    monkeypatch.delattr(torch.utils.checkpoint, "CheckpointPolicy")
    with pytest.raises(PlanError, match=r"needs torch 2\.4 or newer") as caught:
        apply_plan(encoder(1), plan)
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- the gate


def test_compare_gradients() -> None:
    a = {"w": torch.tensor([1.0, float("nan")]), "b": None}
    assert compare_gradients(a, {"w": torch.tensor([1.0, float("nan")]), "b": None})["equal"]
    off = {"w": torch.tensor([1.5, float("nan")]), "b": None}
    assert compare_gradients(a, off) == {
        "equal": False,
        "max_abs_diff": 0.5,
        "first_differing": "w",
    }
    assert compare_gradients(a, off, tolerance=0.5)["equal"]
    missing = compare_gradients(a, {"w": a["w"]})
    assert missing["first_differing"] == "b" and missing["max_abs_diff"] == float("inf")
    grad_vs_none = compare_gradients({"b": torch.zeros(1)}, {"b": None})
    assert not grad_vs_none["equal"]
    with pytest.raises(ValueError, match="tolerance"):
        compare_gradients(a, a, tolerance=-1)
