"""Timing steps under the recompute-all plan: what checkpointing costs this model on this
machine, measured where the plain timing steps run.

NOTE [ Timing steps under plan all ]
    The extra time a projection adds per recomputed region (NOTE [ Extra compute from plain
    times ] in ckview/analysis/timing.py) assumes that a recompute costs what the same calls
    cost in the plain forward, and that a checkpointed forward costs what the plain one does,
    plus checkpoint's cost per call measured on one-op regions. Measured on the loops of
    examples/loops (issue 21), neither holds closely enough: on a TransformerEncoder, GPT-2 or
    BERT the checkpointed forward ran about 10% faster than the plain one (it keeps no
    activations, so its allocations reuse blocks still warm in the caches) and the recompute at
    0.8-0.9x the plain forward, so their plans were projected 20-90% too dear; a small loop's
    regions cost 150-250 us a call more than the one-op calibration says (a ReLU region keeps
    an input the plain step frees at once), so they were projected 30-50% too cheap.

    So where timing steps run, the recorder measures those costs on the script's own step:
    once every run is recorded, a timing-only run under the preset plan ``all`` (every
    candidate block checkpointed, as ``ckpt_runtime`` resolves it on the main model) takes its
    turn in every round of the timing schedule, after the recorded runs (NOTE [ Plain timing
    steps ] in timing.py: a warm-up step, then a kept one), those the recorder adds until the
    runs' extra times are precise included (NOTE [ Enough plain steps ] in
    ckview/trace/precision.py; its own precision does not hold them up). In the rounds asked
    for only (5 in the benchmark), a loaded machine left the medians of its rounds off by up to
    a factor of two (examples/transformer.py, plan all: 124 ms projected for 63 measured; with
    15 rounds, in an earlier run of the benchmark, 53 for 53). In its kept steps a recompute
    listener (ckpt_runtime's markers) times every recompute, by the region's module, with the
    timing steps' clock. The trace keeps, in the optional ``/meta`` attribute
    ``plan_all_times`` (docs/trace-format.md), one row per kept step (round, -1, duration) and
    one per recompute (round, module row, duration); the analysis pairs each step with the
    projected run's timing step of the same round and composes any plan's extra time from
    them (NOTE [ Extra time measured under plan all ] in ckview/analysis/timing.py). No
    calibration runs where ``all`` does not resolve on the model (no chain of blocks, no
    module), where the step runs compiled code (each plan would recompile it), or without
    timing steps; where plan all, resolved when the timing begins, cannot be applied when a step
    begins, that step runs plain and the calibration is void (``Calibration``): the script
    never fails for it. It costs two steps of the script per round, and nothing is
    journaled: a recovered trace has no calibration and keeps the model without it. What it
    adds to a recording, all-in: docs/recording.md "Timing steps".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from recorder.plan_context import plan_context

CALIBRATION_RUN = "calibration:all"
"""The timing-only run's name in the timing schedule; it is never a run of the trace."""


def calibration_context(model: Any) -> Calibration | None:
    """The context of the timing-only run under plan ``all`` (NOTE [ Timing steps under plan
    all ]), None if the preset resolves to no region on ``model`` (or there is no model)."""
    from ckpt_runtime import PlanError, resolve_plan
    from ckpt_runtime.plan import Plan

    plan = Plan("all", preset="all")
    try:
        if model is None or not resolve_plan(model, plan).regions:
            return None
    except (PlanError, RuntimeError, TypeError):
        return None
    return Calibration(plan)


class Calibration:
    """The context of the timing-only run under plan all, which never fails the script: where
    the plan cannot be applied when a step begins, the step runs plain and the calibration is
    void (``failed``: nothing of it is written)."""

    def __init__(self, plan: Any) -> None:
        self._context = plan_context(plan)
        self.failed = False

    @contextlib.contextmanager
    def __call__(self, recorder: Any) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self._context(recorder))
            except (ValueError, RuntimeError, TypeError):  # a PlanError is a ValueError
                self.failed = True
            yield None


class RecomputeTimes:
    """Times each recompute of the kept calibration steps by its region's module row (NOTE
    [ Timing steps under plan all ]): a ckpt_runtime recompute listener. ``row`` gives a
    module's row (None if unknown); ``clock`` is the timing steps' (``HostClock`` or
    ``CudaClock``)."""

    def __init__(self, row: Callable[[object], int | None], clock: Any) -> None:
        self._row = row
        self._clock = clock
        self._round = -1  # the kept calibration step's round, -1 outside one
        self._open: dict[int, tuple[int, Any]] = {}  # region id -> (module row, start mark)
        self._pairs: list[tuple[int, Any, Any]] = []  # (module row, start, end) of this step
        self.rows: list[tuple[int, int, int]] = []
        """(round, module row, duration ns) of every recompute timed so far."""

    def start_step(self, round: int) -> None:
        """A kept calibration step of ``round`` begins (-1: another step, not timed)."""
        self._round = round
        self._open.clear()
        self._pairs.clear()

    def end_step(self) -> None:
        """The step ended: keep its recomputes' durations."""
        if self._round >= 0 and self._pairs:
            durations = self._clock.durations([(s, e) for _, s, e in self._pairs])
            modules = [m for m, _, _ in self._pairs]
            self.rows += [(self._round, m, d) for m, d in zip(modules, durations, strict=True)]
        self.start_step(-1)

    def on_recompute_begin(self, region_id: int, target: object) -> None:
        if self._round >= 0:
            row = self._row(target)
            self._open[region_id] = (-1 if row is None else row, self._clock.mark())

    def on_recompute_end(self, region_id: int, target: object) -> None:
        begun = self._open.pop(region_id, None)
        if begun is not None and begun[0] >= 0:
            self._pairs.append((begun[0], begun[1], self._clock.mark()))


class PlanAllTiming:
    """The timing-only run under plan all while the timing steps run (NOTE [ Timing steps
    under plan all ]): its context and its recompute listener, from ``start`` to ``stop``;
    before ``start`` (or where no calibration applies) every method does nothing."""

    def __init__(self) -> None:
        self._context: Calibration | None = None
        self._recomputes: RecomputeTimes | None = None
        self._listening: Any = None  # the recompute listener's handle

    def start(self, context: Calibration, recomputes: RecomputeTimes) -> None:
        from ckpt_runtime import markers

        self._context, self._recomputes = context, recomputes
        self._listening = markers.add_listener(recomputes)

    def start_step(self, round: int) -> None:
        """A timing step begins: a kept calibration step of ``round``, or another (-1)."""
        if self._recomputes is not None:
            self._recomputes.start_step(round)

    def end_step(self) -> None:
        if self._recomputes is not None:
            self._recomputes.end_step()

    def stop(self) -> None:
        """Stop listening (timing is over, or the script ended)."""
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.remove()

    def rows(self, rounds: list[int], steps_ns: list[int]) -> list[tuple[int, int, int]] | None:
        """The rows of ``plan_all_times`` for the kept calibration steps ``rounds`` and
        ``steps_ns``; None where no calibration ran or it is void (``Calibration.failed``)."""
        if self._context is None or self._context.failed or self._recomputes is None:
            return None
        return calibration_rows(rounds, steps_ns, self._recomputes.rows)


def calibration_rows(
    rounds: list[int], steps_ns: list[int], recomputes: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """The rows of ``plan_all_times``: (round, -1, duration) per kept step, then (round,
    module, duration) per recompute of a kept step."""
    rows = [(r, -1, d) for r, d in zip(rounds, steps_ns, strict=True)]
    kept = set(rounds)
    return rows + [row for row in recomputes if row[0] in kept]
