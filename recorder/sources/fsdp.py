"""FSDP's storage resizes as a source: FSDP frees and re-allocates unsharded parameters by
resizing their storages, without an op (NOTE [ FSDP's storages ] in recorder/ledger.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from recorder._torch import follow_fsdp_buffers, follow_fsdp_resizes
from recorder.sources.base import RunPart
from recorder.tables import RunTables


class FsdpSource:
    """Calls ``resized(fsdp_param)`` after each resize, and ``comm(buffer)`` (if given: the
    native path, where no op hook sees FSDP's ops) with each communication buffer FSDP fills,
    once FSDP is in use: the script has built its model by the first recorded step."""

    def __init__(
        self,
        resized: Callable[[Any], None],
        comm: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self._resized = resized
        self._comm = comm
        self._undo: list[Callable[[], None]] = []
        self._tried = False

    def install(self) -> Callable[[], None]:
        return self._uninstall

    def _uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def begin_run(self, run: RunTables) -> None:
        pass

    def step_begins(self, now: int) -> None:
        if self._tried:
            return
        undo = follow_fsdp_resizes(self._resized)
        if undo is None:
            return
        self._tried = True
        self._undo.append(undo)
        comm = None if self._comm is None else follow_fsdp_buffers(self._comm)
        if comm is not None:
            self._undo.append(comm)

    def step_ends(self, now: int) -> None:
        pass

    def end_run(self, run: RunTables, now: int, error: str) -> RunPart:
        return RunPart()

    def meta(self) -> dict[str, Any]:
        return {}
