"""How many plain timing steps verify takes, and the spread it shows (NOTE [ Enough plain
steps ] in ckview/trace/precision.py, NOTE [ Extra time, like for like ] in
ckview/analysis/recompute.py)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from ckview.analysis.recompute import extra_time
from ckview.trace import open_trace
from ckview.trace.precision import (
    MAX_ROUNDS,
    NEEDED_CAP,
    median_interval,
    precise_enough,
    rounds_needed,
)
from recorder import Recorder
from recorder.plans import plan_runs
from recorder.timing import TimingStep, add_round, timing_schedule

pytestmark = pytest.mark.torch


def test_the_median_interval_widens_to_whole_ranks() -> None:
    five = median_interval([5, 1, 4, 2, 3])
    assert five is not None and (five.median, five.low, five.high) == (3, 1, 5)
    sixteen = median_interval(list(range(16)))  # ranks 8 -/+ 3.92: the 5th to the 12th
    assert sixteen is not None and (sixteen.low, sixteen.high, sixteen.median) == (4, 11, 7.5)
    assert median_interval([]) is None


def test_paired_steps_cancel_a_slow_moment_of_the_machine() -> None:
    """Round 2 is slow for both runs: the difference of each round is still 10."""
    t = extra_time([100, 300, 100, 100, 100], [110, 310, 110, 110, 110], 10, True)
    assert t is not None
    assert (t.measured_ns, t.low_ns, t.high_ns, t.steps) == (10, 10, 10, 5)
    assert t.precise and not t.miss
    apart = extra_time([100, 300, 100], [110, 100, 310], 10, True)  # unpaired, noisy
    assert apart is not None and (apart.low_ns, apart.high_ns) == (-200, 210)


def test_rounds_needed_grow_with_the_square_of_the_spread() -> None:
    interval = median_interval([0, 20, 40, 60, 80])  # median 40, half-width 40
    assert interval is not None
    # allowed: 10% of 40 ms = 4, or 2% of a 1000 step = 20: 20 -> (40/20)**2 = 4 times 5 rounds
    assert rounds_needed(interval, 1000) == 20
    assert rounds_needed(interval, 4000) == 5  # 2% of 4000 = 80 >= 40: precise already
    far = median_interval([-1e9, 0, 1e9, 0, 0])
    assert far is not None and rounds_needed(far, 10) == NEEDED_CAP


def test_precise_enough_needs_every_run() -> None:
    steady = [100, 101, 100, 101, 100]
    assert precise_enough([steady, [s + 50 for s in steady]])
    assert not precise_enough([steady, [s + 50 for s in steady], [150, 100, 200, 120, 180]])
    assert precise_enough([steady])  # one run: its own steps around their median
    assert not precise_enough([steady[:4], steady[:4]])  # too few rounds to say
    assert not precise_enough([[]])


def test_a_round_is_added_after_the_last() -> None:
    """Rounds added for precision time the step only (NOTE [ Quiet timing steps ])."""
    schedule = timing_schedule(runs=2, rounds=1)
    add_round(schedule, 2)
    assert schedule[6:] == [
        TimingStep(0, False, 1),
        TimingStep(0, True, 1),
        TimingStep(1, False, 1),
        TimingStep(1, True, 1),
    ]
    alone = timing_schedule(runs=1, rounds=1)
    add_round(alone, 1)  # a run that follows itself needs no warm-up
    assert alone == [
        TimingStep(0, False, 0),
        TimingStep(0, True, 0),
        TimingStep(0, True, 0, calls=True),
        TimingStep(0, True, 1),
    ]


class _Noisy(nn.Module):
    """Sleeps 20 ms in two forwards of five, drawn from a seeded generator: the kept steps of
    the two runs sleep in different rounds, and never settle."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.draws = random.Random(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02 * (self.draws.random() < 0.4))
        return torch.tanh(self.fc(x))


def _record_noisy(path: Path, timing_steps: int, iterations: int) -> None:
    """A baseline and plan 'none' of ``_Noisy``."""
    from ckview.cli.recording import load_plans

    torch.manual_seed(0)
    model = _Noisy()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    runs = plan_runs(load_plans(["none"]), baseline=True, checkpointed=False)
    with Recorder(path, steps=1, warmup=1, runs=runs, progress=False, timing_steps=timing_steps):
        for _ in range(iterations):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()


def test_rounds_are_added_until_the_cap(tmp_path: Path) -> None:
    """NOTE [ Enough plain steps ]: 2 rounds asked, steps that never settle: MAX_ROUNDS kept
    steps per run, and no more, however long the script runs."""
    path = tmp_path / "n.h5"
    _record_noisy(path, timing_steps=2, iterations=1 + 2 + 2 * 2 * MAX_ROUNDS + 10)
    with open_trace(path) as trace:
        for name in ("baseline", "plan:none"):
            rounds = trace.read_run(name)["timing_steps"]["round"].tolist()
            assert rounds == list(range(MAX_ROUNDS)), name


def test_verify_says_when_the_script_ran_too_few_steps(tmp_path: Path) -> None:
    """The script ends after 2 rounds: verify's note says how many rounds the spread needs."""
    from ckview.cli.recording import load_plans
    from ckview.cli.verify import _precision_notes, _verify

    path = tmp_path / "n.h5"
    _record_noisy(path, timing_steps=2, iterations=1 + 2 + 2 * 3 * 2)
    checks, missing, _ = _verify(path, load_plans(["none"]))
    assert not missing and checks[0].time is not None
    assert checks[0].time.steps == 2 and not checks[0].time.precise
    [note] = _precision_notes(checks)
    assert note.startswith("note: the script ran too few steps to measure the extra time of none")
    needed = checks[0].time.rounds_needed
    about = f"{NEEDED_CAP} or more" if needed >= NEEDED_CAP else f"about {needed}"
    assert needed > 2 and f"2 rounds of plain steps, {about} needed" in note
