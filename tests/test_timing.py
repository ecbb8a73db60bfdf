"""Plain timing steps: the schedule, what the trace stores, and extra compute from plain times
(NOTE [ Plain timing steps ] in recorder/timing.py, NOTE [ Extra compute from plain times ] in
ckview/analysis/timing.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from ckview.analysis import project
from ckview.analysis.regions import ModuleRegion
from ckview.analysis.timing import (
    CallCosts,
    PlanAllTimes,
    Spread,
    forward_call_order,
    plain_times,
    recorded_times_only,
    step_time_ns,
)
from ckview.trace import CorruptTraceError, TraceWriter, open_trace
from ckview.trace.schema import SavedEventKind
from recorder import Recorder
from recorder.calibration import RecomputeTimes, calibration_rows
from recorder.plans import plan_runs
from recorder.timing import CALIBRATION_BYTES, TimingStep, plan_call_costs, timing_schedule
from tests.factory import record_model

pytestmark = pytest.mark.torch


def test_runs_are_timed_in_turn_each_turn_warmed_up() -> None:
    """Round-robin: a slow moment of the machine falls on every run alike. Each turn times the
    step, then the module calls in a step of their own (NOTE [ Quiet timing steps ])."""
    schedule = timing_schedule(runs=2, rounds=2)
    assert schedule == [
        TimingStep(0, False, 0),
        TimingStep(0, True, 0),
        TimingStep(0, True, 0, calls=True),
        TimingStep(1, False, 0),
        TimingStep(1, True, 0),
        TimingStep(1, True, 0, calls=True),
        TimingStep(0, False, 1),
        TimingStep(0, True, 1),
        TimingStep(0, True, 1, calls=True),
        TimingStep(1, False, 1),
        TimingStep(1, True, 1),
        TimingStep(1, True, 1, calls=True),
    ]


def test_a_single_run_warms_up_once() -> None:
    assert timing_schedule(runs=1, rounds=2) == [
        TimingStep(0, False, 0),
        TimingStep(0, True, 0),
        TimingStep(0, True, 0, calls=True),
        TimingStep(0, True, 1),
        TimingStep(0, True, 1, calls=True),
    ]
    assert timing_schedule(runs=3, rounds=0) == []


def test_spread_is_median_and_range() -> None:
    assert Spread.of([5, 1, 9]) == Spread(5, 1, 9, 3)
    assert Spread.of([]) is None


def test_plain_times_take_medians_per_call() -> None:
    """Module 0 is called twice a step: each call has its own median over the steps."""
    tables = {
        "timing_steps": {"round": np.array([0, 1, 2]), "duration_ns": np.array([30, 10, 20])},
        "timed_calls": {
            "timing_step": np.array([0, 0, 1, 1, 2, 2, 2]),
            "module": np.array([0, 0, 0, 0, 0, 0, 1]),
            "order": np.array([0, 1, 0, 1, 0, 1, 0]),
            "duration_ns": np.array([1, 100, 3, 300, 2, 200, 7]),
        },
        "checkpoint_call_ns": np.array([50, 40, 70]),
    }
    times = plain_times(tables)
    assert times is not None
    assert times.step == Spread(20, 10, 30, 3)
    assert times.calls[0].tolist() == [2, 200] and times.calls[1].tolist() == [7]
    assert times.call_spread[0].tolist() == [[1, 100], [3, 300]]  # lowest, highest per call
    assert times.call_cost == Spread(50, 40, 70, 0)
    unmeasured = {**tables, "checkpoint_call_ns": np.array([-1, -1, -1])}
    assert plain_times(unmeasured).call_cost is None  # type: ignore[union-attr]
    assert plain_times({**tables, "timing_steps": _empty_steps()}) is None


def test_cost_per_call_is_read_at_the_bytes_saved() -> None:
    """NOTE [ Checkpoint's cost grows with the data around it ]: linear in log bytes between
    the measured sizes, the end values beyond them, each curve made non-decreasing."""
    costs = CallCosts.of([[32, 60, 50, 70], [1024, 160, 100, 400], [4096, 120, 90, 300]])
    assert costs is not None
    median, low, high = costs.at(np.array([1, 32, 181, 1024, 2048, 10**9]))
    # 181 bytes is halfway between 32 and 1024 in log2 (5 -> 10: 7.5).
    assert median.tolist() == [60, 60, 110, 160, 160, 160]  # 120 at 4096 is noise: held at 160
    assert low.tolist() == [50, 50, 75, 100, 100, 100]
    assert high.tolist() == [70, 70, 235, 400, 400, 400]
    assert CallCosts.of(np.zeros((0, 4))) is None


def test_without_cost_by_size_the_fixed_cost_stands_for_every_call() -> None:
    tables = {
        "timing_steps": {"round": np.array([0]), "duration_ns": np.array([10])},
        "timed_calls": {k: np.zeros(0, np.int64) for k in ("timing_step", "module", "order")}
        | {"duration_ns": np.zeros(0, np.int64)},
        "checkpoint_call_ns": np.array([50, 40, 70]),
    }
    times = plain_times(tables)
    assert times is not None and times.call_costs is None
    assert [c.tolist() for c in times.cost_per_call(np.array([8, 10**6]))] == [
        [50, 50],
        [40, 40],
        [70, 70],
    ]
    by_size = plain_times({**tables, "checkpoint_call_by_size": [[8, 5, 4, 6], [64, 9, 8, 10]]})
    assert by_size is not None
    assert by_size.cost_per_call(np.array([8, 64]))[0].tolist() == [5, 9]


def test_the_cost_by_size_round_trips_and_damage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    with TraceWriter(path) as writer:
        writer.set_call_costs([(32, 60, 50, 70), (1024, 160, 100, 400)])
        with pytest.raises(ValueError, match="increasing bytes"):
            writer.set_call_costs([(64, 1, 1, 1), (32, 1, 1, 1)])
    with open_trace(path) as trace:
        assert trace.call_costs().tolist() == [[32, 60, 50, 70], [1024, 160, 100, 400]]
    with TraceWriter(tmp_path / "older.h5"):
        pass  # a trace without it (older recorders): optional, no rows
    with open_trace(tmp_path / "older.h5") as trace:
        assert trace.call_costs().shape == (0, 4)
    with h5py.File(path, "r+") as f:
        f["meta"].attrs["checkpoint_call_by_size"] = np.zeros((3, 5), dtype=np.int64)
    with open_trace(path) as trace, pytest.raises(CorruptTraceError, match="rows of 4"):
        trace.call_costs()


def test_the_calibration_measures_every_size() -> None:
    costs = plan_call_costs(sizes=(32, 4096), repeats=3)
    assert [n for n, _ in costs] == [32, 4096]
    assert all(0 <= c.low_ns <= c.median_ns <= c.high_ns and c.rounds == 3 for _, c in costs)
    assert CALIBRATION_BYTES[0] == 32 and list(CALIBRATION_BYTES) == sorted(CALIBRATION_BYTES)


def _empty_steps() -> dict[str, np.ndarray]:
    return {"round": np.zeros(0, np.int32), "duration_ns": np.zeros(0, np.int64)}


def test_forward_call_order_counts_per_module_and_step() -> None:
    calls = {
        "module": np.array([3, 4, 3, 3, 3]),
        "step": np.array([0, 0, 0, 1, 1]),
        "phase": np.array([0, 0, 0, 0, 2]),  # the last one a recompute
    }
    assert forward_call_order(calls).tolist() == [0, 0, 1, 0, -1]


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def _record(path: Path, timing_steps: int, script_steps: int) -> None:
    """Six blocks, 2 recorded steps after a warm-up step, in a script of ``script_steps``."""
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(64) for _ in range(6)])
    options = {"steps": 2, "iterations": script_steps, "timing_steps": timing_steps}
    record_model(path, model, (32, 64), loss=torch.sum, lr=0.01, **options)


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recording with 3 rounds of timing steps, shared by the tests that only read it: each
    round a warm-up and a kept step of the run, then of plan all (NOTE [ Timing steps under
    plan all ] in recorder/calibration.py)."""
    path = tmp_path_factory.mktemp("timed") / "t.h5"
    # each round: the run's warm-up, kept and calls steps, then plan all's warm-up and kept
    _record(path, timing_steps=3, script_steps=1 + 2 + 3 * (3 + 2))
    return path


def test_the_trace_holds_plain_timings_and_the_cost_per_call(timed: Path) -> None:
    with open_trace(timed) as trace:
        meta = trace.meta
        assert 0 <= meta.checkpoint_call_low_ns <= meta.checkpoint_call_ns
        assert meta.checkpoint_call_ns <= meta.checkpoint_call_high_ns
        tables = trace.read_run("main")
    assert tables["timing_steps"]["round"].tolist() == [0, 1, 2]
    calls = tables["timed_calls"]
    # Every module (the Sequential, 6 blocks, 6 Linears) once per kept step.
    assert np.bincount(calls["timing_step"]).tolist() == [13, 13, 13]
    assert (calls["order"] == 0).all() and (calls["duration_ns"] > 0).all()
    rows = calls["module"][calls["timing_step"] == 0]
    assert sorted(rows.tolist()) == list(range(13))


def test_extra_compute_comes_from_plain_times(timed: Path) -> None:
    """NOTE [ Extra compute from plain times ]: per recomputed block, its plain forward time
    (median over the timing steps) plus checkpoint's cost per call; without timing steps, the
    recorded op times."""
    tables, blocks = _without_plan_all(timed)
    projection = project(tables, blocks)
    assert projection.plain_times
    times = plain_times(tables)
    assert times is not None and times.call_costs is not None
    assert times.call_costs.nbytes.tolist() == list(CALIBRATION_BYTES)
    # Each block's recompute replays it whole (tanh's saved output is its last op), and pays
    # checkpoint's cost per call at the bytes it saves (NOTE [ Checkpoint's cost grows ...]).
    assert len(projection.recomputes) == 6 * 2
    expected = 0
    for r in projection.recomputes:
        row = int(tables["module_calls"]["module"][r.call])
        cost = times.cost_per_call(np.array([_saved_bytes(tables, r.call)]))[0][0]
        expected += int(times.calls[row][0]) + cost
        assert r.compute_ns == int(times.calls[row][0]) + cost
    assert projection.extra_compute_ns == expected > 0
    # NOTE [ How sure the extra time is ]: every call at its lowest (highest) time and cost.
    low, high = projection.extra_compute_range_ns
    assert 0 < low <= projection.extra_compute_ns <= high and low < high
    recorded = project(recorded_times_only(tables), blocks)
    assert not recorded.plain_times
    assert [r.instance for r in recorded.recomputes] == [r.instance for r in projection.recomputes]
    assert step_time_ns(tables) == (times.step.median_ns * 2, True)
    assert step_time_ns(recorded_times_only(tables))[1] is False


def _without_plan_all(path: Path) -> tuple[dict[str, Any], list[ModuleRegion]]:
    """The run 'main' without its timing steps under plan all (the model of NOTE [ Extra
    compute from plain times ]), and the regions of its six blocks."""
    with open_trace(path) as trace:
        tables = trace.read_run("main")
        paths = [trace.strings[int(p)] for p in tables["modules"]["path"]]
    tables["plan_all_times"] = np.zeros((0, 3), dtype=np.int64)
    return tables, [ModuleRegion(paths.index(str(i))) for i in range(6)]


def test_timing_steps_under_plan_all_time_every_recompute(timed: Path) -> None:
    """NOTE [ Timing steps under plan all ]: one kept step a round under plan all, and in it
    one recompute per block, by the block's module row; the run's own timing steps are as many
    as without them."""
    with open_trace(timed) as trace:
        rows = trace.plan_all_times()
        tables = trace.read_run("main")
        paths = [trace.strings[int(p)] for p in tables["modules"]["path"]]
    assert tables["timing_steps"]["round"].tolist() == [0, 1, 2]
    steps = rows[rows[:, 1] == -1]
    assert steps[:, 0].tolist() == [0, 1, 2] and (steps[:, 2] > 0).all()
    recomputes = rows[rows[:, 1] >= 0]
    blocks = sorted(paths.index(str(i)) for i in range(6))
    for r in range(3):
        assert sorted(recomputes[recomputes[:, 0] == r, 1].tolist()) == blocks
    assert (recomputes[:, 2] > 0).all()


def test_extra_time_is_composed_from_the_timing_steps_under_plan_all(timed: Path) -> None:
    """NOTE [ Extra time measured under plan all ]: each block's instance is projected at the
    recompute's shape (a + b x its plain recompute time, scaled per round) + o, from the rounds
    under plan all over this run's instances of plan all (the six blocks, twice: two recorded
    steps)."""
    old_tables, blocks = _without_plan_all(timed)
    with open_trace(timed) as trace:
        tables = trace.read_run("main")
    times = plain_times(tables)
    assert times is not None and times.plan_all is not None
    assert len(times.plan_all.extra_ns) == 3  # every round paired with the run's
    old = project(old_tables, blocks)
    new = project(tables, blocks)
    assert new.plain_times and [r.instance for r in new.recomputes] == [
        r.instance for r in old.recomputes
    ]
    plain = np.zeros((3, len(old.recomputes)), dtype=np.int64)
    saved = np.array([_saved_bytes(tables, r.call) for r in old.recomputes])
    for i, r in enumerate(old.recomputes):
        costs = times.cost_per_call(saved[i : i + 1])
        plain[0, i] = r.compute_ns - costs[0][0]  # the old model adds the cost per call
    plain[1:] = plain[0]  # (the ranges are checked below, on the sums)
    per_step = (plain[0].sum() / 2, len(blocks), saved.sum() / 2)
    module = np.array([tables["module_calls"]["module"][r.call] for r in old.recomputes])
    calls = {int(m): 1.0 for m in module}  # each block once a step
    compute = {int(m): plain[0][module == m].sum() / 2 for m in module}
    shape = times.plan_all.recompute_shape(calls, compute)
    expected = times.plan_all.compose(plain, saved, per_step, shape)
    assert [r.compute_ns for r in new.recomputes] == expected[0].tolist()
    low, high = new.extra_compute_range_ns
    assert 0 <= low <= new.extra_compute_ns <= high


def test_no_timing_steps_under_plan_all_without_blocks(tmp_path: Path) -> None:
    """NOTE [ Timing steps under plan all ]: a model without a chain of blocks has no plan all
    to time: the run's timing steps follow each other as before, and projections keep the
    model of NOTE [ Extra compute from plain times ]."""
    path = record_model(
        tmp_path / "t.h5", nn.Linear(16, 16), (8, 16), iterations=1 + 1 + 1 + 2 * 3, timing_steps=3
    )
    with open_trace(path) as trace:
        assert trace.plan_all_times().shape == (0, 3)
        tables = trace.read_run("main")
    assert tables["timing_steps"]["round"].tolist() == [0, 1, 2]
    times = plain_times(tables)
    assert times is not None and times.plan_all is None


def test_recomputes_are_timed_only_in_kept_steps_under_plan_all() -> None:
    """RecomputeTimes (NOTE [ Timing steps under plan all ]): a recompute of a known module in
    a kept step under plan all gives one row; outside such a step, or of a region that is no
    module of the model, none."""

    class Ticks:  # a clock whose marks count up by 10
        now = 0

        def mark(self) -> int:
            self.now += 10
            return self.now

        def durations(self, pairs: list[tuple[int, int]]) -> list[int]:
            return [end - start for start, end in pairs]

    block, stranger = object(), object()
    times = RecomputeTimes(lambda target: 4 if target is block else None, Ticks())
    times.on_recompute_begin(1, block)  # not in a kept step under plan all
    times.on_recompute_end(1, block)
    times.start_step(2)
    times.on_recompute_begin(2, block)
    times.on_recompute_begin(3, stranger)
    times.on_recompute_end(3, stranger)
    times.on_recompute_end(2, block)
    times.end_step()
    times.on_recompute_begin(4, block)  # the step ended: not timed
    times.on_recompute_end(4, block)
    times.end_step()
    assert times.rows == [(2, 4, 20)]  # marks 10 and 30 (the stranger took 20)
    assert calibration_rows([2], [500], [*times.rows, (7, 4, 1)]) == [(2, -1, 500), (2, 4, 20)]


def test_a_plan_all_that_cannot_be_applied_never_fails_the_script(monkeypatch: Any) -> None:
    """NOTE [ Timing steps under plan all ]: where plan all cannot be applied when a step
    begins, the step runs plain and the calibration is void, instead of an error in the
    script."""
    from ckpt_runtime import PlanError
    from recorder import calibration

    def refuse(plan: Any) -> Any:
        def enter(recorder: Any) -> Any:
            raise PlanError("a module region cannot be checkpointed")

        return enter

    monkeypatch.setattr(calibration, "plan_context", refuse)
    context = calibration.calibration_context(nn.Sequential(Block(4), Block(4)))
    assert context is not None and not context.failed
    with context(None) as value:
        assert value is None
    assert context.failed


def test_plan_all_times_pair_rounds_and_compose() -> None:
    """NOTE [ Extra time measured under plan all ], on arrays: rounds pair by number (one the
    run lacks is left out); rho and o per round; the median over rounds, the range from the
    extremes; never below zero."""
    rows = [(0, -1, 150), (0, 3, 40), (0, 4, 40), (1, -1, 170), (1, 3, 50), (1, 4, 40)]
    rows += [(2, -1, 999), (2, 3, 1)]
    steps = {"round": np.array([1, 0]), "duration_ns": np.array([110, 100])}
    measured = PlanAllTimes.of(rows, steps)
    assert measured is not None
    assert measured.extra_ns.tolist() == [50, 60] and measured.recompute_ns.tolist() == [80, 90]
    # Per step, plan all has two instances saving 100 bytes each and replaying 100 ns of plain
    # recompute: rho 0.8 and 0.9; O = E - R = -30, -15 per 100 saved bytes.
    plain = np.array([[50, 50, 2, 50], [40, 40, 2, 50], [60, 60, 2, 50]])
    saved = np.array([100, 100, 100, 200])
    out = measured.compose(plain, saved, (100.0, 2.0, 200.0))
    assert out[:, 0].tolist() == [28, 17, 39]  # median of 25 and 30; 0.8*40-15; 0.9*60-15
    assert out[:, 2].tolist() == [0, 0, 0]  # 0.8*2-15 < 0: never below zero
    assert out[0, 3] == 12  # twice the bytes, twice O's share: median of 10 and 15
    one_round = PlanAllTimes.of(rows[:3], steps)
    assert one_round is not None  # plan all's own instances add up to its measured extra time
    assert one_round.compose(plain[:, :2], saved[:2], (100.0, 2.0, 200.0))[0].sum() == 50
    no_compute = one_round.compose(plain[:, :1], saved[:1], (0.0, 2.0, 200.0))
    assert no_compute[0].tolist() == [35]  # rho 1
    nothing_saved = one_round.compose(plain[:, :1], np.zeros(1), (100.0, 2.0, 0.0))
    assert nothing_saved[0].tolist() == [25]  # O per call
    assert PlanAllTimes.of(rows, {"round": np.array([5]), "duration_ns": np.array([1])}) is None
    # With 9 rounds the range is the 95% interval of the median (ranks 1 and 7, NOTE [ Enough
    # plain steps ]), not the extremes: one round slowed by the machine does not stretch it.
    calm = [(r, -1, 200 + r) for r in range(9)] + [(r, 3, 100) for r in range(9)]
    slow = [(8, -1, 10_000) if row == (8, -1, 208) else row for row in calm]
    nine = {"round": np.arange(9), "duration_ns": np.full(9, 100)}
    for measured_rows, high in ((calm, 107), (slow, 107)):
        nine_rounds = PlanAllTimes.of(measured_rows, nine)
        assert nine_rounds is not None
        out = nine_rounds.compose(np.full((3, 1), 100), np.array([100]), (100.0, 1.0, 100.0))
        assert out[:, 0].tolist() == [104, 101, high]  # E - R + R: 100 + r; median r = 4


def test_plan_all_times_round_trip_and_damage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    with TraceWriter(path) as writer:
        writer.set_plan_all_times([(0, -1, 100), (0, 0, 30)])
        with pytest.raises(ValueError, match="module row"):
            writer.set_plan_all_times([(0, -2, 100)])
    with open_trace(path) as trace:
        assert trace.plan_all_times().tolist() == [[0, -1, 100], [0, 0, 30]]
        with pytest.raises(CorruptTraceError, match="module row outside"):
            trace.plan_all_times(modules=0)  # no module 0 in a model without modules
    for damaged in (np.zeros((2, 4), dtype=np.int64), np.array([[0, -1, -5]])):
        with h5py.File(path, "r+") as f:
            f["meta"].attrs["plan_all_times"] = damaged
        with open_trace(path) as trace, pytest.raises(CorruptTraceError, match="plan_all_times"):
            trace.plan_all_times()
    with TraceWriter(tmp_path / "older.h5"):
        pass  # optional: a trace without it has no rows
    with open_trace(tmp_path / "older.h5") as trace:
        assert trace.plan_all_times().shape == (0, 3)


def _saved_bytes(tables: dict[str, Any], call: int) -> int:
    """Bytes of the distinct storages PACKed by ``call`` or a call inside it (a naive walk)."""
    parent = tables["module_calls"]["parent"]

    def inside(c: int) -> bool:
        while c >= 0 and c != call:
            c = int(parent[c])
        return c == call

    saved = tables["saved_events"]
    storages = {
        int(saved["storage"][i])
        for i in range(len(saved["kind"]))
        if saved["kind"][i] == SavedEventKind.PACK and inside(int(saved["module_call"][i]))
    }
    assert storages  # a block saves its Linear's input and weight and its tanh's output
    return sum(int(tables["storages"]["nbytes"][s]) for s in storages)


def test_a_script_that_ends_in_its_timing_steps_keeps_what_was_timed(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    _record(path, timing_steps=3, script_steps=1 + 2 + 2)  # the warm-up and one kept step
    with open_trace(path) as trace:
        assert trace.meta.complete
        tables: dict[str, Any] = trace.read_run("main")
    assert tables["timing_steps"]["round"].tolist() == [0]
    assert plain_times(tables) is not None


def test_no_timing_steps_leave_empty_tables(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    _record(path, timing_steps=0, script_steps=1 + 2)
    with open_trace(path) as trace:
        assert trace.meta.checkpoint_call_ns == -1
        tables = trace.read_run("main")
    assert plain_times(tables) is None
    assert len(tables["timed_calls"]["module"]) == 0


def test_plan_runs_are_timed_in_their_own_context(tmp_path: Path) -> None:
    """Each plan run's timing steps run with its plan applied: the plan run's plain step
    calls every block's forward twice (forward, then recompute in backward), recompute calls
    are not counted as forward calls, so its timed calls match the baseline's."""
    from ckview.cli.recording import load_plans

    torch.manual_seed(0)
    model = nn.Sequential(*[Block(64) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    runs = plan_runs(load_plans(["all"]), baseline=True, checkpointed=False)
    path = tmp_path / "p.h5"
    with Recorder(path, steps=1, warmup=1, runs=runs, progress=False, timing_steps=2):
        for _ in range(1 + 2 + 2 * (2 * 3 + 2)):  # 2 rounds: 2 runs x 3 steps, plan all's 2
            model(torch.randn(32, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
    with open_trace(path) as trace:
        kept = {
            n: trace.run(n).table("timing_steps").read()["round"].tolist() for n in trace.run_names
        }
        calls = {n: len(trace.run(n).table("timed_calls")) for n in trace.run_names}
    assert kept == {"baseline": [0, 1], "plan:all": [0, 1]}
    assert calls["baseline"] == calls["plan:all"] == 2 * 9


def test_a_script_that_fails_in_its_timing_steps_leaves_a_complete_trace(tmp_path: Path) -> None:
    """Every run was recorded before the timing steps: the trace is complete, with what was
    timed, whatever the script does next."""
    path = tmp_path / "t.h5"
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(64) for _ in range(2)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        with Recorder(path, steps=1, warmup=1, progress=False, timing_steps=3):
            for step in range(6):
                if step == 4:  # warmup, recorded, timing warm-up, one kept timing step
                    raise KeyboardInterrupt
                model(torch.randn(8, 64)).sum().backward()
                opt.step()
                opt.zero_grad()
    except KeyboardInterrupt:
        pass
    with open_trace(path) as trace:
        assert trace.meta.complete and trace.meta.error == ""
        assert len(trace.run("main").table("timing_steps")) == 1


class _HookProbe(nn.Module):
    """Notes, at each forward, how many global module hooks and whether saved-tensor hooks
    are installed (torch's own registries)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.seen: list[tuple[int, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.modules import module as nn_module

        saved = torch._C._autograd._top_saved_tensors_default_hooks(True) is not None
        self.seen.append((len(nn_module._global_forward_pre_hooks), saved))
        return torch.tanh(self.fc(x))


def test_timed_steps_run_without_the_recorders_per_call_hooks(tmp_path: Path) -> None:
    """NOTE [ Quiet timing steps ]: the kept steps that time the step run with no module or
    saved-tensor hook of the recorder; the steps that time module calls have its module
    pre-hook alone; both paths."""
    torch.manual_seed(0)
    model = _HookProbe()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(tmp_path / "q.h5", steps=1, warmup=1, progress=False, timing_steps=2):
        for _ in range(1 + 1 + 1 + 2 * 2):  # warmup, recorded, then W P C P C
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    seen = model.seen
    recorded, warm_up, timed, calls = seen[1], seen[2], seen[3::2], seen[4::2]
    assert recorded[0] >= 1 and recorded[1]  # recording: module and saved-tensor hooks
    assert warm_up == (0, False)
    assert timed == [(0, False)] * 2
    assert calls == [(1, False)] * 2
    with open_trace(tmp_path / "q.h5") as trace:
        tables = trace.read_run("main")
    assert tables["timing_steps"]["round"].tolist() == [0, 1]
    assert tables["timed_calls"]["timing_step"].tolist() == [0, 0, 1, 1]  # the probe and fc


def test_a_recompute_stops_before_an_op_whose_inputs_it_saves_last() -> None:
    """NOTE [ Early stop, in time ] in projection/, on arrays: the recompute of a Linear ends
    once addmm's inputs are saved again (addmm never runs); one whose last PACK is the op's own
    output (tanh) or comes late in the op (relu_ saves its result in place) runs that op; one
    without a PACK keeps its last op (an upper bound)."""
    from ckview.analysis.projection.effects import _last_op_run
    from ckview.analysis.regions import RegionInstances

    pack = int(SavedEventKind.PACK)
    tables = {
        # ops: 0 t, 1 addmm (call 0); 2 tanh (call 1); 3 relu_ (call 2); 4 add (call 3)
        "ops": {"start_ns": np.array([0, 10, 200, 300, 400]),
                "end_ns": np.array([5, 110, 250, 350, 450])},
        "storages": {"op": np.array([-1, 0, 2, -1])},  # 0 a weight, 1 t's, 2 tanh's
        "saved_events": {"kind": np.full(4, pack), "storage": np.array([3, 1, 2, 2]),
                         "op": np.array([1, 1, 2, 3]), "module_call": np.array([0, 0, 1, 2]),
                         "time_ns": np.array([12, 13, 249, 349])},
    }  # fmt: skip
    calls = np.arange(4)
    inst = RegionInstances(
        region=calls, first_call=calls, call_stop=calls + 1, last_call=calls,
        start_ns=calls, end_ns=calls, top_instance=calls, top_call=calls,
    )  # fmt: skip
    last_op = np.array([1, 2, 3, 4])
    assert _last_op_run(tables, inst, last_op).tolist() == [0, 2, 3, 4]


def test_the_recompute_shape_fits_a_cost_per_recompute() -> None:
    """NOTE [ Extra time measured under plan all ]: a module that replays nothing (a Linear
    stopped before its matmul) still costs a recompute's own time a; the fit finds it and the
    slope b from modules that replay unlike amounts, and is proportional (0, 1) otherwise."""
    rows = [(0, -1, 1000), (0, 1, 140), (0, 2, 240), (0, 3, 140)]
    steps = {"round": np.array([0]), "duration_ns": np.array([500])}
    measured = PlanAllTimes.of(rows, steps)
    assert measured is not None and measured.module_ns == {1: 140.0, 2: 240.0, 3: 140.0}
    calls = {1: 1.0, 2: 1.0, 3: 1.0}
    a, b = measured.recompute_shape(calls, {1: 0.0, 2: 100.0, 3: 0.0})
    assert (round(a), round(b, 6)) == (140, 1.0)
    # Alike per call (no slope to fit), or a fit with a negative part or a slope out of
    # SLOPE_RANGE: the replay at its plain time and the rest per recompute ((520 - 310) / 3)
    # where the recomputes took more than their plain time, else proportional (520 / 650).
    assert measured.recompute_shape(calls, {1: 100.0, 2: 110.0, 3: 100.0}) == (70.0, 1.0)
    assert measured.recompute_shape(calls, {1: 100.0, 2: 0.0, 3: 100.0}) == (320 / 3, 1.0)
    assert measured.recompute_shape(calls, {1: 0.0, 2: 10.0, 3: 0.0}) == (170.0, 1.0)  # b 10
    assert measured.recompute_shape(calls, {1: 200.0, 2: 250.0, 3: 200.0}) == (0.0, 0.8)
    # Composed: per round the shape scaled to R (520 = 3 x 140 + 100); a segment that replays
    # two modules (200 ns of plain time) is one recompute: 140 + 200 = 340, plus its share by
    # saved bytes of O = E - R = 500 - 520 (half: -10).
    out = measured.compose(np.full((3, 1), 200), np.array([50]), (100.0, 3.0, 100.0), (a, b))
    assert out[:, 0].tolist() == [330] * 3
