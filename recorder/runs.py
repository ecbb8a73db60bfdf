"""The runs of a recording, one after another at step boundaries: warmup, the recorded steps of
each run, the plain timing steps, done.

NOTE [ Early run context ]
A loop without optimizer ends its step when the next forward begins: inside the root module's
forward pre-hook, after torch looked up the root's ``forward`` (and while its ``_call_impl``
runs). A run context entered there (a plan with a segment of the root nn.Sequential, or a region
on the root) would miss that first call. So when such a step boundary is due to begin a run, the
run's context is entered already at the end of the backward before it (the previous run's
context is left then); the run itself still begins at the boundary. What runs in between (a
no_grad parameter update) is not checkpointed either way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

from ckview.trace.precision import MAX_ROUNDS
from recorder.calibration import (
    CALIBRATION_RUN,
    PlanAllTiming,
    RecomputeTimes,
    calibration_context,
)
from recorder.ledger import StorageLedger
from recorder.modules import ModuleRegistry
from recorder.phases import OTHER, PhaseState
from recorder.progress import StepProgress
from recorder.sink import TraceSink
from recorder.sources.base import HooksEveryCall, Source
from recorder.stacks import Stacks
from recorder.steady import DATA_SETTLE_LIMIT, DataLoaders, warmup_needed
from recorder.steps import IterationTracker, StepCounts, plural
from recorder.tables import Flags, State
from recorder.timing import RunTimes, StepTimer, add_round, plan_call_costs, timing_schedule

_FILE_FLUSH_NS = 5_000_000_000  # HDF5's flush costs ~20 ms: at most one per 5 s of steps


@dataclass(frozen=True)
class RunSpec:
    """One run of the recording: its name and what to change while it is recorded.

    ``context(recorder)`` returns a context manager entered at the step boundary where the run
    begins and left where it ends (e.g. ``ckpt_runtime.bypass()`` for the baseline, or applying
    a checkpoint plan to the recorder's :meth:`Recorder.main_model`).
    """

    name: str
    context: Callable[[Any], AbstractContextManager[Any]] | None = None
    checkpointing: str = "script"
    """What the run does with the script's own checkpointing (schema.CHECKPOINTING)."""


class StopScript(BaseException):
    """Raised into the user's script when ``stop_after`` is set and all steps are recorded.

    A ``BaseException`` so that a script's ``except Exception`` does not swallow it. With
    arguments it is an abort with a reason, which ``run_script`` passes on to its caller.
    """


@dataclass(frozen=True)
class Plan:
    """What to record: the runs, steps per run, warmup steps, and whether to stop after."""

    runs: tuple[RunSpec, ...]
    steps: int
    warmup: int
    stop_after: bool
    timing_steps: int
    wait_for_data: bool = True
    """Warm up until the DataLoaders settle (NOTE [ A data pipeline that settles ])."""


@dataclass(frozen=True)
class Parts:
    """The parts of the recorder a sequencer drives."""

    flags: Flags
    sink: TraceSink
    ledger: StorageLedger
    phases: PhaseState
    registry: ModuleRegistry
    sources: Sequence[Source]
    stacks: Stacks | None
    tracker: IterationTracker
    progress: StepProgress
    data: DataLoaders = field(default_factory=DataLoaders)
    """The script's DataLoaders the warmup waits for (NOTE [ A data pipeline that settles ])."""


class RunSequencer:
    """Steps through warmup, the runs and the timing steps at each step boundary.

    ``owner`` is what run contexts receive (the Recorder); ``done()`` removes the recorder's
    hooks once everything is recorded and timed; ``op_hook()`` is the op hook that timing steps
    take off, None if it must stay (NOTE [ A forward without modules ] in hooks.py);
    ``quiet(calls)`` leaves on only the hooks a timing step needs (NOTE [ Quiet timing steps ]).
    """

    def __init__(
        self,
        plan: Plan,
        parts: Parts,
        owner: object,
        done: Callable[[], None],
        op_hook: Callable[[], Any],
        quiet: Callable[[bool], None],
    ) -> None:
        self.plan = plan
        self._p = parts
        self._owner = owner
        self._done = done
        self._op_hook = op_hook
        self._quiet = quiet
        self.timer = StepTimer(plan.timing_steps)  # NOTE [ Plain timing steps ] in timing.py
        self._schedule = timing_schedule(len(plan.runs), plan.timing_steps)
        self._specs: tuple[RunSpec, ...] = plan.runs
        """The runs the timing steps take turns in: the recorded ones, then the calibration
        run under plan all where it applies (NOTE [ Timing steps under plan all ])."""
        self._plan_all = PlanAllTiming()  # NOTE [ Timing steps under plan all ]
        self._timing_pos = -1  # entry of the schedule under way
        self._timing_run: int | None = None  # the run whose context the timing step is in
        self._run_index = 0
        self._run_context: AbstractContextManager[Any] | None = None
        self._early_context: AbstractContextManager[Any] | None = None  # NOTE [ Early run context ]
        self.warmup_done = 0
        self._began = False  # whether a run's recording began
        self.steps_recorded = 0
        self._steps_in_run = 0
        self._last_file_flush = 0

    def begin_run(self) -> None:
        """Fresh tables and counters: every run is self-contained (rows index its own tables)."""
        p = self._p
        p.sink.begin_run(self.plan.runs[self._run_index].name)
        tables = p.sink.tables
        p.ledger.begin_run(tables)
        p.phases.begin_run(tables)
        self._steps_in_run = 0
        for source in p.sources:
            source.begin_run(tables)

    # ------------------------------------------------------------------------- run contexts

    def _enter_context(self, index: int) -> None:
        """Be in run ``index``'s context: the one entered early for it, or enter it now."""
        spec = self._specs[index]
        self._run_context, self._early_context = self._early_context, None
        if spec.context is not None and self._run_context is None:
            self._run_context = spec.context(self._owner)
            self._run_context.__enter__()

    def _leave_context(self) -> None:
        context, self._run_context = self._run_context, None
        if context is not None:
            context.__exit__(None, None, None)

    def _drop_early_context(self) -> None:
        """Leave a context entered early for a run that never began."""
        early, self._early_context = self._early_context, None
        if early is not None:
            early.__exit__(None, None, None)

    def enter_next_context_early(self) -> None:
        """At the end of a backward after which the next forward begins a run (NOTE [ Early run
        context ])."""
        if self._early_context is not None or not self._next_boundary_starts_run():
            return
        spec = self._specs[self._next_run_index()]
        if spec.context is None:
            return
        self._leave_context()
        self._early_context = spec.context(self._owner)
        self._early_context.__enter__()

    def warmup_needed(self) -> int:
        """Warmup iterations: as asked, and until the script's model has settled (NOTE [ Warm-up
        until steady ] in steady.py)."""
        if self.plan.warmup == 0:
            return 0
        try:
            model = self._p.registry.main_model()
        except RuntimeError:  # no module ran forward (yet)
            model = None
        return warmup_needed(self.plan.warmup, model)

    def _data_settled(self) -> bool:
        """Whether the script's DataLoaders deliver in turn, or the warmup waited long enough (it
        then says so); NOTE [ A data pipeline that settles ] in steady.py."""
        if not self.plan.wait_for_data or self._p.data.settled():
            return True
        waited = self.warmup_done - self.warmup_needed()
        if waited < DATA_SETTLE_LIMIT:
            return False
        print(
            f"ckview: warning: a DataLoader still delivers batches ahead of their turn after "
            f"{plural(self.warmup_done, 'warmup step')} (its workers are not ahead of the "
            "training): a recorded step may hold a batch more or less than another, and a "
            "projection be off by that much",
            file=sys.stderr,
            flush=True,
        )
        return True

    def _next_boundary_starts_run(self) -> bool:
        """Whether the next step boundary enters another run's context: the first run after
        warmup, the next run, the first run's timing steps after the last recorded step, or
        the next run's timing steps (NOTE [ Plain timing steps ] in timing.py)."""
        state = self._p.flags.state
        if state is State.WARMUP:
            return self.warmup_done + 1 >= self.warmup_needed()
        if state is State.TIMING:
            following = self._schedule[self._timing_pos + 1 : self._timing_pos + 2]
            return bool(following) and following[0].run != self._timing_run
        more = self._run_index + 1 < len(self.plan.runs) or bool(self._schedule)
        return state is State.RECORDING and self._steps_in_run + 1 >= self.plan.steps and more

    def _next_run_index(self) -> int:
        """The run whose context the next boundary enters (see _next_boundary_starts_run)."""
        state = self._p.flags.state
        if state is State.WARMUP:
            return self._run_index
        if state is State.TIMING:
            return self._schedule[self._timing_pos + 1].run
        return self._run_index + 1 if self._run_index + 1 < len(self.plan.runs) else 0

    # ------------------------------------------------------------------------- steps

    def start_recording(self) -> None:
        """Begin the next run at a step boundary: enter its context, note what exists."""
        p = self._p
        if p.flags.state in (State.BETWEEN_RUNS, State.SETTLING):
            self.begin_run()
        self._enter_context(self._run_index)
        p.flags.state = State.RECORDING
        self._began = True
        tables = p.sink.tables
        tables.t0 = self._last_file_flush = perf_counter_ns()
        p.ledger.mark_training_state()
        self._open_step(tables.t0)

    def _open_step(self, now: int) -> None:
        p = self._p
        tables = p.sink.tables
        tables.steps.append((tables.step, now, -1, tables.ops.rows, tables.mem.rows, -1, -1, -1, 0))
        for source in p.sources:
            source.step_begins(now)

    def _close_step_row(self, now: int, counts: StepCounts, complete: bool) -> None:
        steps = self._p.sink.tables.steps
        row = len(steps) - 1
        steps.set(row, "end_ns", now)
        steps.set(row, "forwards", counts.forwards)
        steps.set(row, "backwards", counts.backwards)
        steps.set(row, "optimizer_steps", counts.optimizer_steps)
        steps.set(row, "complete", int(complete))
        for source in self._p.sources:
            source.step_ends(now)

    def end_step(self) -> None:
        """A step boundary (NOTE [ Step = one optimizer iteration ])."""
        p = self._p
        now = perf_counter_ns()
        counts = p.tracker.boundary()
        p.phases.top_phase = OTHER
        if p.flags.state is State.WARMUP:
            p.tracker.learned = counts
            self.warmup_done += 1
            p.progress.step_done(warmup=True)
            if self.warmup_done >= self.warmup_needed() and self._data_settled():
                self.start_recording()
        elif p.flags.state is State.TIMING:
            self.timer.end_step()
            self._plan_all.end_step()
            self._journal_timing()
            self._next_timing_step()
        elif p.flags.state is State.RECORDING:
            self._end_recorded_step(now, counts)
        elif p.flags.state is State.SETTLING:
            self.start_recording()

    def _end_recorded_step(self, now: int, counts: StepCounts) -> None:
        p = self._p
        self._close_step_row(now, counts, complete=True)
        p.sink.tables.step += 1
        self._steps_in_run += 1
        self.steps_recorded += 1
        self._journal_step()
        p.progress.step_done(warmup=False)
        if self._steps_in_run < self.plan.steps:
            self._open_step(now)
            if now - self._last_file_flush > _FILE_FLUSH_NS:
                p.ledger.flush()  # whole steps on disk (the journal keeps them too)
                p.sink.flush_file()
                self._last_file_flush = now
            return
        self.end_run("")
        self._run_index += 1
        if self._run_index < len(self.plan.runs):
            if self._runs_compiled_code():
                self._settle()
            else:
                self.start_recording()
            return
        early, self._early_context = self._early_context, None  # the timing's, if any
        self.finish("")
        self._early_context = early
        if self._schedule:
            self._p.sink.flush_file()  # a whole trace on disk while the timing steps run
            self._start_timing()  # the hooks stay for the timing steps
            return
        self._all_done()

    # NOTE [ Runs of compiled code ]
    # A run's context changes the model (a plan checkpoints its modules), and compiled code
    # recompiles for it on its first step: seconds of dynamo and inductor, their allocations
    # and none of the step's own. Where the recorded steps ran compiled code, each run after the
    # first therefore begins one step later: a settling step runs unrecorded in its context.
    # The script runs one step more per such run (verify's "let the script run N more steps"
    # counts them with the timing steps).

    def _runs_compiled_code(self) -> bool:
        return self.meta().get("compiled") == "compiled"

    def _settle(self) -> None:
        """Enter the next run's context for a settling step; its end begins the run."""
        self._enter_context(self._run_index)
        self._early_context, self._run_context = self._run_context, None  # for start_recording
        self._p.flags.state = State.SETTLING

    def _all_done(self) -> None:
        """Recording (and timing) done: close the trace; the script runs on unrecorded, or
        stops."""
        self._drop_early_context()  # never expected: no run follows
        self._p.flags.state = State.DONE
        self._done()
        self.close_trace("")
        self._p.progress.close()
        if self.plan.stop_after:
            raise StopScript

    # NOTE [ Plain timing steps ] in timing.py: once every run is recorded, the runs are
    # entered again in turn for unrecorded timing steps, following ``self._schedule``.

    def _start_timing(self) -> None:
        self._p.flags.state = State.TIMING
        self.timer.begin(self._op_hook())
        for source in self._p.sources:  # NOTE [ Quiet timing steps ] in timing.py
            if isinstance(source, HooksEveryCall):
                source.quiet()
        self._calibrate()
        self._next_timing_step()

    def _calibrate(self) -> None:
        """Add the timing-only run under plan all to the rounds, with its recompute listener,
        where it applies (NOTE [ Timing steps under plan all ] in calibration.py). The
        schedule's first entries (the first run's) stay as they were, so a context entered
        early for them still holds."""
        if self._runs_compiled_code():
            return
        try:
            model = self._p.registry.main_model()
        except RuntimeError:  # no module ran forward
            return
        context = calibration_context(model)
        if context is None:
            return
        self._specs = (*self.plan.runs, RunSpec(CALIBRATION_RUN, context, checkpointing="plan"))
        calibration = len(self.plan.runs)  # its steps time no module calls: none is stored
        schedule = timing_schedule(len(self._specs), self.plan.timing_steps)
        self._schedule = [e for e in schedule if not (e.calls and e.run == calibration)]
        assert self.timer.clock is not None  # chosen by timer.begin
        self._plan_all.start(context, RecomputeTimes(self._p.registry.row, self.timer.clock))

    def _next_timing_step(self) -> None:
        """Begin the schedule's next step, in its run's context; the last one done, close."""
        self._timing_pos += 1
        if self._timing_pos == len(self._schedule):
            self._more_rounds_if_needed()
        if self._timing_pos >= len(self._schedule):
            self.timer.stop()
            self._plan_all.stop()
            self._leave_context()
            self._timing_run = None
            self._all_done()
            return
        entry = self._schedule[self._timing_pos]
        if entry.run != self._timing_run:
            self._leave_context()
            self._enter_context(entry.run)
            self._timing_run = entry.run
        spec = self._specs[entry.run]
        self._quiet(entry.keep and entry.calls)
        self.timer.start_step(spec.name, entry.keep, entry.round, entry.calls)
        calibrating = entry.keep and not entry.calls and spec.name == CALIBRATION_RUN
        self._plan_all.start_step(entry.round if calibrating else -1)

    def _more_rounds_if_needed(self) -> None:
        """The schedule's last step ended: add a round unless the rounds so far are precise
        enough or the cap is reached (NOTE [ Enough plain steps ] in ckview/trace/precision.py).
        With several runs the added round begins with a warm-up step, so that its run's context,
        entered at the boundary rather than early (NOTE [ Early run context ]), costs no kept
        step a call."""
        rounds = self._schedule[-1].round + 1
        names = [spec.name for spec in self.plan.runs]
        if rounds < MAX_ROUNDS and not self.timer.precise_enough(names):
            add_round(self._schedule, len(self._specs))

    def stop_timing(self) -> None:
        """The script ended during the timing steps: keep what was timed."""
        self.timer.stop()
        self._plan_all.stop()
        self._leave_context()
        self._drop_early_context()
        self._p.flags.state = State.DONE

    # ------------------------------------------------------------------------- writing

    def _journal_step(self) -> None:
        """Append the step that just ended to the journal (NOTE [ The recording journal ])."""
        p, spec = self._p, self.plan.runs[self._run_index]
        attrs = {
            "steps_recorded": self._steps_in_run,
            "checkpointing": spec.checkpointing,
            "complete": self._steps_in_run >= self.plan.steps,
        }
        p.sink.journal_step(p.registry.columns(), attrs, self.meta())

    def _journal_timing(self) -> None:
        run = self.timer.current
        name = self._specs[self._schedule[self._timing_pos].run].name
        if run is None or not run.steps_ns or name == CALIBRATION_RUN:
            return  # NOTE [ Timing steps under plan all ]: not journaled
        tables = {"timing_steps": run.step_columns(), "timed_calls": run.call_columns()}
        self._p.sink.journal_timing(name, tables)

    def meta(self) -> dict[str, Any]:
        """The trace's meta fields as they stand: steps, warmup (the iterations run, once the
        recording began: more than asked while the training settles, NOTE [ Warm-up until
        steady ] in steady.py), device, step rule and the sources'."""
        p = self._p
        meta: dict[str, Any] = {
            "steps_recorded": self.steps_recorded,
            "warmup": self.warmup_done if self._began else self.plan.warmup,
            "device": "cuda" if p.ledger.saw_cuda else "cpu",
            "step_rule": p.tracker.describe(self.plan.warmup, modules=p.flags.sees_forwards),
        }
        for source in p.sources:
            meta.update(source.meta())
        return meta

    def end_run(self, error: str) -> None:
        """Write the run's tables that stayed editable, close it and leave its context."""
        p = self._p
        tables, sink = p.sink.tables, p.sink
        p.flags.busy = True
        try:
            now = perf_counter_ns()
            last = len(tables.steps) - 1
            if last >= 0 and tables.steps.get(last, "end_ns") == -1:
                self._close_step_row(now, p.tracker.current(), complete=False)
            parts = [source.end_run(tables, now, error) for source in p.sources]
            for buf in tables.appended:
                buf.flush()
            for part in parts:
                for name, columns in part.tables.items():
                    sink.sink(name, columns)
            for kept in tables.written_as_they_go:
                kept.finish()  # NOTE [ Kept rows ] in storage_rows.py
            for table in tables.written_at_end:
                sink.sink(table.table, table.as_columns())
            attrs = {
                "steps_recorded": self._steps_in_run,
                "checkpointing": self.plan.runs[self._run_index].checkpointing,
            }
            for part in parts:
                attrs.update(part.attrs)
            sink.set_run_attrs(**attrs)
            sink.close_run(complete=not error)
        finally:
            p.flags.busy = False
            p.flags.state = State.BETWEEN_RUNS
            p.ledger.forget()
            self._leave_context()

    def finish(self, error: str) -> None:
        """End the current run if one is open, then write the modules and meta. The trace stays
        open for the timings (``close_trace``)."""
        p = self._p
        error = self.failure(error)
        if p.flags.state is State.RECORDING:
            self.end_run(error)
        self._drop_early_context()  # the script ended before the run it was entered for
        p.flags.state = State.DONE
        p.ledger.forget()
        writer = p.sink.writer
        if writer is None:
            return
        p.sink.write(writer.append_modules, p.registry.columns())
        if p.stacks is not None:
            p.sink.write(p.stacks.write, writer)
        p.sink.write(writer.update_meta, **self.meta())

    def close_trace(self, error: str) -> None:
        """Write the plain timings (NOTE [ Plain timing steps ] in timing.py), with checkpoint's
        cost per call unless the script failed, close the trace and settle it (NOTE [ Writing
        beside the target ]). Call with every hook removed: the cost is measured on a model of
        its own."""
        self._plan_all.stop()
        sink = self._p.sink
        writer = sink.writer
        if writer is None:
            return
        error = self.failure(error)
        try:
            timed = [(n, t) for n, t in self.timer.runs.items() if t.steps_ns]
            calibration = [t for n, t in timed if n == CALIBRATION_RUN]
            timed = [(n, t) for n, t in timed if n != CALIBRATION_RUN]
            for name, times in timed:
                sink.write(lambda n=name, t=times: _write_timings(writer.run(n), t))
            if timed and not error:
                costs = plan_call_costs()  # NOTE [ Checkpoint's cost grows with the data ...]
                _, cost = costs[0]
                sink.write(
                    writer.update_meta,
                    checkpoint_call_ns=cost.median_ns,
                    checkpoint_call_low_ns=cost.low_ns,
                    checkpoint_call_high_ns=cost.high_ns,
                )
                rows = [(n, c.median_ns, c.low_ns, c.high_ns) for n, c in costs]
                sink.write(writer.set_call_costs, rows)
            all_times = calibration and self._plan_all.rows(
                calibration[0].rounds, calibration[0].steps_ns
            )
            if timed and all_times:
                sink.write(writer.set_plan_all_times, all_times)
        finally:
            sink.close(error)

    def failure(self, error: str) -> str:
        """``error``, or why no step was recorded: that is a failure too."""
        if error or self.steps_recorded:
            return error
        needed = self.warmup_needed()
        if self.warmup_done < needed:
            done = f"{self.warmup_done} of {plural(needed, 'warmup step')}"
            settle = " (DDP settles in its second iteration)" if needed > self.plan.warmup else ""
            return f"no step was recorded: the code ended after {done}{settle}"
        if not self._began:  # waited for a DataLoader: NOTE [ A data pipeline that settles ]
            done = plural(self.warmup_done, "warmup step")
            return (
                f"no step was recorded: the code ended after {done}, while a DataLoader still "
                "delivered batches ahead of their turn"
            )
        rule = self._p.tracker.describe(self.plan.warmup)
        return f"no step was recorded: the first recorded step never ended (steps: {rule})"


def _write_timings(run: Any, times: RunTimes) -> None:
    run.append("timing_steps", times.step_columns())
    run.append("timed_calls", times.call_columns())
