"""The one plan core (ckpt_runtime/resolve.py) through its two adapters: a live ``nn.Module``
(``ckpt_runtime.resolve_plan``) and the trace that recorded it (``ckview.analysis.plans``).

The same plan document must resolve to the same regions (or fail with the same message) over a
model and over its recorded step, for real module trees: ModuleList and Sequential chains, a
Sequential subclass, a Sequential whose ``forward`` is overridden or replaced on the instance,
nested models, a loss module recorded as a second root. And importing the core imports no torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import ckpt_runtime
from ckpt_runtime.plan import PlanError
from ckview.analysis import plan_from_regions, regions_from_plan
from tests.conftest import ROOT, read_run
from tests.factory import record_model

pytestmark = pytest.mark.torch

WIDTH = 8

# ----------------------------------------------------------------------------- importing


def test_core_imports_no_torch_nor_qt(tmp_path: Path) -> None:
    """Importing the plan core, ckpt_runtime's plan parsing (load_plan), every module of
    ckview.trace and ckview.analysis, and the verbs that view, plan and project imports neither
    torch nor Qt (NOTE [ Importing ckpt_runtime does not import torch ])."""
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"format": "ckview-plan", "version": 1, "preset": "sqrt"}))
    code = f"""
import importlib, pkgutil, sys
import ckpt_runtime
from ckpt_runtime import load_plan, Plan, PlanError
import ckpt_runtime.plan, ckpt_runtime.resolve
assert load_plan("every:2@blocks").chain == "blocks"
assert load_plan({str(plan)!r}).preset == "sqrt"
import ckview.trace, ckview.analysis
for package in (ckview.trace, ckview.analysis):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
for verb in ("project", "plan", "summary", "view", "validate"):
    importlib.import_module("ckview.cli." + verb)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "PyQt6", "pyqtgraph"))
print(loaded)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_layering_contracts_hold() -> None:
    """The import-linter contracts of pyproject.toml (ckview.trace and ckview.analysis import
    neither torch nor Qt, the plan core no torch, ...), checked statically."""
    pytest.importorskip("importlinter")
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "0 broken" in out.stdout


def test_lazy_runtime_names_are_the_functions() -> None:
    """``checkpoint`` and ``bypass`` stay functions although their submodules are imported."""
    import ckpt_runtime.bypass
    import ckpt_runtime.checkpoint  # binds the submodule on the package

    assert ckpt_runtime.checkpoint is sys.modules["ckpt_runtime.checkpoint"].checkpoint
    assert ckpt_runtime.bypass is sys.modules["ckpt_runtime.bypass"].bypass
    assert callable(ckpt_runtime.apply_plan)
    with pytest.raises(AttributeError):
        ckpt_runtime.no_such_name  # noqa: B018


# ----------------------------------------------------------------------------- module trees


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class MySequential(nn.Sequential):
    """A Sequential subclass that keeps nn.Sequential's forward: segments apply."""


