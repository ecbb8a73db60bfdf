"""Checkpoint plans: the JSON format (ckpt_runtime.plan), and resolving, applying and removing a
plan on real models (ckpt_runtime.apply). See docs/plan-format.md."""

from __future__ import annotations

import copy
import importlib
import itertools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ckpt_runtime.apply as apply_mod
from ckpt_runtime import markers
from ckpt_runtime.apply import AppliedPlan, apply_plan, remove_plan, resolve_plan
from ckpt_runtime.checkpoint import UnsafeRecomputeWarning
from ckpt_runtime.plan import (
    ModuleRegion,
    Plan,
    PlanError,
    PlanOptions,
    SegmentRegion,
    load_plan,
    match_path,
    parse_preset,
    save_plan,
)
from ckpt_runtime.presets import find_block_chain, resolve_preset
from tests.conftest import ROOT, load_example

pytestmark = pytest.mark.torch

# ----------------------------------------------------------------------------- models


class Block(nn.Module):
    def __init__(self, d: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm(x)))))


class SeqNet(nn.Module):
    """A custom model whose blocks are an nn.Sequential that forward calls."""

    def __init__(self, n: int = 6, d: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.blocks = nn.Sequential(*(Block(d, dropout) for _ in range(n)))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)))


class LoopNet(SeqNet):
    """Loops over its nn.Sequential instead of calling it (as examples/cnn.py does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class KwBlock(nn.Module):
    """Takes a non-tensor positional argument and tensor / non-tensor keyword arguments."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(
        self, x: torch.Tensor, scale: float, *, mask: torch.Tensor, act: str = "tanh"
    ) -> tuple[torch.Tensor, str]:
        y = getattr(torch, act)(self.fc(x)) * mask * scale
        return x + y, act


