"""Peak-preserving downsampling of step curves, so a redraw costs the same for 1e3 or 1e7 points.

NOTE [ Max envelope ]
    Memory curves are steps: a point's value holds until the next point. ``Envelope`` keeps a
    pyramid of levels; level ``L`` has one bin per ``FACTOR ** L`` consecutive points, placed at
    the x of its first point, holding the maximum of each curve over the bin. Drawn as steps,
    a level is never below the curve it stands for and touches it at every bin's maximum, so
    no peak is lost at any zoom (it can only widen a peak to its bin). Curves stacked in order
    stay in order (the max of a sum of non-negative layers is at least the max of the part).
    ``visible`` picks the finest level with at most ``per_pixel`` bins per pixel of the visible
    x range and returns only that slice: the cost of a redraw depends on the widget width, not
    on the number of points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FACTOR = 4


@dataclass(frozen=True)
class Visible:
    """A slice of one envelope level: bin ``j`` holds ``y[:, j]`` from ``edges[j]`` to
    ``edges[j + 1]`` (the last bin ends at the next bin's start, or at the last point)."""

    edges: np.ndarray
    """(m+1,) x of the bins' starts, then where the last one ends."""
    y: np.ndarray
    """(k, m) the curves' maxima over each bin."""
    level: int

    @property
    def x(self) -> np.ndarray:
        """(m,) x of each bin's start."""
        return self.edges[:-1]


class Envelope:
    """Max-envelope pyramid over curves that share one non-decreasing x (NOTE [ Max envelope ])."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        smallest: int = 512,
        x_offset: int = 0,
        x_divisor: float = 1.0,
    ) -> None:
        """``x``: (n,) non-decreasing; ``y``: (k, n) or (n,) values. Levels stop once a level
        has at most ``smallest`` bins. ``x`` and ``y`` keep their dtypes (an int64 curve of
        1e6 points is not copied to float64 on every toggle); the x shown, which ``visible``
        takes and returns, is ``(x - x_offset) / x_divisor`` (ns to ms: ``t0, 1e6``)."""
        ys = np.atleast_2d(np.asarray(y))
        xs = np.asarray(x)
        if ys.shape[1] != xs.shape[0]:
            raise ValueError(f"x has {xs.shape[0]} points but y has {ys.shape[1]}")
        self.x_offset, self.x_divisor = x_offset, x_divisor
        self.levels_x = [xs]
        self.levels_y = [ys]
        while self.levels_x[-1].size > smallest:
            px, py = self.levels_x[-1], self.levels_y[-1]
            self.levels_x.append(px[::FACTOR])
            self.levels_y.append(_bin_max(py))

    def shown(self, x: np.ndarray) -> np.ndarray:
        """Stored x as shown (float64)."""
        out = np.array(x, dtype=np.float64)
        if self.x_offset or self.x_divisor != 1.0:
            out -= self.x_offset
            out /= self.x_divisor
        return out

    def _stored(self, x: float, up: bool) -> float | int:
        """A shown x as a query on the stored x (an int rounded ``up`` or down for integer
        x, so ``searchsorted`` does not convert the whole level to float)."""
        value = x * self.x_divisor + self.x_offset
        if self.levels_x[0].dtype.kind in "iu":
            return math.ceil(value) if up else math.floor(value)
        return value

    def visible(self, x0: float, x1: float, pixels: int, per_pixel: float = 2.0) -> Visible:
        """The bins covering ``[x0, x1]`` at the finest level with at most ``per_pixel`` bins
        per pixel, plus one bin either side so steps run to the edges."""
        x = self.levels_x[0]
        if x.size == 0:
            return Visible(np.zeros(1), self.levels_y[0].astype(np.float64), 0)
        # From the point holding the value at x0 to the last point at or before x1.
        first = max(int(np.searchsorted(x, self._stored(x0, True), side="left")) - 1, 0)
        last = int(np.searchsorted(x, self._stored(x1, False), side="right"))
        stop = max(min(last, x.size), first + 1)
        budget = max(int(pixels * per_pixel), 2)
        level = 0
        while level + 1 < len(self.levels_x) and (stop - first) / FACTOR**level > budget:
            level += 1
        scale = FACTOR**level
        a, b = first // scale, -(-stop // scale)
        xs = self.levels_x[level]
        end = xs[b] if b < xs.size else x[-1]
        edges = self.shown(np.append(xs[a:b], end))
        return Visible(edges, self.levels_y[level][:, a:b].astype(np.float64), level)


def _bin_max(y: np.ndarray) -> np.ndarray:
    """(k, ceil(n / FACTOR)): the maximum of every FACTOR consecutive columns of ``y`` (k, n),
    the last bin holding what is left; what ``np.maximum.reduceat`` gives, several times
    faster: an element-wise maximum of the FACTOR strided slices of the whole bins."""
    k, n = y.shape
    whole = n // FACTOR
    out = np.empty((k, -(-n // FACTOR)), dtype=y.dtype)
    head = out[:, :whole]
    np.maximum(y[:, 0 : whole * FACTOR : FACTOR], y[:, 1 : whole * FACTOR : FACTOR], out=head)
    for i in range(2, FACTOR):
        np.maximum(head, y[:, i : whole * FACTOR : FACTOR], out=head)
    if whole < out.shape[1]:
        out[:, whole] = y[:, whole * FACTOR :].max(axis=1)
    return out