class OwnForward(nn.Sequential):
    """A Sequential subclass with its own forward: segments do not apply."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self:
            x = block(x) + x
        return x


class Chains(nn.Module):
    """A ModuleList chain, and Sequentials of every kind inside it and beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(5))
        self.sub = MySequential(Block(), Block(), nn.ReLU())
        self.own = OwnForward(Block(), Block())
        self.replaced = nn.Sequential(Block(), Block())
        # forward replaced on the instance: the Sequential's own forward never runs
        self.replaced.forward = self._replaced_forward  # type: ignore[method-assign]

    def _replaced_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.replaced[1](self.replaced[0](x) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.replaced(self.own(self.sub(x)))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class Nested(nn.Module):
    """Two encoders with Sequential chains, one of them a ModuleDict entry."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.heads = nn.ModuleDict({"a": Encoder(), "b": nn.Linear(WIDTH, WIDTH)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads["b"](self.heads["a"](self.encoder(x)))


def _sequential() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), *(Block() for _ in range(6)))


MODELS: dict[str, Callable[[], nn.Module]] = {
    "chains": Chains,
    "nested": Nested,
    "sequential": _sequential,
}


def record(
    model: nn.Module, path: Path, step: Callable[[nn.Module], torch.Tensor] | None = None
) -> Path:
    """One recorded training step of ``model`` (after one warmup step), with a loss module
    that the recorder sees as a second root, or the loss ``step(model)``."""
    loss_fn = nn.MSELoss()

    def mse(m: nn.Module) -> torch.Tensor:
        return loss_fn(m(torch.randn(2, WIDTH)), torch.zeros(2, WIDTH))

    torch.manual_seed(0)
    return record_model(path, model, step=step or mse, lr=0.01)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[nn.Module, Any]]:
    out = {}
    for name, build in MODELS.items():
        torch.manual_seed(0)
        model = build()
        path = record(model, tmp_path_factory.mktemp(name) / "t.h5")
        out[name] = (model, read_run(path))
    return out


def _listing_free(message: str) -> str:
    """An error message without the adapter's hint on how to list paths."""
    return message.split("; list all paths with")[0]


def _both(model: nn.Module, tables: Any, doc: Any) -> tuple[Any, Any]:
    """The concrete regions (or the error message) from each adapter."""
    modules, strings = tables["modules"], tables["strings"]
    try:
        live: Any = ckpt_runtime.resolve_plan(model, doc).to_json()["regions"]
    except PlanError as exc:
        live = _listing_free(str(exc))
    try:
        regions = regions_from_plan(doc, modules, strings)
        trace: Any = plan_from_regions(regions, modules, strings, "p")["regions"]
    except PlanError as exc:
        trace = _listing_free(str(exc))
    return live, trace


@st.composite
def documents(draw: st.DrawFn, model: nn.Module) -> Any:
    """Plan documents over a model's paths: presets (with or without a chain), patterns made
    from real paths with globs (now and then a typo), and segments, mostly of the model's
    Sequentials and mostly disjoint (now and then of another module, or overlapping)."""
    paths = [p for p, _ in model.named_modules()]
    sequentials = [p for p, m in model.named_modules() if isinstance(m, nn.Sequential)]
    if draw(st.integers(0, 3)) == 0:
        preset = draw(st.sampled_from(["none", "all", "sqrt", "every:1", "every:2", "every:3"]))
        if draw(st.booleans()):
            preset += "@" + draw(st.sampled_from(sequentials + paths[1:4]))
        return preset

    def pattern() -> str:
        parts = draw(st.sampled_from(paths[1:])).split(".")
        mode = draw(st.sampled_from(["exact", "star", "star", "globstar", "prefix", "typo"]))
        if mode == "star":
            parts[-1] = "*"
        elif mode == "globstar":
            parts = ["**", parts[-1]]
        elif mode == "prefix":
            parts = [*parts, "**"]
        elif mode == "typo" and draw(st.booleans()):
            parts[-1] += "x"
        return ".".join(parts)

    stops: dict[str, int] = {}

    def segment() -> dict[str, Any]:
        path = draw(st.sampled_from(sequentials if draw(st.integers(0, 5)) else paths))
        overlap = draw(st.integers(0, 5)) == 0
        start = draw(st.integers(0, 2)) + (0 if overlap else stops.get(path, 0))
        stop = start + draw(st.integers(1, 3))
        stops[path] = stop
        return {"sequential": path, "start": start, "stop": stop}

    regions = [
        {"module": pattern()} if draw(st.booleans()) else segment()
        for _ in range(draw(st.integers(1, 4)))
    ]
    return {"format": "ckview-plan", "version": 1, "name": "d", "regions": regions}


@pytest.mark.parametrize("name", list(MODELS))
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_one_document_resolves_the_same_over_the_model_and_its_trace(
    recorded: dict[str, tuple[nn.Module, Any]], name: str, data: st.DataObject
) -> None:
    model, tables = recorded[name]
    doc = data.draw(documents(model))
    live, trace = _both(model, tables, doc)
    assert live == trace, doc


def _m(pattern: str) -> dict[str, Any]:
    return {"module": pattern}


def _s(path: str, start: int, stop: int) -> dict[str, Any]:
    return {"sequential": path, "start": start, "stop": stop}


def _doc(*regions: dict[str, Any]) -> dict[str, Any]:
    return {"format": "ckview-plan", "version": 1, "name": "d", "regions": list(regions)}


@pytest.mark.parametrize(
    ("name", "doc", "expected"),
    [
        # A Sequential subclass runs nn.Sequential.forward: segments apply (and sqrt on it).
        ("chains", "sqrt@sub", [_s("sub", 0, 1), _s("sub", 1, 3)]),
        # Its own forward, or one replaced on the instance: blocks as modules, no segments.
        ("chains", "sqrt@own", [_m("own.0")]),
        ("chains", "sqrt@replaced", [_m("replaced.0")]),
        ("chains", _doc(_s("replaced", 0, 2)), "has its own forward"),
        ("chains", _doc(_s("own", 0, 1)), "has its own forward"),
        # The detected chain: the ModuleList of 5 beats the Sequentials of 2 and 3.
        ("chains", "every:2", [_m("layers.0"), _m("layers.2"), _m("layers.4")]),
        # Nested: the two 4-block chains tie on children and bytes; the first wins.
        ("nested", "every:3", [_m("encoder.blocks.0"), _m("encoder.blocks.3")]),
        ("nested", "all@heads", "a chain of blocks is a non-empty nn.ModuleList or"),
        ("nested", _doc(_m("heads.a.*.[13]")), [_m("heads.a.blocks.1"), _m("heads.a.blocks.3")]),
        # The model is the main root: the loss module (another root) is not part of it.
        ("sequential", _doc(_m("MSELoss")), "matches no module of Sequential"),
        ("sequential", "sqrt", [_s("", 0, 2), _s("", 2, 5), _s("", 5, 8)]),
    ],
)
def test_known_trees(
    recorded: dict[str, tuple[nn.Module, Any]], name: str, doc: Any, expected: Any
) -> None:
    model, tables = recorded[name]
    live, trace = _both(model, tables, doc)
    assert live == trace
    if isinstance(expected, str):
        assert isinstance(live, str) and expected in live
    else:
        assert live == expected


def test_chain_detection_counts_parameter_bytes(tmp_path: Path) -> None:
    """Two chains of four blocks tie on children; the one with more parameter bytes wins, on
    both sides (the copies counted elements on one side and bytes on the other)."""

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.small = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(4)))
            self.big = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(4))).double()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.small(x) + self.big(x.double()).float()

    model = Two()
    tables = read_run(record(model, tmp_path / "t.h5"))
    live, trace = _both(model, tables, "all")
    assert live == trace == [{"module": f"big.{i}"} for i in range(4)]


