"""Tests of the checkpoint projection (ckview.analysis.projection) and of region resolution.

Synthetic steps come from ``tests/synthetic.py`` (``StepBuilder``, ``training_step``). NOTE
names in docstrings refer to ckview/analysis/projection/__init__.py and regions.py.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckview.analysis import (
    ModuleRegion,
    ProjectionModel,
    SegmentRegion,
    chain_of_blocks,
    find_peak,
    memory_timeline,
    module_rows_matching,
    project,
    region_instances,
    sequential_children,
)
from ckview.trace.schema import (
    MODULES,
    Category,
    MemoryEventKind,
    Phase,
    SavedEventKind,
)
from tests.conftest import ROOT, read_run
from tests.synthetic import Block, Layer, StepBuilder, Tables, training_step

ALLOC, FREE, SEEN = MemoryEventKind.ALLOC, MemoryEventKind.FREE, MemoryEventKind.SEEN
FIXED = [Category.PARAMETER, Category.GRADIENT, Category.OPTIMIZER_STATE]
SAMPLES = ROOT / "sample_traces"

layers = st.builds(Layer, st.integers(1, 200), st.booleans(), st.integers(0, 6))
block_specs = st.builds(
    Block,
    st.lists(layers, min_size=1, max_size=5).map(tuple),
    st.integers(1, 50),
    st.booleans(),
)
steps = st.lists(block_specs, min_size=1, max_size=5)


def block_rows(tables: Tables) -> list[int]:
    return sequential_children(tables["modules"], tables["strings"], 1)


def block_plans(tables: Tables, picks: Sequence[bool]) -> list[ModuleRegion]:
    return [ModuleRegion(r) for r, on in zip(block_rows(tables), picks, strict=False) if on]


def baseline_total(tables: Tables) -> np.ndarray:
    return memory_timeline(tables["storages"], tables["memory_events"]).total


# ----------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(steps)
def test_empty_plan_reproduces_the_baseline(spec: list[Block]) -> None:
    tables = training_step(spec)
    projection = project(tables, [])
    base = memory_timeline(tables["storages"], tables["memory_events"])
    np.testing.assert_array_equal(projection.total, base.total)
    np.testing.assert_array_equal(projection.by_category, base.by_category)
    np.testing.assert_array_equal(projection.events.source, np.arange(len(base.total) - 1))
    assert projection.peak == find_peak(base) and not projection.recomputes


@settings(max_examples=60, deadline=None)
@given(steps, st.lists(st.booleans(), min_size=5, max_size=5))
def test_fixed_categories_never_move(spec: list[Block], picks: list[bool]) -> None:
    """NOTE [ Fixed categories ]: the projected peak is never below the largest memory of
    parameters, gradients and optimizer state at any baseline point."""
    tables = training_step(spec)
    projection = project(tables, block_plans(tables, picks))
    base = memory_timeline(tables["storages"], tables["memory_events"])
    fixed_base = base.by_category[FIXED].sum(axis=0)
    assert projection.peak.bytes >= fixed_base.max()
    assert projection.by_category[FIXED].sum(axis=0).max() == fixed_base.max()


@settings(max_examples=80, deadline=None)
@given(steps, st.lists(st.booleans(), min_size=5, max_size=5))
def test_checkpointing_never_raises_forward_memory(spec: list[Block], picks: list[bool]) -> None:
    """Before backward begins, every baseline event's projected total is at most its baseline
    total, plus the inputs the checkpoints keep that the baseline had freed
    (NOTE [ Kept inputs ]: zero when every block saves its input, as pre-norm blocks do)."""
    tables = training_step(spec)
    projection = project(tables, block_plans(tables, picks))
    allowance = sum(
        spec[i - 1].out_bytes
        for i, on in enumerate(picks[: len(spec)])
        if on and i > 0 and not spec[i].input_saved
    )
    backward = first_backward_event(tables)
    ev = projection.events
    mine = np.flatnonzero((ev.instance == -1) & (ev.source >= 0) & (ev.source < backward))
    base = baseline_total(tables)
    assert np.all(projection.total[mine + 1] <= base[ev.source[mine] + 1] + allowance)
    if allowance == 0:
        assert projection.total[: mine[-1] + 2].max() <= base[: backward + 1].max()


@settings(max_examples=60, deadline=None)
@given(steps, st.lists(st.booleans(), min_size=5, max_size=5))
def test_projection_is_consistent(spec: list[Block], picks: list[bool]) -> None:
    """The live storages at the peak add up to it, times never go back (NOTE [ Event keys ]),
    and extra compute is the forward time of the recomputed blocks up to their last save
    (NOTE [ Early stop ]; whole blocks where they save nothing)."""
    tables = training_step(spec)
    projection = project(tables, block_plans(tables, picks))
    nbytes = tables["storages"]["nbytes"]
    assert nbytes[projection.live.storage].sum() == projection.peak.bytes
    assert np.all(np.diff(projection.events.time_ns) >= 0)
    ops, inst = tables["ops"], projection.instances
    forward = ops["phase"] == Phase.FORWARD
    saved = tables["saved_events"]
    pack = saved["kind"] == SavedEventKind.PACK
    expected = 0
    calls = ops["module_call"]
    for r in projection.recomputes:
        first, stop = inst.first_call[r.instance], inst.call_stop[r.instance]
        packs = pack & (saved["module_call"] >= first) & (saved["module_call"] < stop)
        last = saved["op"][packs].max() if packs.any() else len(calls)
        inside = (calls >= first) & (calls < stop) & (np.arange(len(calls)) <= last)
        expected += int((ops["end_ns"] - ops["start_ns"])[forward & inside].sum())
    for r in projection.recomputes:
        assert projection.events.copy[r.point] and projection.events.instance[r.point] == r.instance
    assert projection.extra_compute_ns == expected
    assert len(projection.recomputes) == sum(picks[: len(spec)])


# ----------------------------------------------------------------------------- hand-made


def three_blocks() -> tuple[Tables, list[int]]:
    """3 blocks; each makes a 50-byte temporary, saves a 100-byte activation and outputs 10
    bytes, its first op saving its input; parameters 1000 bytes, input 10 bytes."""
    b = StepBuilder()
    net = b.module("", "Net")
    rows = [b.module(f"{i}", "Block", net) for i in range(3)]
    b.existing(1000, Category.PARAMETER)
    x = b.existing(10, Category.INPUT)
    saved = []
    with b.call(net) as root:
        for row in rows:
            with b.call(row, inputs=[x]) as call:
                (t,) = b.op(alloc=[50], pack=[x])
                (a,) = b.op(alloc=[100], free=[t])
                b.save(a)
                (out,) = b.op(alloc=[10])
                b.output(call, out)
            saved.append((call, a, x))
            x = out
        b.op(alloc=[4], pack=[x])
    b.op(Phase.BACKWARD, call=root, unpack=[x], free=[x])
    for i, (call, a, inp) in enumerate(reversed(saved)):
        frees = [a] if i == 2 else [a, inp]  # the model's input outlives the step
        b.op(
            Phase.BACKWARD,
            call=call,
            unpack=[a, inp],
            alloc=[20],
            free=frees,
            category=Category.GRADIENT,
        )
    return b.tables(), rows


# Live bytes at each point: 1000 at the start and after the parameter's SEEN, 1010 after the
# input's (an input is live from its SEEN: NOTE [ Pre-existing storages ]), then one point
# per event. A checkpointed block loses its 100-byte activation at its end; its replay brings
# back the temporary (+50), the activation (+100) and frees the temporary; it stops there, after
# the block's last save, so the output is not recomputed (NOTE [ Early stop ]).
AT_START = (1000, 1000, 1010)
EXPECTED: dict[tuple[int, ...], tuple[list[int], int]] = {
    (): (
        [
            *(*AT_START, 1060, 1160, 1110, 1120, 1170, 1270, 1220, 1230),  # blocks 0, 1
            *(1280, 1380, 1330, 1340, 1344),  # block 2, the loss
            *(1334, 1354, 1254, 1244, 1264, 1164, 1154, 1174, 1074),  # backward
        ],
        1380,
    ),
    (0,): (
        [
            *(*AT_START, 1060, 1160, 1110, 1120, 1020),  # block 0, minus its activation
            *(1070, 1170, 1120, 1130, 1180, 1280, 1230, 1240, 1244),  # blocks 1, 2, loss
            *(1234, 1254, 1154, 1144, 1164, 1064, 1054),  # backward of loss, blocks 2, 1
            *(1104, 1204, 1154, 1174, 1074),  # replay 0, its backward
        ],
        1280,
    ),
    (1,): (
        [
            *(*AT_START, 1060, 1160, 1110, 1120, 1170, 1270, 1220, 1230, 1130),  # 1, -100
            *(1180, 1280, 1230, 1240, 1244, 1234, 1254, 1154, 1144),
            *(1194, 1294, 1244, 1264, 1164, 1154),  # replay 1, its backward
            *(1174, 1074),
        ],
        1294,
    ),
    (2,): (
        [
            *(*AT_START, 1060, 1160, 1110, 1120, 1170, 1270, 1220, 1230, 1280, 1380, 1330, 1340),
            *(1240, 1244, 1234),  # block 2 -100, the loss and its backward
            *(1284, 1384, 1334, 1354, 1254, 1244),  # replay 2: the peak
            *(1264, 1164, 1154, 1174, 1074),
        ],
        1384,
    ),
    (0, 1, 2): (
        [
            *(*AT_START, 1060, 1160, 1110, 1120, 1020, 1070, 1170, 1120, 1130, 1030),
            *(1080, 1180, 1130, 1140, 1040, 1044, 1034),
            *(1084, 1184, 1134, 1154, 1054, 1044),  # replay 2, its backward
            *(1094, 1194, 1144, 1164, 1064, 1054),  # replay 1, its backward
            *(1104, 1204, 1154, 1174, 1074),  # replay 0: the peak
        ],
        1204,
    ),
}


@pytest.mark.parametrize("plan", list(EXPECTED), ids=lambda p: "blocks" + "".join(map(str, p)))
def test_three_blocks_by_hand(plan: tuple[int, ...]) -> None:
    """The exact projected curve of NOTE [ Checkpointed forward ] (the 100-byte activation
    goes at the block's end) and NOTE [ Recompute in backward ] (temporary and activation come
    back at the block's first unpack, the output does not (NOTE [ Early stop ]); the activation
    copy goes where the baseline freed the activation)."""
    tables, rows = three_blocks()
    curve, peak = EXPECTED[plan]
    projection = project(tables, [ModuleRegion(rows[i]) for i in plan])
    assert projection.total.tolist() == curve
    assert projection.peak.bytes == peak
    model = ProjectionModel(tables, [ModuleRegion(r) for r in rows])
    assert model.peak(list(plan)) == projection.projected_peak


def test_three_blocks_peak_in_a_recompute() -> None:
    """Checkpointing the last block raises the peak: its replay comes on top of the loss, and
    the recomputed temporary and activation are live there."""
    tables, rows = three_blocks()
    projection = project(tables, [ModuleRegion(rows[2])])
    (recompute,) = projection.recomputes
    assert projection.projected_peak.recompute_call == recompute.call
    assert projection.projected_peak.time_ns == recompute.time_ns
    nbytes = tables["storages"]["nbytes"]
    live = projection.live
    assert nbytes[live.storage[live.copy]].sum() == 150
    assert nbytes[live.storage[~live.copy]].sum() == 1384 - 150


def test_kept_input_can_raise_forward_memory() -> None:
    """NOTE [ Kept inputs ]: a block whose input the baseline frees in forward keeps it, so at
    the end of the forward the second block saves its 100-byte activation but keeps the first
    block's 40-byte output."""
    spec = [Block((Layer(100, True, 0),), 40, False), Block((Layer(100, True, 0),), 10, False)]
    tables = training_step(spec)
    projection = project(tables, [ModuleRegion(block_rows(tables)[1])])
    backward = first_backward_event(tables)
    assert before_backward(tables, projection) - baseline_total(tables)[backward] == 40 - 100


