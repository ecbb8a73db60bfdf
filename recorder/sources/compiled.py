"""``torch.compile`` as a source: on the Python path compiled code runs eagerly while recorded
(NOTE [ torch.compile under the recorder ] in recorder/compiled.py), on the native path it runs
compiled (NOTE [ Compiled code on the native path ]); the trace's ``compiled`` field says which."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from recorder.compiled import EagerWhileRecording
from recorder.modules import ModuleRegistry
from recorder.sources.base import RunPart
from recorder.tables import RunTables


class CompiledSource:
    """Forces compiled code eager while installed (``eager``), or hides ``hidden`` (the
    recorder's hooks) from dynamo's tracing; meta ``compiled``."""

    def __init__(
        self,
        registry: ModuleRegistry,
        eager: bool = True,
        hidden: Sequence[Callable[..., None]] = (),
        on_call: Callable[[], None] = lambda: None,
    ) -> None:
        self._registry = registry
        self._watch = EagerWhileRecording(eager, hidden, on_call)

    @classmethod
    def for_path(
        cls, registry: ModuleRegistry, ext: Any, on_call: Callable[[], None]
    ) -> CompiledSource:
        """The source for the recorder's path: ``ext`` None (Python path), compiled code runs
        eagerly; else compiled, with the extension's module hooks hidden from dynamo and
        ``on_call()`` told of each compiled call (NOTE [ A compiled call begins a forward ] in
        recorder/hooks.py)."""
        if ext is None:
            return cls(registry)
        hooks = (ext.pre_hook, ext.post_hook)
        for hook in hooks:  # dynamo writes its config out by each member's __module__ (None)
            hook.__module__ = ext.__name__
        return cls(registry, eager=False, hidden=hooks, on_call=on_call)

    def install(self) -> Callable[[], None]:
        self._watch.install()
        return self._watch.uninstall

    def begin_run(self, run: RunTables) -> None:
        pass

    def step_begins(self, now: int) -> None:
        pass

    def step_ends(self, now: int) -> None:
        pass

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        return RunPart()

    def meta(self) -> dict[str, Any]:
        """'compiled' if compiled code ran compiled while recording (the native path), 'eager'
        if the script uses ``torch.compile`` and its compiled code ran eagerly, else 'no'."""
        watch = self._watch
        if not watch.eager and watch.ran_compiled:
            return {"compiled": "compiled"}
        used = watch.compile_used or self._registry.saw_compiled()
        return {"compiled": "eager" if used else "no"}
