"""A pyqtgraph y axis in binary byte units: ticks at 1, 2, 4 or 5 x 2**(10k) bytes, labelled
``256 MiB``, ``1.5 GiB`` by ``ckview.analysis.format_bytes``."""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PyQt6.QtCore import QRectF
from PyQt6.QtGui import QPainter

from ckview.analysis import format_bytes

_MULTIPLES = (1, 2, 2.5, 5)


def byte_ticks(low: float, high: float, target: int = 6) -> list[float]:
    """About ``target`` round byte values in ``[low, high]``: m x 10**e x 2**(10k), so labels
    read ``200 MiB``, ``1.5 GiB``."""
    span = max(high - low, 1.0)
    unit = 1024.0 ** max(0, min(6, int(math.log(max(high, 1.0), 1024))))
    raw = span / unit / max(target, 1)
    power = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next((m * power for m in _MULTIPLES if m * power >= raw), 10 * power) * unit
    step = max(step, 1.0)  # whole bytes
    first = math.ceil(max(low, 0.0) / step) * step
    count = int((high - first) // step) + 1
    return [first + i * step for i in range(max(count, 0))]


class BytesAxis(pg.AxisItem):
    """Left axis of a memory plot."""

    def drawPicture(self, p: Any, axisSpec: Any, tickSpecs: Any, textSpecs: Any) -> None:
        """pyqtgraph's, but horizontal tick and grid lines are filled one-pixel rectangles:
        Qt's raster engine strokes a line at ~0.1 us a pixel and fills a row span ~30x faster
        (a grid across a 1500-pixel plot: ~3 ms a paint stroked, ~0.1 ms filled)."""
        rows = [(pen, a, b) for pen, a, b in tickSpecs if a.y() == b.y()]
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        for pen, a, b in rows:
            width = max(pen.widthF(), 1.0)
            left, right = sorted((a.x(), b.x()))
            p.fillRect(QRectF(left, a.y() - width / 2, right - left, width), pen.color())
        rest = [spec for spec in tickSpecs if spec[1].y() != spec[2].y()]
        super().drawPicture(p, axisSpec, rest, textSpecs)

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[Any]:
        target = max(2, int(size / 45))
        return [(0, byte_ticks(minVal, maxVal, target))]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [format_bytes(round(v)) for v in values]