def two_blocks_saving_their_outputs() -> tuple[Tables, list[int], list[int]]:
    """2 blocks; each saves its input (a Linear) and its own 100-byte output (a Tanh), so the
    output of block 0 is saved by both blocks. Returns the tables, the block rows and the
    outputs' storages."""
    b = StepBuilder()
    net = b.module("", "Net")
    rows = [b.module(f"{i}", "Block", net) for i in range(2)]
    b.existing(1000, Category.PARAMETER)
    x = b.existing(10, Category.INPUT)
    calls, outs, ins = [], [], []
    with b.call(net) as root:
        inp = x
        for row in rows:
            with b.call(row, inputs=[inp]) as call:
                (t,) = b.op(alloc=[50], pack=[inp])
                (out,) = b.op(alloc=[100], free=[t], pack=[])
                b.save(out)
                b.output(call, out)
            calls.append(call)
            outs.append(out)
            ins.append(inp)
            inp = out
        b.op(alloc=[4], pack=[inp])
    b.op(Phase.BACKWARD, call=root, unpack=[inp], alloc=[100], category=Category.GRADIENT)
    b.op(Phase.BACKWARD, call=calls[1], unpack=[outs[1], ins[1]], free=[outs[1]])
    b.op(Phase.BACKWARD, call=calls[0], unpack=[outs[0], ins[0]], free=[outs[0]])
    return b.tables(), rows, outs


