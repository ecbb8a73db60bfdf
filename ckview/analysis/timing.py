"""Plain timings of a run as figures: its step time and each module call's forward time,
measured without the recorder's per-op hook, and checkpoint's fixed cost per call.

The recorder takes them in unrecorded timing steps (NOTE [ Plain timing steps ] and NOTE [ Fixed
cost of a checkpoint call ] in recorder/timing.py) and stores them in the run's ``timing_steps``
and ``timed_calls`` tables and the meta field ``checkpoint_call_ns``. Pure functions over a
run's tables as ``Trace.read_run`` gives them.

NOTE [ Extra compute from plain times ]
    A recomputed instance costs the forward of its region once more, plus checkpoint's fixed
    cost per call. Recorded op times carry the recorder's per-op cost, several times the op
    itself for small ops. So where the run has plain timings, an instance's extra compute is
    the plain time of its top-level calls (median over the timing steps of the same call: same
    module, same index among that module's forward calls in the step), times the share of its
    recorded forward op time that its recompute replays (NOTE [ Early stop, in time ] in
    projection/), plus the median cost per call. Without them (older traces, a script that
    ended before its timing steps, ``--timing-steps 0``) it is the recorded op time of what the
    recompute replays (plus the cost per call where it was measured), and every surface says
    so. Step times, the base of every extra-compute share, come from the same source
    (``step_time_ns``), so that a share never divides plain time by recorded time.

    What the model assumes, and how far it held when measured outside the recorder (issue 21;
    CPU, OMP_NUM_THREADS=1, ckpt_runtime's plans, interleaved medians):
    (1) a recompute costs what the same calls cost in the plain forward, and (2) a checkpointed
    forward costs what the plain forward costs. Both hold to a few percent and err the same
    way: on a TransformerEncoder step (4 layers) the recompute ran 3% faster than the plain
    forward (its inputs are warm) and the checkpointed forward 5% faster (it keeps no
    activations), so ``all`` was projected 10% too dear (55.5 ms vs 50.5); on examples/cnn.py's
    first block, 8% too cheap (22.5 vs 24.5: its backward ran slower after the recompute).
    (3) checkpoint's fixed cost per call, measured on one-op regions of 8 elements, stands for
    any region. It does not where the region's tensors are large: a chain of one-op regions
    cost 60 us per call beyond its plain forward at 8 elements, 330 us at 128 KiB and 950 us
    at 512 KiB, per call rather than per recomputed tensor (three ops a region cost the same).
    A profile at 512 KiB shows the recompute's ops and the unpack that runs it slower than the
    same ops in the plain step (tanh 277 us vs 173, TanhBackward0's own time 226 us vs 49):
    what a recompute reads is cold, and the blocks it writes are others than the plain step's;
    raising glibc's MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ lowered the 128 KiB cost
    (to 75 us) but not the 512 KiB one. So a plan of many small regions over large activations
    is projected too cheap: the small loops of examples/loops miss 150-200 us per recomputed
    call (``all`` of linear_relu.py: 1.6 ms projected, 3.3 ms measured), while layer-sized
    regions (the transformer's) show no such cost. Why, and the model that followed: NOTE
    [ Checkpoint's cost grows with the data around it ] in recorder/timing.py. The cost per
    call is now read, per instance, at the bytes the instance saves for backward, from the cost
    the recorder measured by size on the recording machine (``CallCosts``); traces without it
    keep the fixed cost. (Six small loops of examples/loops run side by side with the fixed
    cost and with this: median error 64% and 39% of the measured extra time, 9 and 4 plans
    more than 30% outside the measured spread; they are still projected too cheap, by 30-50%.)
    Where the trace has timing steps under plan all, NOTE [ Extra time measured under plan all ]
    replaces assumptions (1)-(3) with what those steps measured.

NOTE [ How sure the extra time is ]
    A projected extra time carries the range its measurements allow: per instance, the sum of
    the lowest (highest) plain time of each of its calls over the timing steps, scaled as the
    median is, plus the lowest (highest) cost per call measured at its size; summed over the
    instances recomputed. It says how far the timings themselves reach, with every call at its
    extreme at once (wide: an upper bound of the measurement noise), not the model's own error
    (a recompute as dear as the plain forward: within about 10% where measured). ``verify``,
    ``project`` and ``plan`` show it beside the number, in text and JSON. Where the trace has
    timing steps under plan all, the range is the next NOTE's instead.

NOTE [ Extra time measured under plan all ]
    Where the recorder took timing steps under the preset plan ``all`` (NOTE [ Timing steps
    under plan all ] in recorder/calibration.py), the costs the model above assumes are
    measured on the script's own step instead: per round, paired with the projected run's
    timing step of the same round, the step's extra time E under ``all`` and the summed time
    R of its recomputes (by ckpt_runtime's recompute markers), and per module of ``all`` the
    median over rounds of its recomputes' time. Over the instances of ``all`` in this run (C:
    the sum of their plain recompute times as above, up to the early stop in time, n: their
    number, B: the bytes they save for backward, all per step), two figures follow, each with
    a named cause:
        - the recompute's shape a + b x (plain time replayed): a is a recompute's own cost
          (checkpoint's unpack, its Python forward, the recompute context), paid once per
          recompute whatever it replays; b how fast the replay runs against the plain forward
          (0.8-0.9 on a transformer layer: its inputs are warm; about 1 on small Linear/ReLU
          blocks). Fitted by least squares over plan all's modules (``recompute_shape``: their
          number of recomputes and C per module against their measured time; a module without
          a PACK is left out, what it replays is a guess), and scaled per round so that plan
          all's instances add up to R. The fit is kept where the modules replay unlike amounts
          per call and it gives a >= 0 and b in ``SLOPE_RANGE`` (0.5-2: on gan, whose Linear
          blocks replay next to nothing, it read b = 8.5 from a few us of difference, and sqrt,
          whose segments replay the matmuls, was projected at 3x). Otherwise: where the
          recomputes took at least their plain time, b = 1 and the rest is a, per recompute
          (activation_gelu's alike Linear+GELU blocks: about 200 us); else proportional, a = 0 and b
          = R / C (a transformer's layers, whose replay runs faster than the plain forward).
          Without a: on examples/loops/ddp.py a Linear block under ``all`` recomputes in 140 us
          (it replays nothing: NOTE [ Early stop, in time ]) and a ReLU block in 260 us for
          110-150 us of plain forward; a proportional rho was 0.5 while the op records said the
          Linear replays its matmul, and 3.5 once they said it does not, and a segment of
          several blocks (sqrt) was projected at half or at twice its measured extra time. The
          fit gives a = 140 us, b = 0.9-1.0;
        - O = E - R, what checkpointing costs besides the recomputes: checkpoint's own work in
          forward and backward, less what the forward saves by keeping no activations
          (negative on a transformer, whose checkpointed forward runs ~10% faster; 150-250 us
          a call on a loop of small Linear/ReLU regions). Both parts grow with the data a
          call saves for backward (NOTE [ Checkpoint's cost grows with the data around it ]
          in recorder/timing.py; the activations a forward no longer keeps are those bytes),
          so each instance takes the share of O that its saved bytes are of the saved bytes
          B of plan all's instances (per call where B is 0). A segment saves the bytes of
          its blocks: on lightning_residual the recorded steps agree (O -11 ms under ``all``,
          -12 under sqrt, for recomputes of 34 and 53 ms).
    An instance of any plan is then projected at a + b x (its plain recompute time), scaled by
    the round, + O x (its saved bytes) / B, composed per instance: a segment of several blocks
    takes its blocks' plain times, which its recompute replays in full up to the early stop, one
    a, and the bytes it saves. Each round gives one (scale, O); the figure is the median over
    rounds and its range that median's 95% interval (NOTE [ Enough plain steps ] in
    ckview/trace/precision.py: the lowest to the highest round with 5 rounds or fewer), taken
    with the instance's lowest (highest) plain times. (The lowest to the highest of 15 rounds
    read 0..74 ms for a plan measured at 7 ms on a loaded machine: a range of single rounds, not
    of the figure.) An instance is never projected below zero (a recompute costs time; a
    negative figure is O's noise on a small region). Without these rows, or without a round
    paired with the run, the model above holds; where plan all's shape sums to nothing (a x n +
    b x C = 0), a recompute costs its plain time.

    Measured (issue 21, the loop corpus, benchmarks/projection_accuracy.py with 5 plain timing
    steps asked, OMP_NUM_THREADS=1 on 2 shared cores under load; each set of traces also
    projected with the model above): over 74 plans, median error 7.9% (the model above on the
    same traces 20.4%) with no plan more than 30% of its measured extra time outside the
    measured spread (4), and in a later run 11.0% (15.0%) with 2 (8): a transformer plan whose
    measured extra time was itself an outlier (3 ms, spread -6..11, for one layer measured at
    9-11 ms in the other runs), and lightning_residual's sqrt (12 ms projected, 60 measured:
    its steps vary by +-200 ms from round to round, and the median of 15 rounds under plan all
    is no firmer); a third run 8.6% (13.6%) with 2 (2): ddp's sqrt (2.2 ms projected, 4.2
    measured, 3.9..5.5: see below) and lightning_residual's sqrt again (24.7 for 43.4). The
    target (none outside) was not met. Sharing O per call instead gave 8.6% and 1 plan outside
    on the first set, checkpoint's fixed cost per call plus the rest by bytes 8.8% and 1. With
    plan all in the rounds asked for only (5), a loaded run gave 24.8% and 4 (the model above
    19.1% and 6): hence every round.
    With the recompute's shape (a, b) and the early stop in time, the same three sets of
    traces (first, later, third) projected again (``benchmarks/projection_accuracy.py
    --reproject``; the model before it in brackets): 7.8% (7.9%) and 0 (0) outside; 9.9%
    (11.0%) and 2 (2); 7.9% (8.6%) and 0 (2); a fourth run, on a machine loaded more (load 4 on
    2 cores), 18.3% (17.4%) and 1 (2); a fifth (load 2.4), 5.8% (6.8%) and 0 (1: manual_sgd's
    sqrt, 2.0 ms for 4.0, now 3.1).
    ddp's sqrt now reads 3.8-4.5 ms for 3.6-5.0 measured (1.8-3.0 before), manual_sgd's 2.9-3.5
    for 4.4-5.1 (2.1-2.7), lightning_residual's 22.9-34.4 for 43-60 (12-25).
    What it still misses: lightning_residual's sqrt in one of these five runs (22.9 ms for 60,
    spread 50..90: the same run measured its plan all at 25, 8..64, and its steps swing by +-100
    ms; the recorded steps give sqrt's recompute 1.56x all's, about 43 ms in all, so the
    measurement, not the model, is off: verify stopped at its 15 rounds, short of the precision
    NOTE [ Enough plain steps ] asks); a transformer plan (13 ms for a measured 3, spread
    -6..11) and python_loop_sequential's all (13.7 for 5.4, -9..11) in one run each, measured
    values the other runs do not repeat. Small flat loops' sqrt is still projected 25-40% too
    cheap on manual_sgd and some plans 30-45% too dear (indexed_dataset, dataloader_workers sqrt
    in one run), within their spreads' reach.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckview.trace.precision import interval_ranks
from ckview.trace.schema import Phase

SLOPE_SPREAD = 1.5
"""``recompute_shape`` fits a slope only where plan all's modules replay per call this many
times more plain time at the most than at the least."""
SLOPE_RANGE = (0.5, 2.0)
"""... and keeps it only within these bounds: a replay measured at 0.8-1.2x its plain time
(a fit beyond them extrapolates from modules that replay next to nothing: gan's 8.5)."""

PLAN_ALL_TIMES = "plan_all_times"
"""The key of the trace's timing steps under plan all among a run's tables (``read_run``)."""


@dataclass(frozen=True)
class Spread:
    """The median of a few measurements, with the lowest and the highest."""

    median_ns: int
    low_ns: int
    high_ns: int
    count: int

    @classmethod
    def of(cls, values: Sequence[int] | np.ndarray) -> Spread | None:
        """The spread of ``values``; None if there are none."""
        v = np.sort(np.asarray(values, dtype=np.int64))
        if not v.size:
            return None
        return cls(int(v[v.size // 2]), int(v[0]), int(v[-1]), int(v.size))

    def to_json(self) -> dict[str, int]:
        return {
            "median_ns": self.median_ns,
            "low_ns": self.low_ns,
            "high_ns": self.high_ns,
            "count": self.count,
        }


@dataclass(frozen=True)
class PlainTimes:
    """A run's plain timings (NOTE [ Plain timing steps ] in recorder/timing.py)."""

    step: Spread
    """The run's plain step time over its kept timing steps."""
    steps_ns: np.ndarray
    """(s,) int64: each kept timing step's duration, in the order they were taken."""
    calls: Mapping[int, np.ndarray]
    """Module row -> (n,) int64: median plain time of the module's i-th forward call of a
    step, over the timing steps that made an i-th call."""
    call_spread: Mapping[int, np.ndarray]
    """Module row -> (2, n) int64: the lowest and the highest of those times."""
    call_cost: Spread | None
    """Checkpoint's fixed cost per call (forward and backward), None if not measured."""
    call_costs: CallCosts | None = None
    """Checkpoint's cost per call by the bytes a call saves, None if not measured."""
    plan_all: PlanAllTimes | None = None
    """The timing steps under plan all paired with this run's, None if not measured."""

    def cost_per_call(self, saved_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(median, low, high), each (k,) int64: checkpoint's cost per call of instances saving
        ``saved_bytes`` each (NOTE [ Checkpoint's cost grows with the data around it ] in
        recorder/timing.py): from the cost by size where measured, else the fixed cost (zero
        where neither was measured)."""
        if self.call_costs is not None:
            return self.call_costs.at(saved_bytes)
        cost = self.call_cost or Spread(0, 0, 0, 0)
        k = len(saved_bytes)
        return (
            np.full(k, cost.median_ns, dtype=np.int64),
            np.full(k, cost.low_ns, dtype=np.int64),
            np.full(k, cost.high_ns, dtype=np.int64),
        )


@dataclass(frozen=True)
class CallCosts:
    """Checkpoint's cost per call measured at a few sizes (NOTE [ Checkpoint's cost grows with
    the data around it ] in recorder/timing.py)."""

    nbytes: np.ndarray
    """(n,) int64, increasing: bytes each one-op region of the measurement saved."""
    costs: np.ndarray
    """(3, n) int64: median, low and high cost per call at each size."""

    @classmethod
    def of(cls, rows: Any) -> CallCosts | None:
        """From the trace's rows of (bytes, median, low, high); None without rows."""
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        if not len(table):
            return None
        return cls(table[:, 0], table[:, 1:].T.copy())

    def at(self, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(median, low, high) cost per call of regions saving ``nbytes`` each: interpolated
        linearly in log bytes between the measured sizes, the end values beyond them. Each
        curve is made non-decreasing first (a cost that falls with size is noise: the caches
        only get colder), so a larger region never projects cheaper per call."""
        x = np.log2(np.maximum(np.asarray(nbytes, dtype=np.float64), 1.0))
        xp = np.log2(np.maximum(self.nbytes.astype(np.float64), 1.0))
        out = [
            np.round(np.interp(x, xp, np.maximum.accumulate(curve))).astype(np.int64)
            for curve in self.costs
        ]
        return out[0], out[1], out[2]


@dataclass(frozen=True)
class PlanAllTimes:
    """What the timing steps under plan all measured, by round paired with the run's timing
    steps (NOTE [ Extra time measured under plan all ])."""

    extra_ns: np.ndarray
    """(r,) int64: the step under plan all less the run's step of the same round."""
    recompute_ns: np.ndarray
    """(r,) int64: the summed time of that step's recomputes."""
    module_ns: Mapping[int, float] = field(default_factory=dict)
    """Module row -> the median over those rounds of its recomputes' summed time in a step."""

    @classmethod
    def of(cls, rows: Any, run_steps: Mapping[str, Any]) -> PlanAllTimes | None:
        """From the trace's ``plan_all_times`` rows and the run's ``timing_steps``; None
        without a round in both."""
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        run_round = np.asarray(run_steps["round"], dtype=np.int64)
        run_ns = np.asarray(run_steps["duration_ns"], dtype=np.int64)
        extra, recompute, paired = [], [], []
        for rnd, ns in table[table[:, 1] < 0][:, [0, 2]].tolist():
            mine = run_ns[run_round == rnd]
            if mine.size:
                extra.append(ns - int(mine[0]))
                in_step = (table[:, 0] == rnd) & (table[:, 1] >= 0)
                recompute.append(int(table[in_step, 2].sum()))
                paired.append(rnd)
        if not extra:
            return None
        rec = table[np.isin(table[:, 0], paired) & (table[:, 1] >= 0)]
        module_ns = {
            m: float(np.median([rec[(rec[:, 0] == r) & (rec[:, 1] == m), 2].sum() for r in paired]))
            for m in np.unique(rec[:, 1]).tolist()
        }
        return cls(
            np.asarray(extra, dtype=np.int64), np.asarray(recompute, dtype=np.int64), module_ns
        )

    def recompute_shape(
        self, calls: Mapping[int, float], compute: Mapping[int, float]
    ) -> tuple[float, float]:
        """(a, b): a recompute's time as a + b x (the plain time it replays), from plan all's
        modules, given per step each module's number of recomputes (``calls``) and their summed
        plain recompute time (``compute``) (NOTE [ Extra time measured under plan all ]): a
        least-squares fit where the modules replay unlike amounts per call and it gives a >= 0
        and b within ``SLOPE_RANGE``; else, where the recomputes took at least their plain
        time, b = 1 and the rest a cost per recompute; else proportional (a = 0)."""
        rows = [m for m in self.module_ns if calls.get(m, 0) > 0]
        n = np.array([calls[m] for m in rows], dtype=np.float64)
        c = np.array([compute.get(m, 0.0) for m in rows], dtype=np.float64)
        y = np.array([self.module_ns[m] for m in rows], dtype=np.float64)
        if not rows or y.sum() <= 0:
            return 0.0, 1.0
        per_call = c / np.maximum(n, 1.0)
        if len(rows) >= 2 and per_call.min() * SLOPE_SPREAD <= per_call.max():
            (a, b), *_ = np.linalg.lstsq(np.stack([n, c], 1), y, rcond=None)
            if a >= 0 and SLOPE_RANGE[0] <= b <= SLOPE_RANGE[1]:
                return float(a), float(b)
        if y.sum() >= c.sum():
            return float((y.sum() - c.sum()) / n.sum()), 1.0
        return 0.0, float(y.sum() / c.sum())

    def compose(
        self,
        plain: np.ndarray,
        saved_bytes: np.ndarray,
        per_step: tuple[float, float, float],
        shape: tuple[float, float] = (0.0, 1.0),
    ) -> np.ndarray:
        """(3, k) int64: median, lowest and highest extra time of instances whose plain
        recompute times are ``plain`` ((3, k): median, lowest, highest) and that save
        ``saved_bytes`` (k,) each for backward, given per step the summed plain recompute time,
        the number and the summed saved bytes of the instances of plan all, and the
        ``recompute_shape`` (a, b) (NOTE [ Extra time measured under plan all ])."""
        compute_all, calls_all, bytes_all = per_step
        a, b = shape
        base = a * calls_all + b * compute_all
        if base <= 0:  # nothing replayed: a recompute costs its plain time
            a, b, base = 0.0, 1.0, 1.0
            scale = np.ones(len(self.extra_ns))
        else:
            scale = self.recompute_ns / base
        rest = (self.extra_ns - self.recompute_ns).astype(np.float64)
        share = np.asarray(saved_bytes, dtype=np.float64) / bytes_all if bytes_all > 0 else None
        if share is None:  # nothing saved by plan all: per call
            share = np.full(len(saved_bytes), 1.0 / max(calls_all, 1.0))
        other = rest[:, None] * share[None, :]
        recompute = a + b * plain.astype(np.float64)
        per_round = scale[:, None] * recompute[:, None, :] + other[None, :, :]
        low, high = interval_ranks(len(self.extra_ns))
        out = np.stack(
            [
                np.median(per_round[0], 0),
                np.sort(per_round[1], 0)[low],
                np.sort(per_round[2], 0)[high],
            ]
        )
        return np.maximum(np.round(out), 0).astype(np.int64)


def extra_range_text(extra: tuple[int, int]) -> str:
    """``; timings allow LOW..HIGH ms``: the range of a projected extra compute (NOTE [ How
    sure the extra time is ]), for the surfaces that show it; '' if there is none."""
    low, high = extra
    return f"; timings allow {low / 1e6:.1f}..{high / 1e6:.1f} ms" if high > low else ""


def plain_times(tables: Mapping[str, Any]) -> PlainTimes | None:
    """The run's plain timings, None if it has no kept timing step."""
    steps = tables.get("timing_steps")
    if steps is None or not len(steps["duration_ns"]):
        return None
    durations = np.asarray(steps["duration_ns"], dtype=np.int64)
    step = Spread.of(durations)
    assert step is not None
    stats = _call_stats(tables["timed_calls"])
    return PlainTimes(
        step=step,
        steps_ns=durations,
        calls={row: s[0] for row, s in stats.items()},
        call_spread={row: s[1:] for row, s in stats.items()},
        call_cost=_call_cost(tables.get("checkpoint_call_ns")),
        call_costs=CallCosts.of(tables.get("checkpoint_call_by_size", ())),
        plan_all=PlanAllTimes.of(tables.get(PLAN_ALL_TIMES, ()), steps),
    )


def _call_stats(calls: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Module row -> (3, n) int64: median, lowest and highest time of its i-th call."""
    module = np.asarray(calls["module"], dtype=np.int64)
    order = np.asarray(calls["order"], dtype=np.int64)
    duration = np.asarray(calls["duration_ns"], dtype=np.int64)
    out: dict[int, np.ndarray] = {}
    for row in np.unique(module).tolist():
        mine = module == row
        n = int(order[mine].max()) + 1
        stats = np.zeros((3, n), dtype=np.int64)
        for i in range(n):
            d = duration[mine & (order == i)]
            stats[:, i] = (np.median(d), d.min(), d.max()) if d.size else (0, 0, 0)
        out[row] = stats
    return out


def _call_cost(values: Any) -> Spread | None:
    if values is None or len(values) != 3 or int(values[0]) < 0:
        return None
    median, low, high = (int(v) for v in values)
    return Spread(median, low, high, 0)


def plain_instance_ns(
    tables: Mapping[str, Any],
    times: PlainTimes,
    top_instance: np.ndarray,
    top_call: np.ndarray,
    instances: int,
) -> np.ndarray | None:
    """(3, k) int64: the plain forward time of each instance's top-level calls (NOTE [ Extra
    compute from plain times ]): the sum of their medians, of their lowest and of their highest
    times; None if a call has no plain time (the timing steps called the modules otherwise than
    the recorded steps)."""
    calls = tables["module_calls"]
    module = np.asarray(calls["module"], dtype=np.int64)
    order = forward_call_order(calls)
    out = np.zeros((3, instances), dtype=np.int64)
    for i, call in zip(top_instance.tolist(), top_call.tolist(), strict=True):
        medians = times.calls.get(int(module[call]))
        k = int(order[call])
        if medians is None or not 0 <= k < len(medians):
            return None
        out[0, i] += medians[k]
        out[1:, i] += times.call_spread[int(module[call])][:, k]
    return out


def forward_call_order(calls: Mapping[str, np.ndarray]) -> np.ndarray:
    """(c,) int64: each FORWARD call's index among the forward calls of its module in its step
    (-1 for other calls), as ``timed_calls.order`` counts them."""
    module = np.asarray(calls["module"], dtype=np.int64)
    step = np.asarray(calls["step"], dtype=np.int64)
    rows = np.flatnonzero(np.asarray(calls["phase"]) == Phase.FORWARD)
    rows = rows[np.lexsort((rows, module[rows], step[rows]))]
    out = np.full(len(module), -1, dtype=np.int64)
    if rows.size:
        key = step[rows] * (module.max() + 1) + module[rows]
        starts = np.flatnonzero(np.append(True, key[1:] != key[:-1]))
        first = np.repeat(starts, np.diff(np.append(starts, len(rows))))
        out[rows] = np.arange(len(rows)) - first
    return out


def step_time_ns(tables: Mapping[str, Any]) -> tuple[int, bool]:
    """The summed time of the run's complete recorded steps (a step cut short is left out:
    ``recompute.step_durations``), and whether it comes from plain timing steps: their median
    times the number of those steps (else the recorded steps' own durations, with the
    recorder's cost)."""
    from ckview.analysis.recompute import step_durations

    durations = step_durations(tables["steps"])
    times = plain_times(tables)
    if times is not None:
        return times.step.median_ns * max(len(durations), 1), True
    return int(durations.sum()), False


def recorded_times_only(tables: Mapping[str, Any]) -> dict[str, Any]:
    """The run's tables without its timing steps: what projects extra compute from recorded op
    times, to compare with recorded steps when the other run has no plain timings."""
    return {name: table for name, table in tables.items() if name != "timing_steps"}


def forward_ns_by_module(tables: Mapping[str, Any], modules: int) -> tuple[np.ndarray, bool]:
    """(modules,) int64: the summed time of each module's forward calls in the recorded steps,
    from plain times where the run has them for every call (else recorded call durations), and
    whether they are plain."""
    calls = tables["module_calls"]
    forward = np.flatnonzero(np.asarray(calls["phase"]) == Phase.FORWARD)
    module = np.asarray(calls["module"], dtype=np.int64)[forward]
    times = plain_times(tables)
    if times is not None:
        order = forward_call_order(calls)[forward]
        plain = [_plain_call(times, int(m), int(k)) for m, k in zip(module, order, strict=True)]
        if all(p is not None for p in plain):
            weights = np.asarray(plain, dtype=np.float64)
            return np.bincount(module, weights, minlength=modules).astype(np.int64), True
    end = np.asarray(calls["end_ns"], dtype=np.int64)[forward]
    start = np.asarray(calls["start_ns"], dtype=np.int64)[forward]
    duration = np.maximum(end - start, 0).astype(np.float64)
    return np.bincount(module, duration, minlength=modules).astype(np.int64), False


def _plain_call(times: PlainTimes, module: int, order: int) -> int | None:
    medians = times.calls.get(module)
    return int(medians[order]) if medians is not None and 0 <= order < len(medians) else None
