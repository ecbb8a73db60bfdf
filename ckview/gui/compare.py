"""Comparison of runs: the runs of one trace (baseline, checkpointed, plans) and of several
traces, overlaid on one plot or side by side with linked x axes, aligned at their first event.

The projected curve of the plan being built joins the overlay as one more (dashed) entry.
"""

from __future__ import annotations

import html

import pyqtgraph as pg
from PyQt6.QtCore import QSize, Qt
from PyQt6.QtGui import QBrush, QFont, QFontMetricsF, QResizeEvent, QTextDocument, QTextOption
from PyQt6.QtWidgets import QLabel, QVBoxLayout, QWidget

from ckview.analysis import format_bytes
from ckview.gui.axes import BytesAxis
from ckview.gui.curves import EnvelopeCurves, color, visible_pixels
from ckview.gui.envelope import Envelope
from ckview.gui.planning import PlanOutcome
from ckview.gui.rundata import STACK_ORDER, Axis, RunData
from ckview.gui.style import (
    CATEGORY_COLORS,
    LIGHT,
    PROJECTION_COLOR,
    PROJECTION_HALO_WIDTH,
    PROJECTION_PEN_WIDTH,
    RUN_COLORS,
    Theme,
)


def peak_difference(run: RunData, reference: RunData) -> str:
    """``-58.8% vs baseline`` (empty for the reference itself)."""
    if run is reference or reference.peak.bytes == 0:
        return ""
    change = run.peak.bytes / reference.peak.bytes - 1
    return f"{change:+.1%} vs {_short_label(reference, run)}".replace("-", "−")


def _short_label(reference: RunData, other: RunData) -> str:
    """The reference's run name, with its file when the two come from different traces."""
    return reference.name if reference.source == other.source else reference.label


def _rank_imbalance(runs: list[RunData]) -> list[str]:
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


SEPARATOR = " &nbsp;·&nbsp; "
"""Between two entries of a line of the Compare tab's header."""


class EntriesLabel(QLabel):
    """A header of entries (rich text: a run's peak, the plan's, the ranks' imbalance) that is
    never cut at the right edge: as many whole entries to a line as fit the width, separated by
    dots, so that no entry is split over two lines where it fits on one; an entry wider than a
    line wraps at its own spaces, and one that cannot (a word wider than the label: a long file
    name in a narrow window) is elided, the whole header then in the tooltip. Laid out again
    whenever the width changes; asks for no width of its own."""

    MARGIN = 4.0
    """Pixels kept free at the right of a line: a measure rounds, a paint may not."""

    def __init__(self) -> None:
        super().__init__()
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)  # the entries' own spaces, where one is wider than a line
        self.entries: list[str] = []

    def set_entries(self, entries: list[str]) -> None:
        """Show ``entries`` (rich text each)."""
        self.entries = entries
        self._lay_out()

    def minimumSizeHint(self) -> QSize:
        """As narrow as the layout likes: the entries are laid out again for the width given
        (a long word, taken as the least width, would push the window wider than the screen)."""
        return QSize(0, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        super().resizeEvent(event)
        self._lay_out()

    def _lay_out(self) -> None:
        width = self.contentsRect().width() - self.MARGIN
        if width <= 0:  # not laid out yet: one paragraph, wrapped by Qt
            lines, elided = [SEPARATOR.join(self.entries)], False
        else:
            lines, elided = _lines(self.entries, width, self.font())
        text = "<br>".join(lines)
        if self.text() != text:  # a new text changes the height, and resizes the label again
            self.setText(text)
        tip = SEPARATOR.join(self.entries) if elided else ""
        if self.toolTip() != tip:
            self.setToolTip(tip)


def _lines(entries: list[str], width: float, font: QFont) -> tuple[list[str], bool]:
    """``entries`` packed whole into lines of ``width`` pixels (an entry alone on its line when
    it is wider), and whether one was elided (no space to wrap it at)."""
    lines: list[list[str]] = []
    used = width + 1.0  # a new line for the first entry
    gap = _text_width(SEPARATOR, font)
    elided = False
    for entry in entries:
        size = _text_width(entry, font)
        if size > width and _text_width(entry, font, wrap=width) > width:
            entry, elided = _elide(entry, width, font), True
            size = width
        if lines and used + gap + size <= width:
            lines[-1].append(entry)
            used += gap + size
        else:
            lines.append([entry])
            used = size
    return [SEPARATOR.join(line) for line in lines], elided


def _text_width(rich: str, font: QFont, wrap: float = -1.0) -> float:
    """The width in pixels of rich text in ``font``: of its widest line when wrapped at
    ``wrap`` pixels (a word wider than that overflows), else on one line."""
    doc = QTextDocument()
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    option = doc.defaultTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)  # as a QLabel wraps: never in a word
    doc.setDefaultTextOption(option)
    doc.setHtml(rich)
    doc.setTextWidth(wrap)
    return doc.idealWidth()


def _elide(rich: str, width: float, font: QFont) -> str:
    """``rich`` as plain text ending in … where it passes ``width`` pixels (measured in bold:
    part of it may be)."""
    doc = QTextDocument()
    doc.setHtml(rich)
    bold = QFont(font)
    bold.setBold(True)
    short = QFontMetricsF(bold).elidedText(doc.toPlainText(), Qt.TextElideMode.ElideRight, width)
    return html.escape(short)


class CompareView(QWidget):
    """Overlay (``side_by_side=False``) or one stacked plot per run with a shared x range."""

    def __init__(self, parent: QWidget | None = None, theme: Theme = LIGHT) -> None:
        super().__init__(parent)
        self.theme = theme
        self.runs: list[RunData] = []
        self.outcome: tuple[PlanOutcome, RunData] | None = None
        self.axis = Axis.TIME
        self.side_by_side = False
        self.summary = EntriesLabel()
        self.plots = pg.GraphicsLayoutWidget()
        self._curves: list[tuple[pg.PlotItem, EnvelopeCurves]] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        layout.addWidget(self.plots, stretch=1)

    def set_runs(
        self,
        runs: list[RunData],
        outcome: tuple[PlanOutcome, RunData] | None = None,
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
                f"{change:+.1%} vs {_short_label(ref, over)}".replace("-", "−")
            )
        return rows + _rank_imbalance(self.runs)

    def _new_plot(self, row: int, title: str | None = None) -> pg.PlotItem:
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
            plot.setTitle(title, color=self.theme.foreground, size="10pt")
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
        # NOTE [ Projected curve halo ] in ckview/gui/style.py
        halo = pg.mkPen(self.theme.background, width=PROJECTION_HALO_WIDTH)
        envelope = Envelope(xs, plan.total)
        curves = EnvelopeCurves(plot, envelope, [pen], z=30, halos=[halo])
        self._curves.append((plot, curves))
        peak_x = float(xs[int(plan.total.argmax())])
        self._mark_peak(plot, peak_x, plan.peak_bytes, PROJECTION_COLOR, left=True)

    def _build_panels(self) -> None:
        first: pg.PlotItem | None = None
        for i, run in enumerate(self.runs):
            title = f"{run.label}: peak {format_bytes(run.peak.bytes)} " + peak_difference(
                run, self.runs[0]
            )
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
