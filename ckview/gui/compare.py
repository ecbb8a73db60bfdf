"""Comparison of runs: the runs of one trace (baseline, checkpointed, plans) and of several
traces, overlaid on one plot or side by side with linked x axes, aligned at their first event.

The projected curve of the plan being built joins the overlay as one more (dashed) entry.
"""

from __future__ import annotations

import html

import pyqtgraph as pg
from PyQt6.QtCore import Qt
from PyQt6.QtGui import QBrush, QFont, QFontMetricsF, QResizeEvent
from PyQt6.QtWidgets import QVBoxLayout, QWidget

from ckview.analysis import format_bytes
from ckview.analysis.units import MINUS, format_change
from ckview.app.envelope import Envelope
from ckview.app.planning import PlanOutcome
from ckview.app.run import STACK_ORDER, Axis, Run
from ckview.app.style import (
    CATEGORY_COLORS,
    LIGHT,
    PROJECTION_COLOR,
    PROJECTION_HALO_WIDTH,
    PROJECTION_PEN_WIDTH,
    RUN_COLORS,
    Theme,
)
from ckview.gui.axes import BytesAxis
from ckview.gui.curves import EnvelopeCurves, color, visible_pixels
from ckview.gui.fit import EntriesLabel


def peak_difference(run: Run, reference: Run) -> str:
    """``-58.8% vs baseline`` (empty for the reference itself)."""
    parts = _difference_parts(run, reference)
    return f"{parts[0]} vs {parts[1]}" if parts else ""


def _difference_parts(run: Run, reference: Run) -> tuple[str, str] | None:
    """The change of ``run``'s peak from ``reference``'s, and the reference's short label; None
    for the reference itself."""
    if run is reference or reference.peak.bytes == 0:
        return None
    change = format_change(run.peak.bytes / reference.peak.bytes - 1, MINUS)
    return change, _short_label(reference, run)


def _short_label(reference: Run, other: Run) -> str:
    """The reference's run name, with its file when the two come from different traces."""
    return reference.name if reference.source == other.source else reference.label


def _rank_imbalance(runs: list[Run]) -> list[str]:
    """Per run name held by two or more rank traces (``run.rank{R}.h5``): the imbalance of
    their peaks, e.g. ``main: ranks 1.05× (rank 1 highest)``."""
    from ckview.analysis.ranks import peak_imbalance
    from ckview.trace.ranks import rank_of

    by_name: dict[str, list[tuple[int, int]]] = {}
    for run in runs:
        rank = rank_of(run.source)
        if rank is not None:
            by_name.setdefault(run.name, []).append((rank, run.peak.bytes))
    rows = []
    for name, ranked in by_name.items():
        if len(ranked) > 1:
            ratio, high, low = peak_imbalance([peak for _, peak in ranked])
            rows.append(
                f"{name}: ranks balanced"
                if high == low
                else f"{name}: ranks <b>{ratio:.2f}×</b> (rank {ranked[high][0]} highest, "
                f"rank {ranked[low][0]} lowest)"
            )
    return rows


TITLE_SPARE = 100.0
"""Pixels of the view's width that are not a side-by-side panel's title: the left axis beside
it, the layouts' margins and the text's."""


