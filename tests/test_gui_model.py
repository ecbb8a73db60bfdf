"""The explorer's Qt-free layer: run data, max-envelope downsampling, the plan session."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckview.analysis import (
    ModuleRegion,
    SegmentRegion,
    live_storages,
    project,
    regions_from_plan,
)
from ckview.app.envelope import FACTOR, Envelope
from ckview.app.planning import PlanSession
from ckview.app.run import STACK_ORDER, Axis, load_trace
from tests.conftest import ROOT

SAMPLES = ROOT / "sample_traces"


@pytest.fixture(scope="module")
def transformer() -> PlanSession:
    """Baseline of the transformer (a ModuleList chain of 4 layers), model built."""
    session = PlanSession(load_trace(SAMPLES / "transformer_compare.h5").runs[0])
    session.prepare()
    return session


@pytest.fixture(scope="module")
def cnn() -> PlanSession:
    """The CNN (an nn.Sequential chain of 3 blocks), model built."""
    session = PlanSession(load_trace(SAMPLES / "cnn.h5").runs[0])
    session.prepare()
    return session


# ----------------------------------------------------------------------------- envelope


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=3000),
    st.floats(0, 1),
    st.floats(0, 1),
    st.integers(10, 400),
)
def test_envelope_keeps_every_peak(values: list[int], a: float, b: float, pixels: int) -> None:
    """NOTE [ Max envelope ]: the visible bins never drop below the curve, reach its maximum
    over the visible range, and number at most ~2 per pixel (plus the edge bins)."""
    y = np.asarray(values, dtype=np.float64)
    x = np.cumsum(np.random.default_rng(len(values)).integers(0, 3, len(values))).astype(float)
    env = Envelope(x, y, smallest=8)
    x0, x1 = sorted((x[0] + a * (x[-1] - x[0]), x[0] + b * (x[-1] - x[0])))
    vis = env.visible(x0, x1, pixels)
    inside = np.flatnonzero((x >= x0) & (x <= x1))
    assert vis.y.shape[1] <= 2 * pixels + 2
    if inside.size:
        assert vis.y[0].max() >= y[inside].max()
        assert vis.edges[0] <= x[inside[0]] and vis.edges[-1] >= x[inside[-1]]
    # Every bin of every level holds the maximum of its points.
    for level, ys in enumerate(env.levels_y):
        bins = np.arange(len(y)) // FACTOR**level
        assert np.all(ys[0][bins] >= y)
        assert np.array_equal(np.maximum.reduceat(y, np.arange(0, len(y), FACTOR**level)), ys[0])


def test_envelope_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="points"):
        Envelope(np.arange(3.0), np.zeros(4))


# ----------------------------------------------------------------------------- run data


def test_run_data_axes_and_live_tensors(transformer: PlanSession) -> None:
    """NOTE [ Two x axes ]: both axes non-decreasing; the live tensors at the peak add up to the
    peak, largest first, and are the analysis's live set."""
    run = transformer.run
    for axis in Axis:
        assert np.all(np.diff(run.x(axis)) >= 0)
    live = run.live_tensors(run.peak.point)
    assert sum(t.nbytes for t in live) == run.peak.bytes
    assert [t.nbytes for t in live] == sorted((t.nbytes for t in live), reverse=True)
    rows = live_storages(run.tables["storages"], run.tables["memory_events"], run.peak.event)
    assert sorted(t.storage for t in live) == rows.tolist()
    assert np.array_equal(run.stacked[-1], run.timeline.total)
    assert len(STACK_ORDER) == run.timeline.by_category.shape[0]
    assert [s.label for s in run.phases] == ["forward 0", "backward 0", "optimizer 0"]


def test_recorded_recomputes_become_spans() -> None:
    checkpointed = load_trace(SAMPLES / "transformer_compare.h5").runs[1]
    labels = [s.label for s in checkpointed.recomputes]
    assert labels == [f"recompute CausalLM.encoder.layers.{i}" for i in (3, 2, 1, 0)]
    assert all(s.start_ms <= s.end_ms for s in checkpointed.recomputes)


# ----------------------------------------------------------------------------- plan session


def test_outcome_matches_the_exact_projection(transformer: PlanSession) -> None:
    """The readout's numbers are ``project``'s, whichever path answers."""
    session = transformer
    blocks = session.chain.blocks if session.chain else ()
    for picks in ([blocks[0]], [blocks[1], blocks[3]], list(blocks)):
        session.set_selection(ModuleRegion(b) for b in picks)
        fast = session.outcome()
        exact = project(session.run.tables, session.regions())
        assert fast.incremental
        assert fast.peak_bytes == exact.projected_peak.bytes
        assert fast.extra_compute_ns == exact.extra_compute_ns
        assert fast.extra_compute_range_ns == exact.extra_compute_range_ns  # How sure ...
        low, high = fast.extra_compute_range_ns
        assert low <= fast.extra_compute_ns <= high and low < high
        assert fast.total.max() == exact.total.max()
        assert len(fast.recomputes) == len(exact.recomputes)
    session.set_selection([])


def test_sequential_strip_cuts_and_joins(cnn: PlanSession) -> None:
    """NOTE [ Chain strip ]: joining keeps a selected segment selected, cutting splits it."""
    session = cnn
    chain = session.chain
    assert chain is not None and chain.sequential and len(chain.blocks) == 3
    session.set_selection([])
    assert session.segments() == [(0, 1), (1, 2), (2, 3)]
    session.toggle_block(1)
    assert session.selection == {ModuleRegion(chain.blocks[1])}
    session.toggle_boundary(2)  # join blocks 1 and 2
    assert session.segments() == [(0, 1), (1, 3)]
    assert session.selection == {SegmentRegion(chain.row, 1, 3)}
    outcome = session.outcome()
    assert outcome.incremental
    assert outcome.peak_bytes == project(session.run.tables, session.regions()).projected_peak.bytes
    session.toggle_boundary(2)  # cut again: both halves stay selected
    assert session.selection == {ModuleRegion(chain.blocks[1]), ModuleRegion(chain.blocks[2])}
    session.toggle_block(2)
    assert session.selection == {ModuleRegion(chain.blocks[1])}
    with pytest.raises(ValueError, match="no gap"):
        session.toggle_boundary(0)
    session.set_selection([])


