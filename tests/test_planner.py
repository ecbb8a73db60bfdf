"""Tests of the planner (ckview.analysis.planner), of plans against a trace's module tree
(ckview.analysis.plans) and of ``ckview plan``.

The planner is checked against brute force: every plan of a small synthetic chain judged by the
full projection (``project``), which the planner never calls. NOTE names refer to
ckview/analysis/planner.py and ckpt_runtime/resolve.py (the plan core; tests/test_plan_core.py
checks it through both adapters on recorded models).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckview.analysis import (
    ModuleRegion,
    Planner,
    Region,
    SegmentRegion,
    pareto,
    plan_for_budget,
    plan_from_regions,
    plan_name,
    project,
    regions_from_plan,
    sequential_children,
)
from ckview.trace.schema import ContainerKind
from tests.conftest import ROOT, load_example, read_run
from tests.synthetic import Block, Layer, training_step

pytestmark = pytest.mark.torch

SAMPLES = ROOT / "sample_traces"
Tables = dict[str, Any]

# ----------------------------------------------------------------------------- chains

layers = st.builds(Layer, st.integers(1, 200), st.booleans(), st.integers(0, 6))
blocks = st.builds(
    Block, st.lists(layers, min_size=1, max_size=5).map(tuple), st.integers(1, 50), st.booleans()
)
"""Blocks of random activation sizes, lifetimes and compute (one op per layer, 10 ns each)."""


def chain(spec: Sequence[Block], sequential: bool) -> Tables:
    """A synthetic step whose model ``Net`` has a chain ``blocks`` of ``spec``: an
    ``nn.Sequential`` as built, or relabelled ``ModuleList`` (then only blocks are candidates)."""
    tables = training_step(spec)
    if not sequential:
        strings = list(tables["strings"])
        strings[strings.index("Sequential")] = "ModuleList"
        tables["strings"] = strings
        modules = {k: np.array(v) for k, v in tables["modules"].items()}
        modules["container"][1] = ContainerKind.MODULE_LIST
        modules["sequential_forward"][1] = 0
        tables["modules"] = modules
    return tables


def every_plan(tables: Tables, sequential: bool) -> list[list[Region]]:
    """Brute force: every subset of blocks (ModuleList), or every way to cut the blocks into
    checkpointed segments and plain blocks (Sequential; one-block segments as segments)."""
    blocks = sequential_children(tables["modules"], tables["strings"], 1)
    n = len(blocks)
    if not sequential:
        return [
            [ModuleRegion(blocks[i]) for i in range(n) if bits >> i & 1] for bits in range(2**n)
        ]
    plans: list[list[Region]] = []

    def cut(start: int, regions: list[Region]) -> None:
        if start == n:
            plans.append(regions)
            return
        cut(start + 1, regions)
        for stop in range(start + 1, n + 1):
            cut(stop, [*regions, SegmentRegion(1, start, stop)])

    cut(0, [])
    return plans


def judge(tables: Tables, plans: Sequence[Sequence[Region]]) -> list[tuple[int, int]]:
    """(peak, extra compute) of each plan by the full projection."""
    out = []
    for regions in plans:
        projection = project(tables, list(regions))
        out.append((projection.peak.bytes, projection.extra_compute_ns))
    return out


def front(points: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Non-dominated (peak, compute) pairs, cheapest first."""
    out: list[tuple[int, int]] = []
    for peak, cost in sorted(points, key=lambda p: (p[1], p[0])):
        if not out or peak < out[-1][0]:
            out.append((peak, cost))
    return out


def assert_optimal(result: Any, judged: Sequence[tuple[int, int]], budget: int) -> None:
    """The planner's answer is the brute-force optimum for ``budget``."""
    fitting = [cost for peak, cost in judged if peak <= budget]
    lowest = min(peak for peak, _ in judged)
    assert result.best_reachable_peak == lowest
    if fitting:
        assert result.fits and result.peak_bytes <= budget
        assert result.extra_compute_ns == min(fitting)
    else:
        assert not result.fits
        assert result.peak_bytes == lowest
        assert result.extra_compute_ns == min(c for p, c in judged if p == lowest)


