"""A pyqtgraph y axis in binary byte units: ticks every power of two bytes (1, 2, 4, 8... x
B/KiB/MiB/GiB), labelled exactly (``256 KiB``, ``1.25 MiB``), the same in every panel and in the
exported report (NOTE [ Binary byte ticks ])."""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PyQt6.QtCore import QRectF
from PyQt6.QtGui import QPainter

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

# NOTE [ Binary byte ticks ]
# Memory is allocated in powers of two, so the y axis steps by a power of two bytes: the step
# is the smallest 2**k with at most ``target`` ticks over the range. Every tick is then a whole
# multiple of 2**k, and its label is exact in the largest binary unit not above it (``768
# KiB``, ``1.25 MiB``): a decimal step over bytes would read ``205 B, 410 B, 614 B``, and
# ``format_bytes``' three significant digits would round a tick such as 1.125 MiB.


def byte_step(low: float, high: float, target: int = 6) -> int:
    """The tick step over ``[low, high]``: the smallest power of two bytes giving at most
    ``target`` intervals (NOTE [ Binary byte ticks ])."""
    span = max(high - low, 1.0)
    return 2 ** max(0, math.ceil(math.log2(span / max(target, 1))))


def byte_ticks(low: float, high: float, target: int = 6) -> list[float]:
    """The multiples of ``byte_step`` in ``[max(low, 0), high]`` (NOTE [ Binary byte ticks ])."""
    step = byte_step(low, high, target)
    first = math.ceil(max(low, 0.0) / step)
    last = math.floor(high / step) if high >= 0 else first - 1
    return [float(i * step) for i in range(first, last + 1)]


def tick_label(value: float) -> str:
    """A tick value (a multiple of a power of two bytes) in the largest binary unit not above
    it, with no more digits than it needs: ``0``, ``512 B``, ``768 KiB``, ``1.25 MiB``."""
    n = round(value)
    if n == 0:
        return "0"
    power = min(int(math.log2(abs(n)) // 10), len(_UNITS) - 1)
    text = f"{n / 1024**power:.3f}".rstrip("0").rstrip(".")
    return f"{text} {_UNITS[power]}"


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
        return [tick_label(v) for v in values]