def test_released_output_goes_before_its_recompute() -> None:
    """NOTE [ Released outputs ]: checkpointed, block 0 no longer holds its output for backward,
    so the output goes once block 1 (which saved it too) has run backward, before block 0's
    recompute brings back its copy; without the rule both would be live in the recompute."""
    tables, rows, outs = two_blocks_saving_their_outputs()
    projection = project(tables, [ModuleRegion(rows[0])])
    (recompute,) = projection.recomputes
    events = projection.events

    def free_of(storage: int) -> int:
        (row,) = np.flatnonzero((events.storage == storage) & ~events.copy & (events.kind == FREE))
        return int(row)

    assert free_of(outs[1]) < free_of(outs[0]) < recompute.point
    copies = events.copy & (events.storage == outs[0]) & (events.kind == ALLOC)
    assert np.flatnonzero(copies).tolist() == [recompute.point + 1]  # after the temporary's
    model = ProjectionModel(tables, [ModuleRegion(r) for r in rows])
    for plan in ([0], [1], [0, 1]):
        assert (
            model.peak(plan)
            == project(tables, [ModuleRegion(rows[i]) for i in plan]).projected_peak
        )


def first_backward_event(tables: Tables) -> int:
    ops, events = tables["ops"], tables["memory_events"]
    return int(np.flatnonzero(ops["phase"][np.maximum(events["op"], 0)] == Phase.BACKWARD)[0])


