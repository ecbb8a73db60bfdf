"""Timings that the recorder's per-op hooks would distort: plain steps, plain module forwards,
and checkpoint's fixed cost per call.

NOTE [ Plain timing steps ]
    The recorder's per-op hook (a TorchDispatchMode) costs microseconds per op, more than many
    ops themselves, and it is paid again by every recomputed op: times from recorded steps
    inflate both the step and its extra compute, unevenly. So with ``timing_steps=k``, once
    every run is recorded, each run's context (a plan applied, or checkpointing bypassed) is
    entered again for unrecorded steps with the op hook taken off the dispatch stack (and the
    other per-call hooks: NOTE [ Quiet timing steps ]).
    ``timing_schedule`` orders them in k rounds, each run in turn: a machine that slows down for
    a while (other processes, frequency scaling) then slows every run alike instead of biasing
    one run against another. After the k rounds asked for, the recorder adds one round at a time
    until every run's extra time is measured precisely enough, or up to a cap (NOTE [ Enough
    plain steps ] in ckview/trace/precision.py). The first step after a switch of context is the
    slowest (often by a third: the allocator's cache holds the other run's blocks), so a run's
    turn starts with a warm-up step that is timed, not kept; with a single run only its first
    step warms up. Timing comes after the last recorded run, so that a script that ends early
    loses timings, never a recorded run; the timings are written to the trace's ``timing_steps``
    and ``timed_calls`` tables before it is closed (docs/trace-format.md).
    ``StepTimer`` keeps, per run, each kept step's duration and the duration of every forward
    module call in it (by module row, in call order), so that medians over the k steps, with
    their spread, give the plain step time of each run and the plain forward time of each call
    of the baseline (ckview/analysis/timing.py). A loop without optimizer ends a timing step
    when its next top-level forward begins (no backward is seen without the op hook; the
    recorder learned in warmup that there is no optimizer). If the op hook is not on top of the
    dispatch stack (another mode above it), it stays and runs its fast path; the timings then
    still carry one Python call per op.

NOTE [ Quiet timing steps ]
    A hook on every module call or saved tensor is not free: the recorder's module hooks cost
    10-20 us a call in Python, its saved-tensor hooks a Python call per saved tensor, and a
    global module hook sends every module call through torch's slow path. Left on, they made
    plain timing steps of a 4-layer TransformerEncoder step (37 module calls, 5.5 ms, CPU)
    read 1.10-1.21x the step without ckview, 1.17-1.47x on an H200, where the step waits on its
    launches; and in a run that checkpoints, every recomputed module call pays them again, so
    they inflate the measured extra time too. So once every run is recorded, the sources whose
    hooks run per call take them off (``HooksEveryCall.quiet``), the recorder's saved-tensor
    hooks come off, and its module hooks are on only in the steps that time module calls: the
    step times come from steps that run as the script does without ckview (the optimizer hooks
    that find the step's end remain). Each turn of the rounds asked for is a warm-up where the
    run changes, a kept step timed whole, then a step that times the run's module calls, whose
    durations carry the hooks of the calls nested in them; rounds added for precision (NOTE
    [ Enough plain steps ]) time the step only. A loop whose steps end where its next forward
    begins (no optimizer) keeps the module pre-hook in every step, which finds the boundary,
    and the Python path's saved-tensor hooks, whose unpack sees backward begin (NOTE [ Early
    run context ] in runs.py).

NOTE [ Times on an accelerator ]
    On CUDA an op returns once its kernel is queued, so host clocks around a step or a module
    call measure launches, not work. Where the script uses CUDA, a timing step synchronises
    the device at its start and end (its host time is then the device's), and each forward
    call is timed by a pair of CUDA events recorded on the current stream, read once the step
    has ended and the device is synchronised (``CudaClock``); a CPU run keeps host clocks
    (``HostClock``). Synchronising costs a timing step nothing it would not wait for anyway at
    its end; recorded steps are never synchronised, so their op times stay launch times.

NOTE [ Fixed cost of a checkpoint call ]
    A checkpointed call costs more than its recomputed ops: in forward, checkpoint saves the
    RNG state, pushes saved-tensor hooks and packs holders; in backward, it sets up the
    recompute, unpacks and stops it. For a region of a few tiny ops (a tutorial that
    checkpoints 1,000 small functions) that fixed cost is most of the extra time, and a
    projection that sums only the recomputed ops says +2% where the step runs several times
    slower. ``plan_call_cost_ns`` measures it on this machine, outside any recorder, the
    way plans checkpoint (module regions of ``apply_plan``: the region's module call, hooks
    and running-statistics guard included): the median over ``repeats`` interleaved rounds
    of (forward + backward of ``calls`` one-op modules, each a region) minus the same without
    the plan and minus the plain forward the recompute reruns, per call, with the spread of
    the rounds (benchmarks/checkpoint_runtime.py compares the fixed cost of ckpt_runtime's and
    torch's checkpoint of a function). The recorder stores it, for regions of 8 elements, in
    the trace's meta (``checkpoint_call_ns``), and projections add it per recomputed instance
    to the extra time (ckview/analysis/timing.py) where the trace has no cost by size (next
    NOTE).

NOTE [ Checkpoint's cost grows with the data around it ]
    Measured on one-op regions of 8 elements, the cost per call stands only for regions whose
    tensors are tiny. On this machine (CPU, one thread, interleaved medians, issue 21) a chain
    of one-op regions cost, per call beyond the plain forward it recomputes: 70 us at 8
    elements, 100 us at 128 KiB, 200-370 us at 512 KiB and 2 MiB. The kernels are not what
    grows: a profile at 512 KiB shows the recomputed tanh and its backward no slower than in
    the plain step (perf: libtorch's time per step +0.5 ms for 16 recomputed tanh of 60 us), no
    more page faults or mmap calls, and the cyclic GC changes nothing (disabled, the same
    cost); what grows is the time in the Python interpreter (+2.4 ms a step, 150 us a call):
    checkpoint's unpack, recompute and early stop run between kernels that stream the
    region's tensors through the caches, most likely on cold caches (the growth stops past a
    quarter of the 2 MiB L2; this VM has no hardware counters to confirm it). The cost is not
    per recomputed op: a Linear region whose recompute stops before its matmul (NOTE [ Early
    stop ] in ckview/analysis/projection; no addmm in its backward, checked with a dispatch
    mode) cost 150 us a call at batch 1024 x 128. It depends on the machine, so the recorder
    measures it at record time:
    ``plan_call_costs`` repeats the measurement of NOTE [ Fixed cost of a checkpoint call ] on
    one-op regions saving ``CALIBRATION_BYTES`` each (a fresh chain per size, fewer calls for
    larger tensors, its plain forward subtracted) and stores the rows in the trace's optional
    meta attribute ``checkpoint_call_by_size`` (docs/trace-format.md). Projections read the
    cost per call at the bytes each instance saves for backward (ckview/analysis/timing.py,
    ``CallCosts``). Each size takes 11 interleaved rounds (7 left the median at 512 KiB
    varying by a factor of two between recordings on a loaded machine): about a second at the
    end of a recording (1.4 s on 2 loaded cores), and 16 MiB at most.

    What it leaves (issue 21, measured on a quiet machine, 15 interleaved rounds): the cost
    also depends on what the plan does to the memory around the region, which one-op regions
    do not show. In examples/loops/linear_relu.py (batch 1024 x 128) a Linear region cost 150
    us a call (its recompute stops before the matmul), near the calibration's 120-145 at 512
    KiB; a ReLU region 250 us beyond its 40 us forward, 80 of them in the forward: checkpoint
    keeps the ReLU's input, which the plain step frees at once. Under load every figure is
    higher (the 512 KiB cost read 200-370 us), and a recording measures it under its own load.
    Where the model has a chain of blocks, the recorder now measures these costs on the
    script's own step instead (NOTE [ Timing steps under plan all ] in recorder/calibration.py),
    and projections use the cost by size only without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

import torch

from ckview.trace.precision import precise_enough
from recorder._torch import dispatch_mode


@dataclass(frozen=True)
class TimingStep:
    """One entry of the timing schedule: a step of run ``run`` (its index), kept or warm-up;
    a kept step times either the step or its module calls (NOTE [ Quiet timing steps ])."""

    run: int
    keep: bool
    round: int
    calls: bool = False


def timing_schedule(runs: int, rounds: int) -> list[TimingStep]:
    """NOTE [ Plain timing steps ]: ``rounds`` rounds of the runs in turn, each turn a warm-up
    step, a kept one, then one that times the module calls (NOTE [ Quiet timing steps ]); a run
    that follows itself (a single run) needs no new warm-up."""
    schedule: list[TimingStep] = []
    for _ in range(rounds):
        add_round(schedule, runs, calls=True)
    return schedule


def add_round(schedule: list[TimingStep], runs: int, calls: bool = False) -> None:
    """Append one more round of the runs to ``schedule`` (see ``timing_schedule``); with
    ``calls``, each turn ends with a step that times the module calls."""
    r = schedule[-1].round + 1 if schedule else 0
    for run in range(runs):
        if not schedule or schedule[-1].run != run:
            schedule.append(TimingStep(run, False, r))
        schedule.append(TimingStep(run, True, r))
        if calls:
            schedule.append(TimingStep(run, True, r, calls=True))


@dataclass
class RunTimes:
    """Kept plain timing steps of one run (NOTE [ Plain timing steps ])."""

    rounds: list[int] = field(default_factory=list)
    steps_ns: list[int] = field(default_factory=list)
    calls_ns: list[dict[int, list[int]]] = field(default_factory=list)
    """Per kept step: module row -> durations of its forward calls, in call order."""

    def step_columns(self) -> dict[str, list[int]]:
        """The rows of the run's ``timing_steps`` table."""
        return {"round": self.rounds, "duration_ns": self.steps_ns}

    def call_columns(self) -> dict[str, list[int]]:
        """The rows of the run's ``timed_calls`` table (by step, module, call order)."""
        columns: dict[str, list[int]] = {
            "timing_step": [],
            "module": [],
            "order": [],
            "duration_ns": [],
        }
        for step, calls in enumerate(self.calls_ns):
            for row in sorted(calls):
                for order, duration in enumerate(calls[row]):
                    columns["timing_step"].append(step)
                    columns["module"].append(row)
                    columns["order"].append(order)
                    columns["duration_ns"].append(duration)
        return columns


