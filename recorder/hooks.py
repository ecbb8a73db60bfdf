"""The recorder's hooks into torch: the op hook, module and optimizer hooks, saved-tensor hooks,
the end of each backward. They tell the phases where the step is, hand ops and tensors to the
ledger, and step boundaries to the run sequencer.

NOTE [ A forward without modules ]
A loop with no nn.Module at all (parameters as plain tensors, the model a function of them) has
no module pre-hook to say where its forward begins, nor a module to own its parameters. While no
module has run forward, every op outside backward that builds autograd graph (grad mode on, a
tensor argument that requires grad, not an op that never does: ``.item()``, ``detach``,
comparisons) is looked at: the first one after the recorder is installed or a backward ended
begins a forward (counted, its ops FORWARD), and the leaf tensors that require grad among its
arguments are parameters (no module owns them). The op hook runs below autograd, where a step
boundary cannot be taken (the boundary may write the trace and time checkpoint calls, which need
autograd): without optimizer, such a loop's step ends at the end of its backward instead (the
no_grad update after it belongs to the next step; NOTE [ Step = one optimizer iteration ] in
steps.py), in autograd's final callback. Thread-local state (the op hook, saved-tensor hooks)
changed there is undone when backward returns, so there the op hook stays on for timing steps,
and when all is done both stay, inert, until ``close``. A script with modules pays one attribute
test per op.
The native path has no op hook: there the forward is counted when its backward begins
(``backward_begins``, from ``_torch.bracket_backward``), the leaves that backward trains are the
parameters (NOTE [ Leaves of a graph ] in ckrec_hooks.cpp), and the forward's ops are FORWARD from
the op that made the graph's first node on (``NativeLedger._functional_forward_spans``); the step
ends when ``backward`` returns, outside autograd.

NOTE [ A compiled call begins a forward ]
Compiled around the model (``torch.compile(lambda x: model(x))``, ``torch.compile(train_step)``)
on the native path, no module call runs: the loop looks like one without modules. But dynamo
tells of each compiled call before it runs, outside autograd (``EagerWhileRecording``'s
``on_call``), and there a step boundary can be taken. So while no module has run forward, a
compiled call outside backward, the optimizer and any module call begins a forward as a
top-level module call does (``compiled_call``): counted, a boundary before it where the step
rule puts one, and the end of a backward no longer ends the step. A top-level module call that
runs eagerly inside that forward (the model of ``torch.compile(model)``, whose wrapper's call
dynamo is told of first; a module after a graph break) is part of it, not a second forward:
the first such call registers the modules, and from then on module calls begin forwards. The
loop's steps then follow NOTE [ Step = one optimizer iteration ] in steps.py as a loop with
modules does; before, an optimizer built before the recorder (known from its first step on)
came too late: the first backward's end closed the warmup iteration and the recorded step held
that iteration's optimizer step alone. The ledger's spans agree: a ``CompiledFunction``
outside backward begins a forward (NOTE [ Compiled code on the native path ] in compiled.py).
The Python path runs compiled code eagerly (its module calls are seen) and is not told.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch
from torch.compiler import is_compiling
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from ckview.trace.schema import NO_INDEX, Category, SavedEventKind
from recorder._torch import (
    DisableTorchDispatch,
    Parameter,
    Tensor,
    TorchDispatchMode,
    current_graph_task_id,
    dispatch_mode,
    saved_tensors_hooks_on_top,
    tensors_in,
)
from recorder.ledger import StorageLedger
from recorder.modules import ModuleRegistry
from recorder.phases import FORWARD, OTHER, PhaseState
from recorder.runs import RunSequencer
from recorder.steps import IterationTracker
from recorder.tables import Flags, State

_PARAMETER = int(Category.PARAMETER)
# The module hooks run at every module call: a global is read faster than an Enum member
# (70 ns a member on CPython 3.11).
_RECORDING, _TIMING = State.RECORDING, State.TIMING
_NO_GRAPH = frozenset(
    {"_local_scalar_dense", "detach", "alias", "equal", "is_nonzero", "eq", "ne", "lt", "le"}
    | {"gt", "ge", "argmax", "argmin", "isnan", "isinf", "isfinite"}
)
"""Ops that never build autograd graph (NOTE [ A forward without modules ])."""


class _OpObserver(TorchDispatchMode):
    """Sees every aten op; the ledger does the bookkeeping."""

    def __init__(self, hooks: TorchHooks) -> None:
        super().__init__()
        self._hooks = hooks
        self._flags = hooks.flags
        self._phases = hooks.phases
        self._on_op = hooks.ledger.on_op

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Dynamo skips this module's code by a flag on each code object (NOTE [ torch.compile
        # under the recorder ]); torch's per-op dynamo-disable wrapper would cost microseconds.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flags = self._flags
        if kwargs is None:
            kwargs = {}
        if flags.no_modules:
            self._hooks.functional_op(func, args, kwargs)  # NOTE [ A forward without modules ]
        if flags.state is State.RECORDING and not flags.busy:
            t0 = perf_counter_ns()
            try:
                out = func._op(*args, **kwargs)  # the C++ op, without OpOverload.__call__'s frame
            except BaseException as exc:
                self._hooks.op_failed(func, exc, t0)  # NOTE [ OOM capture ] in recorder/oom.py
                raise
            self._on_op(func, args, kwargs, out, t0, perf_counter_ns())
            return out
        phases = self._phases
        if not phases.in_backward and flags.state is State.WARMUP and current_graph_task_id() >= 0:
            phases.enter_backward()
        return func._op(*args, **kwargs)


class TorchHooks:
    """Installs the recorder's hooks into torch and routes what they see.

    ``op_failed(func, exc, t0)`` hears an op that raised while recording (NOTE [ OOM capture ]).
    """

    def __init__(
        self,
        flags: Flags,
        phases: PhaseState,
        ledger: StorageLedger,
        registry: ModuleRegistry,
        tracker: IterationTracker,
        runs: RunSequencer,
        op_failed: Callable[[Any, BaseException, int], None],
    ) -> None:
        self.flags = flags
        self.phases = phases
        self.ledger = ledger
        self._registry = registry
        self._tracker = tracker
        self._runs = runs
        self.op_failed = op_failed
        phases.on_backward_end = self._on_backward_end
        self._handles: list[Any] = []  # module pre and post hooks, then the optimizer's
        self._module_hooks_on = True
        self._saved_hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._observer: _OpObserver | None = None
        self._await_forward = False
        self._in_backward_callback = False
        self._counted_task = -1  # graph task whose backward pass was counted last
        # a compiled call's forward was counted and its backward has not ended (NOTE [ A
        # compiled call begins a forward ])
        self._compiled_forward_open = False
        self._leaves: Callable[[list[torch.Tensor]], list[torch.Tensor]] = lambda roots: []

    def install(self) -> None:
        """Module and optimizer hooks, saved-tensor hooks, then the op hook."""
        self._handles = [
            *self._module_hooks(),
            register_optimizer_step_pre_hook(self._pre_optimizer),
            register_optimizer_step_post_hook(self._post_optimizer),
        ]
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()

    def enter_op_hook(self) -> None:
        self._observer = _OpObserver(self)
        self._observer.__enter__()
        self.flags.no_modules = self._await_forward = self._registry.empty

    def watch_backward(self, leaves: Callable[[list[torch.Tensor]], list[torch.Tensor]]) -> None:
        """The native path, without op hook: a loop without modules is seen when each backward
        begins (``backward_begins``); ``leaves(roots)`` gives the leaf tensors a backward from
        ``roots`` trains (NOTE [ A forward without modules ])."""
        self._leaves = leaves
        self.flags.no_modules = self._await_forward = self._registry.empty

    def backward_begins(self, roots: Any) -> None:
        """A backward pass begins (the native path): in a loop without modules, the forward
        that made its graph is counted now, and the leaves it trains are parameters (NOTE [ A
        forward without modules ])."""
        if not self.flags.no_modules:
            return
        if self._await_forward:
            self._await_forward = False
            self._tracker.forward_begun()
        recording = self.flags.state is State.RECORDING
        for t in self._leaves(list(tensors_in(roots))):
            if self._registry.add_loose(t) and recording:
                self.ledger.mark(t, _PARAMETER)

    def uninstall(self, keep_optimizer_hooks: bool = False) -> None:
        """Remove every hook; a hook that others stacked on top of stays, inert. Inside
        backward the thread-local ones (saved-tensor hooks, the op hook) stay for ``close``:
        autograd restores thread-local state when backward returns (NOTE [ A forward without
        modules ])."""
        keep = self._handles[2:] if keep_optimizer_hooks else []
        for handle in self._handles:
            if handle not in keep:
                handle.remove()
        self._handles = keep
        if self._in_backward_callback:
            return
        self._take_off_saved_hooks()
        if self._observer is not None and dispatch_mode() is self._observer:
            self._observer.__exit__(None, None, None)
            self._observer = None

    def quiet_for_timing(self, calls: bool) -> None:
        """A plain timing step begins (NOTE [ Quiet timing steps ] in timing.py): the
        saved-tensor hooks come off, and the module hooks stay on only where the step times its
        module calls. A loop whose steps end at a top-level forward keeps both: the module
        pre-hook finds that forward, and the unpack hook sees backward begin, where the next
        run's context is entered (NOTE [ Early run context ] in runs.py)."""
        at_forward = self._tracker.ends_at_forward()
        if not (at_forward or self._in_backward_callback):  # thread-local: restored after it
            self._take_off_saved_hooks()
        on = calls or at_forward
        if on == self._module_hooks_on or not self._handles:
            return
        self._module_hooks_on = on
        for handle in self._handles[:2]:
            handle.remove()
        if on:
            self._handles[:2] = self._module_hooks()

    def _take_off_saved_hooks(self) -> None:
        """Leave our saved-tensor hooks, unless others were stacked on top (then they stay)."""
        if self._saved_hooks is not None and saved_tensors_hooks_on_top(self._pack):
            self._saved_hooks.__exit__()
            self._saved_hooks = None

    def _module_hooks(self) -> list[Any]:
        return [
            register_module_forward_pre_hook(self._pre_forward),
            register_module_forward_hook(self._post_forward, with_kwargs=True, always_call=True),
        ]

    def op_hook_to_pause(self) -> Any:
        """The op hook timing steps take off; None in backward's callback, where it cannot be
        taken off (NOTE [ A forward without modules ]): those timing steps run with it."""
        return None if self._in_backward_callback else self._observer

    def compiled_call(self) -> None:
        """Compiled code is about to run compiled (the native path): in a loop where no module
        has run forward, a call outside backward, the optimizer and any module call begins a
        forward (NOTE [ A compiled call begins a forward ])."""
        phases = self.phases
        if (
            not self.flags.no_modules
            or phases.stack
            or phases.in_backward
            or phases.optimizer_depth
            or self.flags.state is State.DONE
            or current_graph_task_id() >= 0
            or not torch.is_grad_enabled()
        ):
            return
        self.flags.compiled_forwards = self._compiled_forward_open = True
        self._await_forward = False  # counted here, not when its backward begins
        self._begin_forward()

    def _begin_forward(self) -> None:
        """A top-level forward begins: the step ends before it where the step rule says so."""
        if self._tracker.on_forward():
            self._runs.end_step()  # e.g. a loop without optimizer: the next forward starts one
        self._tracker.forward_begun()
        self.phases.top_phase = FORWARD
        if self.flags.state is State.TIMING:
            self._timing_forward()

    # ------------------------------------------------------------------------- modules

    def functional_op(self, func: Any, args: Any, kwargs: Any) -> None:
        """An op about to run in a loop without modules (NOTE [ A forward without modules ])."""
        phases = self.phases
        if phases.in_backward or current_graph_task_id() >= 0 or not torch.is_grad_enabled():
            return
        graph = [t for t in tensors_in(args, kwargs) if t.requires_grad]
        if not graph or getattr(func, "_opname", "") in _NO_GRAPH:
            return
        if self._await_forward:
            self._await_forward = False
            self._tracker.forward_begun()
            phases.top_phase = FORWARD
        for t in graph:
            if t.is_leaf and self._registry.add_loose(t) and self.flags.state is State.RECORDING:
                self.ledger.mark(t, _PARAMETER)

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if is_compiling():  # NOTE [ Compiled code on the native path ] in compiled.py
            return
        phases, state = self.phases, self.flags.state
        row = self._registry.row(module)
        if row is None:
            if self._registry.passes_through(module):
                return
            if state in (State.TIMING, State.DONE):
                return  # timing steps: a module first seen now is not timed
            row = self._register_module(module)
        in_backward = phases.in_backward
        if not in_backward and current_graph_task_id() >= 0:
            phases.enter_backward()  # a recompute before backward's first op
            in_backward = True
        if not in_backward and not phases.stack:
            if self._compiled_forward_open:  # its compiled call's forward, counted there
                self._compiled_forward_open = False
            else:
                self._begin_forward()  # may end the step: state and stack are read after
        state = self.flags.state
        call = NO_INDEX
        if state is _RECORDING:
            call = phases.open_call(row)
        elif state is _TIMING and not in_backward:
            self._runs.timer.call_begin(row)
        phases.stack.append((row, call))

    def _timing_forward(self) -> None:
        """A top-level forward in a timing step; without optimizer it ends the step if the step
        had one already (NOTE [ Plain timing steps ] in timing.py)."""
        if not self._tracker.ends_at_forward() or not torch.is_grad_enabled():
            return
        timer = self._runs.timer
        if timer.forwards:
            self._runs.end_step()
        if self.flags.state is State.TIMING:
            timer.forwards += 1

    def _post_forward(self, module: torch.nn.Module, args: Any, *rest: Any) -> None:
        # (kwargs, output) normally; only (output,) when forward raised: torch then calls
        # always_call hooks without kwargs (checkpoint's early stop raises inside recompute).
        if is_compiling():
            return
        kwargs, output = rest if len(rest) == 2 else ({}, rest[0])
        stack = self.phases.stack
        if not stack or stack[-1][0] != self._registry.row(module):
            return  # the matching pre-hook ran before we were installed
        row, call = stack.pop()
        state = self.flags.state
        if state is _TIMING:
            self._runs.timer.call_end(row)
        elif call != NO_INDEX and state is _RECORDING:
            # Inputs are noted here, where keyword arguments are seen too; they are still alive.
            self.ledger.note_call_io(call, args, kwargs, output)
            self.phases.close_call(call)

    def _register_module(self, module: torch.nn.Module) -> int:
        self.flags.no_modules = self._await_forward = False
        stack = self.phases.stack
        caller = stack[-1][0] if stack else NO_INDEX
        row, new_params = self._registry.register(module, caller)
        if self.flags.state is State.RECORDING:
            for p in new_params:
                self.ledger.mark(p, _PARAMETER)
        return row

    # ------------------------------------------------------------------------- optimizers

    def optimizer_created(self, optimizer: torch.optim.Optimizer) -> None:
        """Know every optimizer built while recording, before its first step: a GAN's second
        optimizer must be waited for (NOTE [ Step = one optimizer iteration ])."""
        if self.flags.state is not State.DONE:
            self._tracker.add_optimizer(optimizer)

    def _pre_optimizer(
        self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        if is_compiling():
            return None
        self.ledger.optimizers.add(optimizer)
        self._tracker.add_optimizer(optimizer)
        self.phases.optimizer_depth += 1
        if self.flags.state is State.RECORDING:
            self.ledger.mark_gradients()
        return self._wrap_closure(args, kwargs)

    def _wrap_closure(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """``step(closure)``: the closure's forward and backward are FORWARD and BACKWARD, not
        OPTIMIZER (Lightning's automatic optimization, LBFGS). Returns the new arguments;
        ``args[0]`` is the optimizer itself."""
        if len(args) > 1 and callable(args[1]):
            return (args[0], self._closure(args[1]), *args[2:]), kwargs
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._closure(kwargs["closure"])}
        return None

    def _closure(self, closure: Callable[..., Any]) -> Callable[..., Any]:
        phases = self.phases
        ledger = self.ledger

        def closure_outside_the_optimizer(*a: Any, **k: Any) -> Any:
            depth, phase = phases.optimizer_depth, phases.top_phase
            phases.optimizer_depth, phases.top_phase = 0, OTHER
            ledger.closure_runs(True)
            try:
                return closure(*a, **k)
            finally:
                phases.optimizer_depth, phases.top_phase = depth, phase
                ledger.closure_runs(False)

        return closure_outside_the_optimizer

    def _post_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if is_compiling():
            return
        self.phases.optimizer_depth = max(0, self.phases.optimizer_depth - 1)
        if self.flags.state is State.RECORDING:
            self.ledger.mark_optimizer_tensors()
        if self._tracker.on_optimizer_step(optimizer):
            self._runs.end_step()

    # ------------------------------------------------------------------------- autograd

    def _on_backward_end(self) -> None:
        self.phases.backward_ended()
        self._compiled_forward_open = False
        # A callback queued after ours (DDP's reducer copying buckets into .grad) runs ops in
        # the same graph task: backward "begins" again there, but it is one backward pass.
        task = current_graph_task_id()
        if task < 0 or task != self._counted_task:
            self._tracker.on_backward()
        self._counted_task = task
        if self.flags.state is State.RECORDING:
            self.ledger.mark_gradients()
        no_modules = not self.flags.sees_forwards
        self._await_forward = no_modules
        if no_modules and self._tracker.boundary_at_next_forward():
            # No forward hook to wait for: NOTE [ A forward without modules ].
            self._in_backward_callback = True
            try:
                self._runs.end_step()
            finally:
                self._in_backward_callback = False
        elif self._tracker.boundary_at_next_forward():
            self._runs.enter_next_context_early()  # NOTE [ Early run context ] in runs.py

    def _pack(self, x: torch.Tensor) -> torch.Tensor:
        if self.flags.state is State.RECORDING:
            self.ledger.on_saved(x, SavedEventKind.PACK)
        # See NOTE [ Never hold a user tensor ]. detach is an op: keep it out of the trace, and
        # for plain tensors skip the Python dispatch round trip altogether.
        if type(x) is Tensor or type(x) is Parameter:
            with DisableTorchDispatch():
                return x.detach()
        self.flags.busy = True
        try:
            return x.detach()
        finally:
            self.flags.busy = False

    def _unpack(self, x: torch.Tensor) -> torch.Tensor:
        if self.flags.state is State.RECORDING:
            self.ledger.on_saved(x, SavedEventKind.UNPACK)
        elif self.flags.state is State.TIMING and not self.phases.in_backward:
            self.phases.enter_backward()  # no op hook to see it: NOTE [ Early run context ]
        return x

    def saw_saved(self, x: torch.Tensor, kind: SavedEventKind) -> None:
        """Another saved-tensor hook pair kept or handed back ``x`` (NOTE [ Cooperating with
        other saved-tensor hooks ] in ledger.py)."""
        if self.flags.state is State.RECORDING:
            self.ledger.on_saved(x, kind)