def before_backward(tables: Tables, projection: Any) -> int:
    """Projected bytes just before the first backward event of the baseline."""
    at = np.flatnonzero(projection.events.source == first_backward_event(tables))[0]
    return int(projection.total[at])


# ----------------------------------------------------------------------------- nesting, segments


@settings(max_examples=40, deadline=None)
@given(steps, st.integers(0, 4))
def test_outer_region_wins(spec: list[Block], block: int) -> None:
    """NOTE [ Nesting: the outer region wins ]: a block and its mlp project as the block."""
    tables = training_step(spec)
    block = block % len(spec)
    outer = ModuleRegion(block_rows(tables)[block])
    inner = ModuleRegion(
        module_rows_matching(tables["modules"], tables["strings"], f"blocks.{block}.mlp")[0]
    )
    np.testing.assert_array_equal(
        project(tables, [outer, inner]).total, project(tables, [outer]).total
    )
    np.testing.assert_array_equal(
        project(tables, [inner, outer]).total, project(tables, [outer]).total
    )


@settings(max_examples=40, deadline=None)
@given(steps, st.integers(0, 4))
def test_one_child_segment_is_the_module(spec: list[Block], block: int) -> None:
    tables = training_step(spec)
    block = block % len(spec)
    segment = project(tables, [SegmentRegion(1, block, block + 1)])
    module = project(tables, [ModuleRegion(block_rows(tables)[block])])
    np.testing.assert_array_equal(segment.total, module.total)
    assert segment.projected_peak == module.projected_peak


def test_segment_drops_inner_outputs() -> None:
    """A segment keeps only its input: the output of its first block (the second block's input,
    which per-block checkpoints keep) is gone by the end of the forward, and the segment is
    recomputed once."""
    spec = [Block((Layer(100, True, 0),), 30, True)] * 3
    tables = training_step(spec)
    segment = project(tables, [SegmentRegion(1, 0, 2)])
    per_block = project(tables, [ModuleRegion(r) for r in block_rows(tables)[:2]])
    assert len(segment.recomputes) == 1 and len(per_block.recomputes) == 2
    assert before_backward(tables, per_block) - before_backward(tables, segment) == 30


def test_segment_outside_children_is_an_error() -> None:
    tables = training_step([Block((Layer(8, True, 0),), 8, True)] * 2)
    with pytest.raises(ValueError, match="outside its 2 children"):
        project(tables, [SegmentRegion(1, 1, 3)])