class KwNet(nn.Module):
    def __init__(self, n: int = 3, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.layers = nn.ModuleList(KwBlock(d) for _ in range(n))
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, layer in enumerate(self.layers):
            x, act = layer(x, 0.5 + i, mask=mask, act="sigmoid" if i % 2 else "tanh")
            assert act in ("tanh", "sigmoid")  # a non-tensor output survives checkpointing
        return self.head(x)


def seq_net(n: int = 6, dropout: float = 0.0) -> SeqNet:
    torch.manual_seed(0)
    return SeqNet(n, dropout=dropout)


def encoder_lm() -> nn.Module:
    """examples/transformer.py's CausalLM: an nn.TransformerEncoder with dropout."""
    torch.manual_seed(0)
    model: nn.Module = load_example("transformer").CausalLM(
        vocab=50, seq_len=16, d_model=32, nhead=2, num_layers=4, dim_feedforward=64, dropout=0.1
    )
    return model.train()


def gpt2() -> nn.Module:
    """HF GPT-2 built from a config (no download); dropout on, KV cache off for training."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=4,
        n_embd=64,
        n_head=2,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    torch.manual_seed(0)
    model: nn.Module = transformers.GPT2LMHeadModel(config)
    return model.train()


# One training step for each model; the seed makes dropout draw the same masks in every run.
Step = Callable[[nn.Module], torch.Tensor]


def seq_loss(model: nn.Module) -> torch.Tensor:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    return model(x).square().mean()


def lm_loss(model: nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    return F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())


def gpt2_loss(model: nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    return model(ids, labels=ids).loss


def train_step(model: nn.Module, loss_fn: Step) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(1234)
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_same_step(a: Any, b: Any) -> None:
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


@contextmanager
def count_calls(model: nn.Module, paths: list[str]) -> Iterator[Counter[str]]:
    """Count calls of the modules at ``paths`` with forward PRE-hooks. (A forward hook may not
    fire in the recompute: checkpoint stops it as soon as every saved tensor is back.)"""
    calls: Counter[str] = Counter()
    handles = [
        model.get_submodule(p).register_forward_pre_hook(
            lambda module, args, p=p: calls.update([p])
        )
        for p in paths
    ]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def regions(plan: Plan | AppliedPlan) -> list[str]:
    plan = plan.plan if isinstance(plan, AppliedPlan) else plan
    return [str(r) for r in plan.regions]


def doc(**members: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"format": "ckview-plan", "version": 1, "name": "t", "regions": []}
    base.update(members)
    return {k: v for k, v in base.items() if v is not DROP}


DROP = object()

# ----------------------------------------------------------------------------- the format

EXAMPLE = {
    "format": "ckview-plan",
    "version": 1,
    "name": "sqrt",
    "regions": [{"module": "transformer.h.0"}, {"sequential": "blocks", "start": 0, "stop": 3}],
    "options": {"use_reentrant": False, "preserve_rng_state": True},
}


def test_example_plan_parses_and_round_trips() -> None:
    plan = Plan.from_json(json.dumps(EXAMPLE))
    assert plan == Plan(
        "sqrt",
        (ModuleRegion("transformer.h.0"), SegmentRegion("blocks", 0, 3)),
        PlanOptions(use_reentrant=False, preserve_rng_state=True),
    )
    assert plan.to_json() == EXAMPLE
    assert str(plan) == "plan 'sqrt': transformer.h.0, blocks[0:3]"


def test_defaults_and_canonical_form() -> None:
    plan = Plan.from_json({"format": "ckview-plan", "version": 1, "regions": []})
    assert plan.name == "plan" and plan.options == PlanOptions() and plan.regions == ()
    # Options are always written out; a preset's "@chain" becomes "chain".
    assert Plan.from_json(doc(regions=DROP, preset="every:02@enc.layers")).to_json() == {
        "format": "ckview-plan",
        "version": 1,
        "name": "t",
        "preset": "every:2",
        "chain": "enc.layers",
        "options": {"use_reentrant": False, "preserve_rng_state": True},
    }


def test_every_json_example_in_the_docs_is_a_valid_plan() -> None:
    text = (ROOT / "docs" / "plan-format.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 5
    for block in blocks:
        plan = Plan.from_json(block)
        assert Plan.from_json(plan.to_json()) == plan


_components = st.sampled_from(["h", "0", "12", "layers", "blk_1", "*", "?", "[0-3]", "**", "x*"])
_paths = st.lists(st.sampled_from(["blocks", "0", "enc", "layers", "f_1"]), max_size=3).map(
    ".".join
)
_names = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "" and s.isprintable())
_meta = st.dictionaries(
    st.text(max_size=5),
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    max_size=3,
)


@st.composite
def _segments(draw: st.DrawFn) -> list[SegmentRegion]:
    out: list[SegmentRegion] = []
    for path in draw(st.lists(_paths, max_size=2, unique=True)):
        bounds = sorted(draw(st.sets(st.integers(0, 30), min_size=2, max_size=6)))
        for a, b in itertools.pairwise(bounds):
            if draw(st.booleans()):
                out.append(SegmentRegion(path, a, b))
    return out


_options = st.builds(PlanOptions, st.booleans(), st.booleans())
_region_plans = st.builds(
    lambda name, mods, segs, options, meta, order: Plan(
        name,
        tuple(sorted([*mods, *segs], key=lambda r: order.index(type(r).__name__))),
        options,
        meta=meta,
    ),
    _names,
    st.lists(st.lists(_components, max_size=4).map(".".join).map(ModuleRegion), max_size=4),
    _segments(),
    _options,
    _meta,
    st.permutations(["ModuleRegion", "SegmentRegion"]),
)
_preset_plans = st.builds(
    lambda name, preset, chain, options, meta: Plan(
        name, preset=preset, chain=chain, options=options, meta=meta
    ),
    _names,
    st.sampled_from(["none", "all", "sqrt", "every:1", "every:3"]),
    st.none() | _paths,
    _options,
    _meta,
)


@settings(max_examples=150, deadline=None)
@given(_region_plans | _preset_plans)
def test_json_round_trip(plan: Plan) -> None:
    text = json.dumps(plan.to_json())
    again = Plan.from_json(text)
    assert again == plan
    assert again.to_json() == plan.to_json()


def test_save_and_load(tmp_path: Path) -> None:
    plan = Plan("budget", (ModuleRegion("blocks.*"),), meta={"budget_bytes": 123})
    path = tmp_path / "my-plan.json"
    save_plan(plan, path)
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n") and json.loads(text)["meta"] == {"budget_bytes": 123}
    assert load_plan(path) == plan and load_plan(str(path)) == plan
    # A file without a name is named after the file; a file named like a preset loads via ./
    (tmp_path / "sqrt").write_text(json.dumps(doc(name=DROP)), encoding="utf-8")
    assert load_plan(tmp_path / "sqrt").name == "sqrt"
    assert load_plan(tmp_path / "sqrt").regions == ()


@pytest.mark.parametrize(
    ("text", "preset", "chain", "name"),
    [
        ("none", "none", None, "none"),
        ("all", "all", None, "all"),
        ("sqrt", "sqrt", None, "sqrt"),
        ("every:3", "every:3", None, "every:3"),
        ("every:02@encoder.layers", "every:2", "encoder.layers", "every:2@encoder.layers"),
        ("sqrt@", "sqrt", "", "sqrt@"),
    ],
)
def test_load_preset_strings(text: str, preset: str, chain: str | None, name: str) -> None:
    plan = load_plan(text)
    assert (plan.preset, plan.chain, plan.name, plan.regions) == (preset, chain, name, ())
    assert plan.is_preset


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("transformer.h.*", "transformer.h.0", True),
        ("transformer.h.*", "transformer.h.0.attn", False),  # '*' does not cross a dot
        ("transformer.h.*", "transformer.h", False),
        ("encoder.layers.[0-3]", "encoder.layers.3", True),
        ("encoder.layers.[0-3]", "encoder.layers.13", False),  # [..] is one character
        ("encoder.layers.1[0-5]", "encoder.layers.13", True),
        ("h.[!0]", "h.0", False),
        ("h.?", "h.7", True),
        ("**.mlp", "transformer.h.3.mlp", True),
        ("**.mlp", "mlp", True),  # '**' matches zero components too
        ("**.mlp", "transformer.h.3.mlp.c_fc", False),
        ("encoder.**", "encoder", True),
        ("a.**.c", "a.b.b.c", True),
        ("", "", True),  # the model itself
        ("", "blocks", False),
        ("Blocks", "blocks", False),  # case-sensitive everywhere
        ("a[[]1]", "a[1]", True),  # escaping a literal '['
    ],
)
def test_pattern_matching(pattern: str, path: str, expected: bool) -> None:
    # NOTE [ Module path patterns ]
    assert match_path(pattern, path) is expected


# (plan document, substring of the message)
STATIC_ERRORS: list[tuple[Any, str]] = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "a plan is a JSON object"),
    (doc(format=DROP), "not a ckview plan: it has no 'format'"),
    (doc(format="ckview-trace"), "has format 'ckview-trace'"),
    (doc(version=DROP), "'version' must be a positive integer"),
    (doc(version="1"), "'version' must be a positive integer"),
    (doc(version=True), "'version' must be a positive integer"),
    (doc(version=3), "newer than this ckpt_runtime supports (2); upgrade"),
    (doc(regions=DROP), "exactly one of 'regions'"),
    (doc(preset="sqrt"), "it has both"),
    (doc(region=[]), "unknown key(s) ['region']"),
    (doc(name=""), "plan name must be a non-empty string"),
    (doc(name="two\nlines"), "one line of printable characters"),
    (doc(name=3), "plan name must be a non-empty string"),
    (doc(regions={"module": "a"}), "'regions' must be a JSON array"),
    (doc(regions=["blocks.0"]), "regions[0]: a region must be a JSON object"),
    (doc(regions=[{}]), "regions[0]: region {} has neither 'module' nor 'sequential'"),
    (doc(regions=[{"module": "a", "sequential": "b"}]), "either 'module'"),
    (doc(regions=[{"module": "a", "stop": 2}]), "unknown key(s) ['stop'] in module region"),
    (doc(regions=[{"module": 3}]), "module pattern must be a string"),
    (doc(regions=[{"module": "a..b"}]), "has an empty component"),
    (doc(regions=[{"module": "a."}]), "has an empty component"),
    (doc(regions=[{"module": "a**.b"}]), "'**' must be a whole component"),
    (doc(regions=[{"sequential": "b", "start": 0}]), "is missing 'stop'"),
    (doc(regions=[{"sequential": "b", "start": 0, "stop": 2, "x": 1}]), "unknown key(s) ['x']"),
    (doc(regions=[{"sequential": "b.*", "start": 0, "stop": 2}]), "exact module path"),
    (doc(regions=[{"sequential": "b", "start": 2, "stop": 2}]), "start (2) must be less than"),
    (doc(regions=[{"sequential": "b", "start": 3, "stop": 1}]), "start (3) must be less than"),
    (doc(regions=[{"sequential": "b", "start": -1, "stop": 1}]), "start must be >= 0"),
    (doc(regions=[{"sequential": "b", "start": False, "stop": 1}]), "must be an integer"),
    (doc(regions=[{"sequential": "b", "start": 0.0, "stop": 1}]), "must be an integer"),
    (
        doc(
            regions=[
                {"sequential": "b", "start": 0, "stop": 3},
                {"sequential": "b", "start": 2, "stop": 4},
            ]
        ),
        "segments b[0:3] and b[2:4] overlap",
    ),
    (
        doc(
            regions=[
                {"sequential": "b", "start": 0, "stop": 4},
                {"sequential": "b", "start": 1, "stop": 2},
            ]
        ),
        "overlap",
    ),
    (doc(options={"use_reentrnt": True}), "unknown option 'use_reentrnt'"),
    (doc(options={"use_reentrant": 1}), "option use_reentrant must be true or false"),
    (doc(options=[]), "'options' must be a JSON object"),
    (doc(meta=[1]), "'meta' must be a JSON object"),
    (doc(regions=DROP, preset="sqrtt"), "unknown preset 'sqrtt'"),
    (doc(regions=DROP, preset="every:0"), "K must be >= 1"),
    (doc(regions=DROP, preset="every"), "unknown preset 'every'"),
    (doc(regions=DROP, preset="every:-2"), "unknown preset"),
    (doc(regions=DROP, preset=2), "'preset' must be a string"),
    (doc(regions=DROP, preset="sqrt@a.*"), "exact module path"),
    (doc(regions=DROP, preset="sqrt@a", chain="b"), "the chain is given twice"),
    (doc(chain="blocks"), "'chain' only applies to a preset plan"),
]


@pytest.mark.parametrize(("document", "message"), STATIC_ERRORS)
def test_plan_errors(document: Any, message: str) -> None:
    text = document if isinstance(document, str) else json.dumps(document)
    with pytest.raises(PlanError) as info:
        Plan.from_json(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_plan_errors_in_python_api_and_files(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="must be ModuleRegion or SegmentRegion"):
        Plan("p", ("blocks.0",))  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="not both"):
        Plan("p", (ModuleRegion("a"),), preset="sqrt")
    with pytest.raises(PlanError, match=r"give the chain separately \(chain='x'\)"):
        Plan("p", preset="sqrt@x")
    with pytest.raises(PlanError, match="JSON data only"):
        Plan("p", meta={"x": object()})
    with pytest.raises(PlanError, match=r"no plan file 'nope\.json'; pass a plan file .* sqrt"):
        load_plan("nope.json")
    with pytest.raises(PlanError, match=r"unknown preset 'every:x'"):
        load_plan("every:x")  # looks like a preset: never looked up as a file
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "ckview-plan", "version": 9, "regions": []}', encoding="utf-8")
    with pytest.raises(PlanError, match=r"^plan file '.*bad\.json': plan format version 9"):
        load_plan(bad)
    assert parse_preset("every:4@a.b").k == 4


# ----------------------------------------------------------------------------- resolution


def moe() -> nn.Module:
    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(8))

    model = nn.Module()
    model.layers = nn.ModuleList(Layer() for _ in range(3))
    return model


def two_chains() -> nn.Module:
    model = nn.Module()
    model.small = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
    model.big = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
    model.short = nn.ModuleList(nn.Linear(64, 64) for _ in range(2))
    return model


def vgg_like() -> nn.Module:
    model = nn.Module()
    model.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU())
    model.classifier = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    return model


@pytest.mark.parametrize(
    ("build", "chain", "length"),
    [
        (seq_net, "blocks", 6),
        (encoder_lm, "encoder.layers", 4),
        (gpt2, "transformer.h", 4),
        # NOTE [ Block chain detection ]: the outermost chain wins over the experts inside it,
        (moe, "layers", 3),
        # ties in length go to the most parameters, and length beats parameters,
        (two_chains, "big", 3),
        # mixed-class Sequentials only count when no uniform chain exists,
        (vgg_like, "features", 4),
        # and the model itself can be the chain.
        (lambda: nn.Sequential(*(Block() for _ in range(3))), "", 3),
        (lambda: load_example("cnn").build_model(), "features", 3),
    ],
)
def test_block_chain_detection(build: Callable[[], nn.Module], chain: str, length: int) -> None:
    found = find_block_chain(build())
    assert (found.path, len(found)) == (chain, length)


def test_block_chain_errors_and_explicit_chain() -> None:
    with pytest.raises(PlanError, match=r"found no chain of blocks in Linear .* name one"):
        find_block_chain(nn.Linear(2, 2))
    model = two_chains()
    assert find_block_chain(model, "small").path == "small"
    assert regions(resolve_preset(model, "all@short")) == ["short.0", "short.1"]
    assert regions(resolve_preset(model, "all", chain="small")) == ["small.0", "small.1", "small.2"]
    with pytest.raises(PlanError, match=r"chain 'small.0' is a Linear; a chain of blocks is"):
        find_block_chain(model, "small.0")
    with pytest.raises(PlanError, match=r"chain 'smal' is not a module .* did you mean 'small'"):
        resolve_plan(model, "sqrt@smal")
    # "none" needs no chain at all.
    assert resolve_preset(nn.Linear(2, 2), "none").regions == ()


@pytest.mark.parametrize(
    ("build", "preset", "expected"),
    [
        (seq_net, "none", []),
        (seq_net, "all", [f"blocks.{i}" for i in range(6)]),
        (seq_net, "every:2", ["blocks.0", "blocks.2", "blocks.4"]),
        (seq_net, "every:4", ["blocks.0", "blocks.4"]),
        (seq_net, "every:9", ["blocks.0"]),
        # sqrt on an nn.Sequential: ceil(sqrt(n)) near-equal segments, all checkpointed.
        (seq_net, "sqrt", ["blocks[0:2]", "blocks[2:4]", "blocks[4:6]"]),
        (lambda: seq_net(5), "sqrt", ["blocks[0:1]", "blocks[1:3]", "blocks[3:5]"]),
        (
            lambda: seq_net(10),
            "sqrt",
            ["blocks[0:2]", "blocks[2:5]", "blocks[5:7]", "blocks[7:10]"],
        ),
        # NOTE [ sqrt on a ModuleList ]: the last round(sqrt(n)) blocks keep their activations.
        (encoder_lm, "sqrt", ["encoder.layers.0", "encoder.layers.1"]),
        (encoder_lm, "every:3", ["encoder.layers.0", "encoder.layers.3"]),
        (encoder_lm, "all", [f"encoder.layers.{i}" for i in range(4)]),
        (gpt2, "sqrt", ["transformer.h.0", "transformer.h.1"]),
        (gpt2, "every:2", ["transformer.h.0", "transformer.h.2"]),
        (gpt2, "all", [f"transformer.h.{i}" for i in range(4)]),
        (lambda: nn.ModuleList(nn.Linear(2, 2) for _ in range(12)), "sqrt", list("012345678")),
        (lambda: nn.ModuleList(nn.Linear(2, 2) for _ in range(2)), "sqrt", ["0"]),
        # A Sequential that overrides forward is not segmentable: treated like a ModuleList.
        (lambda: Chained(*(Block() for _ in range(4))), "sqrt", ["0", "1"]),
    ],
)
def test_presets_resolve(build: Callable[[], nn.Module], preset: str, expected: list[str]) -> None:
    model = build()
    plan = resolve_preset(model, preset)
    assert regions(plan) == expected
    assert plan.name == preset and not plan.is_preset
    assert regions(resolve_plan(model, preset)) == expected
    if preset != "none":
        chain = find_block_chain(model)
        assert plan.meta == {"preset": {"name": preset, "chain": chain.path, "blocks": len(chain)}}


class Chained(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self:
            x = block(x) * 1.0
        return x


def test_patterns_resolve_on_real_models() -> None:
    model = gpt2()

    def resolve(*patterns: str) -> list[str]:
        return regions(resolve_plan(model, doc(regions=[{"module": p} for p in patterns])))

    assert resolve("transformer.h.*") == [f"transformer.h.{i}" for i in range(4)]
    assert resolve("transformer.h.[0-1]", "transformer.h.1") == [
        "transformer.h.0",
        "transformer.h.1",
    ]  # several patterns matching one module select it once
    assert resolve("**.mlp") == [f"transformer.h.{i}.mlp" for i in range(4)]
    assert resolve("transformer.h.*.attn", "transformer.h.0") == [
        "transformer.h.0",
        "transformer.h.0.attn",
        "transformer.h.1.attn",
        "transformer.h.2.attn",
        "transformer.h.3.attn",
    ]  # model order, a block before its submodules
    enc = encoder_lm()
    plan = resolve_plan(enc, doc(regions=[{"module": "encoder.layers.*"}]))
    assert regions(plan) == [f"encoder.layers.{i}" for i in range(4)]
    assert regions(resolve_plan(seq_net(), doc(regions=[{"module": "blocks.?.fc[12]"}]))) == [
        f"blocks.{i}.fc{j}" for i in range(6) for j in (1, 2)
    ]


# ----------------------------------------------------------------------------- applying

PRESET_CASES = [
    (seq_net, seq_loss, "sqrt"),
    (seq_net, seq_loss, "every:2"),
    (lambda: seq_net(dropout=0.2), seq_loss, "sqrt"),
    (lambda: seq_net(dropout=0.2), seq_loss, "all"),
    (encoder_lm, lm_loss, "sqrt"),
    (encoder_lm, lm_loss, "all"),
    (gpt2, gpt2_loss, "sqrt"),
    (gpt2, gpt2_loss, "every:2"),
]


@pytest.mark.parametrize(("build", "loss_fn", "preset"), PRESET_CASES)
def test_applied_plan_gives_identical_step_and_recomputes(
    build: Callable[[], nn.Module], loss_fn: Step, preset: str
) -> None:
    """Loss and gradients equal the un-planned model bitwise (dropout included: the RNG state is
    restored for the recompute), and every checkpointed block runs twice per step: its own
    pre-hooks fire in the recompute (NOTE [ A module region is the whole module call ])."""
    model = build()
    chain = find_block_chain(model)
    blocks = [chain.block_path(i) for i in range(len(chain))]
    baseline = train_step(model, loss_fn)
    with apply_plan(model, preset) as applied, count_calls(model, blocks) as calls:
        planned = train_step(model, loss_fn)
    assert_same_step(baseline, planned)
    checkpointed = set(applied.modules)
    for seg in applied.segments:
        checkpointed |= {chain.block_path(i) for i in range(seg.start, seg.stop)}
    assert checkpointed  # each preset here checkpoints something
    assert calls == {b: 2 if b in checkpointed else 1 for b in blocks}
    assert set(applied.region_calls().values()) == {1}
    assert_same_step(baseline, train_step(model, loss_fn))  # removed on leaving the block


def test_rng_state_option_reaches_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    # checkpoint warns once per region, keyed by id(module): ids of freed modules are reused.
    # (The package re-exports checkpoint(), which hides the submodule's name: go via importlib.)
    monkeypatch.setattr(importlib.import_module("ckpt_runtime.checkpoint"), "_warned", set())
    model = encoder_lm()
    baseline = train_step(model, lm_loss)
    options = PlanOptions(preserve_rng_state=False)
    plan = Plan("no-rng", (ModuleRegion("encoder.layers.*"),), options)
    with apply_plan(model, plan), pytest.warns(UnsafeRecomputeWarning, match="preserve_rng_state"):
        loss, grads = train_step(model, lm_loss)
    assert torch.equal(loss, baseline[0])  # the forward is the same...
    # ...but the recompute draws new dropout masks, so the gradients differ.
    assert not all(torch.equal(grads[n], g) for n, g in baseline[1].items())


@pytest.mark.parametrize("reentrant", [False, True])
def test_kwargs_and_non_tensor_arguments(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = KwNet()
    mask = torch.rand(8, 16, requires_grad=True)

    def loss_fn(m: nn.Module) -> torch.Tensor:
        return m(torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), mask).sum()

    def step() -> Any:
        mask.grad = None
        loss, grads = train_step(model, loss_fn)
        assert mask.grad is not None
        return loss, {**grads, "mask": mask.grad.clone()}

    baseline = step()
    plan = Plan("kw", (ModuleRegion("layers.*"),), PlanOptions(use_reentrant=reentrant))
    with apply_plan(model, plan), count_calls(model, ["layers.0", "layers.2"]) as calls:
        planned = step()
    # The tensor keyword argument gets its gradient, in both checkpoint variants.
    assert_same_step(baseline, planned)
    assert calls == {"layers.0": 2, "layers.2": 2}


def test_segment_runs_as_one_region(monkeypatch: pytest.MonkeyPatch) -> None:
    model = seq_net()
    order: list[str] = []
    in_backward = [False]
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(
            lambda m, a, i=i: order.append(f"{'B' if in_backward[0] else 'F'}{i}")
        )
    checkpoint_calls: list[Any] = []
    real = apply_mod.checkpoint

    def counting(function: Any, *args: Any, **kwargs: Any) -> Any:
        checkpoint_calls.append(function)
        return real(function, *args, **kwargs)

    monkeypatch.setattr(apply_mod, "checkpoint", counting)
    applied = apply_plan(model, "sqrt")
    loss = seq_loss(model)
    in_backward[0] = True
    loss.backward()
    # One checkpoint call per segment, each reported to markers as the nn.Sequential...
    assert len(checkpoint_calls) == 3
    assert {markers.region_target(f) for f in checkpoint_calls} == {model.blocks}
    # ...and in backward each segment recomputes as a unit, last segment first.
    assert order == ["F0", "F1", "F2", "F3", "F4", "F5", "B4", "B5", "B2", "B3", "B0", "B1"]
    assert applied.region_calls() == {"blocks[0:2]": 1, "blocks[2:4]": 1, "blocks[4:6]": 1}


def test_module_region_reports_the_module_to_markers() -> None:
    model = seq_net()
    seen: list[object] = []

    class Listener:
        def on_recompute_begin(self, region_id: int, target: object) -> None:
            seen.append(target)

        def on_recompute_end(self, region_id: int, target: object) -> None:
            pass

    with markers.add_listener(Listener()), apply_plan(model, "every:3"):
        seq_loss(model).backward()
    assert seen == [model.blocks[3], model.blocks[0]]


def test_nested_module_region_inside_segment() -> None:
    """NOTE [ Nesting of regions ]: blocks.1 is checkpointed inside segment blocks[0:3], so it
    runs in forward, in the segment's recompute, and in its own recompute."""
    model = seq_net()
    baseline = train_step(model, seq_loss)
    plan = Plan("nested", (SegmentRegion("blocks", 0, 3), ModuleRegion("blocks.1")))
    paths = [f"blocks.{i}" for i in range(6)]
    with apply_plan(model, plan) as applied, count_calls(model, paths) as calls:
        planned = train_step(model, seq_loss)
    assert_same_step(baseline, planned)
    assert calls == {
        "blocks.0": 2,
        "blocks.1": 3,
        "blocks.2": 2,
        "blocks.3": 1,
        "blocks.4": 1,
        "blocks.5": 1,
    }
    assert regions(applied) == ["blocks[0:3]", "blocks.1"]  # model order: the Sequential first
    assert applied.region_calls() == {"blocks[0:3]": 1, "blocks.1": 2}


def module_state(model: nn.Module) -> dict[str, Any]:
    """Everything apply_plan may touch, per module: instance attributes and hook dicts."""
    return {
        path: (
            sorted(vars(m)),
            dict(m._forward_pre_hooks),
            dict(m._forward_hooks),
            dict(m._forward_pre_hooks_with_kwargs),
        )
        for path, m in model.named_modules()
    }


def test_remove_plan_restores_exactly() -> None:
    model = seq_net(dropout=0.1)
    x = torch.randn(8, 4)
    before_state = module_state(model)
    before_dict = model.state_dict()
    torch.manual_seed(5)
    before_out = model(x)
    plan = Plan(
        "mix", (SegmentRegion("blocks", 0, 2), ModuleRegion("blocks.[35]"), ModuleRegion("head"))
    )
    applied = apply_plan(model, plan)
    assert "forward" in vars(model.blocks) and "_call_impl" in vars(model.blocks[3])
    train_step(model, seq_loss)
    remove_plan(model)
    assert "forward" not in vars(model.blocks)
    assert all("_call_impl" not in vars(m) for m in model.modules())
    assert module_state(model) == before_state
    after_dict = model.state_dict()
    assert after_dict.keys() == before_dict.keys()
    assert all(torch.equal(after_dict[k], before_dict[k]) for k in before_dict)
    torch.manual_seed(5)
    assert torch.equal(model(x), before_out)
    with count_calls(model, ["blocks.0", "blocks.3"]) as calls:
        train_step(model, seq_loss)
    assert calls == {"blocks.0": 1, "blocks.3": 1}  # nothing is recomputed any more
    assert applied.region_calls() == {"blocks[0:2]": 1, "blocks.3": 1, "blocks.5": 1, "head": 1}
    remove_plan(model)  # no plan: nothing to do
    applied.remove()  # already removed: nothing to do


def test_applying_twice() -> None:
    model = seq_net()
    applied = apply_plan(model, "sqrt")
    with pytest.raises(PlanError, match=r"SeqNet already has plan 'sqrt' applied; call remove"):
        apply_plan(model, "all")
    with pytest.raises(PlanError, match="already has plan 'sqrt'"):
        apply_plan(model.blocks, "all")  # a part of the planned model counts too
    with pytest.raises(PlanError, match="matches no module"):
        apply_plan(model, doc(regions=[{"module": "nope"}]), replace=True)
    assert "forward" in vars(model.blocks)  # a failed replace leaves the old plan alone
    replaced = apply_plan(model, "every:3", replace=True)
    assert "forward" not in vars(model.blocks)
    assert regions(replaced) == ["blocks.0", "blocks.3"]
    assert applied.plan.name == "sqrt" and replaced.source == load_plan("every:3")
    remove_plan(model)
    assert regions(apply_plan(model, "every:3")) == ["blocks.0", "blocks.3"]
    remove_plan(model)
    assert module_state(model) == module_state(seq_net())
    # Removing a replaced plan leaves the plan that replaced it alone.
    old = apply_plan(model, "sqrt")
    new = apply_plan(model, Plan("p", (SegmentRegion("blocks", 1, 3),)), replace=True)
    old.remove()
    with count_calls(model, ["blocks.1"]) as calls:
        train_step(model, seq_loss)
    assert calls == {"blocks.1": 2} and new.region_calls() == {"blocks[1:3]": 1}
    new.remove()
    assert module_state(model) == module_state(seq_net())


def test_module_names_with_glob_characters() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    model.add_module("odd[1]", nn.Linear(2, 2))
    with apply_plan(model, doc(regions=[{"module": "odd[[]1]"}])) as applied:
        assert applied.modules == ("odd[1]",)
        assert regions(applied) == ["odd[[]1]"]  # the concrete plan escapes the name
        model(torch.randn(3, 2)).sum().backward()
        assert applied.region_calls() == {"odd[[]1]": 1}
    assert regions(resolve_preset(model, "all@")) == ["0", "1", "odd[[]1]"]


def test_applied_plan_description() -> None:
    model = seq_net()
    with apply_plan(model, "sqrt") as applied:
        assert str(applied) == (
            "plan 'sqrt' (preset sqrt on 'blocks', 6 blocks): 3 regions\n"
            "  segment blocks[0:2]\n  segment blocks[2:4]\n  segment blocks[4:6]"
        )
        assert applied.segments == tuple(r for r in applied.plan.regions)
        assert applied.modules == () and applied.source.preset == "sqrt"
    plan = Plan("p", (ModuleRegion("blocks.[0-1]"), ModuleRegion("")))
    with apply_plan(model, plan.to_json()) as applied:
        assert applied.modules == ("", "blocks.0", "blocks.1")
        assert str(applied) == "plan 'p': 3 regions\n  <model>\n  blocks.0\n  blocks.1"
        assert_same_step(train_step(model, seq_loss), train_step(seq_net(), seq_loss))


class OwnForward(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def own_forward_net() -> nn.Module:
    model = seq_net()
    model.blocks = OwnForward(*model.blocks)
    return model


def compiled_net() -> nn.Module:
    model = seq_net()
    # What module.compile() sets; a compiled module's __call__ would bypass the plan.
    object.__setattr__(model.blocks[0], "_compiled_call_impl", lambda *a, **k: None)
    return model


APPLY_ERRORS: list[tuple[Callable[[], nn.Module], Any, str]] = [
    (
        seq_net,
        doc(regions=[{"module": "block.*"}]),
        "module pattern 'block.*' matches no module of SeqNet; did you mean",
    ),
    (seq_net, doc(regions=[{"module": "zzz"}]), "its top-level modules are \\['inp', 'blocks'"),
    (
        seq_net,
        doc(regions=[{"sequential": "blokcs", "start": 0, "stop": 2}]),
        "sequential 'blokcs' is not a module of SeqNet; did you mean 'blocks'?",
    ),
    (
        encoder_lm,
        doc(regions=[{"sequential": "encoder.layers", "start": 0, "stop": 2}]),
        "'encoder.layers' is a ModuleList, not an nn.Sequential; .* \"encoder.layers.\\*\"",
    ),
    (
        seq_net,
        doc(regions=[{"sequential": "blocks", "start": 4, "stop": 7}]),
        "stop 7 is past the end of 'blocks', which has 6 children",
    ),
    (
        own_forward_net,
        doc(regions=[{"sequential": "blocks", "start": 0, "stop": 2}]),
        "OwnForward 'blocks' has its own forward",
    ),
    (
        seq_net,
        doc(regions=[{"sequential": "blocks", "start": 2, "stop": 3}, {"module": "blocks.*"}]),
        "module region 'blocks.2' and segment blocks\\[2:3\\] checkpoint the same computation",
    ),
    (
        seq_net,
        doc(regions=[{"sequential": "blocks", "start": 0, "stop": 6}, {"module": "blocks"}]),
        "module region 'blocks' and segment blocks\\[0:6\\] checkpoint the same computation",
    ),
    (lambda: nn.Linear(2, 2), "sqrt", "found no chain of blocks in Linear"),
    (compiled_net, "all", "'blocks.0' was compiled with module.compile\\(\\)"),
    (seq_net, "./no-such-plan.json", "no plan file './no-such-plan.json'"),
]


@pytest.mark.parametrize(("build", "plan", "message"), APPLY_ERRORS)
def test_apply_errors(build: Callable[[], nn.Module], plan: Any, message: str) -> None:
    model = build()
    before = module_state(model)
    with pytest.raises(PlanError, match=message) as info:
        apply_plan(model, plan)
    assert "\n" not in str(info.value)
    assert module_state(model) == before  # nothing was patched


def test_package_exports_the_plan_api() -> None:
    import ckpt_runtime

    assert ckpt_runtime.apply_plan is apply_plan and ckpt_runtime.remove_plan is remove_plan
    assert ckpt_runtime.resolve_preset is resolve_preset
    assert ckpt_runtime.AppliedPlan is AppliedPlan


def test_non_module_and_bad_plan_types() -> None:
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        apply_plan("model", "sqrt")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a plan is a Plan"):
        apply_plan(seq_net(), 3)  # type: ignore[arg-type]


def test_segment_of_a_sequential_the_model_loops_over_warns() -> None:
    torch.manual_seed(0)
    model = LoopNet()
    with apply_plan(model, "sqrt") as applied:
        with pytest.warns(UserWarning, match=r"segment blocks\[0:2\] .* does not take effect"):
            train_step(model, seq_loss)
        train_step(model, seq_loss)  # warns once
        assert applied.region_calls() == {"blocks[0:2]": 0, "blocks[2:4]": 0, "blocks[4:6]": 0}
    # Module regions work whether or not the Sequential is called.
    with apply_plan(model, "all") as applied:
        train_step(model, seq_loss)
        assert set(applied.region_calls().values()) == {1}


def test_no_grad_calls_run_plainly() -> None:
    model = seq_net()
    x = torch.randn(3, 4)
    expected = model(x)
    with apply_plan(model, "sqrt") as applied, torch.no_grad():
        assert torch.equal(model(x), expected)
        assert set(applied.region_calls().values()) == {0}


def test_deepcopy_of_a_planned_model_runs_its_own_modules() -> None:
    model = seq_net()
    baseline = train_step(model, seq_loss)
    apply_plan(model, Plan("p", (ModuleRegion("blocks.1"), SegmentRegion("blocks", 3, 5))))
    twin = copy.deepcopy(model)
    with count_calls(twin, ["blocks.1", "blocks.3"]) as calls:
        assert_same_step(baseline, train_step(twin, seq_loss))
    assert calls == {"blocks.1": 2, "blocks.3": 2}
    remove_plan(twin)
    assert module_state(twin) == module_state(seq_net())
    assert "forward" in vars(model.blocks)  # the original keeps its plan
