"""Timings that the recorder's per-op hooks would distort: plain steps, plain module forwards,
and checkpoint's fixed cost per call.

NOTE [ Plain timing steps ]
    The recorder's per-op hook (a TorchDispatchMode) costs microseconds per op, more than many
    ops themselves, and it is paid again by every recomputed op: times from recorded steps
    inflate both the step and its extra compute, unevenly. So with ``timing_steps=k`` each run
    first runs 1 + k unrecorded steps in its own context (a plan applied, or checkpointing
    bypassed) with the op hook taken off the dispatch stack: only the global module hooks
    remain, which take a ``perf_counter_ns`` pair per module call. The first of them warms the
    run up (the first step after a switch of context is the slowest, often by a third) and
    is not kept. ``StepTimer`` keeps, per
    run, each plain step's duration and the duration of every module call in it (by module
    row, in call order), so that medians over the k steps, with their spread, give the plain
    step time of each run and the plain forward time of each call of the baseline. A loop
    without optimizer ends a timing step when its next top-level forward begins (no backward
    is seen without the op hook; the recorder learned in warmup that there is no optimizer).
    If the op hook is not on top of the dispatch stack (another mode above it), it stays and
    runs its fast path; the timings then still carry one Python call per op.

NOTE [ Fixed cost of a checkpoint call ]
    A checkpointed call costs more than its recomputed ops: in forward, checkpoint saves the
    RNG state, pushes saved-tensor hooks and packs holders; in backward, it sets up the
    recompute, unpacks and stops it. For a region of a few tiny ops (a tutorial that
    checkpoints 1,000 small functions) that fixed cost is most of the extra time, and a
    projection that sums only the recomputed ops says +2% where the step runs several times
    slower. ``plan_call_cost_ns`` measures it on this machine, outside any recorder, the
    way plans checkpoint (module regions of ``apply_plan``: the region's module call, hooks
    and running-statistics guard included): the median over ``repeats`` rounds of (forward +
    backward of ``calls`` one-op modules, each a region) minus the same without the plan,
    per call, with the spread of the rounds; ``checkpoint_call_cost_ns`` does the same for a
    checkpointed function, ckpt_runtime's or torch's. ``ckview verify`` adds the plan cost
    per recomputed instance to the projected extra time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


@dataclass
class RunTimes:
    """Plain timing steps of one run (NOTE [ Plain timing steps ])."""

    steps_ns: list[int] = field(default_factory=list)
    calls_ns: list[dict[int, list[int]]] = field(default_factory=list)
    """Per timing step: module row -> durations of its forward calls, in call order."""

    def call_medians(self) -> dict[int, list[int]]:
        """Module row -> median duration of its i-th forward call of a step, over the steps
        that made an i-th call."""
        rows = {row for step in self.calls_ns for row in step}
        out = {}
        for row in rows:
            per_step = [step.get(row, []) for step in self.calls_ns]
            n = max(len(calls) for calls in per_step)
            out[row] = [
                _median([calls[i] for calls in per_step if len(calls) > i]) for i in range(n)
            ]
        return out


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


class StepTimer:
    """Times a run's plain steps and module calls (NOTE [ Plain timing steps ])."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.runs: dict[str, RunTimes] = {}
        self._run: RunTimes | None = None
        self._start = 0
        self._open: list[tuple[int, int]] = []  # (module row, start) of open calls
        self._observer: Any = None
        self.forwards = 0
        """Top-level forwards begun in the current timing step."""
        self._warming = False
        """The current timing step is the run's first: timed, not kept."""

    @property
    def active(self) -> bool:
        return self._run is not None

    def begin(self, run: str, observer: Any) -> None:
        """Start ``run``'s timing steps now; take ``observer`` (the op hook) off if on top."""
        self._run = self.runs.setdefault(run, RunTimes())
        self._warming = True
        if observer is not None and _get_current_dispatch_mode() is observer:
            self._observer = observer
            self._observer.__exit__(None, None, None)
        self._new_step(perf_counter_ns())

    def end_step(self) -> bool:
        """A timing step ended: keep its duration. True once the run's timing steps are done
        (the op hook is back on then)."""
        now = perf_counter_ns()
        assert self._run is not None
        if self._warming:
            self._warming = False
            self._run.calls_ns.pop()
        else:
            self._run.steps_ns.append(now - self._start)
        if len(self._run.steps_ns) < self.steps:
            self._new_step(now)
            return False
        self.stop()
        return True

    def stop(self) -> None:
        """Leave timing (also when the script ends mid-way): put the op hook back."""
        self._run = None
        self._open.clear()
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.__enter__()

    def _new_step(self, now: int) -> None:
        assert self._run is not None
        self._run.calls_ns.append({})
        self._open.clear()
        self.forwards = 0
        self._start = now

    def call_begin(self, row: int) -> None:
        self._open.append((row, perf_counter_ns()))

    def call_end(self, row: int) -> None:
        if not self._open or self._open[-1][0] != row or self._run is None:
            return
        _, start = self._open.pop()
        self._run.calls_ns[-1].setdefault(row, []).append(perf_counter_ns() - start)