# ----------------------------------------------------------------------------- incremental


@settings(max_examples=60, deadline=None)
@given(steps, st.data())
def test_incremental_matches_exact_on_synthetic_steps(spec: list[Block], data: Any) -> None:
    """NOTE [ Incremental peak ]: blocks, their mlps, the whole model and segments as
    candidates, any selection (nested ones included)."""
    tables = training_step(spec)
    n = len(spec)
    mlps = module_rows_matching(tables["modules"], tables["strings"], "blocks.*.mlp")
    segments = [SegmentRegion(1, a, b) for a, b in itertools.combinations(range(n + 1), 2)]
    candidates = [*map(ModuleRegion, [0, *block_rows(tables), *mlps]), *segments[:4]]
    model = ProjectionModel(tables, candidates)
    for _ in range(4):
        picks = data.draw(
            st.lists(st.booleans(), min_size=len(candidates), max_size=len(candidates))
        )
        exact = model.project(np.asarray(picks))
        assert model.peak(np.asarray(picks)) == exact.projected_peak
        assert model.extra_compute_ns(np.asarray(picks)) == exact.extra_compute_ns
        check_curve(model, np.asarray(picks), exact)


def test_incremental_matches_exact_on_the_benchmark_step() -> None:
    """The benchmark's synthetic step (blocks whose temporaries outlive them, outputs saved by
    the next block), small: incremental and exact agree on random selections."""
    bench = _load_benchmark()
    tables = bench.synthetic_run(events=20_000, blocks=12, seed=3)
    model = ProjectionModel(tables, [ModuleRegion(r) for r in range(2, 14)])
    rng = np.random.default_rng(0)
    for _ in range(15):
        picks = rng.random(12) < rng.random()
        exact = model.project(picks)
        assert model.peak(picks) == exact.projected_peak
        check_curve(model, picks, exact)
    assert model.peak([]) == model.project([]).projected_peak


def test_incremental_matches_exact_when_two_regions_move_one_storage() -> None:
    """NOTE [ Incremental peak ]: block 0 makes a 500-byte mask it does not output (a cache)
    and block 2 takes it as an input. Checkpointing block 0 frees it at block 0's end, block 2
    keeps it to the end of its backward; with both, ``project`` keeps it through the peak (the
    loss's 2000-byte logits) and so must the model (adding both changes would drop it there)."""
    b = StepBuilder()
    net = b.module("", "Net")
    rows = [b.module(str(i), "Block", net) for i in range(3)]
    x = b.existing(10, Category.INPUT)
    mask, blocks = -1, []
    with b.call(net):
        for i, row in enumerate(rows):
            with b.call(row, inputs=[x, mask] if i == 2 else [x]) as call:
                (act,) = b.op(alloc=[100], pack=[x])
                b.save(act)
                mask = b.op(alloc=[500])[0] if i == 0 else mask
                (out,) = b.op(alloc=[10])
                b.output(call, out)
            blocks.append((call, act, x))
            x = out
        (logits,) = b.op(alloc=[2000], pack=[x], free=[mask])
    b.op(Phase.BACKWARD, call=0, unpack=[x], free=[x, logits])
    for call, act, inp in reversed(blocks):
        b.op(Phase.BACKWARD, call=call, unpack=[act, inp], free=[act] if call == 1 else [act, inp])
    tables = b.tables()
    model = ProjectionModel(tables, [ModuleRegion(r) for r in rows])
    for picks in itertools.product([False, True], repeat=3):
        assert model.peak(np.asarray(picks)) == model.project(np.asarray(picks)).projected_peak
    both = model.project([0, 2])
    ev = both.events
    (moved,) = np.flatnonzero((ev.storage == mask) & (ev.kind == FREE) & ~ev.copy)
    assert both.instances.first_call[ev.instance[moved]] == blocks[2][0]
    assert mask in both.live.storage


