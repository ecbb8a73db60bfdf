"""The recording session: the :class:`Recorder` that turns training steps into trace rows.

The Recorder builds its parts and installs them; each part has one job:

* ``hooks.py``: the hooks into torch. A ``TorchDispatchMode`` sees every aten op below autograd
  (forward, backward, recompute and optimizer alike); ``saved_tensors_hooks`` tell which
  storages autograd keeps for backward (activations); global module forward hooks give the
  module path and the recompute of checkpointed regions; global optimizer step hooks and the
  end of each backward give the step boundaries.
* ``phases.py``: where the step is (forward, backward, recompute, optimizer; the module call).
* ``ledger.py``: the per-op rows, storages, frees, categories, saved tensors.
* ``runs.py``: warmup, the runs and the timing steps, one after another at step boundaries.
* ``sink.py``: the trace and the journal; ``storage_rows.py``: the storage and module-call
  rows still in memory.
* ``sources/``: event sources behind one protocol (NOTE [ Sources ] in sources/base.py): the
  allocator's events, device samples, OOM capture, ``torch.compile``, FSDP's resizes, and any
  given in ``Recorder(sources=...)``.
* ``_torch.py``: every private torch API and patch of torch or ``os``, each with its undo.
* ``native_ledger.py``, ``native_steps.py`` and ``sources/native.py``: the native path
  (``CKVIEW_RECORDER=native``; NOTE [ The native ledger ]); ``auto`` stays on the Python path.
"""

from __future__ import annotations

import os
import platform
import sys
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ckview import __version__ as ckview_version
from ckview.trace.journal import journal_path
from ckview.trace.ranks import launcher_world, this_rank_path
from ckview.trace.staging import staging_path
from recorder import (
    _torch,
    buffers,
    hooks,
    ledger,
    modules,
    phases,
    runs,
    sink,
    sources,
    steps,
    tables,
)
from recorder.compiled import skip_in_dynamo
from recorder.hooks import TorchHooks
from recorder.ledger import StorageLedger
from recorder.modules import ModuleRegistry
from recorder.native import for_recording
from recorder.native_ledger import NativeLedger
from recorder.phases import PhaseState
from recorder.progress import StepProgress
from recorder.runs import Parts, Plan, RunSequencer, RunSpec, StopScript
from recorder.sink import TraceSink
from recorder.sources.allocator import AllocatorSource
from recorder.sources.base import Source
from recorder.sources.compiled import CompiledSource
from recorder.sources.device import DeviceSource
from recorder.sources.fsdp import FsdpSource
from recorder.sources.native import NativeRowsSource
from recorder.sources.oom import OomSource
from recorder.stacks import Stacks
from recorder.steps import IterationTracker, StepCounts, StepRule
from recorder.tables import Flags, State
from recorder.timing import RunTimes

__all__ = ["Recorder", "RunSpec", "State", "StopScript"]


