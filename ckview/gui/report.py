"""The report ``ckview export`` writes: one figure (PNG or SVG) that compares runs and projected
plans, and the same curves as CSV.

The figure is a pyqtgraph scene rendered offscreen, so it needs a ``QApplication`` but no
display (the CLI sets ``QT_QPA_PLATFORM=offscreen`` before creating one). Every number comes
from ``RunData`` and ``PlanOutcome``; this module only lays them out:

    title, subtitle
    comparison panel: total live memory of every run (solid) and plan (dashed), peaks marked
    category legend
    one stacked-area panel per run: live bytes by category over shaded phases

Text sizes are in pixels, not points, so the figure reads the same whatever the paint device's
resolution (a QImage and a QSvgGenerator disagree about points).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from pyqtgraph.Qt import QtCore, QtGui, QtWidgets

from ckview.analysis import format_bytes
from ckview.gui.axes import BytesAxis
from ckview.gui.envelope import Envelope
from ckview.gui.planning import PlanOutcome
from ckview.gui.rundata import CATEGORY_LABELS, STACK_ORDER, Axis, RunData, Span
from ckview.gui.style import CATEGORY_COLORS, LIGHT, PEAK_COLOR, RUN_COLORS, Theme
from ckview.trace.schema import Phase

PlanCurve = tuple[str, PlanOutcome, RunData]
"""A projected plan: its name, its outcome and the baseline run it was projected over."""

IMAGE_FORMATS = (".png", ".svg")

# Pixel sizes at any width; 15 px is 11 pt at 96 dpi, the smallest text in the figure.
TEXT_PX = 15
TITLE_PX = 26
PANEL_TITLE_PX = 17
MARGINS = (16, 14, 30, 14)  # left, top, right, bottom
SPACING = 6
TITLE_H = 40
SUBTITLE_H = 26
LEGEND_ROW_H = 28
COMPARISON_H = 420
RUN_H = 260
X_LABEL_H = 26
LEFT_AXIS_W = 100


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
    runs: Sequence[RunData],
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
    view, height = _build(runs, plans, width, theme, axis, title, subtitle)
    try:
        if ext == ".png":
            _save_png(view, path, width, height, theme)
        else:
            _save_svg(view, path, width, height, theme, title or _default_title(runs))
    finally:
        view.close()
        view.deleteLater()
    return width, height


def report_height(n_runs: int, n_plans: int) -> int:
    """Height in pixels of the report of ``n_runs`` runs and ``n_plans`` plans."""
    return sum(h for h in _row_heights(n_runs, n_plans)) + _padding(
        len(_row_heights(n_runs, n_plans))
    )


def category_column(category: object) -> str:
    """CSV column of a category: ``optimizer state`` -> ``optimizer_state_bytes``."""
    return CATEGORY_LABELS[category].replace(" ", "_") + "_bytes"  # type: ignore[index]


def plan_label(name: str, run: RunData) -> str:
    """How a projected plan is named in the CSV: ``plan:<name> over <run label>``."""
    return f"plan:{name} over {run.label}"


def write_csv(runs: Sequence[RunData], plans: Sequence[PlanCurve], path: str) -> int:
    """Write every run's timeline and every plan's projected curve to ``path`` as long CSV
    (one row per point); returns the number of data rows."""
    header = ["run", "point", "time_ms", "op_index", "total_bytes"]
    header += [category_column(c) for c in STACK_ORDER]
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for run in runs:
            rows += _write_run_rows(writer, run)
        for name, outcome, run in plans:
            rows += _write_plan_rows(writer, plan_label(name, run), outcome, run)
    return rows


def plan_x(outcome: PlanOutcome, run: RunData, axis: Axis) -> np.ndarray:
    """x of each state of a projected curve, on the baseline run's axis."""
    if axis is Axis.TIME:
        return run.x_of_time_ns(outcome.time_ns)
    return run.x_op[np.asarray(outcome.point, dtype=np.int64)]


# ----------------------------------------------------------------------------- CSV