def assert_judged(tables: Tables, result: Any) -> None:
    """The reported peak and compute are the full projection's for the reported regions, and
    the plan document maps back to those regions."""
    projection = project(tables, list(result.regions))
    assert (result.peak_bytes, result.extra_compute_ns) == (
        projection.peak.bytes,
        projection.extra_compute_ns,
    )
    assert result.fits == (result.peak_bytes <= result.budget_bytes)
    back = regions_from_plan(result.plan, tables["modules"], tables["strings"])
    assert tuple(back) == result.regions


# ----------------------------------------------------------------------------- vs brute force


@settings(max_examples=25, deadline=None)
@given(st.lists(blocks, min_size=2, max_size=5), st.booleans(), st.floats(0.3, 1.05))
def test_planner_is_exact_on_small_chains(
    spec: list[Block], sequential: bool, share: float
) -> None:
    tables = chain(spec, sequential)
    judged = judge(tables, every_plan(tables, sequential))
    planner = Planner(tables)
    assert planner.exact
    budget = int(share * judged[0][0])  # judged[0]: the empty plan, the baseline peak
    result = planner.for_budget(budget)
    assert_optimal(result, judged, budget)
    assert_judged(tables, result)
    got = [(p.peak_bytes, p.extra_compute_ns) for p in planner.pareto()]
    assert got == front(judged)


@settings(max_examples=25, deadline=None)
@given(st.lists(blocks, min_size=2, max_size=5), st.booleans(), st.floats(0.3, 1.05))
def test_heuristic_is_judged_and_never_worse_than_the_presets(
    spec: list[Block], sequential: bool, share: float
) -> None:
    tables = chain(spec, sequential)
    baseline = project(tables, []).peak.bytes
    budget = int(share * baseline)
    result = plan_for_budget(tables, budget, exact_limit=0)
    assert not result.exact
    assert_judged(tables, result)
    for preset in result.presets:
        if preset.peak_bytes <= budget:  # NOTE [ Planner heuristic ]: presets are seeds
            assert result.fits and result.extra_compute_ns <= preset.extra_compute_ns


@settings(max_examples=10, deadline=None)
@given(st.lists(blocks, min_size=2, max_size=3), st.floats(0.3, 1.05))
def test_nested_candidates_are_searched_exactly(spec: list[Block], share: float) -> None:
    """Given candidates that nest (each block and its mlp), the exact answer is the best of
    every subset of candidates, nested ones included (the outer one wins)."""
    tables = chain(spec, sequential=True)
    paths = [tables["strings"][p] for p in tables["modules"]["path"]]
    candidates: list[Region] = [ModuleRegion(r) for r, p in enumerate(paths) if p.count(".") >= 1]
    subsets = [
        [c for i, c in enumerate(candidates) if bits >> i & 1]
        for bits in range(2 ** len(candidates))
    ]
    judged = judge(tables, subsets)
    budget = int(share * judged[0][0])
    result = plan_for_budget(tables, budget, candidates)
    assert result.exact
    assert_optimal(result, judged, budget)
    assert_judged(tables, result)
    assert [(p.peak_bytes, p.extra_compute_ns) for p in pareto(tables, candidates)] == front(judged)


def test_one_block_segments_are_module_regions() -> None:
    """NOTE [ Planner search space ]: a one-block segment projects like the block's module
    region, so the planner offers only the latter."""
    spec = [Block((Layer(100, True, 0), Layer(50, True, 0)), 10, False)] * 3
    tables = chain(spec, sequential=True)
    blocks_ = sequential_children(tables["modules"], tables["strings"], 1)
    for i, block in enumerate(blocks_):
        seg, mod = (
            project(tables, [SegmentRegion(1, i, i + 1)]),
            project(tables, [ModuleRegion(block)]),
        )
        assert (seg.peak.bytes, seg.extra_compute_ns) == (mod.peak.bytes, mod.extra_compute_ns)
    planner = Planner(tables)
    assert not any(
        isinstance(c, SegmentRegion) and c.stop - c.start == 1 for c in planner.candidates
    )