class Recorder:
    """Record training steps of the code run inside it into a ckview trace.

    >>> with Recorder("trace.h5", steps=2, warmup=1):
    ...     train()          # unchanged training code

    A step is one iteration of the loop (NOTE [ Step = one optimizer iteration ]): by default
    it ends once every optimizer has stepped, or, without an optimizer, at the first forward
    after a backward; ``step_every`` says it when that cannot be learned (``"optimizer:2"``,
    ``"backward:4"``, ``"manual"``), and calling :meth:`mark_step` makes it the only boundary.
    ``warmup`` iterations run unrecorded first, more until the model and its DataLoaders
    settle (NOTE [ Warm-up until steady ] in steady.py; ``wait_for_data=False``: exactly
    ``warmup``, as the gradient gate needs); after ``steps`` recorded steps the trace is
    written and closed and the code runs on unrecorded, or stops with :class:`StopScript` if
    ``stop_after`` is set.

    The trace is written beside ``path`` and replaces it only if it is good (NOTE [ Writing
    beside the target ] in ckview/trace/staging.py); :attr:`written` says where it went. No step
    recorded is a failure: the trace is marked incomplete. ``progress``: a line on stderr per
    step; None (default) shows it when stderr is a terminal. ``sources``: event sources beyond
    the built-in ones (NOTE [ Sources ] in recorder/sources/base.py).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        steps: int = 1,
        warmup: int = 1,
        stop_after: bool = False,
        command: list[str] | None = None,
        runs: Sequence[RunSpec] = (),
        progress: bool | None = None,
        step_every: str | StepRule = "auto",
        timing_steps: int = 0,
        stacks: bool = False,
        sources: Sequence[Source] = (),
        wait_for_data: bool = True,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        if warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {warmup}")
        self.path = this_rank_path(path)  # NOTE [ One file per rank ] in ckview/trace/ranks.py
        self.command = command if command is not None else list(sys.argv)
        specs = tuple(runs) or (RunSpec("main"),)
        if len({r.name for r in specs}) != len(specs):
            raise ValueError(f"run names must differ: {[r.name for r in specs]}")
        self.plan = Plan(specs, steps, warmup, stop_after, timing_steps, wait_for_data)
        self.stacks = stacks
        """Record the user's frames of every allocation (NOTE [ User frames ] in stacks.py)."""
        self._extra_sources = tuple(sources)
        one_line = os.environ.get("LOCAL_RANK", "0") == "0"  # one progress line per machine
        self._progress = StepProgress(warmup, steps * len(specs), enabled=progress and one_line)
        rule = step_every if isinstance(step_every, StepRule) else StepRule.parse(step_every)
        self._tracker = IterationTracker(rule)
        self._flags = Flags()
        self._sink: TraceSink | None = None
        self._parts: Parts | None = None
        self._runs: RunSequencer | None = None
        self._hooks: TorchHooks | None = None
        self._restore: list[Callable[[], None]] = []  # undo what _install patched

    # ----------------------------------------------------------------- public API

    def __enter__(self) -> Recorder:
        self._open()
        try:
            self._install()
            self._sequencer.begin_run()
            self._progress.start()
            if self.plan.warmup == 0:
                self._sequencer.start_recording()
        except BaseException as exc:
            self.close(error=f"{type(exc).__name__}: {exc}")
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc_type is StopScript:
            exc = None
        self.close(error=None if exc is None else f"{exc_type.__name__}: {exc}")

    def mark_step(self) -> None:
        """End the current step by hand; from then on only ``mark_step`` ends steps.

        The first call right after an automatic boundary (``opt.step(); rec.mark_step()``)
        confirms that boundary instead of ending an empty step.
        """
        confirms = self._tracker.rule.kind != "manual" and self._tracker.current() == StepCounts()
        self._tracker.mark()
        if not confirms:
            self._sequencer.end_step()

    def close(self, error: str | None = None) -> None:
        """Stop recording, write everything recorded so far and close the trace.

        With ``error`` (the script raised or was interrupted) the trace is marked incomplete.
        """
        sequencer, state = self._runs, self._flags.state
        if sequencer is None:
            return
        if state is State.RECORDING and error is None and self._tracker.pending_at_close():
            sequencer.end_step()
        if self._flags.state is State.TIMING:
            # Every run is recorded: a script that fails in its timing steps (NOTE [ Plain
            # timing steps ] in timing.py) leaves a complete trace, with what was timed.
            sequencer.stop_timing()
            error = None
        if self._flags.state is not State.DONE:
            sequencer.finish(error or "")
        self._uninstall()
        sequencer.close_trace(error or "")
        self._progress.close()

    def main_model(self) -> torch.nn.Module:
        """The root module with the most parameters seen so far: the script's model."""
        assert self._parts is not None, "the trace is not open"
        return self._parts.registry.main_model()

    @property
    def steps(self) -> int:
        return self.plan.steps

    @property
    def warmup(self) -> int:
        return self.plan.warmup

    @property
    def runs(self) -> tuple[RunSpec, ...]:
        return self.plan.runs

    @property
    def steps_recorded(self) -> int:
        """Steps recorded, in all runs (those kept, after a write failure)."""
        if self._sink is not None and self._sink.recovered_steps is not None:
            return self._sink.recovered_steps
        return 0 if self._runs is None else self._runs.steps_recorded

    @property
    def warmup_done(self) -> int:
        """Warmup steps that ended."""
        return 0 if self._runs is None else self._runs.warmup_done

    @property
    def timings(self) -> dict[str, RunTimes]:
        """Plain timing steps per run name (``timing_steps``; NOTE [ Plain timing steps ])."""
        return {} if self._runs is None else self._runs.timer.runs

    @property
    def written(self) -> Path | None:
        """Where the trace went once closed (NOTE [ Writing beside the target ])."""
        return None if self._sink is None else self._sink.written

    @property
    def write_error(self) -> str | None:
        """Why writing the trace failed (a full disk...); the trace then comes from the journal
        (NOTE [ When the trace cannot be written ] in sink.py)."""
        return None if self._sink is None else self._sink.write_error

    @property
    def journal(self) -> Path:
        """The recording's journal (NOTE [ The recording journal ]): removed once the trace is
        written; kept if the trace could not be rebuilt from it (a full disk)."""
        return journal_path(staging_path(self.path))

    # ----------------------------------------------------------------- parts

    @property
    def _sequencer(self) -> RunSequencer:
        assert self._runs is not None, "the trace is not open"
        return self._runs

    def _open(self) -> None:
        """Open the trace and build the parts that write into it."""
        meta = {
            "ckview_version": ckview_version,
            "torch_version": str(torch.__version__),
            "python_version": platform.python_version(),
            "device": "cpu",
            "command": list(self.command),
            "start_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "steps_requested": self.plan.steps,
            "steps_recorded": 0,
            "warmup": self.plan.warmup,
            "recorder": "python",  # the native source's meta says "native"
        }
        meta["rank"], meta["world_size"] = launcher_world()
        ext = for_recording()  # before the trace exists: a forced path that fails leaves none
        flags = self._flags
        self._sink = out = TraceSink(self.path, meta, flags)
        registry = ModuleRegistry(out.intern)
        stacks = Stacks(out.writer) if self.stacks and out.writer is not None else None
        phases = PhaseState(flags, registry)
        allocations = AllocatorSource(flags, stacks is not None)
        self._device, self._oom = DeviceSource(out.intern), OomSource()
        ledger: StorageLedger
        if ext is None:
            ledger = StorageLedger(flags, phases, registry, allocations, stacks)
            ops_and_blocks: Source = allocations
        else:
            ledger = NativeLedger(ext, flags, phases, registry, allocations, stacks)
            ops_and_blocks = NativeRowsSource(ext, ledger, self._oom.noted)
        built_in: tuple[Source, ...] = (
            ops_and_blocks,
            self._device,  # after: it places a step's peak on the step's storage rows
            self._oom,
            CompiledSource.for_path(registry, ext, lambda: self._installed_hooks.compiled_call()),
        )
        comm = ledger.comm_buffer if isinstance(ledger, NativeLedger) else None
        everything = (*built_in, FsdpSource(ledger.on_resized, comm), *self._extra_sources)
        self._parts = parts = Parts(
            flags, out, ledger, phases, registry, everything, stacks, self._tracker, self._progress
        )
        self._runs = RunSequencer(
            self.plan,
            parts,
            owner=self,
            done=lambda: self._uninstall(keep_optimizer_hooks=True),
            op_hook=lambda: self._installed_hooks.op_hook_to_pause(),
            quiet=lambda calls: self._installed_hooks.quiet_for_timing(calls),
        )
        self._hooks = TorchHooks(
            flags, phases, ledger, registry, self._tracker, self._runs, self._on_op_failed
        )
        self._allocations = allocations

    @property
    def _installed_hooks(self) -> TorchHooks:
        assert self._hooks is not None, "the trace is not open"
        return self._hooks

    def _install(self) -> None:
        """Install the hooks, the patches and the sources; each patch's undo is kept."""
        parts, torch_hooks = self._parts, self._installed_hooks
        assert parts is not None and self._sink is not None
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_in_child(me))
        torch_hooks.install()
        restore = self._restore
        restore.append(_torch.watch_optimizer_init(torch_hooks.optimizer_created))
        restore.append(_torch.watch_dataloader_iterators(parts.data.created))
        phases = parts.phases
        restore.append(
            _torch.bracket_recompute(
                phases.recompute_enter, phases.recompute_exit, parts.registry.row
            )
        )
        restore += [source.install() for source in parts.sources]
        # after the sources: the native source's own saved-tensor hooks are not observed
        restore.append(_torch.observe_saved_tensor_hooks(torch_hooks.saw_saved))
        restore.append(_torch.keep_fd_on_closerange(self._sink.fileno, self._closing_every_fd))
        self._listen_to_ckpt_runtime(phases)
        ledger = parts.ledger
        if isinstance(ledger, NativeLedger):  # no op hook: backward's bounds come from
            # autograd's entry points (NOTE [ The native ledger ])
            torch_hooks.watch_backward(ledger.graph_leaves)

            def backward_begins(roots: Any) -> None:
                torch_hooks.backward_begins(roots)
                ledger.backward_begins()

            def backward_ends() -> None:
                ledger.backward_ends()
                phases.on_backward_end()

            restore.append(_torch.bracket_backward(backward_begins, backward_ends))
            restore.append(_torch.watch_shared_tensors(ledger.shared_input))
            if parts.stacks is not None:  # NOTE [ Stacks on the native path ]
                restore.append(_torch.watch_torch_calls(ledger.on_torch_call))
        else:
            torch_hooks.enter_op_hook()

    def _closing_every_fd(self) -> None:
        """The script closes every file descriptor: the allocator's window closes first, the
        next one never opens (with a window open, or reopened at once, torch's profiler crashed
        the process)."""
        self._allocations.give_up("the script closed every file descriptor")

    def _listen_to_ckpt_runtime(self, listener: PhaseState) -> None:
        try:
            from ckpt_runtime import markers
        except ImportError:  # an older ckpt_runtime without markers
            return
        handle = markers.add_listener(listener)
        self._restore.append(handle.remove)

    def _uninstall(self, keep_optimizer_hooks: bool = False) -> None:
        """Undo every patch, then remove the hooks (TorchHooks.uninstall)."""
        while self._restore:
            self._restore.pop()()
        self._allocations.stop()  # a window left open by a failure: the profiler is the user's
        self._installed_hooks.uninstall(keep_optimizer_hooks)

    def _on_op_failed(self, func: Any, exc: BaseException, t0: int) -> None:
        """An op raised while recording: note it if it failed to allocate (NOTE [ OOM capture ]
        in recorder/oom.py), with the module it ran in."""
        assert self._parts is not None
        if self._oom.failed(exc, str(func), self._parts.phases.module_running, t0):
            self._device.oom(t0)


def _forget_in_child(recorder: weakref.ref[Recorder]) -> None:
    """In a forked child (a DataLoader worker), go inert: the trace file is the parent's."""
    rec = recorder()
    if rec is not None:
        rec._flags.state = State.DONE
        if rec._sink is not None:
            rec._sink.forget_in_child()
        if rec._parts is not None:
            rec._parts.ledger.forget()


_PARTS = (_torch, buffers, hooks, ledger, modules, phases, runs, sink, steps, tables)
_NATIVE_PARTS = ("native_ledger", "native.attribute", "native.rows", "native.source")
skip_in_dynamo(
    sys.modules[__name__],
    *_PARTS,
    *(sys.modules[f"recorder.{name}"] for name in _NATIVE_PARTS),
    *(sys.modules[f"recorder.sources.{name}"] for name in sources.NAMES),
)
