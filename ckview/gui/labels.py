"""Where the timeline's labels go: peak labels, recompute mark labels and phase names placed
so that no two shown meet, by arithmetic on scene pixels.

NOTE [ Labels never overlap ]
    The main plot writes three kinds of label near its top: the peak labels (the recorded peak's,
    boxed above its dot, and the projected peak's, boxed below its dot), the recompute marks'
    labels (running down their line from just under the top) and the phase bands' names (at the
    top left of each band's visible part). On a checkpointed run the peak usually falls in
    backward, where the recomputes are: one label drawn over another makes both unreadable, and
    the peak is the number users came for. So, in this order (``place_labels``):
      1. The peak labels always show while their dot is in view, the recorded one first, then
         the projected one; each slides along x to stay wholly inside the plot, and goes to the
         other side of its dot where it would leave the plot at the top or bottom, or cover the
         peak label placed before it.
      2. A recompute label runs down its line from just under the top; where it would meet a
         peak label it starts just below that label instead (a checkpointed run's marks cluster
         around its peak), and it shows only where, so placed, it meets no peak label, stays in
         the plot and does not meet the recompute label shown before it (left to right).
      3. A phase name shows only where its box meets none of those, fits in its band and starts
         after the previous name; the shorter name (``backward`` for ``backward 0``) is tried too.
    Recompute labels win over phase names: a phase is still told by its band's tint and its name
    shows again once zoomed in or panned, but a recompute label names one event at one moment and
    nothing else on the plot names it. A hidden label's line, band and tooltip stay.
    Boxes are scene pixels computed from the view range and each text's size, a few dozen
    rectangles at most (``LabelGeometry``): the items' own transforms follow a range change only
    when painted, and a scene-wide query per frame would cost what the envelope saves. They are
    placed again on every x range change, resize, y fit and plan toggle (``TimelineView._redraw``,
    ``_fit_y``); tests/test_gui_labels.py checks the rule from the boxes Qt paints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyqtgraph as pg
from PyQt6.QtCore import QPointF, QRectF

Placed = list[tuple[pg.TextItem, QRectF]]
"""Labels shown, each with its box in scene pixels."""

LABEL_GAP = 2.0
"""Pixels kept free between two labels shown (NOTE [ Labels never overlap ]): closer, their
boxes read as one."""

MARK_LABEL_AT = 0.94
"""Where a recompute label's end sits along its line, from the bottom of the view (0) to the
top (1): just under the top, the label running down the line."""

PEAK_SIDES = (1.25, -0.25)
"""The recorded peak label's vertical anchors: above its dot, else below it."""

PROJECTED_SIDES = (-0.3, 1.3)
"""The projected peak label's vertical anchors: below its dot, else above it."""


@dataclass
class BandLabel:
    """A phase band's name, shown where it fits inside the visible part of its band."""

    item: pg.TextItem
    x0: float
    x1: float
    names: list[tuple[str, float]]
    """The names to try, longest first (``optimizer 0``, ``optimizer``), with their widths in
    pixels."""
    height: float
    """The names' height in pixels."""


@dataclass
class LabelGeometry:
    """The main plot's view mapped to scene pixels, as of now (NOTE [ Labels never overlap ]):
    where a label's box falls, by arithmetic, and whether it is free of the boxes taken."""

    vb: pg.ViewBox
    area: QRectF
    """The view box in scene pixels."""
    origin: QPointF
    """View point (0, 0) in scene pixels."""
    scale: QPointF
    """Scene pixels per view unit along x and y (negative along y: up is smaller)."""

    @classmethod
    def of(cls, vb: pg.ViewBox) -> LabelGeometry:
        """The view box's mapping as of now: two points mapped by Qt, the rest arithmetic
        (the view is scaled and moved, never turned)."""
        origin = vb.mapViewToScene(QPointF(0.0, 0.0))
        return cls(
            vb, vb.sceneBoundingRect(), origin, vb.mapViewToScene(QPointF(1.0, 1.0)) - origin
        )

    def at(self, x: float, y: float) -> QPointF:
        """A view point in scene pixels."""
        return QPointF(self.origin.x() + x * self.scale.x(), self.origin.y() + y * self.scale.y())

    @staticmethod
    def box(at: QPointF, label: pg.TextItem, anchor: tuple[float, float]) -> QRectF:
        """The box of an upright ``label`` anchored at scene point ``at``."""
        size = label.textItem.boundingRect().size()
        w, h = size.width(), size.height()
        return QRectF(at.x() - anchor[0] * w, at.y() - anchor[1] * h, w, h)

    @staticmethod
    def met(box: QRectF, taken: list[QRectF]) -> list[QRectF]:
        """The boxes of ``taken`` that ``box``, with ``LABEL_GAP`` around it, meets."""
        grown = box.adjusted(-LABEL_GAP, -LABEL_GAP, LABEL_GAP, LABEL_GAP)
        return [other for other in taken if grown.intersects(other)]

    @staticmethod
    def free(box: QRectF, taken: list[QRectF]) -> bool:
        """True when ``box``, with ``LABEL_GAP`` around it, meets none of ``taken``."""
        return not LabelGeometry.met(box, taken)


def place_labels(
    geometry: LabelGeometry,
    peaks: Sequence[tuple[object, tuple[float, float]]],
    marks: Iterable[pg.InfiniteLine],
    bands: Sequence[BandLabel],
) -> Placed:
    """Show and place the labels at the top of the main plot, the peak labels first, so that
    no two shown meet (NOTE [ Labels never overlap ]): ``peaks`` (a peak label, or None, with
    its vertical anchors), the labels of the recompute ``marks``, then the ``bands``' names.
    Returns each label shown with its box."""
    placed = _place_value_labels(geometry, peaks)
    taken = [box for _, box in placed]
    shown = _place_mark_labels(geometry, marks, taken)
    taken += [box for _, box in shown]
    return placed + shown + _place_band_labels(geometry, bands, taken)


