"""The recorder and ``torch.compile``: on the Python path compiled code runs eagerly while steps
are recorded, on the native path compiled; dynamo stays out of ckview's own code, and
compilation resumes when recording ends.

NOTE [ torch.compile under the recorder ]
With a non-infra ``TorchDispatchMode`` on the mode stack, dynamo (torch 2.13,
``config.inline_torch_dispatch_torch_compile``) does not compile a frame: it runs it eagerly
("non-infra torch dispatch mode present, this is not supported today in torch.compile") and
marks the frame's code to be skipped for good, so the model stayed eager after recording too.
Inside the mode's own ``__torch_dispatch__`` the mode is off the stack, so dynamo compiled the
recorder's handler, once per op signature, until it hit its recompile limit: pages of warnings
and seconds of compile time. Code compiled before the recorder was entered would run from
dynamo's cache under the mode.

A mode could claim ``ignore_compile_internals`` and let compiled graphs run under it, but
inductor's kernels allocate and free their buffers without any aten op: the recorder would see a
fused graph's tensors only where they meet an extern kernel (``mm.out``) or autograd, and the
timeline would be wrong without saying so. So, while the recorder is installed:

* ``torch.compile``'d code runs eagerly (``torch.compiler.set_stance("force_eager")``, set as
  soon as dynamo is imported), and the trace records what runs: eager aten ops, whose memory
  is the eager one (inductor's fusion usually saves less for backward). The trace's ``compiled``
  meta field says ``eager`` when the script uses ``torch.compile`` (a compiled module ran, or
  ``torch.compile`` was called while recording), else ``no``: recorded steps never run
  compiled code.
* The plain timing steps that follow the recorded runs (NOTE [ Plain timing steps ] in
  timing.py) run eagerly too: their times compare with the recorded (eager) steps, and a
  compile inside them would be timed as a step.
* When recording and timing end the previous stance comes back, nothing was marked skipped, and
  the script compiles and runs compiled as it would have without ckview.
* Every function of the recorder is marked for dynamo to skip (a flag on the code object, no
  per-op cost, unlike the ``torch._dynamo.disable`` wrapper ``TorchDispatchMode`` would put
  around ``__torch_dispatch__``), so that dynamo never traces ckview's hooks, whatever stance a
  script sets.

NOTE [ Compiled code on the native path ]
The native path (``CKVIEW_RECORDER=native``) has no dispatch mode, so compiled code runs
compiled while recorded: no stance is set, and the ``compiled`` meta field says ``compiled``
once compiled code ran so (dynamo's stance let it: ``_callback_from_stance``).

* ckview's hooks stay out of the compiled graphs. Dynamo inlines ``Module._call_impl`` with
  the global module hooks it calls, and a skip flag on a code object does not stop inlining:
  the Python module and optimizer hooks return at once when ``torch.compiler.is_compiling()``
  (dynamo folds it to True: nothing of them is traced), and the extension's C hooks, which
  dynamo cannot trace at all (a graph break per module), are in dynamo's
  ``ignore_logging_functions`` while installed (full no-ops to tracing). Hooks that run
  eagerly around a compiled frame (the compiled model's own call) run as always; dynamo's
  frame callback is active there, so every recorder module is marked skipped (ckview code
  with tensors would otherwise be compiled, and break on the extension's calls).
* Saved-tensor hooks are off while dynamo traces; at run time a compiled autograd function
  saves through ``ctx.save_for_backward``, so the extension's pack hook sees every tensor the
  partitioner chose to save: they are activations as on the eager path.
* Every allocator block of a compiled graph is in the trace: inductor's buffers come from the
  allocator like any tensor's, and the memory reporter sees them. A compiled training graph
  runs inside an autograd function's range, ``CompiledFunction`` in forward and its node's
  ``CompiledFunctionBackward`` in backward (``COMPILED_REGIONS``): the native ledger counts
  them as ops, so each is one op of the trace (NOTE [ Outermost ops ] in native/attribute.py)
  that holds the graph's blocks and kernels (extern ones such as ``aten.mm.out`` included).
  A graph without autograd (inference, ``no_grad``) has no such range: its blocks take the
  outermost dispatcher op around them, else the next op to start. Their module call is the
  call open when the graph ran (the compiled model's own: its hooks run eagerly around the
  compiled ``forward``), in backward the forward call that made the node. Compiled around the
  model (``torch.compile(step_fn)``) no module call runs: a ``CompiledFunction`` outside
  backward begins a forward as a top-level module call does (``NativeLedger._forward_spans``),
  and so does the compiled call for the step rule (NOTE [ A compiled call begins a forward ] in
  hooks.py).
  Modules inside a compiled graph do not run as modules: no call of theirs is recorded, so a
  projection over them is no promise for the compiled step (docs/recording.md, plans on
  compiled code).
* Code compiled while recorded guards on the hooks it ignored: it compiles once more when
  recording ends.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

COMPILED_REGIONS = ("CompiledFunction", "CompiledFunctionBackward")
"""RecordFunction ranges around a compiled graph's forward and backward (NOTE [ Compiled code on
the native path ])."""


def skip_in_dynamo(*modules: types.ModuleType) -> None:
    """Mark every function defined in ``modules`` (methods and nested functions too) for dynamo
    to run as plain Python, never to trace. See NOTE [ torch.compile under the recorder ]."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
    except ImportError:  # a torch without dynamo
        return
    strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
    for module in modules:
        for code in _codes_of(module):
            set_code_exec_strategy(code, strategy)


