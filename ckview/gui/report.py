"""The report ``ckview export`` writes: one figure (PNG or SVG) that compares runs and projected
plans, and the same curves as CSV.

The figure is a pyqtgraph scene rendered offscreen, so it needs a ``QApplication`` but no
display (the CLI sets ``QT_QPA_PLATFORM=offscreen`` before creating one). Every number comes
from ``Run`` and ``PlanOutcome``; this module only lays them out, top to bottom:

    title, subtitle
    legend of the comparison: each curve's peak and its change against the first run
    comparison panel: total live memory of every run (solid) and plan (dashed), peaks marked
    category and phase legend
    one stacked-area panel per run: live bytes by category over its shaded phases

Text sizes are in pixels, not points, so the figure reads the same whatever the paint device's
resolution (a QImage and a QSvgGenerator disagree about points). Plots have fixed heights;
text rows take the height their (possibly wrapped) text needs.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyqtgraph as pg
from pyqtgraph.Qt import QtCore, QtGui, QtWidgets

from ckview.analysis import format_bytes
from ckview.analysis.cost import share
from ckview.analysis.units import MINUS, format_change
from ckview.app.envelope import Envelope
from ckview.app.report import PlanCurve, default_title, plan_notes, plan_x, short_names
from ckview.app.run import CATEGORY_LABELS, STACK_ORDER, Axis, Run, Span
from ckview.app.style import CATEGORY_COLORS, LIGHT, PEAK_COLOR, RUN_COLORS, Theme
from ckview.gui.axes import BytesAxis, byte_ticks
from ckview.trace.schema import Phase

IMAGE_FORMATS = (".png", ".svg")

# Pixel sizes whatever the width; 15 px is 11 pt at 96 dpi, the smallest text of the figure.
TEXT_PX = 15
TITLE_PX = 26
PANEL_TITLE_PX = 17
MARGINS = (16, 14, 30, 14)  # left, top, right, bottom
SPACING = 8
COMPARISON_H = 420
RUN_H = 260
X_LABEL_H = 26
LEFT_AXIS_W = 100
LEGEND_INDENT = LEFT_AXIS_W - 40  # swatches end where the plots' data area begins
SWATCH_W, SWATCH_H = 40, 18
LEGEND_GAP = 24
PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE, Phase.OPTIMIZER)


@dataclass(frozen=True)
class _Curve:
    """One line of the comparison panel."""

    label: str
    color: str
    dashed: bool
    x: np.ndarray
    y: np.ndarray


# ----------------------------------------------------------------------------- public


def render_report(
    runs: Sequence[Run],
    plans: Sequence[PlanCurve],
    path: str,
    *,
    width: int = 1600,
    theme: Theme = LIGHT,
    axis: Axis = Axis.TIME,
    title: str | None = None,
    subtitle: str | None = None,
) -> tuple[int, int]:
    """Draw the report of ``runs`` and projected ``plans`` and save it to ``path`` (``.png`` or
    ``.svg``, by extension). Needs a ``QApplication``; returns the image size (width, height).
    Raises ``ValueError`` for another extension, ``OSError`` if the file cannot be written."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in IMAGE_FORMATS:
        raise ValueError(f"cannot write {path!r}: supported formats are {', '.join(IMAGE_FORMATS)}")
    if not runs:
        raise ValueError("a report needs at least one run")
    title = title or default_title(runs)
    view, height = _build(runs, plans, width, theme, axis, title, subtitle or "")
    try:
        if ext == ".png":
            _save_png(view, path, width, height, theme)
        else:
            _save_svg(view, path, width, height, theme, title)
    finally:
        view.close()
        view.deleteLater()
    return width, height


# ----------------------------------------------------------------------------- layout