def _place_value_labels(
    geometry: LabelGeometry, peaks: Sequence[tuple[object, tuple[float, float]]]
) -> Placed:
    """Keep the peak labels wholly inside the plot: centred over their dot, slid along x
    near the plot's sides (ending at the dot at the very edge), on their other side of the
    dot where the first would leave the plot or cover the label placed before; hidden with
    their dot out of view (a label cut by the edge reads as another value)."""
    area = geometry.area
    inner = area.adjusted(1.0, 1.0, -1.0, -1.0)
    placed: list[tuple[pg.TextItem, QRectF]] = []
    for label, sides in peaks:
        if not isinstance(label, pg.TextItem):
            continue
        at = geometry.at(label.pos().x(), label.pos().y())
        if not show(label, area.left() <= at.x() <= area.right()):
            continue
        width = max(label.textItem.boundingRect().width(), 1.0)
        # Centred where it fits; else the least shift that keeps it a pixel inside (flush
        # with the edge, rounding can put the drawn box a hair across it).
        ends_inside = 1 - (inner.right() - at.x()) / width
        starts_inside = (at.x() - inner.left()) / width
        across = min(max(min(max(0.5, ends_inside), starts_inside), 0.0), 1.0)
        boxes = [(side, geometry.box(at, label, (across, side))) for side in sides]
        fits = [
            (side, box)
            for side, box in boxes
            if inner.top() <= box.top()
            and box.bottom() <= inner.bottom()
            and geometry.free(box, [b for _, b in placed])
        ]
        side, box = (fits or boxes)[0]
        if (label.anchor.x(), label.anchor.y()) != (across, side):
            label.setAnchor((across, side))
        placed.append((label, box))
    return placed


def _place_mark_labels(
    geometry: LabelGeometry, marks: Iterable[pg.InfiniteLine], taken: list[QRectF]
) -> Placed:
    """Show a recompute mark's label where its line is in view and the label, from just
    under the top or else just below the peak labels it would meet, meets none of ``taken``
    and not the previous label shown (marks a few pixels apart at this zoom: the tooltip
    still names each)."""
    # A line made without a label (more marks than MAX_MARK_LABELS) has no ``label``.
    lines = [line for line in marks if getattr(line, "label", None)]
    area = geometry.area
    shown: list[tuple[pg.TextItem, QRectF]] = []
    for line in sorted(lines, key=lambda line: line.value()):
        label = line.label
        x = geometry.at(line.value(), 0.0).x()
        size = label.textItem.boundingRect().size()
        # Turned a quarter (read upwards), the text's end at the top of its box and its
        # top against the line: the box runs down from there, right of the line, as wide
        # as the text is tall.
        box = _mark_label_box(area, x, size.height(), size.width(), taken)
        # The labels are as wide: the last one shown is the nearest on the left. A line
        # out of view keeps no label (cut by the edge).
        fits = area.left() <= x <= area.right() and box.bottom() <= area.bottom() - 1.0
        if show(label, fits and geometry.free(box, taken + [b for _, b in shown[-1:]])):
            at = (area.bottom() - box.top()) / max(area.height(), 1.0)
            if abs(label.orthoPos - at) > 1e-6:
                label.setPosition(at)
            shown.append((label, box))
    return shown


def _place_band_labels(
    geometry: LabelGeometry, bands: Sequence[BandLabel], taken: list[QRectF]
) -> Placed:
    """Show each band's name at the left of the band's visible part, where it fits in it
    and meets no box in ``taken`` (the peak and recompute labels): names never run into
    the next band (a checkpointed run's recompute bands are narrow), and zooming in
    reveals them."""
    vb = geometry.vb
    (v0, v1), (_, top) = vb.viewRange()
    per_px = (v1 - v0) / max(vb.width(), 1.0)
    free_from = v0  # bands can overlap in time (a backward op around a recompute)
    shown: list[tuple[pg.TextItem, QRectF]] = []
    for band in sorted(bands, key=lambda b: max(b.x0, v0)):
        left, right = max(band.x0, v0, free_from), min(band.x1, v1)
        at = geometry.at(left, top)
        fits = [
            (text, width, box)
            for text, width in band.names
            if right - left >= (width + LABEL_GAP) * per_px
            and geometry.free(box := QRectF(at.x(), at.y(), width, band.height), taken)
        ]
        if show(band.item, bool(fits)):
            text, width, box = fits[0]
            if band.item.textItem.toPlainText() != text:
                band.item.setText(text)
            if band.item.pos() != QPointF(left, top):
                band.item.setPos(left, top)
            free_from = left + (width + LABEL_GAP) * per_px
            shown.append((band.item, box))
    return shown


def _mark_label_box(
    area: QRectF, x: float, width: float, height: float, taken: list[QRectF]
) -> QRectF:
    """A recompute label's box (NOTE [ Labels never overlap ]): from just under the top of the
    plot, or else from just below the boxes in ``taken`` that it would meet."""
    box = QRectF(x, area.bottom() - MARK_LABEL_AT * area.height(), width, height)
    for _ in taken:  # each move clears one box at least
        met = LabelGeometry.met(box, taken)
        if not met:
            break
        box.moveTop(max(other.bottom() for other in met) + 2 * LABEL_GAP)
    return box


def show(item: pg.GraphicsObject, visible: bool) -> bool:
    """Set ``item``'s visibility only if it changes (each call costs an update); returns it."""
    if item.isVisible() != visible:
        item.setVisible(visible)
    return visible
