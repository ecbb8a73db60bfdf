"""Where in the user's code a storage was made: ``ckview record --stacks``.

NOTE [ User frames ]
When an op makes a storage, the Python stack runs from the script down through torch (and the
recorder) to the op hook. The frames that say something to the user are the ones outside
torch, ckview and the standard library's plumbing: the model's ``forward`` line that called
``self.fc(x)``, a library's modelling code (transformers' ``modeling_bert.py`` is code the user
runs, so it counts), the training loop. The recorder keeps up to ``MAX_FRAMES`` of those,
innermost first, interned into the trace's root ``frames`` and ``stacks`` tables (a prefix
tree: one row per distinct frame and caller, NOTE [ The stack prefix tree ] in
ckview/trace/stacks.py), and the storage's ``stack`` column points at the innermost. Memory
only the allocator saw takes the stack of the op that was running.
Walking the stack costs microseconds per op, which is why it is asked for, not always on.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import CodeType

import numpy as np
import torch

import ckpt_runtime
import ckview
from ckview.trace.stacks import StackInterner
from ckview.trace.writer import TraceWriter

MAX_FRAMES = 16
"""User frames kept per stack, innermost first."""


def _package_dir(module: object) -> str:
    return os.path.dirname(os.path.abspath(str(getattr(module, "__file__", "")))) + os.sep


_RECORDER = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""The recorder package's folder (not imported here: its face imports the whole recorder)."""

#: Frames from files under these directories are not the user's (NOTE [ User frames ]).
_NOT_THE_USERS = tuple(
    {_package_dir(torch), _package_dir(ckview), _RECORDER, _package_dir(ckpt_runtime)}
)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _is_users(code: CodeType) -> bool:
    file = code.co_filename
    if file.startswith("<") or file.startswith(_NOT_THE_USERS):  # <frozen runpy>, <string>
        return False
    # A library installed into the standard library's tree is still code the user runs.
    return not file.startswith(_STDLIB) or "-packages" + os.sep in file


class Stacks:
    """Interns the user's current Python stack into rows of the root tables."""

    def __init__(self, writer: TraceWriter) -> None:
        self._intern = writer.intern
        self._frame_base = writer.root_rows("frames")
        self._stacks = StackInterner(writer.root_rows("stacks"))
        self._frames: dict[tuple[CodeType, int], int] = {}
        self._frame_rows: list[tuple[int, int, int]] = []
        self._written = (0, 0)

    def current(self) -> int:
        """The stack row of the user's frames calling the recorder now (-1 if none)."""
        frame = sys._getframe(1)
        rows: list[int] = []
        while frame is not None and len(rows) < MAX_FRAMES:
            code = frame.f_code
            if _is_users(code):
                rows.append(self._frame(code, frame.f_lineno))
            frame = frame.f_back  # type: ignore[assignment]
        return self._stacks.intern(rows)

    def _frame(self, code: CodeType, line: int) -> int:
        key = (code, line)
        row = self._frames.get(key)
        if row is None:
            row = self._frames[key] = self._frame_base + len(self._frame_rows)
            name = getattr(code, "co_qualname", code.co_name)
            self._frame_rows.append((self._intern(code.co_filename), line, self._intern(name)))
        return row

    def write(self, writer: TraceWriter) -> None:
        """Append the rows interned since the last write to the root tables."""
        frames, stacks = self._written
        new_frames = np.asarray(self._frame_rows[frames:], dtype=np.int64).reshape(-1, 3)
        writer.append_root(
            "frames",
            {"file": new_frames[:, 0], "line": new_frames[:, 1], "name": new_frames[:, 2]},
        )
        writer.append_root("stacks", self._stacks.columns(stacks))
        self._written = (len(self._frame_rows), len(self._stacks.rows))
