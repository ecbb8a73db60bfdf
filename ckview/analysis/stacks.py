"""Call stacks of storages (the root ``frames`` and ``stacks`` tables, format v4) for people,
and the reserved memory of a run's allocator segments (run table ``segments``).

NOTE [ The frame that names an allocation ]
    A stack lists every frame from the allocator up to ``<module>``: in a CUDA snapshot the
    innermost ones are C++ (``torch::unwind``, ``c10::cuda::CUDACachingAllocator``...), which
    say nothing about the user's code. An allocation is named by its innermost Python frame
    (a file ending in ``.py``); a stack of C++ frames only (autograd's engine thread runs
    backward without Python frames) is named as such, not by an allocator internal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckview.analysis.types import Table
from ckview.trace.schema import NO_INDEX

NO_PYTHON_FRAME = "(C++ frames only)"


def stack_frames(stacks: Table, stack: int) -> list[int]:
    """Rows of ``frames`` of stack row ``stack``, innermost first ([] for -1)."""
    parent = np.asarray(stacks["parent"])
    frame = np.asarray(stacks["frame"])
    rows: list[int] = []
    while stack != NO_INDEX and 0 <= stack < len(parent) and len(rows) <= len(parent):
        rows.append(int(frame[stack]))
        stack = int(parent[stack])
    return rows


def frame_label(frames: Table, strings: Sequence[str], row: int) -> str:
    """``file:line (function)`` of frame row ``row``."""
    file = strings[int(frames["file"][row])]
    name = strings[int(frames["name"][row])]
    return f"{file}:{int(frames['line'][row])} ({name})"


def allocation_site(frames: Table, stacks: Table, strings: Sequence[str], stack: int) -> str:
    """The frame that names an allocation (NOTE [ The frame that names an allocation ]) as
    ``file:line (function)``, ``NO_PYTHON_FRAME`` for C++ frames only; '' if the stack is
    unknown."""
    rows = stack_frames(stacks, stack)
    if not rows:
        return ""
    files = np.asarray(frames["file"])
    python = [r for r in rows if strings[int(files[r])].endswith(".py")]
    return frame_label(frames, strings, python[0]) if python else NO_PYTHON_FRAME


def reserved_peak(segments: Table) -> int:
    """The most bytes reserved at once by the segments of a run (the CUDA caching allocator's
    reserved memory; 0 without segments). A segment with ``alloc_ns`` -1 is reserved from the
    start, one with ``free_ns`` -1 to the end; at equal times releases count first."""
    nbytes = np.asarray(segments["nbytes"], np.int64)
    if not len(nbytes):
        return 0
    alloc = np.asarray(segments["alloc_ns"], np.int64)
    free = np.asarray(segments["free_ns"], np.int64)
    start = int(min(alloc.min(), 0)) - 1
    end = int(max(alloc.max(), free.max())) + 1
    times = np.concatenate((np.where(alloc < 0, start, alloc), np.where(free < 0, end, free)))
    deltas = np.concatenate((nbytes, -nbytes))
    order = np.lexsort((deltas, times))  # at one time, releases (negative) first
    return int(max(np.cumsum(deltas[order]).max(), 0))