def _build(
    runs: Sequence[Run],
    plans: Sequence[PlanCurve],
    width: int,
    theme: Theme,
    axis: Axis,
    title: str,
    subtitle: str,
) -> tuple[pg.GraphicsLayoutWidget, int]:
    """The laid-out figure in an offscreen widget, and its height."""
    text_w = width - MARGINS[0] - MARGINS[2]
    curves = _comparison_curves(runs, plans, axis)
    x_range = _x_range(runs, plans, axis)
    comparison = _plot(theme, axis, show_x_label=True)
    _fill_comparison(comparison, curves, x_range, width, theme)
    # Headroom above the highest stack for the band names.
    y_max = max(float(r.timeline.total.max()) for r in runs) * 1.14
    panels = [_plot(theme, axis, show_x_label=i == len(runs) - 1) for i in range(len(runs))]
    for run, panel, name in zip(runs, panels, short_names(runs), strict=True):
        _fill_run(panel, run, name, x_range, y_max, width, theme, axis)
    lines = [(_LineSwatch(c.color, c.dashed), c.label) for c in curves]
    rows: list[tuple[Any, int | None]] = [
        (_text(title, theme.foreground, TITLE_PX, text_w, bold=True), None),
        (_text(subtitle, _muted(theme), TEXT_PX, text_w), None),
        *[(_text(note, PEAK_COLOR, TEXT_PX, text_w), None) for note in plan_notes(plans)],
        (_legend([lines], text_w, theme, max_columns=1 if len(lines) <= 4 else 2), None),
        (comparison, COMPARISON_H),
        (_category_legend(text_w, theme), None),
    ]
    rows += [(p, RUN_H) for p in panels]
    rows[-1] = (panels[-1], RUN_H + X_LABEL_H)  # only the last run panel names its x axis

    view = pg.GraphicsLayoutWidget()
    view.setAttribute(QtCore.Qt.WidgetAttribute.WA_DontShowOnScreen)
    view.setBackground(theme.background)
    layout = view.ci
    layout.setContentsMargins(*MARGINS)
    layout.setSpacing(SPACING)
    height = MARGINS[1] + MARGINS[3] + SPACING * (len(rows) - 1)
    for i, (item, fixed) in enumerate(rows):
        h = fixed if fixed is not None else _needed_height(item)
        layout.addItem(item, row=i, col=0)
        layout.layout.setRowFixedHeight(i, h)
        height += h
    view.resize(width, height)
    view.show()  # offscreen (WA_DontShowOnScreen): lays the scene out
    QtWidgets.QApplication.processEvents()
    _annotate_peaks(comparison, curves, theme)
    for run, panel in zip(runs, panels, strict=True):
        _label_bands(panel, _bands(run), axis, theme)
    return view, height


def _needed_height(item: QtWidgets.QGraphicsWidget) -> int:
    hint = item.effectiveSizeHint(QtCore.Qt.SizeHint.PreferredSize)
    return max(math.ceil(hint.height()), 1)