def test_module_list_gaps_are_fixed(transformer: PlanSession) -> None:
    with pytest.raises(ValueError, match="ModuleList"):
        transformer.toggle_boundary(1)


def test_presets_resolve_like_the_analysis(cnn: PlanSession) -> None:
    t = cnn.run.tables
    for preset in ("all", "sqrt", "none"):
        cnn.apply_preset(preset)
        expected = project(t, regions_from_plan(preset, t["modules"], t["strings"]))
        assert cnn.outcome().peak_bytes == expected.projected_peak.bytes
    assert not cnn.selection


def test_nested_selection_is_shadowed(transformer: PlanSession) -> None:
    session = transformer
    assert session.chain is not None
    encoder = session.modules[session.chain.row].parent
    session.set_selection([ModuleRegion(encoder), ModuleRegion(session.chain.blocks[0])])
    assert session.shadowed() == {session.chain.blocks[0]}
    session.set_selection([])


def test_plan_files_round_trip(transformer: PlanSession, tmp_path: Path) -> None:
    session = transformer
    assert session.chain is not None
    picked = {ModuleRegion(session.chain.blocks[1]), ModuleRegion(session.chain.blocks[2])}
    session.set_selection(picked)
    path = tmp_path / "two.json"
    session.save_plan(str(path))
    doc = json.loads(path.read_text())
    assert doc["name"] == "two" and doc["format"] == "ckview-plan"
    session.set_selection([])
    session.load_plan(str(path))
    assert session.selection == picked
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        session.load_plan(str(bad))
    bad.write_text(
        json.dumps({"format": "ckview-plan", "version": 1, "regions": [{"module": "x"}]})
    )
    with pytest.raises(ValueError):
        session.load_plan(str(bad))
    session.set_selection([])


def test_module_table_numbers(transformer: PlanSession) -> None:
    """Activation bytes add up the subtree; forward time and recompute cost are positive for
    called modules; a recompute costs at most the forward (plain times) plus checkpoint's cost
    per call (NOTE [ Extra compute from plain times ])."""
    session = transformer
    infos = session.modules
    root = next(m for m in infos if m.parent < 0 and m.calls)
    children = [m for m in infos if m.parent == root.row]
    st = session.run.tables["storages"]
    own = int(st["nbytes"][(st["module"] == root.row) & (st["category"] == 3)].sum())
    assert root.activation_bytes == own + sum(c.activation_bytes for c in children)
    assert session.chain is not None
    for row in session.chain.blocks:
        assert infos[row].forward_ns > 0
        cost = session.recompute_cost_ns(row)
        by_size = session.run.tables["checkpoint_call_by_size"][:, 1]  # dearer for big calls
        call_cost = max([int(session.run.tables["checkpoint_call_ns"][0]), *by_size.tolist()])
        assert call_cost > 0  # the sample traces have plain timings
        assert cost is not None and 0 < cost <= infos[row].forward_ns + infos[row].calls * call_cost


def test_loading_reports_progress() -> None:
    seen: list[tuple[float, str]] = []
    data = load_trace(SAMPLES / "transformer_compare.h5", lambda f, what: seen.append((f, what)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert any("memory_events" in what for _, what in seen)
    assert [r.name for r in data.runs] == ["baseline", "checkpointed"]


def test_a_run_without_ops_shows_and_projects(cnn: PlanSession) -> None:
    """A recording stopped before the first op: only pre-existing storages. The explorer still
    shows it and every plan projects to its (flat) baseline."""
    from ckview.app.run import build_run

    t = dict(cnn.run.tables)
    for name in ("memory_events", "ops", "module_calls", "module_io", "saved_events", "steps"):
        t[name] = {k: v[:0] for k, v in t[name].items()}
    old = np.asarray(t["storages"]["op"]) < 0
    t["storages"] = {k: v[old] for k, v in t["storages"].items()}
    run = build_run("empty.h5", "main", t)
    assert run.n_events == 0 and run.phases == []
    session = PlanSession(run)
    session.apply_preset("all")
    assert session.outcome().peak_bytes == run.peak.bytes


def test_the_pointer_shows_the_highest_of_points_at_one_time() -> None:
    """Events that share a time, or a pixel, are drawn at one x; hovering there describes the top
    of what is drawn (the peak-preserving curve), not the last event."""
    run = load_trace(SAMPLES / "mlp.h5").runs[0]
    xs, total = run.x(Axis.TIME), run.timeline.total
    for point in (run.peak.point, *range(1, len(xs), 97)):
        shown = run.point_under(Axis.TIME, float(xs[point]))
        same_x = np.flatnonzero(xs == xs[point])
        assert shown in same_x and total[shown] == total[same_x].max()
    peak_x = float(xs[run.peak.point])
    assert total[run.point_under(Axis.TIME, peak_x)] == run.peak.bytes
    # A pointer a little off the spike, within a pixel, still shows it; farther off, it does not.
    assert run.point_under(Axis.TIME, peak_x - 1.0, half_width=2.0) == run.peak.point
    assert run.point_under(Axis.TIME, peak_x - 1.0) != run.peak.point