def test_container_kinds_agree_with_the_trace_format() -> None:
    """The core's Container and the trace's ContainerKind (which may not import each other)
    hold the same values: the trace adapter converts one into the other by value."""
    from ckpt_runtime.resolve import Container
    from ckview.trace.schema import ContainerKind

    assert {k.name: k.value for k in Container} == {k.name: k.value for k in ContainerKind}


def test_hf_llama_resolves_the_same_over_the_model_and_its_trace(tmp_path: Path) -> None:
    """A Hugging Face Llama built from a config (its ModuleList of decoder layers, rotary
    embedding, norms): presets and patterns resolve the same on both sides."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)

    def step(m: nn.Module) -> torch.Tensor:
        ids = torch.randint(0, 64, (2, 8))
        return m(input_ids=ids, labels=ids).loss

    tables = read_run(record(model, tmp_path / "t.h5", step))
    docs: list[Any] = [
        "sqrt", "all", "every:2", "sqrt@model.layers", "sqrt@model",
        _doc(_m("model.layers.*.mlp"), _m("**.self_attn")),
        _doc(_m("model.layers.[02]"), _m("model.layers.0.mlp")),
        _doc(_m("model.layer.*")),
    ]  # fmt: skip
    for doc in docs:
        live, trace = _both(model, tables, doc)
        assert live == trace, doc
    assert _both(model, tables, "every:2")[0] == [_m("model.layers.0"), _m("model.layers.2")]
    assert "did you mean 'model.layers" in _both(model, tables, docs[-1])[0]


def test_a_planned_sequential_still_runs_its_children_in_order(tmp_path: Path) -> None:
    """A plan run's Sequential has ckpt_runtime's segment forward on the instance; the recorder
    stores it as running nn.Sequential.forward (the live adapter's rule), so the plan resolves
    over that trace as over the model."""
    torch.manual_seed(0)
    model = _sequential()
    with ckpt_runtime.apply_plan(model, "sqrt"):
        assert "forward" in vars(model)
        tables = read_run(record(model, tmp_path / "t.h5"))
        root = list(tables["modules"]["path"]).index(tables["strings"].index(""))
        assert tables["modules"]["sequential_forward"][root] == 1
        live, trace = _both(model, tables, "sqrt")
    assert live == trace == [_s("", 0, 2), _s("", 2, 5), _s("", 5, 8)]