def _muted(theme: Theme) -> str:
    """The foreground half-way to the background, for secondary text."""
    a, b = QtGui.QColor(theme.foreground), QtGui.QColor(theme.background)
    mix = [(x + y) // 2 for x, y in zip(a.getRgb()[:3], b.getRgb()[:3], strict=True)]
    return str(QtGui.QColor(*mix).name())


def _font(px: int, *, bold: bool = False) -> QtGui.QFont:
    font = QtGui.QFont()
    font.setPixelSize(px)
    font.setBold(bold)
    return font


def _text(text: str, color: str, px: int, max_width: float, *, bold: bool = False) -> pg.LabelItem:
    """A left-aligned line of text, wrapped to ``max_width`` if longer."""
    text = html.escape(text, quote=False)  # LabelItem takes HTML; file names are not
    label = pg.LabelItem(text, color=color, size=f"{px}px", bold=bold, justify="left")
    if label.itemRect().width() > max_width:
        label.item.setTextWidth(max_width)
        label.updateMin()
    return label


def _fit(text: str, px: int, max_width: float, *, bold: bool = False) -> str:
    """``text`` elided at the end to fit ``max_width`` (a plot title cannot wrap)."""
    metrics = QtGui.QFontMetricsF(_font(px, bold=bold))
    return str(metrics.elidedText(text, QtCore.Qt.TextElideMode.ElideRight, max_width))


def _plot(theme: Theme, axis: Axis, *, show_x_label: bool) -> pg.PlotItem:
    """An empty plot with the theme's axes: bytes on y, ``axis`` on x."""
    plot = pg.PlotItem(axisItems={"left": _BytesAxis(orientation="left")})
    plot.setMenuEnabled(False)
    plot.hideButtons()
    plot.showGrid(x=True, y=True, alpha=theme.grid_alpha)
    for name in ("left", "bottom"):
        ax = plot.getAxis(name)
        ax.setPen(pg.mkPen(theme.foreground))
        ax.setTextPen(pg.mkPen(theme.foreground))
        # Major ticks only: minor grid lines every few ms turn the background into a mesh.
        ax.setStyle(tickFont=_font(TEXT_PX), tickTextOffset=6, tickLength=-6, maxTickLevel=0)
        ax.setZValue(-1)  # the grid it draws goes under the data
    plot.getAxis("left").setWidth(LEFT_AXIS_W)
    if show_x_label:
        plot.setLabel("bottom", axis.label, color=theme.foreground, **{"font-size": f"{TEXT_PX}px"})
    plot.vb.setMouseEnabled(False, False)
    return plot


class _BytesAxis(BytesAxis):
    """``BytesAxis`` with a tick every ~32 px instead of ~45: a 180 px run panel gets 3 or 4
    labelled values, not 1."""

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[Any]:
        return [(0, byte_ticks(minVal, maxVal, max(2, int(size / 32))))]


def _set_title(plot: pg.PlotItem, text: str, theme: Theme, width: int, *, bold: bool) -> None:
    """A plot's title, elided to the width of its data area (``width``: the figure's)."""
    plot.setTitle(
        html.escape(_fit(text, PANEL_TITLE_PX, _plot_pixels(width), bold=bold), quote=False),
        color=theme.foreground,
        size=f"{PANEL_TITLE_PX}px",
        bold=bold,
    )


def _set_ranges(plot: pg.PlotItem, x_range: tuple[float, float], y_max: float) -> None:
    plot.disableAutoRange()
    plot.setXRange(*x_range, padding=0)
    plot.setYRange(0, y_max, padding=0)


def _plot_pixels(width: int) -> int:
    """About the width of a plot's data area: the resolution the envelopes are cut at."""
    return max(width - LEFT_AXIS_W - MARGINS[0] - MARGINS[2], 100)


def _x_range(runs: Sequence[Run], plans: Sequence[PlanCurve], axis: Axis) -> tuple[float, float]:
    """The x range of every panel: from 0 (each run's start) to the end of the longest curve."""
    ends = [float(r.x(axis)[-1]) for r in runs]
    ends += [float(plan_x(o, r, axis)[-1]) for _, o, r in plans if len(o.total)]
    return 0.0, max(max(ends), 1e-6) * 1.01


# ----------------------------------------------------------------------------- comparison


def _change(value: int, ref: int) -> str:
    """``−58.8%`` with a real minus sign (it reads better in a figure)."""
    return format_change(share(value - ref, ref), MINUS)


def _comparison_curves(runs: Sequence[Run], plans: Sequence[PlanCurve], axis: Axis) -> list[_Curve]:
    """Every run's total (solid), then every plan's projection (dashed), with legend labels
    that give the peak and its change against the first run."""
    names = short_names(runs)
    ref, ref_peak = names[0], runs[0].peak.bytes
    curves = []
    for i, (run, name) in enumerate(zip(runs, names, strict=True)):
        label = f"{name}: peak {format_bytes(run.peak.bytes)}"
        if i:
            label += f" ({_change(run.peak.bytes, ref_peak)} vs {ref})"
        color = RUN_COLORS[i % len(RUN_COLORS)]
        curves.append(_Curve(label, color, False, run.x(axis), run.timeline.total))
    for j, (name, outcome, run) in enumerate(plans):
        # Identity, not ==: Run holds arrays.
        base = next((n for r, n in zip(runs, names, strict=True) if r is run), None)
        base = base or short_names([run])[0]
        label = (
            f"plan {name} over {base} (projected): peak {format_bytes(outcome.peak_bytes)} "
            f"({_change(outcome.peak_bytes, ref_peak)} vs {ref}), "
            f"+{outcome.extra_share:.0%} compute"
            + ("" if outcome.plain_times else " (recorded times)")
        )
        if outcome.idle_regions:  # the notes row says why
            label += (
                " (not in effect)"
                if outcome.idle_regions == outcome.regions
                else f" ({outcome.idle_regions} of {outcome.regions} regions not in effect)"
            )
        # Plans continue the run palette: the GUI's single projection colour is too close to
        # the second run's red for a figure that compares several curves.
        color = RUN_COLORS[(len(runs) + j) % len(RUN_COLORS)]
        total = np.asarray(outcome.total, dtype=np.float64)
        curves.append(_Curve(label, color, True, plan_x(outcome, run, axis), total))
    return curves


def _fill_comparison(
    plot: pg.PlotItem,
    curves: Sequence[_Curve],
    x_range: tuple[float, float],
    width: int,
    theme: Theme,
) -> None:
    solid = sum(not c.dashed for c in curves)
    title = "Total live memory"
    title += ", runs aligned at their start" if solid > 1 else ""
    title += " (dashed: projected)" if solid < len(curves) else ""
    _set_title(plot, title, theme, width, bold=True)
    top = max((float(c.y.max()) for c in curves if c.y.size), default=1.0)
    _set_ranges(plot, x_range, max(top, 1.0) * 1.18)  # headroom for the peak labels
    # Dashed projections under the solid runs, so a measured curve is never hidden.
    for curve in sorted(curves, key=lambda c: not c.dashed):
        if not curve.y.size:
            continue
        seen = Envelope(curve.x, curve.y).visible(*x_range, _plot_pixels(width))
        style = QtCore.Qt.PenStyle.DashLine if curve.dashed else QtCore.Qt.PenStyle.SolidLine
        pen = pg.mkPen(curve.color, width=2.5, style=style)
        plot.addItem(pg.PlotCurveItem(seen.x, seen.y[0], pen=pen, stepMode="right", antialias=True))


def _peak_of(curve: _Curve) -> tuple[float, float]:
    i = int(np.argmax(curve.y))
    return float(curve.x[i]), float(curve.y[i])


def _annotate_peaks(plot: pg.PlotItem, curves: Sequence[_Curve], theme: Theme) -> None:
    """A dot on every curve's peak and its value beside it, where no other label or dot is
    (needs the laid-out scene: places labels in scene pixels). Curves that peak at the same
    spot with the same value (a plan that changes nothing) share one label."""
    vb = plot.vb
    peaks = [(_peak_of(c), c) for c in curves if c.y.size]
    dots = [_dot_box(vb.mapViewToScene(QtCore.QPointF(x, y))) for (x, y), _ in peaks]
    labels: list[QtCore.QRectF] = []
    shown: list[tuple[QtCore.QRectF, str]] = []
    for i, ((x, y), curve) in enumerate(peaks):
        dot = pg.ScatterPlotItem(
            [x], [y], size=11, brush=pg.mkBrush(curve.color), pen=pg.mkPen(theme.background)
        )
        dot.setZValue(len(peaks) - i)  # the first curve's dot on top, like its shared label
        plot.addItem(dot)
        value = format_bytes(int(y))
        if any(v == value and box.intersects(dots[i]) for box, v in shown):
            continue
        shown.append((dots[i], value))
        background = QtGui.QColor(theme.background)
        background.setAlpha(210)  # readable over the curves it may cross
        text = pg.TextItem(value, color=curve.color, fill=pg.mkBrush(background))
        text.setFont(_font(TEXT_PX, bold=True))
        others = labels + dots[:i] + dots[i + 1 :]
        anchor, box = _free_spot(dots[i].center(), text.boundingRect().size(), others, vb)
        labels.append(box)
        text.setAnchor(anchor)
        text.setPos(x, y)
        text.setZValue(len(peaks) + 1)
        plot.addItem(text)


def _dot_box(center: QtCore.QPointF) -> QtCore.QRectF:
    return QtCore.QRectF(center.x() - 6, center.y() - 6, 12, 12)


# Anchors of a peak label, by preference: above, above-left, above-right, right, left, below.
_ANCHORS = ((0.5, 1.3), (1.05, 1.1), (-0.05, 1.1), (-0.1, 0.5), (1.1, 0.5), (0.5, -0.3))


def _free_spot(
    dot: QtCore.QPointF, size: QtCore.QSizeF, taken: Sequence[QtCore.QRectF], vb: pg.ViewBox
) -> tuple[tuple[float, float], QtCore.QRectF]:
    """The first anchor whose label box (scene pixels) stays inside the view box and overlaps
    nothing in ``taken``; else the first that stays inside; else 'above'."""
    area = vb.sceneBoundingRect()
    inside = []
    for ax, ay in _ANCHORS:
        box = QtCore.QRectF(
            dot.x() - ax * size.width(), dot.y() - ay * size.height(), size.width(), size.height()
        )
        if area.contains(box):
            if not any(box.intersects(t) for t in taken):
                return (ax, ay), box
            inside.append(((ax, ay), box))
    return inside[0] if inside else (_ANCHORS[0], QtCore.QRectF())


# ----------------------------------------------------------------------------- run panels


def _fill_run(
    plot: pg.PlotItem,
    run: Run,
    name: str,
    x_range: tuple[float, float],
    y_max: float,
    width: int,
    theme: Theme,
    axis: Axis,
) -> None:
    """Stacked categories of one run over its shaded phases, with the peak marked."""
    peak_x = float(run.x(axis)[run.peak.point])
    where = f"{peak_x:.1f} ms" if axis is Axis.TIME else f"op {int(peak_x)}"
    phase = run.phase_of_op(run.op_at(run.peak.point))
    _set_title(
        plot,
        f"{name}: live memory by category; peak {format_bytes(run.peak.bytes)} at {where} "
        f"({phase})",
        theme,
        width,
        bold=False,
    )
    _set_ranges(plot, x_range, y_max)
    for span in _bands(run):
        x0, x1 = span.x_range(axis)
        band = QtWidgets.QGraphicsRectItem(QtCore.QRectF(x0, 0, max(x1 - x0, 0), y_max))
        band.setBrush(pg.mkBrush(_tint(theme, span.kind)))
        band.setPen(QtGui.QPen(QtCore.Qt.PenStyle.NoPen))
        band.setZValue(-10)
        plot.addItem(band, ignoreBounds=True)
    seen = Envelope(run.x(axis), run.stacked).visible(*x_range, _plot_pixels(width))
    # Top layer first: each cumulative layer fills down to 0 over the ones above it.
    for k in reversed(range(len(STACK_ORDER))):
        color = CATEGORY_COLORS[STACK_ORDER[k]]
        plot.addItem(_step_area(seen.x, seen.y[k], color), ignoreBounds=True)
    line = pg.InfiniteLine(peak_x, angle=90, pen=pg.mkPen(PEAK_COLOR, width=1.5, dash=[4, 3]))
    plot.addItem(line, ignoreBounds=True)


def _step_area(x: np.ndarray, y: np.ndarray, color: str) -> QtWidgets.QGraphicsPathItem:
    """The area under a step curve (each value holds until the next x) as ONE filled path.

    Not ``PlotCurveItem(fillLevel=0)``: it fills in chunks of 50 points, whose antialiased
    seams show as pale vertical lines and multiply the shapes of an SVG."""
    xs = np.concatenate([np.repeat(x, 2)[1:], [x[-1], x[0]]])
    ys = np.concatenate([np.repeat(y, 2)[:-1], [0.0, 0.0]])
    path = pg.arrayToQPath(xs, ys, connect="all")
    path.closeSubpath()
    area = QtWidgets.QGraphicsPathItem(path)
    area.setBrush(pg.mkBrush(color))
    area.setPen(pg.mkPen(QtGui.QColor(color).darker(115), width=1))  # cosmetic: 1 px at any zoom
    return area


def _tint(theme: Theme, kind: Phase) -> str:
    """The band colour of a phase (#RRGGBBAA, as ``pg.mkBrush`` reads it)."""
    return theme.phase_tints.get(kind, theme.recompute_tint)


def _bands(run: Run) -> list[Span]:
    """The run's phases, plus recorded recompute regions no recompute phase already covers."""
    covered = [p for p in run.phases if p.kind is Phase.RECOMPUTE]
    extra = [
        r
        for r in run.recomputes
        if not any(p.start_ms < r.end_ms and r.start_ms < p.end_ms for p in covered)
    ]
    return run.phases + extra


def _label_bands(plot: pg.PlotItem, bands: Sequence[Span], axis: Axis, theme: Theme) -> None:
    """Name each band at the top of its panel where the name fits inside it."""
    vb = plot.vb
    metrics = QtGui.QFontMetricsF(_font(TEXT_PX))
    (x_min, x_max), (_, y_top) = vb.viewRange()
    for span in bands:
        x0, x1 = span.x_range(axis)
        x0, x1 = max(x0, x_min), min(x1, x_max)
        left = vb.mapViewToScene(QtCore.QPointF(x0, y_top)).x()
        right = vb.mapViewToScene(QtCore.QPointF(x1, y_top)).x()
        name = span.kind.name.lower()
        if right - left < metrics.horizontalAdvance(name) + 8:
            continue
        text = pg.TextItem(name, color=_muted(theme), anchor=(0, 0))
        text.setFont(_font(TEXT_PX))
        text.setPos(x0, y_top)
        plot.addItem(text, ignoreBounds=True)


def _category_legend(text_w: float, theme: Theme) -> pg.GraphicsLayout:
    """One legend for every run panel: the categories (top of the stack first), then the phase
    bands on their own line."""
    categories = [
        (_FillSwatch(CATEGORY_COLORS[c]), CATEGORY_LABELS[c]) for c in reversed(STACK_ORDER)
    ]
    phases = [
        (_FillSwatch(_tint(theme, p), outline=_muted(theme)), f"{p.name.lower()} phase")
        for p in PHASES
    ]
    return _legend([categories, phases], text_w, theme, max_columns=len(categories))


# ----------------------------------------------------------------------------- legends


class _Swatch(pg.GraphicsWidget):
    """A legend sample drawn with a painter (the same in PNG and SVG)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFixedWidth(SWATCH_W)
        self.setFixedHeight(SWATCH_H)

    def boundingRect(self) -> QtCore.QRectF:
        return QtCore.QRectF(0, 0, SWATCH_W, SWATCH_H)


class _LineSwatch(_Swatch):
    def __init__(self, color: str, dashed: bool) -> None:
        super().__init__()
        style = QtCore.Qt.PenStyle.DashLine if dashed else QtCore.Qt.PenStyle.SolidLine
        self.pen = pg.mkPen(color, width=3, style=style)

    def paint(self, painter: QtGui.QPainter, *args: Any) -> None:
        painter.setPen(self.pen)
        painter.drawLine(
            QtCore.QPointF(2, SWATCH_H / 2), QtCore.QPointF(SWATCH_W - 2, SWATCH_H / 2)
        )


class _FillSwatch(_Swatch):
    def __init__(self, color: str, outline: str | None = None) -> None:
        super().__init__()
        self.brush = pg.mkBrush(color)
        self.pen = pg.mkPen(outline or QtGui.QColor(color).darker(120), width=1)

    def paint(self, painter: QtGui.QPainter, *args: Any) -> None:
        painter.setPen(self.pen)
        painter.setBrush(self.brush)
        painter.drawRect(QtCore.QRectF(6, 1, SWATCH_W - 12, SWATCH_H - 2))


def _legend(
    groups: Sequence[Sequence[tuple[_Swatch, str]]],
    text_w: float,
    theme: Theme,
    *,
    max_columns: int,
) -> pg.GraphicsLayout:
    """Swatch and label pairs in a grid, row by row, each group starting a new row; as many
    columns (up to ``max_columns``) as the widest label allows, labels wrapped if one column
    is still too narrow."""
    grid = pg.GraphicsLayout()
    grid.setContentsMargins(LEGEND_INDENT, 0, 0, 0)
    grid.setSpacing(2)
    available = text_w - LEGEND_INDENT
    labels = [
        [_text(t, theme.foreground, TEXT_PX, available - SWATCH_W) for _, t in g] for g in groups
    ]
    widest = max((lbl.itemRect().width() for g in labels for lbl in g), default=0.0)
    columns = int(max(1, min(max_columns, available // (SWATCH_W + widest + LEGEND_GAP))))
    row = 0
    for group, group_labels in zip(groups, labels, strict=True):
        for i, ((swatch, _), label) in enumerate(zip(group, group_labels, strict=True)):
            r, c = divmod(i, columns)
            grid.addItem(swatch, row=row + r, col=2 * c)
            grid.layout.setAlignment(swatch, QtCore.Qt.AlignmentFlag.AlignVCenter)
            grid.addItem(label, row=row + r, col=2 * c + 1)
        row += -(-len(group) // columns)
    for c in range(columns):
        grid.layout.setColumnFixedWidth(2 * c + 1, min(widest + LEGEND_GAP, available - SWATCH_W))
    return grid


# ----------------------------------------------------------------------------- saving


def _save_png(
    view: pg.GraphicsLayoutWidget, path: str, width: int, height: int, theme: Theme
) -> None:
    image = QtGui.QImage(width, height, QtGui.QImage.Format.Format_ARGB32)
    image.fill(QtGui.QColor(theme.background))
    _render(view, QtGui.QPainter(image), width, height)
    if not image.save(path, "PNG"):
        raise OSError(f"cannot write {path}")


def _save_svg(
    view: pg.GraphicsLayoutWidget, path: str, width: int, height: int, theme: Theme, title: str
) -> None:
    from PyQt6 import QtSvg

    generator = QtSvg.QSvgGenerator()
    generator.setFileName(path)
    generator.setSize(QtCore.QSize(width, height))
    generator.setViewBox(QtCore.QRect(0, 0, width, height))
    generator.setResolution(96)
    generator.setTitle(title)
    generator.setDescription("ckview export")
    painter = QtGui.QPainter(generator)
    if not painter.isActive():
        raise OSError(f"cannot write {path}")
    painter.fillRect(QtCore.QRectF(0, 0, width, height), QtGui.QColor(theme.background))
    _render(view, painter, width, height)


def _render(
    view: pg.GraphicsLayoutWidget, painter: QtGui.QPainter, width: int, height: int
) -> None:
    """Render the whole scene 1:1 into ``painter``, then end it."""
    painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QtGui.QPainter.RenderHint.TextAntialiasing)
    rect = QtCore.QRectF(0, 0, width, height)
    try:
        with _export_mode(view.scene(), painter):
            view.scene().render(painter, rect, rect)
    finally:
        painter.end()


@contextmanager
def _export_mode(scene: QtWidgets.QGraphicsScene, painter: QtGui.QPainter) -> Iterator[None]:
    """Tell pyqtgraph items they are being exported, as its exporters do: scatter dots then
    draw as vector shapes instead of cached pixmaps, and curves antialiased."""
    items = [i for i in scene.items() if hasattr(i, "setExportMode")]
    for item in items:
        item.setExportMode(True, {"antialias": True, "painter": painter})
    try:
        yield
    finally:
        for item in items:
            item.setExportMode(False)