class HostClock:
    """Host time for steps and calls (NOTE [ Times on an accelerator ])."""

    def step_time(self) -> int:
        return perf_counter_ns()

    def mark(self) -> Any:
        return perf_counter_ns()

    def durations(self, pairs: list[tuple[Any, Any]]) -> list[int]:
        """Nanoseconds between each (start, end) pair of marks."""
        return [end - start for start, end in pairs]


class CudaClock:
    """Device time for steps and calls: a synchronised step, CUDA events around each call
    (NOTE [ Times on an accelerator ]); ``cuda`` is ``torch.cuda`` (tests pass a fake)."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda

    def step_time(self) -> int:
        self.cuda.synchronize()
        return perf_counter_ns()

    def mark(self) -> Any:
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def durations(self, pairs: list[tuple[Any, Any]]) -> list[int]:
        self.cuda.synchronize()  # every event recorded so far has completed
        return [round(start.elapsed_time(end) * 1e6) for start, end in pairs]


def clock_for(cuda: Any = None) -> HostClock | CudaClock:
    """The clock a run's timing steps take: CUDA's where the script has used CUDA."""
    cuda = torch.cuda if cuda is None else cuda
    if cuda.is_available() and cuda.is_initialized():
        return CudaClock(cuda)
    return HostClock()


class StepTimer:
    """Times plain steps and module calls, run by run (NOTE [ Plain timing steps ])."""

    def __init__(self, steps: int, clock: HostClock | CudaClock | None = None) -> None:
        self.steps = steps
        self.clock = clock
        """How steps and calls are timed; chosen when timing begins if not given."""
        """Kept timing steps per run (rounds of the schedule)."""
        self.runs: dict[str, RunTimes] = {}
        self._run: RunTimes | None = None
        self.current: RunTimes | None = None
        """The times of the run whose timing step ended last."""
        self._keep = False
        self._round = 0
        self._start = 0
        self._calls: dict[int, list[tuple[Any, Any]]] = {}  # (start, end) marks per module row
        self._open: list[tuple[int, Any]] = []  # (module row, start mark) of open calls
        self._observer: Any = None
        self.forwards = 0
        """Top-level forwards begun in the current timing step."""
        self.timing_calls = False
        """Whether the current timing step times module calls (NOTE [ Quiet timing steps ])."""

    @property
    def active(self) -> bool:
        return self._run is not None

    def begin(self, observer: Any) -> None:
        """Timing begins: take ``observer`` (the op hook) off the dispatch stack if on top."""
        if observer is not None and dispatch_mode() is observer:
            self._observer = observer
            self._observer.__exit__(None, None, None)
        if self.clock is None:
            self.clock = clock_for()

    def start_step(self, run: str, keep: bool, round: int, calls: bool = False) -> None:
        """A timing step of ``run`` begins now (kept, or a warm-up); with ``calls`` it times the
        module calls, else the step (NOTE [ Quiet timing steps ])."""
        self._run = self.runs.setdefault(run, RunTimes())
        self._keep, self._round, self.timing_calls = keep, round, calls
        self._calls = {}
        self._open.clear()
        self.forwards = 0
        self._start = self._clock.step_time()

    def end_step(self) -> None:
        """The timing step ended: keep its duration and calls if it is a kept step."""
        now = self._clock.step_time()
        run = self._run
        if run is not None and self._keep and self.timing_calls:
            durations = self._clock.durations
            run.calls_ns.append({row: durations(p) for row, p in self._calls.items()})
        elif run is not None and self._keep:
            run.rounds.append(self._round)
            run.steps_ns.append(now - self._start)
        self.current, self._run = run, None

    @property
    def _clock(self) -> HostClock | CudaClock:
        if self.clock is None:
            self.clock = clock_for()
        return self.clock

    def precise_enough(self, runs: list[str]) -> bool:
        """Whether the kept steps of ``runs`` (the first is the baseline) measure each run's
        extra time precisely enough to stop timing (NOTE [ Enough plain steps ] in
        ckview/trace/precision.py)."""
        return precise_enough([self.runs.get(name, RunTimes()).steps_ns for name in runs])

    def stop(self) -> None:
        """Leave timing (also when the script ends mid-way): put the op hook back."""
        self._run = None
        self._open.clear()
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.__enter__()

    def call_begin(self, row: int) -> None:
        if self.timing_calls:
            self._open.append((row, self._clock.mark()))

    def call_end(self, row: int) -> None:
        if not self._open or self._open[-1][0] != row or self._run is None:
            return
        _, start = self._open.pop()
        self._calls.setdefault(row, []).append((start, self._clock.mark()))


@dataclass(frozen=True)
class CallCost:
    """Extra nanoseconds per checkpointed call (forward + backward), median and spread."""

    median_ns: int
    low_ns: int
    high_ns: int
    rounds: int


CALIBRATION_BYTES = (32, 64 << 10, 512 << 10)
"""Bytes each one-op region of the calibration saves (NOTE [ Checkpoint's cost grows with the
data around it ]): 8 elements (the fixed cost), then sizes up to a quarter of a core's L2 cache
(2 MiB here), where the cost stops growing: 2 MiB measured as dear as 512 KiB on a quiet
machine (310-370 us against 360-380), and under load several times dearer and noisier (1-2.6 ms,
the subtracted forward of a 2 MiB tanh varying by more than the cost), so the calibration stops
at 512 KiB and larger regions take its cost."""
CALIBRATION_CALLS_BYTES = 16 << 20
"""Bytes a calibration chain saves at most (its calls are fewer for larger tensors)."""


def plan_call_costs(
    sizes: tuple[int, ...] = CALIBRATION_BYTES, repeats: int = 11
) -> list[tuple[int, CallCost]]:
    """NOTE [ Checkpoint's cost grows with the data around it ]: checkpoint's cost per call,
    measured as NOTE [ Fixed cost of a checkpoint call ] does, on one-op regions saving each of
    ``sizes`` bytes; one ``(bytes, cost)`` per size."""
    return [(nbytes, plan_call_cost_ns(_calls_for(nbytes), repeats, nbytes)) for nbytes in sizes]


def _calls_for(nbytes: int) -> int:
    return max(8, min(100, CALIBRATION_CALLS_BYTES // max(nbytes, 1)))


def plan_call_cost_ns(calls: int = 100, repeats: int = 7, nbytes: int = 32) -> CallCost:
    """NOTE [ Fixed cost of a checkpoint call ] for a plan's module region, the way ``ckview
    verify`` applies plans: ``calls`` one-op modules, each a region of ``apply_plan`` saving
    ``nbytes`` (float32), less the plain forward that the recompute reruns."""
    from ckpt_runtime import apply_plan

    model = torch.nn.Sequential(*[_Tiny() for _ in range(calls)])
    x = torch.ones(max(1, nbytes // 4), requires_grad=True)
    plan = {"format": "ckview-plan", "version": 1, "regions": [{"module": "*"}]}
    plain, planned, forward = [], [], []
    with torch.enable_grad():  # called from the script's step, maybe under no_grad
        for _ in range(repeats):  # interleaved: a slow moment of the machine hits both
            f, total = _time(model, x)
            plain.append(total)
            forward.append(f)
            with apply_plan(model, plan):
                planned.append(_time(model, x)[1])
    return _per_call(plain, planned, calls, sorted(forward)[len(forward) // 2])


class _Tiny(torch.nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t)  # saves its output: backward needs the recompute


def _time(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> tuple[int, int]:
    """Nanoseconds for the forward of ``run(x)``, and for its forward and backward."""
    start = perf_counter_ns()
    y = run(x).sum()
    forward = perf_counter_ns() - start
    y.backward()
    return forward, perf_counter_ns() - start


def _per_call(plain: list[int], checked: list[int], calls: int, forward: int) -> CallCost:
    """Per call: checked minus plain (paired by rank), less the plain ``forward`` of all calls."""
    per_call = sorted(
        (c - p - forward) // calls for c, p in zip(sorted(checked), sorted(plain), strict=True)
    )
    return CallCost(
        median_ns=max(0, per_call[len(per_call) // 2]),
        low_ns=max(0, per_call[0]),
        high_ns=max(0, per_call[-1]),
        rounds=len(per_call),
    )
