"""Out-of-memory capture: which op failed to allocate, in which module, asking for how much.

NOTE [ OOM capture ]
On CUDA the allocator's out-of-memory observer (``hear_cuda_oom`` in _torch.py) gives the exact
bytes asked for before the exception is raised; the message rounds them to two decimals of MiB.
An allocation that fails inside a recorded step raises out of the op that asked for it, and
that op runs inside the recorder's dispatch mode. ``_OpObserver.__torch_dispatch__`` catches
the exception there, has the recorder note it (:meth:`OomWatch.failed`: the op, the module call
running it, the time, the bytes asked for, parsed from the message) and re-raises it
unchanged. The note is only a candidate: a script may catch an OOM and carry on (retry with a
smaller batch). The run is marked as ended in an OOM only if the error that ends the recording
is that very exception, told by its text ``"<Type>: <message>"``, which is how the script
runner and ``Recorder.__exit__`` report the error that ended the script
(:meth:`OomWatch.attrs`). Nothing here holds the exception (its traceback holds the user's
frames, and their tensors).

Allocation failures are ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same
class), the CPU allocator's ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory: you
tried to allocate N bytes") and ``MemoryError`` raised inside an op. A ``MemoryError`` raised
by Python code outside any aten op does not pass the dispatch mode: that run is incomplete as
for any other failure, not marked as an OOM.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_CPU_BYTES = re.compile(r"you tried to allocate (\d+) bytes")
# c10's format_size: "N bytes" up to 1 KiB, else two decimals of KiB, MiB or GiB.
_CUDA_BYTES = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)")
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_CPU_ALLOCATOR = "can't allocate memory"


def is_allocation_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says that an allocation failed (NOTE [ OOM capture ])."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and _CPU_ALLOCATOR in str(exc)


def says_allocation_failed(error: str) -> bool:
    """Whether ``error`` (``"<Type>: <message>"``, as a recording's end reports it) says that
    an allocation failed, as ``is_allocation_failure`` tells of the exception."""
    return error.startswith(("OutOfMemoryError: ", "MemoryError: ")) or (
        error.startswith("RuntimeError: ") and _CPU_ALLOCATOR in error
    )


def requested_bytes(message: str) -> int:
    """The bytes an allocation error says were asked for; -1 if it does not say.

    CPU: exact. CUDA: as torch prints them, to two decimals of KiB, MiB or GiB.
    """
    found = _CPU_BYTES.search(message)
    if found:
        return int(found.group(1))
    found = _CUDA_BYTES.search(message)
    if found:
        return round(float(found.group(1)) * _UNITS[found.group(2)])
    return -1


@dataclass(frozen=True)
class OomNote:
    """One allocation failure seen in the dispatch mode."""

    error: str
    """``"<Type>: <message>"``, as the error that ends a recording is reported."""
    op: str
    module: str
    nbytes: int
    time_ns: int
    """``perf_counter_ns`` when the failing op began."""


class OomWatch:
    """The last allocation failure of the current run (NOTE [ OOM capture ])."""

    def __init__(self) -> None:
        self.last: OomNote | None = None
        self._asked = -1  # bytes the CUDA allocator last failed to allocate

    def observed(self, device: int, asked: int, total: int, free: int) -> None:
        """The CUDA allocator's own word of a failure, heard before its exception is raised."""
        self._asked = asked

    def failed(self, exc: BaseException, op: str, module: Callable[[], str], now: int) -> bool:
        """Note ``exc`` if it is an allocation failure of ``op``, begun at ``now``, in the
        module call ``module()`` names; whether it was one."""
        if not is_allocation_failure(exc):
            return False
        message = str(exc)
        error = f"{type(exc).__name__}: {message}"
        asked = self._asked if isinstance(exc, torch.OutOfMemoryError) else -1
        self._asked = -1
        nbytes = asked if asked >= 0 else requested_bytes(message)
        self.last = OomNote(error, op, module(), nbytes, now)
        return True

    def noted(self, note: OomNote) -> None:
        """An allocation failure the native path found (NOTE [ OOM capture on the native
        path ] in recorder/native_ledger.py); CUDA's exact bytes win, as in ``failed``."""
        if self._asked >= 0 and note.error.startswith("OutOfMemoryError: "):
            note = OomNote(note.error, note.op, note.module, self._asked, note.time_ns)
        self._asked = -1
        self.last = note

    def attrs(self, error: str, t0: int) -> dict[str, Any]:
        """Run attributes (schema.RUN_FIELDS ``oom_*``) if ``error``, which ended the run, is the
        noted failure; else none. ``t0``: the run's time origin."""
        note = self.last
        if not error or note is None or note.error != error:
            return {}
        return {
            "oom_op": note.op,
            "oom_module": note.module,
            "oom_bytes": note.nbytes,
            "oom_time_ns": max(note.time_ns - t0, 0),
            "oom_message": note.error,
        }

    def clear(self) -> None:
        """A new run begins: forget the last one's failure."""
        self.last = None