# ----------------------------------------------------------------------------- budgets


@pytest.fixture(scope="module")
def transformer() -> Tables:
    return read_run(SAMPLES / "transformer_compare.h5", "baseline")


@pytest.fixture(scope="module")
def transformer_planner(transformer: Tables) -> Planner:
    return Planner(transformer)


def test_budget_edges(transformer: Tables, transformer_planner: Planner) -> None:
    planner = transformer_planner
    base = planner.baseline_peak
    at_baseline = planner.for_budget(base)
    assert at_baseline.fits and at_baseline.regions == () and at_baseline.extra_compute_ns == 0
    assert planner.for_budget(10 * base).regions == ()
    lowest = planner.for_budget(0).best_reachable_peak
    exactly = planner.for_budget(lowest)
    assert exactly.fits and exactly.peak_bytes == lowest
    below = planner.for_budget(lowest - 1)
    assert not below.fits and below.peak_bytes == lowest == below.best_reachable_peak
    assert below.plan["meta"]["planner"]["fits"] is False
    nothing = planner.for_budget(0)
    assert not nothing.fits and nothing.regions == below.regions
    for result in (at_baseline, exactly, below):
        assert_judged(transformer, result)


def test_pareto_is_non_dominated_and_sorted(transformer_planner: Planner) -> None:
    points = transformer_planner.pareto()
    assert points[0].regions == () and points[0].extra_compute_ns == 0
    for a, b in itertools.pairwise(points):
        assert a.extra_compute_ns < b.extra_compute_ns and a.peak_bytes > b.peak_bytes
    for point in points:  # each point is the planner's answer at its own peak
        assert transformer_planner.for_budget(point.peak_bytes).extra_compute_ns == (
            point.extra_compute_ns
        )


@pytest.mark.parametrize(
    ("name", "run"),
    [
        ("transformer_compare.h5", "baseline"),
        ("gpt2_compare.h5", "baseline"),
        ("cnn.h5", "main"),
        ("mlp.h5", "main"),
    ],
)
@pytest.mark.parametrize("exact_limit", [4096, 0])
def test_never_more_compute_than_sqrt_when_sqrt_fits(name: str, run: str, exact_limit: int) -> None:
    """The issue's invariant: at a budget sqrt meets, the planner's plan costs at most sqrt's."""
    tables = read_run(SAMPLES / name, run)
    planner = Planner(tables, exact_limit=exact_limit)
    budgets = np.linspace(0.3, 1.0, 8) * planner.baseline_peak
    sqrt = planner.for_budget(0).preset("sqrt")
    assert sqrt is not None
    for budget in [*budgets.astype(int), sqrt.peak_bytes]:
        result = planner.for_budget(int(budget))
        if sqrt.peak_bytes <= budget:
            assert result.fits and result.extra_compute_ns <= sqrt.extra_compute_ns
        assert result.peak_bytes == project(tables, list(result.regions)).peak.bytes


def test_planner_on_the_transformer_sample(transformer_planner: Planner) -> None:
    """At 60% of the peak, sqrt (the first two layers) does not fit; the planner's plan does,
    and costs less than 'all': three of the four layers (which three depends on their timed
    forwards)."""
    planner = transformer_planner
    result = planner.for_budget(round(0.6 * planner.baseline_peak))
    sqrt, every = result.preset("sqrt"), result.preset("all")
    assert sqrt is not None and every is not None
    assert result.fits and sqrt.peak_bytes > result.budget_bytes
    assert result.extra_compute_ns < every.extra_compute_ns
    chosen = [r["module"] for r in result.plan["regions"]]
    assert len(chosen) == 3 and all(m.startswith("encoder.layers.") for m in chosen)


