"""Interning call stacks into the root ``stacks`` table, a prefix tree (docs/trace-format.md).

NOTE [ The stack prefix tree ]
A stack row is one ``(frame, parent)`` pair: a frame called from the stack of ``parent``
(-1 at the outermost frame). A stack is named by the row of its innermost frame. Interning a
stack walks its frames outermost first and reuses the row of every ``(frame, parent)`` pair
already seen, so stacks that share callers share rows, each distinct pair is stored once (the
format's SHOULD) and every ``parent`` is an earlier row (the format's MUST). The recorder
(``recorder/stacks.py``) and the snapshot importer (``ckview/snapshot/convert.py``) both build
their stacks here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .schema import NO_INDEX


class StackInterner:
    """The rows of the root ``stacks`` table, built one stack at a time.

    ``base`` is the number of rows the trace already holds: new rows are numbered after them.
    """

    def __init__(self, base: int = 0) -> None:
        self._base = base
        self._rows: dict[tuple[int, int], int] = {}
        self.rows: list[tuple[int, int]] = []
        """The ``(frame, parent)`` rows interned so far, row ``base + i`` at index ``i``."""

    def intern(self, frames: Sequence[int]) -> int:
        """The stack row of frame rows given innermost first; -1 for no frames.

        NOTE [ The stack prefix tree ].
        """
        parent = NO_INDEX
        for frame in reversed(frames):
            key = (frame, parent)
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = self._base + len(self.rows)
                self.rows.append(key)
            parent = row
        return parent

    def columns(self, start: int = 0) -> dict[str, np.ndarray]:
        """The ``frame`` and ``parent`` columns of the rows interned from index ``start`` on."""
        rows = np.asarray(self.rows[start:], dtype=np.int64).reshape(-1, 2)
        return {"frame": rows[:, 0], "parent": rows[:, 1]}