def _codes_of(module: types.ModuleType) -> Iterator[types.CodeType]:
    seen: set[int] = set()
    stack: list[Any] = list(vars(module).values())
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (staticmethod, classmethod)):
            stack.append(obj.__func__)
        elif isinstance(obj, property):
            stack += [f for f in (obj.fget, obj.fset, obj.fdel) if f is not None]
        elif isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
            stack.append(obj.__code__)
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            stack += list(vars(obj).values())
        elif isinstance(obj, types.CodeType):
            yield obj
            stack += [c for c in obj.co_consts if isinstance(c, types.CodeType)]


class EagerWhileRecording:
    """Sets ``torch.compiler.set_stance("force_eager")`` while installed and restores the
    previous stance on ``uninstall``; see NOTE [ torch.compile under the recorder ].

    With ``eager=False`` (the native path, NOTE [ Compiled code on the native path ]) the
    stance is left alone and ``hidden`` (the recorder's hooks that dynamo would otherwise trace
    and break the graph on) are no-ops to dynamo's tracing while installed; ``on_call()`` runs
    as each call of compiled code is about to run compiled (NOTE [ A compiled call begins a
    forward ] in hooks.py).

    Importing dynamo takes seconds, so a script that never compiles never pays for it: the
    stance is set at install if dynamo is already imported, else when ``torch.compile`` is first
    called.
    """

    def __init__(
        self,
        eager: bool = True,
        hidden: Sequence[Callable[..., None]] = (),
        on_call: Callable[[], None] = lambda: None,
    ) -> None:
        self.eager = eager
        self._hidden = tuple(hidden)
        self._on_call = on_call
        self._prior: Any = None
        self._applied = False
        self._installed = False
        self._orig_compile: Any = None
        self.compile_used = False
        """``torch.compile`` was called, or compiled code was entered, while installed."""
        self.ran_compiled = False
        """Compiled code was entered, and dynamo's stance let it run compiled."""
        self._orig_callback: Any = None

    def install(self) -> None:
        self._installed = True
        if "torch._dynamo" in sys.modules:
            self._apply()
            return
        self._orig_compile = torch.compile
        guard = self

        @functools.wraps(torch.compile)
        def compile(*args: Any, **kwargs: Any) -> Any:
            guard.compile_used = True
            compiled = guard._orig_compile(*args, **kwargs)
            if guard._installed:
                guard._apply()
            return compiled

        torch.compile = compile

    def uninstall(self) -> None:
        self._installed = False
        if self._orig_callback is not None:
            from torch._dynamo import eval_frame

            eval_frame._callback_from_stance = self._orig_callback
            self._orig_callback = None
        if self._orig_compile is not None:
            torch.compile = self._orig_compile
            self._orig_compile = None
        if self._applied:
            self._applied = False
            if not self.eager:
                _ignored_by_dynamo().difference_update(self._hidden)
                return
            from torch._dynamo.eval_frame import _set_stance

            _set_stance(self._prior)

    def _apply(self) -> None:
        if self._applied:
            return
        self._applied = True
        self._notice_compiled_calls()
        if not self.eager:
            _ignored_by_dynamo().update(self._hidden)
            return
        from torch._dynamo.eval_frame import DynamoStance, _set_stance

        self._prior = _set_stance(DynamoStance("force_eager"))

    def _notice_compiled_calls(self) -> None:
        """Note when compiled code is entered (run eagerly under the eager stance): dynamo asks
        ``_callback_from_stance`` for each compiled call's frame callback (a private function:
        without it only ``torch.compile`` calls and compiled modules are noticed), outside the
        compiled frame, before it runs."""
        from torch._dynamo import eval_frame

        original = getattr(eval_frame, "_callback_from_stance", None)
        if original is None:
            return
        guard = self

        def callback_from_stance(callback: Any) -> Any:
            resolved = original(callback)
            if callback not in (False, None):
                guard.compile_used = True
                if resolved is not None:  # None: run eagerly
                    guard.ran_compiled = True
                    guard._on_call()
            return resolved

        self._orig_callback = original
        eval_frame._callback_from_stance = callback_from_stance


def _ignored_by_dynamo() -> set[Callable[..., Any]]:
    """Dynamo's set of functions it traces as no-ops (``ignore_logging_functions``): no graph
    break, nothing in the graph. Members must return None; dynamo deep-copies its config, so
    they are builtins or plain functions (a bound method would copy its object)."""
    import torch._dynamo.config

    ignored: set[Callable[..., Any]] = torch._dynamo.config.ignore_logging_functions
    return ignored


__all__ = ["COMPILED_REGIONS", "EagerWhileRecording", "skip_in_dynamo"]
