"""Step curves drawn from an ``Envelope``: only the visible slice, about two bins per pixel.

``EnvelopeCurves`` owns one ``PlotCurveItem`` per curve of an envelope and redraws them when the
view's x range or size changes (NOTE [ Max envelope ] in ``ckview.app.envelope``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PyQt6.QtGui import QBrush, QColor, QPen

from ckview.app.envelope import Envelope


def color(hex_color: str, alpha: int | None = None) -> QColor:
    """A QColor from ``#RRGGBB`` or ``#RRGGBBAA`` (alpha overrides)."""
    c = QColor(hex_color[:7])
    if len(hex_color) == 9:
        c.setAlpha(int(hex_color[7:], 16))
    if alpha is not None:
        c.setAlpha(alpha)
    return c


def over(hex_color: str, background: str) -> QColor:
    """``#RRGGBBAA`` composited over an opaque ``background``, as an opaque colour: looks the
    same, and an opaque fill skips Qt's per-pixel blending (a large share of a paint)."""
    top, base = color(hex_color), QColor(background)
    a = top.alphaF()
    return QColor.fromRgbF(
        top.redF() * a + base.redF() * (1 - a),
        top.greenF() * a + base.greenF() * (1 - a),
        top.blueF() * a + base.blueF() * (1 - a),
    )


class _StepCurve(pg.PlotCurveItem):
    """A ``PlotCurveItem`` that fills with one path. pyqtgraph (0.13.4+) cuts a fill into
    50-point pieces, one ``QPainter.fillPath`` each: on Qt's raster engine the hundreds of
    calls per paint of a few thousand step points cost more than the pixels."""

    def _shouldUseFillPathList(self) -> bool:
        return False


class EnvelopeCurves:
    """The curves of one envelope on one plot, as filled areas or lines."""

    def __init__(
        self,
        plot: pg.PlotItem,
        envelope: Envelope,
        pens: Sequence[QPen | None],
        brushes: Sequence[QBrush | None] | None = None,
        z: float = 0.0,
        halos: Sequence[QPen | None] | None = None,
    ) -> None:
        """Curve ``i`` of ``envelope`` gets ``pens[i]`` and, if given, ``brushes[i]`` (filled
        down to 0) and ``halos[i]``, a wider pen drawn under it so that the line reads on any
        fill. Filled curves stack: each is a cumulative sum, so lower layers paint on top of
        the higher ones they sit under."""
        self.plot, self.envelope = plot, envelope
        k = envelope.levels_y[0].shape[0]
        fills = brushes or [None] * k
        self.items: list[pg.PlotCurveItem] = []
        for i in range(k):
            item = _StepCurve(
                x=np.zeros(1),
                y=np.zeros(0),
                pen=pens[i] if pens[i] is not None else pg.mkPen(None),
                brush=fills[i],
                fillLevel=0 if fills[i] is not None else None,
                stepMode="center",
                skipFiniteCheck=True,
            )
            item.setZValue(z - i * 0.01 if brushes else z + i * 0.01)
            self.items.append(item)
            plot.addItem(item)
        self.halos: list[tuple[int, pg.PlotCurveItem]] = []
        """(curve index, item) of every halo, drawn just under its curve."""
        for i, halo in enumerate(halos or []):
            if halo is not None:
                under = _StepCurve(
                    x=np.zeros(1), y=np.zeros(0), pen=halo, stepMode="center", skipFiniteCheck=True
                )
                under.setZValue(self.items[i].zValue() - 0.005)
                self.halos.append((i, under))
                plot.addItem(under)

    def update(self, x0: float, x1: float, pixels: int) -> int:
        """Redraw for the visible ``[x0, x1]`` over ``pixels`` pixels; returns points drawn."""
        vis = self.envelope.visible(x0, x1, pixels)
        if vis.x.size == 0:
            for item in [*self.items, *(under for _, under in self.halos)]:
                item.setData(np.zeros(1), np.zeros(0))
            return 0
        for item, y in zip(self.items, vis.y, strict=True):
            item.setData(vis.edges, y)
        for i, under in self.halos:
            under.setData(vis.edges, vis.y[i])
        return int(vis.x.size)

    def set_envelope(self, envelope: Envelope) -> None:
        """Draw another envelope of as many curves with the same items (call ``update``)."""
        if envelope.levels_y[0].shape[0] != len(self.items):
            raise ValueError("the new envelope has another number of curves")
        self.envelope = envelope

    def remove(self) -> None:
        for item in [*self.items, *(under for _, under in self.halos)]:
            self.plot.removeItem(item)
        self.items, self.halos = [], []


def visible_pixels(plot: pg.PlotItem) -> int:
    """Width of the plot's view box in device pixels (at least 100)."""
    return max(int(plot.getViewBox().width()), 100)
