"""A pyqtgraph y axis in binary byte units: ticks at 1, 2, 4 or 5 x 2**(10k) bytes, labelled
``256 MiB``, ``1.5 GiB`` by ``ckview.analysis.format_bytes``."""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg

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

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[Any]:
        target = max(2, int(size / 45))
        return [(0, byte_ticks(minVal, maxVal, target))]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [format_bytes(round(v)) for v in values]