@dataclass(frozen=True)
class CallCost:
    """Extra nanoseconds per checkpointed call (forward + backward), median and spread."""

    median_ns: int
    low_ns: int
    high_ns: int
    rounds: int


def plan_call_cost_ns(calls: int = 100, repeats: int = 7) -> CallCost:
    """NOTE [ Fixed cost of a checkpoint call ] for a plan's module region, the way ``ckview
    verify`` applies plans: ``calls`` one-op modules, each a region of ``apply_plan``."""
    from ckpt_runtime import apply_plan

    model = torch.nn.Sequential(*[_Tiny() for _ in range(calls)])
    x = torch.ones(8, requires_grad=True)
    plain = [_time(model, x) for _ in range(repeats)]
    with apply_plan(model, {"format": "ckview-plan", "version": 1, "regions": [{"module": "*"}]}):
        planned = [_time(model, x) for _ in range(repeats)]
    return _per_call(plain, planned, calls)


def checkpoint_call_cost_ns(
    checkpoint: Callable[..., torch.Tensor] | None = None, calls: int = 100, repeats: int = 7
) -> CallCost:
    """NOTE [ Fixed cost of a checkpoint call ] for a checkpointed function: ``checkpoint``
    defaults to ckpt_runtime's; pass ``torch.utils.checkpoint.checkpoint`` for torch's."""
    if checkpoint is None:
        from ckpt_runtime import checkpoint as ckpt_runtime_checkpoint

        checkpoint = ckpt_runtime_checkpoint
    ck = checkpoint
    tiny = _Tiny()
    x = torch.ones(8, requires_grad=True)
    plain = [_time(_Chain(tiny, calls), x) for _ in range(repeats)]
    checked = [
        _time(_Chain(lambda t: ck(tiny, t, use_reentrant=False), calls), x) for _ in range(repeats)
    ]
    return _per_call(plain, checked, calls)


class _Tiny(torch.nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t)  # saves its output: backward needs the recompute


class _Chain:
    def __init__(self, step: Callable[[torch.Tensor], torch.Tensor], calls: int) -> None:
        self.step, self.calls = step, calls

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        for _ in range(self.calls):
            t = self.step(t)
        return t


def _time(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> int:
    """Nanoseconds for one forward and backward of ``run(x)``."""
    start = perf_counter_ns()
    run(x).sum().backward()
    return perf_counter_ns() - start


def _per_call(plain: list[int], checked: list[int], calls: int) -> CallCost:
    per_call = sorted((c - p) // calls for c, p in zip(sorted(checked), sorted(plain), strict=True))
    return CallCost(
        median_ns=max(0, per_call[len(per_call) // 2]),
        low_ns=max(0, per_call[0]),
        high_ns=max(0, per_call[-1]),
        rounds=len(per_call),
    )