def test_heuristic_on_two_hundred_blocks() -> None:
    """Beyond the exact size the heuristic answers, and the projection confirms it."""
    bench = _load_benchmark("projection_speed")
    tables = bench.synthetic_run(events=20_000, blocks=200, seed=1)
    planner = Planner(tables)
    assert not planner.exact and len(planner.candidates) == 200
    result = planner.for_budget(round(0.6 * planner.baseline_peak))
    assert result.fits and 0 < len(result.regions) < 200
    assert result.evaluations <= 1500 + 1
    sqrt = result.preset("sqrt")
    assert sqrt is not None and result.extra_compute_ns <= sqrt.extra_compute_ns
    assert_judged(tables, result)


def test_no_chain_needs_candidates() -> None:
    tables = training_step([Block((Layer(10, True, 0),), 5, False)])  # one block: no chain
    with pytest.raises(ValueError, match="no chain of blocks"):
        Planner(tables)
    result = plan_for_budget(tables, 0, [ModuleRegion(2)])
    assert not result.fits and result.presets[0].name == "none" and len(result.presets) == 1


def _load_benchmark(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- plans


EXAMPLES = [
    ("transformer", "transformer_compare.h5", "baseline", "encoder.layers"),
    ("gpt2", "gpt2_compare.h5", "baseline", "transformer.h"),
    ("cnn", "cnn.h5", "main", "features"),
    ("mlp", "mlp.h5", "main", "blocks"),
]
PRESETS = ["none", "all", "every:1", "every:2", "every:3", "sqrt"]


def _model(example: str) -> Any:
    if example == "gpt2":
        pytest.importorskip("transformers")
    return load_example(example).build_model()


@pytest.mark.parametrize(("example", "trace", "run", "chain_path"), EXAMPLES)
def test_presets_resolve_like_ckpt_runtime(
    example: str, trace: str, run: str, chain_path: str
) -> None:
    from ckpt_runtime import resolve_preset

    tables = read_run(SAMPLES / trace, run)
    modules, strings = tables["modules"], tables["strings"]
    model = _model(example)
    for preset in [*PRESETS, *(f"{p}@{chain_path}" for p in PRESETS[1:])]:
        ours = plan_from_regions(regions_from_plan(preset, modules, strings), modules, strings, "p")
        theirs = resolve_preset(model, preset).to_json()
        assert ours["regions"] == theirs["regions"], preset
        assert plan_name(preset) == resolve_preset(model, preset).name


@pytest.mark.parametrize(("example", "trace", "run", "chain_path"), EXAMPLES)
def test_plans_resolve_like_ckpt_runtime(
    example: str, trace: str, run: str, chain_path: str
) -> None:
    """Patterns, segments and planner output resolve to the same regions here and in
    ckpt_runtime.resolve_plan on the live model, and apply_plan accepts the planner's plan."""
    import ckpt_runtime

    tables = read_run(SAMPLES / trace, run)
    modules, strings = tables["modules"], tables["strings"]
    model = _model(example)
    docs: list[dict[str, Any]] = [
        _doc([{"module": f"{chain_path}.*"}, {"module": "**.0"}]),
        _doc([{"module": f"{chain_path}.[02]"}, {"module": f"{chain_path}.1"}]),
        {"format": "ckview-plan", "version": 1, "preset": "sqrt", "chain": chain_path},
        Planner(tables).for_budget(0).plan,
    ]
    if example in ("cnn", "mlp"):  # Sequential chains: segments
        docs.append(_doc([{"sequential": chain_path, "start": 0, "stop": 2}]))
        docs.append(
            _doc([{"sequential": chain_path, "start": 1, "stop": 3}, {"module": f"{chain_path}.0"}])
        )
    for doc in docs:
        ours = plan_from_regions(regions_from_plan(doc, modules, strings), modules, strings, "p")
        theirs = ckpt_runtime.resolve_plan(model, doc).to_json()
        assert ours["regions"] == theirs["regions"], doc
    applied = ckpt_runtime.apply_plan(model, docs[-1] if example in ("cnn", "mlp") else docs[3])
    applied.remove()


def _doc(regions: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"format": "ckview-plan", "version": 1, "name": "t", "regions": regions, **extra}


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_plan_round_trip(data: Any) -> None:
    """plan_from_regions -> regions_from_plan gives back the regions (deduplicated, in plan
    order), and the document is one ckpt_runtime reads."""
    from ckpt_runtime.plan import Plan

    tables = read_run(SAMPLES / "mlp.h5", "main")
    modules, strings = tables["modules"], tables["strings"]
    n_rows = len(modules["path"])
    module_regions = st.builds(ModuleRegion, st.integers(0, n_rows - 1))
    cuts = data.draw(st.lists(st.integers(0, 8), max_size=6, unique=True).map(sorted))
    segments = [
        SegmentRegion(1, a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if a < b
    ]
    regions = data.draw(st.lists(module_regions, max_size=6)) + segments
    covered = {(s.start, s.stop) for s in segments}
    children = sequential_children(modules, strings, 1)
    # Module regions that repeat a segment are an error (docs/plan-format.md 3.3): skip them.
    regions = [
        r
        for r in regions
        if not (
            isinstance(r, ModuleRegion)
            and (
                (r.module == 1 and (0, 8) in covered)
                or any(r.module == children[a] and b - a == 1 for a, b in covered)
            )
        )
    ]
    doc = plan_from_regions(regions, modules, strings, "round-trip", meta={"k": 1})
    back = regions_from_plan(doc, modules, strings)
    assert set(back) == set(regions) and len(back) == len(set(regions))
    assert back == regions_from_plan(json.dumps(doc), modules, strings)
    assert plan_from_regions(back, modules, strings, "round-trip", meta={"k": 1}) == doc
    Plan.from_json(doc)


BAD_DOCS: list[tuple[Any, str]] = [
    ({"version": 1, "regions": []}, "not a ckview plan"),
    ({"format": "ckview-plan", "version": 3, "regions": []}, "newer"),
    ({"format": "ckview-plan", "version": True, "regions": []}, "positive integer"),
    ({"format": "ckview-plan", "version": 1}, "exactly one of"),
    ({"format": "ckview-plan", "version": 1, "regions": [], "preset": "all"}, "exactly one of"),
    ({"format": "ckview-plan", "version": 1, "region": []}, "unknown key"),
    ({"format": "ckview-plan", "version": 1, "regions": {}}, "JSON array"),
    (_doc([{"module": "a", "sequential": "b"}]), "not both"),
    (_doc([{"module": "a..b"}]), "empty component"),
    (_doc([{"module": "a**"}]), "whole component"),
    (_doc([{"module": 3}]), "must be a string"),
    (_doc([{"sequential": "blocks", "start": 0}]), "missing"),
    (_doc([{"sequential": "blocks", "start": 2, "stop": 2}]), "must be less than stop"),
    (_doc([{"sequential": "blocks", "start": True, "stop": 2}]), "integer"),
    (_doc([{"sequential": "bl*", "start": 0, "stop": 2}]), "exact module path"),
    (_doc([], options={"use_reentrnt": True}), "unknown option"),
    (_doc([], options={"use_reentrant": 1}), "true or false"),
    (_doc([], chain="blocks"), "only applies to a preset"),
    (_doc([], name=""), "non-empty"),
    (_doc([], meta=[]), "JSON object"),
    ({"format": "ckview-plan", "version": 1, "preset": "every:0"}, "K must be >= 1"),
    ({"format": "ckview-plan", "version": 1, "preset": "half"}, "unknown preset"),
    ({"format": "ckview-plan", "version": 1, "preset": "sqrt@a", "chain": "a"}, "twice"),
    (
        _doc(
            [
                {"sequential": "blocks", "start": 0, "stop": 3},
                {"sequential": "blocks", "start": 2, "stop": 4},
            ]
        ),
        "overlap",
    ),
    ([], "JSON object"),
]


@pytest.mark.parametrize(("doc", "match"), BAD_DOCS)
def test_bad_documents_are_rejected_like_ckpt_runtime(doc: Any, match: str) -> None:
    """The trace adapter rejects a bad document with the core's own message."""
    from ckpt_runtime.plan import Plan, PlanError

    tables = read_run(SAMPLES / "mlp.h5", "main")
    with pytest.raises(ValueError, match=match) as caught:
        regions_from_plan(doc, tables["modules"], tables["strings"])
    assert "\n" not in str(caught.value)
    with pytest.raises(PlanError) as core:
        Plan.from_json(doc)
    assert str(core.value) == str(caught.value) or isinstance(doc, list)


BAD_AGAINST_MODEL: list[tuple[Any, str]] = [
    (_doc([{"module": "blocks.9"}]), "matches no module"),
    (_doc([{"module": "blokcs.*"}]), "did you mean 'blocks"),
    (_doc([{"sequential": "blocks.0", "start": 0, "stop": 1}]), "not an nn.Sequential"),
    (_doc([{"sequential": "nope", "start": 0, "stop": 1}]), "not a module"),
    (_doc([{"sequential": "blocks", "start": 0, "stop": 9}]), "past the end"),
    (
        _doc([{"sequential": "blocks", "start": 2, "stop": 3}, {"module": "blocks.2"}]),
        "same computation",
    ),
    (
        _doc([{"sequential": "blocks", "start": 0, "stop": 8}, {"module": "blocks"}]),
        "same computation",
    ),
    ("sqrt@blocks.0.fc1", "chain"),
    ("sqrt@nope", "not a module"),
    ("every:x", "unknown preset"),
    ("plan.json", "neither a preset"),
]


@pytest.mark.parametrize(("plan", "match"), BAD_AGAINST_MODEL)
def test_plans_that_do_not_fit_the_model(plan: Any, match: str) -> None:
    import ckpt_runtime

    tables = read_run(SAMPLES / "mlp.h5", "main")
    with pytest.raises(ValueError, match=match) as caught:
        regions_from_plan(plan, tables["modules"], tables["strings"])
    assert "\n" not in str(caught.value)
    if plan != "plan.json":  # a file path to ckpt_runtime
        with pytest.raises(ckpt_runtime.PlanError):
            ckpt_runtime.resolve_plan(load_example("mlp").build_model(), plan)


def test_plan_name() -> None:
    assert plan_name("every:02@blocks") == "every:2@blocks"
    assert plan_name("sqrt") == "sqrt"
    assert plan_name(_doc([])) == "t"
    assert plan_name({"format": "ckview-plan", "version": 1, "preset": "all"}) == "plan"


def test_plan_from_regions_rejects_what_no_plan_can_say() -> None:
    tables = read_run(SAMPLES / "mlp.h5", "main")
    modules, strings = tables["modules"], tables["strings"]
    with pytest.raises(ValueError, match=r"not an nn\.Sequential"):
        plan_from_regions([SegmentRegion(2, 0, 1)], modules, strings, "x")
    with pytest.raises(ValueError, match="overlap"):
        plan_from_regions([SegmentRegion(1, 0, 3), SegmentRegion(1, 2, 4)], modules, strings, "x")
    with pytest.raises(ValueError, match="not part of the model"):
        plan_from_regions([ModuleRegion(10_000)], modules, strings, "x")
    with pytest.raises(ValueError, match="non-empty"):
        plan_from_regions([], modules, strings, " ")


# ----------------------------------------------------------------------------- ckview plan

TRANSFORMER = str(SAMPLES / "transformer_compare.h5")


def test_cli_plan(run_cli: Any, tmp_path: Path) -> None:
    out_file = tmp_path / "plan.json"
    code, out, err = run_cli("plan", TRANSFORMER, "--budget", "60%", "-o", str(out_file))
    assert code == 0, err
    assert "encoder.layers." in out and "(60% of the recorded peak " in out
    for preset in ("none", "all", "sqrt"):
        assert f"\n  {preset} " in out
    assert "fits the budget" in out and "of the step" in out
    doc = json.loads(out_file.read_text(encoding="utf-8"))
    import ckpt_runtime

    plan = ckpt_runtime.load_plan(out_file)
    model = load_example("transformer").build_model()
    assert [str(r) for r in ckpt_runtime.resolve_plan(model, plan).regions] == [
        r["module"] for r in doc["regions"]
    ]


def test_cli_plan_json_and_pareto(run_cli: Any) -> None:
    code, out, _ = run_cli("plan", TRANSFORMER, "--budget", "50MiB", "--pareto", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["run"] == "baseline" and doc["fits"] and doc["exact"]
    assert doc["projected_peak_bytes"] <= doc["budget_bytes"] == 50 * 2**20
    # NOTE [ How sure the extra time is ]: the sample trace has plain timings, so a range.
    assert doc["extra_compute_low_ns"] < doc["extra_compute_ns"] < doc["extra_compute_high_ns"]
    assert [p["name"] for p in doc["presets"]] == ["none", "all", "sqrt"]
    costs = [p["extra_compute_ns"] for p in doc["pareto"]]
    assert costs == sorted(costs) and doc["pareto"][0]["regions"] == []
    code, out, _ = run_cli("plan", TRANSFORMER, "--pareto")
    assert code == 0 and "peak vs extra compute" in out and "beside the presets" not in out
    code, out, _ = run_cli("plan", TRANSFORMER, "--budget", "50MiB")
    assert code == 0 and "of the step; timings allow" in out


def test_cli_plan_unreachable_budget(run_cli: Any, tmp_path: Path) -> None:
    out_file = tmp_path / "plan.json"
    code, out, err = run_cli("plan", TRANSFORMER, "--budget", "1MiB", "-o", str(out_file))
    assert code == 1
    assert "budget 1.00 MiB is not met: the best plan peaks at" in err
    assert "Traceback" not in err and not out_file.exists()
    assert "does NOT fit" in out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--budget", "12xB"], "cannot read '12xB' as a size"),
        (["--budget", "0%"], "no memory at all"),
        (["--budget", "0"], "no memory at all"),
        (["--budget", "60"], "budget '60' has no unit: write a size such as '60 MiB'"),
        ([], "give a budget"),
        (["--pareto", "-o", "x.json"], "add --budget"),
        (["--budget", "60%", "--run", "nope"], "no run 'nope'; runs: baseline, checkpointed"),
    ],
)
def test_cli_plan_bad_input(run_cli: Any, argv: list[str], match: str) -> None:
    code, _, err = run_cli("plan", TRANSFORMER, *argv)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1


def test_cli_plan_missing_trace(run_cli: Any, tmp_path: Path) -> None:
    code, _, err = run_cli("plan", str(tmp_path / "nope.h5"), "--budget", "1GiB")
    assert code == 2 and "does not exist" in err


def test_cli_plan_run_defaults(run_cli: Any, tmp_path: Path) -> None:
    code, out, _ = run_cli("plan", str(SAMPLES / "cnn.h5"), "--budget", "90%")
    assert code == 0 and "run main" in out
    copy = tmp_path / "other.h5"
    shutil.copy(SAMPLES / "cnn.h5", copy)
    with h5py.File(copy, "r+") as f:
        for group in f["runs"].values():
            group.attrs["name"] = "plan:x"
    code, _, err = run_cli("plan", str(copy), "--budget", "90%")
    assert code == 2 and "neither a 'baseline' nor a 'main' run; runs: plan:x" in err


def test_cli_plan_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from ckview.cli.main import main\n"
        f"code = main(['plan', {TRANSFORMER!r}, '--budget', '60%', '--pareto'])\n"
        "assert code == 0, code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