def _write_run_rows(writer: csv.DictWriter | object, run: RunData) -> int:
    n = run.n_events + 1
    columns = [
        [run.label] * n,
        range(n),
        [f"{v:.6f}" for v in run.x_time.tolist()],
        run.x_op.astype(np.int64).tolist(),
        run.timeline.total.astype(np.int64).tolist(),
    ]
    columns += [run.timeline.by_category[c].astype(np.int64).tolist() for c in STACK_ORDER]
    writer.writerows(zip(*columns, strict=True))  # type: ignore[attr-defined]
    return n


def _write_plan_rows(writer: object, label: str, outcome: PlanOutcome, run: RunData) -> int:
    point = np.asarray(outcome.point, dtype=np.int64)
    n = len(point)
    empty = [""] * len(STACK_ORDER)
    rows = zip(
        point.tolist(),
        plan_x(outcome, run, Axis.TIME).tolist(),
        run.x_op[point].astype(np.int64).tolist(),
        np.asarray(outcome.total, dtype=np.int64).tolist(),
        strict=True,
    )
    writer.writerows([label, p, f"{t:.6f}", op, total, *empty] for p, t, op, total in rows)  # type: ignore[attr-defined]
    return n


# ----------------------------------------------------------------------------- layout


def _row_heights(n_runs: int, n_plans: int) -> list[int]:
    """Fixed height of every row of the layout, top to bottom."""
    legend_rows = -(-(n_runs + n_plans) // 2)
    heights = [TITLE_H, SUBTITLE_H, LEGEND_ROW_H * legend_rows, COMPARISON_H]
    heights.append(LEGEND_ROW_H * 2)  # categories, then phases
    heights += [RUN_H] * n_runs
    heights[-1] += X_LABEL_H  # only the last run panel names its x axis
    return heights


def _padding(n_rows: int) -> int:
    return MARGINS[1] + MARGINS[3] + SPACING * (n_rows - 1)


def _build(
    runs: Sequence[RunData],
    plans: Sequence[PlanCurve],
    width: int,
    theme: Theme,
    axis: Axis,
    title: str | None,
    subtitle: str | None,
) -> tuple[pg.GraphicsLayoutWidget, int]:
    """The laid-out figure in an offscreen widget, and its height."""
    view = pg.GraphicsLayoutWidget()
    view.setAttribute(QtCore.Qt.WidgetAttribute.WA_DontShowOnScreen)
    view.setBackground(theme.background)
    layout = view.ci
    layout.setContentsMargins(*MARGINS)
    layout.setSpacing(SPACING)
    heights = _row_heights(len(runs), len(plans))
    height = sum(heights) + _padding(len(heights))

    curves = _comparison_curves(runs, plans, axis)
    x_range = _x_range(runs, plans, axis)
    items: list[QtWidgets.QGraphicsLayoutItem] = [
        _label(title or _default_title(runs), theme.foreground, TITLE_PX, bold=True),
        _label(subtitle or "", _muted(theme), TEXT_PX),
        _legend([(_LineSwatch(c.color, c.dashed), c.label) for c in curves], 2, theme),
    ]
    comparison = _plot(theme, axis, show_x_label=True)
    _fill_comparison(comparison, curves, x_range, width, theme, axis)
    items += [comparison, _category_legend(theme)]
    y_max = max(float(r.timeline.total.max()) for r in runs) * 1.06
    panels = []
    for i, run in enumerate(runs):
        panel = _plot(theme, axis, show_x_label=i == len(runs) - 1)
        _fill_run(panel, run, runs, x_range, y_max, width, theme, axis)
        panels.append(panel)
    items += panels
    for row, (item, h) in enumerate(zip(items, heights, strict=True)):
        layout.addItem(item, row=row, col=0)
        layout.layout.setRowFixedHeight(row, h)

    view.resize(width, height)
    view.show()  # offscreen (WA_DontShowOnScreen): lays the scene out
    QtWidgets.QApplication.processEvents()
    _annotate_peaks(comparison, curves, theme)
    for run, panel in zip(runs, panels, strict=True):
        _label_bands(panel, _bands(run), axis, theme)
    return view, height


def _default_title(runs: Sequence[RunData]) -> str:
    names = list(dict.fromkeys(os.path.basename(r.source) for r in runs))
    return "Memory of a training step: " + ", ".join(names)


def _muted(theme: Theme) -> str:
    """The foreground half-way to the background, for secondary text."""
    a, b = QtGui.QColor(theme.foreground), QtGui.QColor(theme.background)
    mix = [(x + y) // 2 for x, y in zip(a.getRgb()[:3], b.getRgb()[:3], strict=True)]
    return QtGui.QColor(*mix).name()


def _font(px: int, *, bold: bool = False) -> QtGui.QFont:
    font = QtGui.QFont()
    font.setPixelSize(px)
    font.setBold(bold)
    return font


def _label(text: str, color: str, px: int, *, bold: bool = False) -> pg.LabelItem:
    label = pg.LabelItem(text, color=color, size=f"{px}px", bold=bold, justify="left")
    return label


def _plot(theme: Theme, axis: Axis, *, show_x_label: bool) -> pg.PlotItem:
    """An empty plot with the theme's axes: bytes on y, ``axis`` on x."""
    plot = pg.PlotItem(axisItems={"left": BytesAxis(orientation="left")})
    plot.setMenuEnabled(False)
    plot.hideButtons()
    plot.showGrid(x=True, y=True, alpha=theme.grid_alpha)
    for name in ("left", "bottom"):
        ax = plot.getAxis(name)
        ax.setPen(pg.mkPen(theme.foreground))
        ax.setTextPen(pg.mkPen(theme.foreground))
        ax.setStyle(tickFont=_font(TEXT_PX), tickTextOffset=6, tickLength=-6)
    plot.getAxis("left").setWidth(LEFT_AXIS_W)
    if show_x_label:
        plot.setLabel("bottom", axis.label, color=theme.foreground, **{"font-size": f"{TEXT_PX}px"})
    plot.vb.setMouseEnabled(False, False)
    return plot


def _set_ranges(plot: pg.PlotItem, x_range: tuple[float, float], y_max: float) -> None:
    plot.disableAutoRange()
    plot.setXRange(*x_range, padding=0)
    plot.setYRange(0, y_max, padding=0)


def _plot_pixels(width: int) -> int:
    """Approximate width of a plot's data area: the envelope's resolution."""
    return max(width - LEFT_AXIS_W - MARGINS[0] - MARGINS[2] - 20, 100)


def _x_range(runs: Sequence[RunData], plans: Sequence[PlanCurve], axis: Axis) -> tuple[float, float]:
    """Common x range of every panel: from 0 to the end of the longest curve."""
    ends = [float(r.x(axis)[-1]) for r in runs]
    ends += [float(plan_x(o, r, axis)[-1]) for _, o, r in plans if len(o.total)]
    end = max(max(ends), 1e-9)
    return 0.0, end * 1.01


# ----------------------------------------------------------------------------- comparison


def short_names(runs: Sequence[RunData]) -> list[str]:
    """Names that tell ``runs`` apart: the run name if all come from one file, the file name
    for a 'main' run, else ``file · run``."""
    one_file = len({r.source for r in runs}) == 1
    names = []
    for r in runs:
        if one_file and len(runs) > 1:
            names.append(r.name)
        elif r.name == "main":
            names.append(os.path.basename(r.source))
        else:
            names.append(r.label)
    return names


def _change(value: int, ref: int) -> str:
    """``-58.8%`` with a real minus sign (reads better in a figure)."""
    share = (value - ref) / ref if ref else 0.0
    return f"{share:+.1%}".replace("-", "−")


def _comparison_curves(
    runs: Sequence[RunData], plans: Sequence[PlanCurve], axis: Axis
) -> list[_Curve]:
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
        base = names[runs.index(run)] if run in runs else short_names([run])[0]
        label = (
            f"plan {name} over {base} (projected): peak {format_bytes(outcome.peak_bytes)} "
            f"({_change(outcome.peak_bytes, ref_peak)} vs {ref}), "
            f"+{outcome.extra_share:.0%} compute"
        )
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
    axis: Axis,
) -> None:
    plot.setTitle(
        "Total live memory, runs aligned at their start"
        + (" (dashed: projected)" if any(c.dashed for c in curves) else ""),
        color=theme.foreground,
        size=f"{PANEL_TITLE_PX}px",
        bold=True,
    )
    top = max((float(c.y.max()) for c in curves if c.y.size), default=1.0)
    _set_ranges(plot, x_range, max(top, 1.0) * 1.18)  # headroom for the peak labels
    pixels = _plot_pixels(width)
    # Dashed projections under the solid runs, so a measured curve is never hidden.
    for curve in sorted(curves, key=lambda c: not c.dashed):
        if not curve.y.size:
            continue
        seen = Envelope(curve.x, curve.y).visible(*x_range, pixels)
        style = QtCore.Qt.PenStyle.DashLine if curve.dashed else QtCore.Qt.PenStyle.SolidLine
        pen = pg.mkPen(curve.color, width=2.5, style=style)
        plot.addItem(pg.PlotCurveItem(seen.x, seen.y[0], pen=pen, stepMode="right", antialias=True))


def _peak_of(curve: _Curve) -> tuple[float, float]:
    i = int(np.argmax(curve.y))
    return float(curve.x[i]), float(curve.y[i])


def _annotate_peaks(plot: pg.PlotItem, curves: Sequence[_Curve], theme: Theme) -> None:
    """A dot on every curve's peak and its value beside it, placed where no other label is."""
    vb = plot.vb
    peaks = [(_peak_of(c), c) for c in curves if c.y.size]
    dots = [_dot_box(vb.mapViewToScene(QtCore.QPointF(x, y))) for (x, y), _ in peaks]
    labels: list[QtCore.QRectF] = []
    for i, ((x, y), curve) in enumerate(peaks):
        plot.addItem(
            pg.ScatterPlotItem(
                [x], [y], size=11, brush=pg.mkBrush(curve.color), pen=pg.mkPen(theme.background)
            )
        )
        text = pg.TextItem(format_bytes(int(y)), color=curve.color)
        text.setFont(_font(TEXT_PX, bold=True))
        others = labels + dots[:i] + dots[i + 1 :]
        anchor, box = _free_spot(dots[i].center(), text.boundingRect().size(), others, vb)
        labels.append(box)
        text.setAnchor(anchor)
        text.setPos(x, y)
        plot.addItem(text)


def _dot_box(center: QtCore.QPointF) -> QtCore.QRectF:
    return QtCore.QRectF(center.x() - 6, center.y() - 6, 12, 12)


# Anchors of a peak label, by preference: above, above-left, above-right, right, left, below.
_ANCHORS = ((0.5, 1.3), (1.05, 1.1), (-0.05, 1.1), (-0.1, 0.5), (1.1, 0.5), (0.5, -0.3))


def _free_spot(
    dot: QtCore.QPointF, size: QtCore.QSizeF, taken: Sequence[QtCore.QRectF], vb: pg.ViewBox
) -> tuple[tuple[float, float], QtCore.QRectF]:
    """The first anchor whose label box (scene coordinates) stays inside the view box and
    overlaps nothing in ``taken``; else the first that stays inside; else 'above'."""
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
    run: RunData,
    runs: Sequence[RunData],
    x_range: tuple[float, float],
    y_max: float,
    width: int,
    theme: Theme,
    axis: Axis,
) -> None:
    """Stacked categories of one run over its shaded phases, with the peak marked."""
    name = short_names(runs)[runs.index(run)]
    peak_x = float(run.x(axis)[run.peak.point])
    where = f"{peak_x:.1f} ms" if axis is Axis.TIME else f"op {int(peak_x)}"
    phase = run.phase_of_op(run.op_at(run.peak.point))
    plot.setTitle(
        f"{name}: live memory by category; peak {format_bytes(run.peak.bytes)} at {where} "
        f"({phase})",
        color=theme.foreground,
        size=f"{PANEL_TITLE_PX}px",
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
        plot.addItem(
            pg.PlotCurveItem(
                seen.x,
                seen.y[k],
                stepMode="right",
                fillLevel=0,
                brush=pg.mkBrush(color),
                pen=pg.mkPen(QtGui.QColor(color).darker(115), width=1),
            )
        )
    line = pg.InfiniteLine(peak_x, angle=90, pen=pg.mkPen(PEAK_COLOR, width=1.5, dash=[4, 3]))
    plot.addItem(line, ignoreBounds=True)


def _tint(theme: Theme, kind: Phase) -> str:
    """#RRGGBBAA band tint as Qt's #AARRGGBB."""
    tint = theme.phase_tints.get(kind, theme.recompute_tint)
    return "#" + tint[7:9] + tint[1:7] if len(tint) == 9 else tint


def _bands(run: RunData) -> list[Span]:
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
    x_min, x_max = vb.viewRange()[0]
    y_top = vb.viewRange()[1][1]
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


def _category_legend(theme: Theme) -> pg.GraphicsLayout:
    """One legend for every run panel: the categories, then the phase bands."""
    categories = [
        (_FillSwatch(CATEGORY_COLORS[c]), CATEGORY_LABELS[c]) for c in reversed(STACK_ORDER)
    ]
    phases = [
        (_FillSwatch(_tint(theme, p), outline=_muted(theme)), f"{p.name.lower()} phase")
        for p in (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE, Phase.OPTIMIZER)
    ]
    return _legend(categories + phases, len(categories), theme)


# ----------------------------------------------------------------------------- legends


class _Swatch(pg.GraphicsWidget):
    """A legend sample drawn with a painter (works the same in PNG and SVG)."""

    W, H = 40, 18

    def __init__(self) -> None:
        super().__init__()
        self.setFixedWidth(self.W)
        self.setFixedHeight(self.H)

    def boundingRect(self) -> QtCore.QRectF:  # noqa: N802
        return QtCore.QRectF(0, 0, self.W, self.H)


class _LineSwatch(_Swatch):
    def __init__(self, color: str, dashed: bool) -> None:
        super().__init__()
        style = QtCore.Qt.PenStyle.DashLine if dashed else QtCore.Qt.PenStyle.SolidLine
        self.pen = pg.mkPen(color, width=3, style=style)

    def paint(self, painter: QtGui.QPainter, *args: object) -> None:
        painter.setPen(self.pen)
        painter.drawLine(QtCore.QPointF(2, self.H / 2), QtCore.QPointF(self.W - 2, self.H / 2))


class _FillSwatch(_Swatch):
    def __init__(self, color: str, outline: str | None = None) -> None:
        super().__init__()
        self.brush = pg.mkBrush(color)
        self.pen = pg.mkPen(outline or QtGui.QColor(color).darker(120), width=1)

    def paint(self, painter: QtGui.QPainter, *args: object) -> None:
        painter.setPen(self.pen)
        painter.setBrush(self.brush)
        painter.drawRect(QtCore.QRectF(6, 1, self.W - 12, self.H - 2))


def _legend(
    entries: Sequence[tuple[_Swatch, str]], columns: int, theme: Theme
) -> pg.GraphicsLayout:
    """Swatch and label pairs in a grid of ``columns``, filled row by row."""
    grid = pg.GraphicsLayout()
    grid.setContentsMargins(LEFT_AXIS_W - 40, 0, 0, 0)  # line up with the plots' data area
    grid.setSpacing(2)
    for i, (swatch, text) in enumerate(entries):
        row, col = divmod(i, columns)
        grid.addItem(swatch, row=row, col=2 * col)
        grid.addItem(_label(text, theme.foreground, TEXT_PX), row=row, col=2 * col + 1)
    for col in range(columns):
        grid.layout.setColumnStretchFactor(2 * col + 1, 1)
    return grid


# ----------------------------------------------------------------------------- saving


def _save_png(view: pg.GraphicsLayoutWidget, path: str, width: int, height: int, theme: Theme) -> None:
    image = QtGui.QImage(width, height, QtGui.QImage.Format.Format_ARGB32)
    image.fill(QtGui.QColor(theme.background))
    painter = QtGui.QPainter(image)
    _render(view, painter, width, height)
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


def _render(view: pg.GraphicsLayoutWidget, painter: QtGui.QPainter, width: int, height: int) -> None:
    """Render the whole scene 1:1 into ``painter`` and end it."""
    painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QtGui.QPainter.RenderHint.TextAntialiasing)
    rect = QtCore.QRectF(0, 0, width, height)
    try:
        view.scene().render(painter, rect, rect)
    finally:
        painter.end()