class CompareView(QWidget):
    """Overlay (``side_by_side=False``) or one stacked plot per run with a shared x range."""

    def __init__(self, parent: QWidget | None = None, theme: Theme = LIGHT) -> None:
        super().__init__(parent)
        self.theme = theme
        self.runs: list[Run] = []
        self.outcome: tuple[PlanOutcome, Run] | None = None
        self.axis = Axis.TIME
        self.side_by_side = False
        self.summary = EntriesLabel()
        self.plots = pg.GraphicsLayoutWidget()
        self._curves: list[tuple[pg.PlotItem, EnvelopeCurves]] = []
        self._titles: list[tuple[pg.PlotItem, list[tuple[str, bool]]]] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        layout.addWidget(self.plots, stretch=1)

    def set_runs(
        self,
        runs: list[Run],
        outcome: tuple[PlanOutcome, Run] | None = None,
        axis: Axis | None = None,
        side_by_side: bool | None = None,
    ) -> None:
        """Compare ``runs`` (the first is the reference) and, if given, a projected plan."""
        self.runs = runs
        self.outcome = outcome
        self.axis = axis or self.axis
        if side_by_side is not None:
            self.side_by_side = side_by_side
        self._rebuild()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self._rebuild()

    def _rebuild(self) -> None:
        self.plots.clear()
        self._curves = []
        self._titles = []
        self.plots.setBackground(self.theme.background)
        if not self.runs:
            self.summary.set_entries(["Open traces to compare their runs."])
            return
        self.summary.set_entries(self._summary_entries())
        if self.side_by_side:
            self._build_panels()
        else:
            self._build_overlay()
        self._redraw()

    def _summary_entries(self) -> list[str]:
        """The header's entries: each run's peak and its change, the plan's, the ranks'."""
        ref = self.runs[0]
        rows = [
            f"<span style='color:{RUN_COLORS[i % len(RUN_COLORS)]}'>■</span> {run.label}: "
            f"<b>{format_bytes(run.peak.bytes)}</b> {peak_difference(run, ref)}"
            for i, run in enumerate(self.runs)
        ]
        if self.outcome is not None:
            plan, over = self.outcome
            change = plan.peak_bytes / ref.peak.bytes - 1 if ref.peak.bytes else 0.0
            rows.append(
                f"<span style='color:{PROJECTION_COLOR}'>┅</span> plan over {over.label}: "
                f"<b>{format_bytes(plan.peak_bytes)}</b> "
                f"{format_change(change, MINUS)} vs {_short_label(ref, over)}"
            )
        return rows + _rank_imbalance(self.runs)

    def _new_plot(self, row: int, title: list[tuple[str, bool]] | None = None) -> pg.PlotItem:
        """A plot in row ``row``; ``title``: its parts, and whether each is a run's label
        (elided where the whole does not fit: ``_fit_title``)."""
        plot = self.plots.addPlot(row=row, col=0, axisItems={"left": BytesAxis("left")})
        plot.setMouseEnabled(x=True, y=False)
        plot.hideButtons()
        plot.setMenuEnabled(False)
        plot.showGrid(x=True, y=True, alpha=self.theme.grid_alpha)
        plot.setLabel("bottom", self.axis.label)
        for name in ("left", "bottom"):
            plot.getAxis(name).setPen(pg.mkPen(self.theme.foreground))
            plot.getAxis(name).setTextPen(pg.mkPen(self.theme.foreground))
        if title:
            self._titles.append((plot, title))
            self._fit_title(plot, title)
        plot.getViewBox().sigXRangeChanged.connect(self._redraw)
        return plot

    def _build_overlay(self) -> None:
        """Every run's total, and the plan's; the summary line above the plot is their legend
        (a legend on the plot hid the curves it names)."""
        plot = self._new_plot(0)
        for i, run in enumerate(self.runs):
            tone = RUN_COLORS[i % len(RUN_COLORS)]
            env = Envelope(run.x(self.axis), run.timeline.total)
            curves = EnvelopeCurves(plot, env, [pg.mkPen(tone, width=2)], z=10 + i)
            self._curves.append((plot, curves))
            self._mark_peak(plot, float(run.x(self.axis)[run.peak.point]), run.peak.bytes, tone)
        if self.outcome is not None:
            self._add_projection(plot)
        self._fit(plot)

    def _add_projection(self, plot: pg.PlotItem) -> None:
        """The plan's projected total, dashed, with its peak."""
        assert self.outcome is not None
        plan, over = self.outcome
        time_axis = self.axis is Axis.TIME
        xs = over.x_of_time_ns(plan.time_ns) if time_axis else over.x_op[plan.point]
        pen = pg.mkPen(PROJECTION_COLOR, width=PROJECTION_PEN_WIDTH, style=Qt.PenStyle.DashLine)
        # NOTE [ Projected curve halo ] in ckview/app/style.py
        halo = pg.mkPen(self.theme.background, width=PROJECTION_HALO_WIDTH)
        envelope = Envelope(xs, plan.total)
        curves = EnvelopeCurves(plot, envelope, [pen], z=30, halos=[halo])
        self._curves.append((plot, curves))
        peak_x = float(xs[int(plan.total.argmax())])
        self._mark_peak(plot, peak_x, plan.peak_bytes, PROJECTION_COLOR, left=True)

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        super().resizeEvent(event)
        for plot, title in self._titles:
            self._fit_title(plot, title)

    def _fit_title(self, plot: pg.PlotItem, parts: list[tuple[str, bool]]) -> None:
        """A panel's title fitted to the view: its run labels elided in their middle where the
        whole does not fit (a long file name), the whole in the tooltip then. A title is the
        least width of its panel, and the panels ran past the right of the view, cut
        (NOTE [ Long names never widen the window ] in ckview/gui/fit.py)."""
        font = QFont(plot.titleLabel.item.font())
        font.setPointSizeF(10)  # the title's size="10pt"
        metrics = QFontMetricsF(font)
        room = self.plots.width() - TITLE_SPARE
        room -= sum(metrics.horizontalAdvance(text) for text, label in parts if not label)
        widths = sorted(metrics.horizontalAdvance(text) for text, label in parts if label)
        each = None  # what a label may take: shorter ones whole, the rest share what is left
        for i, width in enumerate(widths):
            if width > room / (len(widths) - i):
                each = max(room / (len(widths) - i), 0.0)
                break
            room -= width
        mode = Qt.TextElideMode.ElideMiddle
        shown = "".join(
            metrics.elidedText(text, mode, each) if label and each is not None else text
            for text, label in parts
        )
        whole = "".join(text for text, _ in parts)
        text = html.escape(shown)
        if plot.titleLabel.text != text:
            plot.setTitle(text, color=self.theme.foreground, size="10pt")
            plot.titleLabel.setToolTip(whole if shown != whole else "")

    def _build_panels(self) -> None:
        first: pg.PlotItem | None = None
        for i, run in enumerate(self.runs):
            title = [(run.label, True), (f": peak {format_bytes(run.peak.bytes)} ", False)]
            parts = _difference_parts(run, self.runs[0])
            if parts:
                title += [(f"{parts[0]} vs ", False), (parts[1], True)]
            plot = self._new_plot(i, title)
            env = Envelope(run.x(self.axis), run.stacked)
            brushes = [QBrush(color(CATEGORY_COLORS[c], 235)) for c in STACK_ORDER]
            pens = [pg.mkPen(color(CATEGORY_COLORS[c]).darker(130)) for c in STACK_ORDER]
            self._curves.append((plot, EnvelopeCurves(plot, env, pens, brushes)))
            tone = RUN_COLORS[i % len(RUN_COLORS)]
            self._mark_peak(plot, float(run.x(self.axis)[run.peak.point]), run.peak.bytes, tone)
            if self.outcome is not None and self.outcome[1] is run:
                self._add_projection(plot)
            if first is None:
                first = plot
            else:
                plot.setXLink(first)
            self._fit(plot)

    def _mark_peak(
        self, plot: pg.PlotItem, x: float, y: int, tone: str, left: bool = False
    ) -> None:
        """A dot on the peak and its value beside it, in a box that reads on any fill: right of
        the dot (``left``: left of it, the projected peak's side, so that a run's peak and the
        plan's at the same moment do not cover each other), flipped near the plot's edges;
        never above the dot (clipped at the top of a short panel), mostly below its level."""
        dot = pg.ScatterPlotItem([x], [y], size=10, brush=pg.mkBrush(tone), pen=pg.mkPen("w"))
        dot.setZValue(60)
        right = max(float(run.x(self.axis)[-1]) for run in self.runs)
        label = pg.TextItem(
            format_bytes(y),
            color=self.theme.foreground,
            anchor=(1.12, 0.25) if (left and x > 0.2 * right) or x > 0.8 * right else (-0.12, 0.25),
            fill=pg.mkBrush(color(self.theme.label_fill)),
            border=pg.mkPen(tone, width=1.5),
        )
        label.setZValue(61)
        label.setPos(x, y)
        plot.addItem(dot, ignoreBounds=True)
        plot.addItem(label, ignoreBounds=True)

    def _fit(self, plot: pg.PlotItem) -> None:
        high = max(run.peak.bytes for run in self.runs)
        if self.outcome is not None:
            high = max(high, self.outcome[0].peak_bytes)
        plot.setYRange(0, high * 1.15, padding=0)
        right = max(float(run.x(self.axis)[-1]) for run in self.runs)
        plot.setXRange(0, right, padding=0.01)

    def _redraw(self) -> None:
        for plot, curves in self._curves:
            (x0, x1), _ = plot.getViewBox().viewRange()
            curves.update(x0, x1, visible_pixels(plot))
