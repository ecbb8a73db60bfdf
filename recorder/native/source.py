"""The native extension as one recorder source: install/undo, run begin/end, step begin/end,
meta (the protocol of ``../shared/research/structure-review.md``, seam 1). Every method runs on
the recording thread (NOTE [ The recording thread writes without a lock ] in ckrec.h).

Each boundary drains the rows written since the previous one and hands their ``StepFacts`` to
``on_facts(kind, facts)``: kind ``"step"`` for a recorded step, ``"between"`` for what ran
between steps (data loading, logging) and ``"end"`` for the rest of the run; a boundary with
no rows since the previous one hands out nothing. The sink decides what to keep; this class
holds no rows.

NOTE [ Native source and the script's own hooks ]
- Saved tensors: the extension's pack/unpack are installed as the outermost
  ``saved_tensors_hooks``. Only the innermost hooks apply, so inside a non-reentrant
  ``torch.utils.checkpoint`` region the checkpoint's hooks run instead and no pack rows come;
  the recorder's existing wrapping of ``saved_tensors_hooks.__init__`` must stay in charge there.
- torch.profiler: torch refuses to start its profiler while the memory reporter holds the
  thread's profiler slot. ``install`` wraps the profiler's entry points: the reporter steps
  aside before the script's profiler starts and comes back when it stops. Allocator events of
  that interval are lost (the script's profiler has them); ops are still recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recorder.native.attribute import Attribution, StepFacts
from recorder.native.rows import drain

Facts = Callable[[str, StepFacts], None]


class NativeSource:
    """Ops, allocator blocks, module calls and saved tensors from the native extension."""

    def __init__(self, ext: Any, on_facts: Facts, outputs: bool = False) -> None:
        self._ext = ext
        self._on_facts = on_facts
        self._outputs = outputs
        self._attribution = Attribution(ext)
        self._running = False
        self._hooks: list[Any] = []
        self._saved: Any = None
        self.yielded = 0  # times the reporter stepped aside for the script's profiler

    def install(self) -> Callable[[], None]:
        """Module hooks, saved-tensor hooks and the profiler hand-over; returns the undo."""
        import torch
        from torch.nn.modules import module as nn_module

        ext = self._ext
        _inert_in_forked_children(ext)
        self._hooks = [
            nn_module.register_module_forward_pre_hook(ext.pre_hook),
            nn_module.register_module_forward_hook(ext.post_hook, always_call=True),
        ]
        self._saved = torch.autograd.graph.saved_tensors_hooks(ext.pack, ext.unpack)
        self._saved.__enter__()
        undo_profiler = self._yield_to_profiler()

        def undo() -> None:
            if self._running:  # a recording that ended without its run's end (a failed start)
                self._ext.stop()
                self._running = False
            undo_profiler()
            self.quiet()

        return undo

    def quiet(self) -> None:
        """Take the module and saved-tensor hooks off: every run is recorded (NOTE [ Quiet
        timing steps ] in recorder/timing.py). Saved-tensor hooks that others stacked on top of
        stay, inert (the extension is stopped)."""
        from recorder._torch import saved_tensors_hooks_on_top

        if self._saved is not None and saved_tensors_hooks_on_top(self._ext.pack):
            self._saved.__exit__(None, None, None)
            self._saved = None
        for hook in self._hooks:
            hook.remove()

    def begin_run(self) -> None:
        self._ext.start(ops=True, memory=True, outputs=self._outputs)
        self._running = True
        self._ext.drain()  # rows of an earlier run that ended mid-op
        self._attribution = Attribution(self._ext)

    def step_begins(self, now: int) -> None:
        self._hand_out("between")

    def step_ends(self, now: int) -> None:
        self._hand_out("step")

    def end_run(self) -> None:
        self._hand_out("end")
        self._ext.stop()
        self._running = False

    def meta(self) -> dict[str, object]:
        return {"recorder": "native"}

    def names(self, first: int = 0) -> list[str]:
        """Op names from index ``first`` (``ops['name']`` indexes them)."""
        return list(self._ext.names(first))

    def _hand_out(self, kind: str) -> None:
        """Drains and attributes; an empty drain (steps back to back) hands out nothing."""
        if self._running:
            rows = drain(self._ext)
            if not rows.is_empty():
                self._on_facts(kind, self._attribution.step(rows))

    def _yield_to_profiler(self) -> Callable[[], None]:
        from torch.autograd import profiler as autograd_profiler

        names = ("_prepare_profiler", "_enable_profiler", "_disable_profiler")
        originals = {name: getattr(autograd_profiler, name) for name in names}
        ext = self._ext

        def before(start: Callable[..., Any]) -> Callable[..., Any]:
            def start_for_the_script(*args: Any, **kwargs: Any) -> Any:
                if ext.suspend_reporter():
                    self.yielded += 1
                return start(*args, **kwargs)

            return start_for_the_script

        def after(stop: Callable[..., Any]) -> Callable[..., Any]:
            def stop_for_the_script(*args: Any, **kwargs: Any) -> Any:
                try:
                    return stop(*args, **kwargs)
                finally:
                    if self._running:
                        ext.resume_reporter()

            return stop_for_the_script

        autograd_profiler._prepare_profiler = before(originals["_prepare_profiler"])
        autograd_profiler._enable_profiler = before(originals["_enable_profiler"])
        autograd_profiler._disable_profiler = after(originals["_disable_profiler"])

        def undo() -> None:
            for name, original in originals.items():
                setattr(autograd_profiler, name, original)

        return undo


_FORK_HOOKED: set[int] = set()


def _inert_in_forked_children(ext: Any) -> None:
    """NOTE [ Forked children ] in ckrec.cpp: once per extension and process."""
    import os

    if id(ext) not in _FORK_HOOKED:
        _FORK_HOOKED.add(id(ext))
        os.register_at_fork(after_in_child=ext.forget_in_child)