def check_curve(model: ProjectionModel, picks: np.ndarray, exact: Any) -> None:
    """NOTE [ Projected curve ]: its maximum is the peak; at each baseline point it is the exact
    projection's state after every event up to that point's key; times never go back."""
    curve = model.curve(picks)
    assert curve.total.max() == exact.projected_peak.bytes
    assert np.all(np.diff(curve.time_ns) >= 0)
    width = model._base.width
    # A baseline point's state comes first among the states at that point (inserted moments
    # and recompute highs follow it, NOTE [ Event keys ]).
    points, first = np.unique(curve.point, return_index=True)
    assert np.array_equal(points, np.arange(len(model._base.times) + 1))
    keys = (points - 1) * width + width - 1
    after = np.searchsorted(exact.events.key, keys, side="right")  # projected point after them
    assert np.array_equal(curve.total[first], exact.total[after])


def _load_benchmark() -> Any:
    path = ROOT / "benchmarks" / "projection_speed.py"
    spec = importlib.util.spec_from_file_location("projection_speed", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_selection_mask_must_fit() -> None:
    tables, rows = three_blocks()
    model = ProjectionModel(tables, [ModuleRegion(r) for r in rows])
    with pytest.raises(ValueError, match="one flag per candidate"):
        model.peak(np.ones(2, dtype=bool))


# ----------------------------------------------------------------------------- sample traces


def _every_block(tables: Tables) -> list[ModuleRegion]:
    chain = chain_of_blocks(tables["modules"], tables["strings"])
    assert chain is not None
    return [
        ModuleRegion(r) for r in sequential_children(tables["modules"], tables["strings"], chain)
    ]


ACCURACY = [
    ("transformer_compare.h5", "baseline", "transformer_compare.h5", "checkpointed"),
    ("gpt2_compare.h5", "baseline", "gpt2_compare.h5", "checkpointed"),
    ("transformer.h5", "main", "transformer_checkpointed.h5", "main"),
    ("mlp.h5", "main", "mlp_checkpointed.h5", "main"),
]


@pytest.mark.parametrize("case", ACCURACY, ids=lambda c: c[0].removesuffix(".h5"))
def test_every_block_projects_the_measured_checkpointed_peak(
    case: tuple[str, str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Projecting every block of the chain on the baseline comes within 2% of the peak measured
    with torch checkpointing every block."""
    base_file, base_run, ckpt_file, ckpt_run = case
    baseline = read_run(SAMPLES / base_file, base_run)
    measured = read_run(SAMPLES / ckpt_file, ckpt_run)
    projected = project(baseline, _every_block(baseline)).peak.bytes
    peak = find_peak(memory_timeline(measured["storages"], measured["memory_events"])).bytes
    error = 100 * (projected - peak) / peak
    with capsys.disabled():
        print(
            f"\n{base_file}:{base_run} every block: projected {projected:,} B, measured "
            f"{peak:,} B ({ckpt_file}:{ckpt_run}), error {error:+.2f}%"
        )
    assert abs(error) <= 2


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.h5")), ids=lambda p: p.stem)
def test_sample_traces_empty_plan_and_incremental(path: Path) -> None:
    """On every sample run: the empty plan is the baseline, and incremental == exact for random
    selections of every module (nested ones included) and of the chain's blocks."""
    tables = read_run(path, "baseline" if "compare" in path.stem else "main")
    np.testing.assert_array_equal(project(tables, []).total, baseline_total(tables))
    candidates = [ModuleRegion(r) for r in range(len(tables["modules"]["path"]))]
    model = ProjectionModel(tables, candidates)
    rng = np.random.default_rng(0)
    for density in (0.05, 0.2, 0.5, 1.0):
        picks = rng.random(len(candidates)) < density
        exact = model.project(picks)
        assert model.peak(picks) == exact.projected_peak
        assert model.extra_compute_ns(picks) == exact.extra_compute_ns
    blocks = ProjectionModel(tables, _every_block(tables))
    for picks in itertools.product([False, True], repeat=min(len(blocks.candidates), 4)):
        mask = np.zeros(len(blocks.candidates), dtype=bool)
        mask[: len(picks)] = picks
        assert blocks.peak(mask) == blocks.project(mask).projected_peak


# ----------------------------------------------------------------------------- region helpers


def _modules(paths: dict[str, tuple[str, str, int]]) -> tuple[dict[str, np.ndarray], list[str]]:
    """A modules table from ``{path: (type, parent path, param bytes)}`` in row order."""
    strings: list[str] = []

    def sid(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    rows = list(paths)
    kinds = {"Sequential": 1, "ModuleList": 2, "ModuleDict": 3}
    table = [
        (
            sid(p),
            sid(t),
            rows.index(parent) if parent in rows and p != "" else -1,
            nbytes,
            kinds.get(t, 0),
            int(t == "Sequential"),
        )
        for p, (t, parent, nbytes) in paths.items()
    ]
    columns = {
        c.name: np.asarray([r[i] for r in table], dtype=c.dtype) for i, c in enumerate(MODULES)
    }
    return columns, strings


def test_module_rows_matching_uses_the_plan_patterns() -> None:
    modules, strings = _modules(
        {
            "": ("GPT", "", 0),
            "transformer": ("Model", "", 0),
            "transformer.h": ("ModuleList", "transformer", 0),
            "transformer.h.0": ("Block", "transformer.h", 0),
            "transformer.h.0.mlp": ("MLP", "transformer.h.0", 8),
            "transformer.h.1": ("Block", "transformer.h", 0),
            "transformer.h.1.mlp": ("MLP", "transformer.h.1", 8),
        }
    )

    def match(pattern: str) -> list[int]:
        return module_rows_matching(modules, strings, pattern)

    assert match("transformer.h.*") == [3, 5]
    assert match("**.mlp") == [4, 6]
    assert match("") == [0]
    assert match("transformer.h.[1]") == [5]
    assert match("transformer.**") == [1, 2, 3, 4, 5, 6]
    assert match("Transformer.h.*") == []
    for bad in ("a..b", "transformer.h**"):
        with pytest.raises(ValueError, match="module pattern"):
            match(bad)


def test_sequential_children_are_in_index_order() -> None:
    paths = {"": ("Net", "", 0), "seq": ("Sequential", "", 0)}
    paths |= {f"seq.{i}": ("Block", "seq", 0) for i in (0, 2, 10, 1, 9)}
    modules, strings = _modules(paths)
    names = [strings[modules["path"][r]] for r in sequential_children(modules, strings, 1)]
    assert names == ["seq.0", "seq.1", "seq.2", "seq.9", "seq.10"]


def test_chain_of_blocks_follows_the_preset_rule() -> None:
    """Most children wins; ties go to the most parameter bytes; candidates inside another are
    dropped; mixed Sequentials only when no uniform candidate exists."""
    paths = {
        "": ("Net", "", 0),
        "enc": ("ModuleList", "", 0),
        "enc.0": ("Layer", "enc", 10),
        "enc.1": ("Layer", "enc", 10),
        "dec": ("ModuleList", "", 0),
        "dec.0": ("Layer", "dec", 30),
        "dec.1": ("Layer", "dec", 30),
        "dec.1.experts": ("ModuleList", "dec.1", 0),
        "dec.1.experts.0": ("Expert", "dec.1.experts", 1),
        "dec.1.experts.1": ("Expert", "dec.1.experts", 1),
        "dec.1.experts.2": ("Expert", "dec.1.experts", 1),
    }
    modules, strings = _modules(paths)
    assert strings[modules["path"][chain_of_blocks(modules, strings)]] == "dec"
    mixed, mixed_strings = _modules(
        {
            "": ("Net", "", 0),
            "features": ("Sequential", "", 0),
            "features.0": ("Conv", "features", 4),
            "features.1": ("ReLU", "features", 0),
        }
    )
    assert chain_of_blocks(mixed, mixed_strings) == 1
    single, single_strings = _modules({"": ("Net", "", 0), "fc": ("Linear", "", 4)})
    assert chain_of_blocks(single, single_strings) is None


@pytest.mark.parametrize(
    ("name", "chain"),
    [
        ("transformer.h5", "encoder.layers"),
        ("gpt2.h5", "transformer.h"),
        ("mlp.h5", "blocks"),
        ("cnn.h5", "features"),
    ],
)
def test_chain_of_blocks_on_sample_traces(name: str, chain: str) -> None:
    """The chains the presets pick on the example models; each block is called once a step."""
    tables = read_run(SAMPLES / name)
    row = chain_of_blocks(tables["modules"], tables["strings"])
    assert row is not None and tables["strings"][tables["modules"]["path"][row]] == chain
    blocks = sequential_children(tables["modules"], tables["strings"], row)
    instances = region_instances(
        tables["module_calls"], tables["modules"], tables["strings"], [ModuleRegion(blocks[0])]
    )
    assert len(instances) == tables["meta"].steps_recorded


# ----------------------------------------------------------------------------- training state


def history_step(history: int, full: bool, extra_ops: int = 0) -> Tables:
    """Two closure iterations (forward, backward, optimizer) of an optimizer that keeps a
    history of 100 B vectors: ``history`` of them exist at the start; each optimizer stretch
    appends one, after dropping the oldest if the history is ``full`` (as L-BFGS does).
    ``extra_ops``: optimizer ops that do nothing (their count depends on the history)."""
    b = StepBuilder()
    kept = [b.existing(100, Category.OPTIMIZER_STATE) for _ in range(history)]
    for _ in range(2):
        (act,) = b.op(Phase.FORWARD, alloc=[1000])
        b.op(Phase.BACKWARD, free=[act])
        for _ in range(extra_ops):
            b.op(Phase.OPTIMIZER)
        if full:
            b.op(Phase.OPTIMIZER, free=[kept.pop(0)])
        kept += b.op(Phase.OPTIMIZER, alloc=[100], category=Category.OPTIMIZER_STATE)
    return b.tables()


def test_run_from_another_state_takes_its_state_per_stretch() -> None:
    # NOTE [ Runs that begin from another state ] (ckview/analysis/timeline.py): the baseline's
    # history grows from 3 to 5 vectors; the plan run's is full at 5 and stays there. Offset
    # at the start (+200 B) would put the second forward's 1400 B at 1600 B; the plan run's
    # peak is 1500 B: at that forward the runs differ by 100 B.
    from ckview.analysis.projection import peak_from_state
    from ckview.analysis.timeline import stretch_offsets

    base, run = history_step(3, full=False), history_step(5, full=True, extra_ops=2)
    measured = find_peak(memory_timeline(run["storages"], run["memory_events"])).bytes
    projection = project(base, [])
    assert (projection.peak.bytes, measured) == (1400, 1500)
    assert stretch_offsets(base, run).tolist() == [200, 200, 200, 200, 100, 100, 100]
    assert peak_from_state(projection, base, run) == measured


def test_run_of_another_structure_takes_the_offset_at_the_start() -> None:
    from ckview.analysis.timeline import stretch_offsets

    base = history_step(3, full=False)
    b = StepBuilder()
    for _ in range(5):
        b.existing(100, Category.OPTIMIZER_STATE)
    b.op(Phase.OPTIMIZER)
    assert stretch_offsets(base, b.tables()).tolist() == [200] * 7


def block_with_a_function(saved: bool) -> tuple[Tables, int, int]:
    """One block: a hand-written Function keeps its 300-byte input on ``ctx`` (no PACK unless
    ``saved``) and frees it in backward; the block's 10-byte output is saved by the loss.
    Returns the tables, the block's row and the kept storage."""
    b = StepBuilder()
    net = b.module("", "Net")
    row = b.module("0", "Block", net)
    x = b.existing(10, Category.INPUT)
    with b.call(net) as root:
        with b.call(row, inputs=[x]) as call:
            (kept,) = b.op(alloc=[300], pack=[x])
            (out,) = b.op(alloc=[10], pack=[kept] if saved else [])
            b.output(call, out)
        b.op(alloc=[4], pack=[out])
    b.op(Phase.BACKWARD, call=root, unpack=[out], alloc=[20], category=Category.GRADIENT)
    b.op(Phase.BACKWARD, call=call, unpack=[x] + ([kept] if saved else []), free=[kept])
    return b.tables(), row, kept


@pytest.mark.parametrize("saved", [False, True])
def test_unsaved_storage_held_from_outside_keeps_its_free(saved: bool) -> None:
    """NOTE [ Held from outside ]: what the Function keeps on ctx outlives the checkpointed
    block as in the baseline (to its free in backward); the same storage saved by autograd is
    freed at the block's end (NOTE [ Checkpointed forward ])."""
    tables, row, kept = block_with_a_function(saved)
    projection = project(tables, [ModuleRegion(row)])
    events = projection.events
    (free,) = np.flatnonzero((events.storage == kept) & ~events.copy & (events.kind == FREE))
    baseline_free = int(np.flatnonzero(tables["memory_events"]["storage"] == kept)[-1])
    assert events.source[free] == baseline_free
    assert events.instance[free] == (0 if saved else -1)
    lower = (
        before_backward(tables, projection) - baseline_total(tables)[first_backward_event(tables)]
    )
    assert lower == (-300 if saved else 0)
