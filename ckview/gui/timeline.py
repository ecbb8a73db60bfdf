"""The memory timeline: live bytes stacked by category, phases, recomputes, the peak, the
projected curve of the plan being built, and an overview strip to pan and zoom with.

Draws what ``Run`` and ``PlanOutcome`` hold; computes nothing but screen geometry.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyqtgraph as pg
from PyQt6.QtCore import QPointF, QRectF, Qt, pyqtSignal
from PyQt6.QtGui import QBrush, QFont
from PyQt6.QtWidgets import QGridLayout, QLabel, QStackedLayout, QWidget

from ckview.analysis import format_bytes
from ckview.app.envelope import Envelope
from ckview.app.planning import PlanOutcome
from ckview.app.run import CATEGORY_LABELS, STACK_ORDER, Axis, Run, Span
from ckview.app.style import (
    CATEGORY_COLORS,
    LIGHT,
    PEAK_COLOR,
    PROJECTION_COLOR,
    PROJECTION_HALO_WIDTH,
    PROJECTION_PEN_WIDTH,
    Theme,
)
from ckview.gui.axes import BytesAxis
from ckview.gui.curves import EnvelopeCurves, color, over, visible_pixels
from ckview.gui.labels import (
    MARK_LABEL_AT,
    PEAK_SIDES,
    PROJECTED_SIDES,
    BandLabel,
    LabelGeometry,
    place_labels,
)
from ckview.gui.legend import LegendEntry, SideLegend
from ckview.trace.schema import Category

MAX_MARK_LABELS = 24
"""Recompute marks beyond this many are drawn without labels (they would overlap)."""

NO_TRACE_HTML = (
    "<h3>No trace open</h3>"
    "<p>Open one with <b>File → Open…</b> (Ctrl+O), or drop a trace file here.</p>"
    "<p>To record one, run your training script under ckview:<br>"
    "<code>ckview record -o trace.h5 train.py</code><br>then open it: "
    "<code>ckview view trace.h5</code></p>"
)
"""What the timeline shows with no trace open."""


def no_step_html(run: Run) -> str:
    """What the timeline shows for a run without a single memory event. The label may wrap
    after each ``_ - . /`` of its file name (a zero-width space there): a long one, a word of
    the message's least width, made the window as wide (NOTE [ Long names never widen the
    window ] in ckview/gui/fit.py)."""
    label = re.sub(r"([_\-./])", "\\1\u200b", html.escape(run.label))
    return (
        f"<h3>{label} holds no step</h3>"
        "<p>No memory event was recorded in this run: the recording ended before a training "
        "step did (a script that stopped during warmup, or an empty loop).</p>"
        "<p>Record again with enough iterations for the warmup and the step, e.g. "
        "<code>ckview record -o trace.h5 --warmup 1 --steps 1 train.py</code>.</p>"
    )


class TimelineView(QWidget):
    """Main memory plot over an overview strip whose region selects the visible x range."""

    pointClicked = pyqtSignal(int)
    """A timeline point the user clicked (baseline run points)."""
    hovered = pyqtSignal(str)
    """One-line description of the point under the mouse (for the status bar)."""

    def __init__(self, parent: QWidget | None = None, theme: Theme = LIGHT) -> None:
        super().__init__(parent)
        self.theme = theme
        self.run: Run | None = None
        self.axis = Axis.TIME
        self.outcome: PlanOutcome | None = None
        self.reserved: np.ndarray | None = None
        """What the caching allocator model holds reserved at each point (a CUDA run), drawn
        as a line over the stack; None: not drawn."""
        self.selected_point: int | None = None
        self._layers: EnvelopeCurves | None = None
        self._projected: EnvelopeCurves | None = None
        self._host: EnvelopeCurves | None = None
        """The host curve of an offload plan; None while no region offloads."""
        self._overview_curve: EnvelopeCurves | None = None
        self._decor: list[pg.GraphicsObject] = []
        self._shown: list[Category] = []
        """The categories drawn, bottom layer first."""
        self._plan_decor: list[pg.GraphicsObject] = []
        self._peak_label: pg.TextItem | None = None
        self._placed: list[tuple[pg.TextItem, QRectF]] = []
        """The labels shown and their boxes in scene pixels, as last placed (NOTE [ Labels
        never overlap ])."""
        self._marks: dict[tuple[float, str | None, str], pg.InfiniteLine] = {}
        """Recompute marks drawn, by (x, label, tooltip): kept from one outcome to the next."""

        self.main = pg.PlotWidget(axisItems={"left": BytesAxis(orientation="left")})
        self.overview = pg.PlotWidget(axisItems={"left": BytesAxis(orientation="left")})
        self.overview.setFixedHeight(110)
        for w in (self.main, self.overview):
            w.setMouseEnabled(x=True, y=False)
            w.getPlotItem().hideButtons()
            w.getPlotItem().setMenuEnabled(False)
        self.overview.setMouseEnabled(x=False, y=False)
        # Major time ticks only: Qt's raster engine draws a line at ~0.1 us a pixel, and the
        # minor and sub-minor levels add ~90 grid lines across the plot (~10 ms a paint).
        self.main.getPlotItem().getAxis("bottom").setStyle(maxTickLevel=0)
        self.legend = SideLegend()
        self.legend.reserve = "projected (1000.0 MiB)"
        """The categories and the projected curve, beside the plot (never over the data)."""
        self.region = pg.LinearRegionItem(swapMode="sort")
        self.region.setZValue(10)
        self.overview.addItem(self.region)
        self.selection_line = pg.InfiniteLine(angle=90, movable=False)
        self.selection_line.setVisible(False)
        self.main.addItem(self.selection_line, ignoreBounds=True)
        self.hover_line = pg.InfiniteLine(angle=90, movable=False)
        self.hover_line.setVisible(False)
        self.main.addItem(self.hover_line, ignoreBounds=True)
        self.hover_text = pg.TextItem(anchor=(0, 0))
        self.hover_text.setZValue(100)
        self.hover_text.setVisible(False)
        self.main.addItem(self.hover_text, ignoreBounds=True)

        self.plots = QWidget()
        layout = QGridLayout(self.plots)  # the legend beside both plots: their x axes align
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.main, 0, 0)
        layout.addWidget(self.overview, 1, 0)
        layout.addWidget(self.legend, 0, 1, 2, 1)
        layout.setRowStretch(0, 1)
        layout.setColumnStretch(0, 1)
        self.message = QLabel()
        """Shown instead of the plots when there is nothing to draw (no trace, no step)."""
        self.message.setTextFormat(Qt.TextFormat.RichText)
        self.message.setWordWrap(True)
        self.message.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.setMargin(40)
        self.pages = QStackedLayout(self)
        self.pages.addWidget(self.plots)
        self.pages.addWidget(self.message)
        self._band_labels: list[BandLabel] = []

        self.main.getPlotItem().getViewBox().sigXRangeChanged.connect(self._on_range)
        self.main.getPlotItem().getViewBox().sigResized.connect(self._redraw)
        self.region.sigRegionChanged.connect(self._on_region)
        self._proxy = pg.SignalProxy(
            self.main.scene().sigMouseMoved, rateLimit=60, slot=self._on_mouse_moved
        )
        self.main.scene().sigMouseClicked.connect(self._on_click)
        self.set_theme(theme)
        self.show_message(NO_TRACE_HTML)

    # -- public

    def set_run(
        self, run: Run, axis: Axis | None = None, reserved: np.ndarray | None = None
    ) -> None:
        """Show ``run`` (its stacked categories, phases and peak), zoomed out; ``reserved``:
        the reserved memory at each of its points, drawn as a line (a CUDA run)."""
        self.run = run
        self.reserved = reserved
        self.axis = axis or self.axis
        self.outcome = None
        self.selected_point = None
        self.selection_line.setVisible(False)
        if run.n_events == 0:
            self._clear()
            self.show_message(no_step_html(run))
            return
        self.pages.setCurrentWidget(self.plots)
        self._rebuild()
        if run.initial_point is not None:  # the run ended in an OOM: open on it
            self.centre_on(run.initial_point)

    def clear(self) -> None:
        """Show nothing (every trace closed)."""
        self.run, self.outcome, self.selected_point = None, None, None
        self._clear()
        self.selection_line.setVisible(False)
        self.show_message(NO_TRACE_HTML)

    def show_message(self, text: str) -> None:
        """Show ``text`` (rich text) in place of the plots."""
        self.message.setText(text)
        self.pages.setCurrentWidget(self.message)

    def showing_message(self) -> bool:
        """True when a message stands in place of the plots."""
        return self.pages.currentWidget() is self.message

    @contextmanager
    def without_transients(self) -> Iterator[None]:
        """Hide what follows the mouse or a click (hover text and line, the selection line)
        for the time of an export, then show again what was shown."""
        items = (self.hover_text, self.hover_line, self.selection_line)
        shown = [item.isVisible() for item in items]
        for item in items:
            item.setVisible(False)
        try:
            yield
        finally:
            for item, visible in zip(items, shown, strict=True):
                item.setVisible(visible)

    def set_axis(self, axis: Axis) -> None:
        """Place points by time or by op index (NOTE [ Two x axes ] in ``ckview.app.run``)."""
        if axis is self.axis:
            return
        point_range = self._visible_points()
        self.axis = axis
        self._rebuild()
        if point_range is not None:
            self._show_points(*point_range)

    def set_outcome(self, outcome: PlanOutcome | None) -> None:
        """Draw the projected curve of the plan being built (None: hide it)."""
        self.outcome = outcome
        if self._layers is None:  # nothing drawn (no step)
            return
        self._draw_projection()
        self._fit_y()
        self._redraw()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        for w in (self.main, self.overview):
            w.setBackground(theme.background)
            for name in ("left", "bottom"):
                axis = w.getPlotItem().getAxis(name)
                axis.setPen(pg.mkPen(theme.foreground))
                axis.setTextPen(pg.mkPen(theme.foreground))
            # No vertical grid on the main plot: blended full-height lines are a third of its
            # paint (benchmarks/gui_performance.py); the hover line and the ticks read time.
            w.getPlotItem().showGrid(x=w is self.overview, y=True, alpha=theme.grid_alpha)
        self.region.setBrush(pg.mkBrush(color(theme.overview_region)))
        self.legend.set_colors(theme.foreground, theme.background)
        self.message.setStyleSheet(f"background: {theme.background}; color: {theme.foreground};")
        self.selection_line.setPen(pg.mkPen(theme.foreground, width=1.5))
        self.hover_line.setPen(pg.mkPen(theme.foreground, width=1, style=Qt.PenStyle.DotLine))
        self.hover_text.fill = pg.mkBrush(color(theme.background, 225))
        self.hover_text.border = pg.mkPen(theme.foreground)
        self.hover_text.setColor(theme.foreground)
        if self.run is not None:
            self._rebuild(keep_range=True)

    def jump_to_peak(self) -> None:
        """Centre the view on the peak (the projected one if a plan is shown), zoomed to a
        tenth of the run, and select it."""
        run = self.run
        if run is None:
            return
        point = run.peak.point
        if self.outcome is not None and self.outcome.peak_bytes < run.peak.bytes:
            point = self.outcome.peak_point
        self.centre_on(point)

    def centre_on(self, point: int) -> None:
        """Centre the view on a timeline point, zoomed to a tenth of the run, and select it."""
        run = self.run
        if run is None:
            return
        xs = run.x(self.axis)
        centre = float(xs[point])
        width = max((float(xs[-1]) - float(xs[0])) / 10, 1e-6)
        self.main.setXRange(centre - width / 2, centre + width / 2, padding=0)
        self.select_point(point)

    def select_point(self, point: int) -> None:
        """Mark a timeline point and tell the inspector (``pointClicked``)."""
        if self.run is None:
            return
        self.selected_point = point
        self.selection_line.setValue(float(self.run.x(self.axis)[point]))
        self.selection_line.setVisible(True)
        self.pointClicked.emit(point)

    def zoom_to_fit(self) -> None:
        if self.run is not None:
            xs = self.run.x(self.axis)
            self.main.setXRange(float(xs[0]), float(xs[-1]), padding=0.01)

    def zoom(self, factor: float) -> None:
        """Zoom the x range about its centre (factor < 1 zooms in)."""
        (x0, x1), _ = self.main.getPlotItem().getViewBox().viewRange()
        c, half = (x0 + x1) / 2, (x1 - x0) * factor / 2
        self.main.setXRange(c - half, c + half, padding=0)

    def pan(self, fraction: float) -> None:
        """Move the x range by a fraction of its width."""
        (x0, x1), _ = self.main.getPlotItem().getViewBox().viewRange()
        d = (x1 - x0) * fraction
        self.main.setXRange(x0 + d, x1 + d, padding=0)

    # -- building

    def _rebuild(self, keep_range: bool = False) -> None:
        run = self.run
        if run is None or run.n_events == 0:
            return
        view = self.main.getPlotItem().getViewBox().viewRange()[0] if keep_range else None
        self._clear()
        xs = run.x(self.axis)
        # A category that never holds bytes adds a layer equal to the one below it: skip it.
        used = [i for i, c in enumerate(STACK_ORDER) if run.timeline.by_category[c].any()]
        used = used or [len(STACK_ORDER) - 1]
        env = Envelope(xs, run.stacked[used])
        shown = [STACK_ORDER[i] for i in used]
        brushes = [QBrush(color(CATEGORY_COLORS[c])) for c in shown]  # opaque: no blending
        pens = [pg.mkPen(color(CATEGORY_COLORS[c]).darker(130), width=1) for c in shown]
        self._layers = EnvelopeCurves(self.main.getPlotItem(), env, pens, brushes)
        self._shown = shown
        self._fill_legend()
        total = Envelope(xs, run.stacked[-1])
        self._overview_curve = EnvelopeCurves(
            self.overview.getPlotItem(),
            total,
            [pg.mkPen(self.theme.foreground, width=1)],
            [QBrush(color(CATEGORY_COLORS[STACK_ORDER[4]], 120))],
        )
        self._overview_curve.update(float(xs[0]), float(xs[-1]), 1600)
        self._draw_bands(run)
        self._draw_peak(run)
        self._draw_device(run)
        self._draw_reserved(xs)
        self._draw_projection()
        for w in (self.main, self.overview):
            w.getPlotItem().setLabel("bottom", self.axis.label)
        self.overview.setXRange(float(xs[0]), float(xs[-1]), padding=0.01)
        self._fit_y()
        if view is not None:
            self.main.setXRange(*view, padding=0)
        else:
            self.zoom_to_fit()
        if self.selected_point is not None:
            self.selection_line.setValue(float(xs[self.selected_point]))
        self._redraw()

    def _fill_legend(self) -> None:
        """Filled swatches, top layer first, for the categories drawn (those that ever hold
        bytes), then the projected curve when a plan is shown."""
        entries = [
            LegendEntry(CATEGORY_LABELS[c], CATEGORY_COLORS[c]) for c in reversed(self._shown)
        ]
        if self.reserved is not None:
            most = format_bytes(int(self.reserved.max()))
            entries.append(
                LegendEntry(f"reserved, model, no plan ({most})", self.theme.foreground, True)
            )
        if self.outcome is not None:
            entries.append(
                LegendEntry(
                    f"projected ({format_bytes(self.outcome.peak_bytes)})",
                    PROJECTION_COLOR,
                    dashed=True,
                    halo=self.theme.background,
                )
            )
        if self._host is not None and self.outcome is not None:
            entries.append(
                LegendEntry(
                    f"host ({format_bytes(self.outcome.host_peak_bytes)})",
                    self.theme.host_color,
                    dashed=False,
                    halo=self.theme.background,
                )
            )
        self.legend.set_entries(entries)

    def _clear(self) -> None:
        for curves in (self._layers, self._projected, self._host, self._overview_curve):
            if curves is not None:
                curves.remove()
        self._layers = self._projected = self._host = self._overview_curve = None
        self._shown = []
        self.legend.set_entries([])
        self._band_labels = []
        for item in self._decor:
            self.main.removeItem(item)
        self._decor = []
        self._peak_label = None
        self._placed = []
        self._clear_plan_decor()
        self._keep_marks({})

    def _clear_plan_decor(self) -> None:
        for item in self._plan_decor:
            self.main.removeItem(item)
        self._plan_decor = []

    def _draw_bands(self, run: Run) -> None:
        for span in run.phases:
            x0, x1 = span.x_range(self.axis)
            band = pg.LinearRegionItem(
                (x0, x1),
                movable=False,
                brush=pg.mkBrush(over(self.theme.phase_tints[span.kind], self.theme.background)),
                pen=pg.mkPen(None),
            )
            band.setZValue(-20)
            self._add_decor(band)
            self._add_band_label(span)
        for span in run.recomputes:
            x0, x1 = span.x_range(self.axis)
            brush = QBrush(color(self.theme.recompute_tint), Qt.BrushStyle.BDiagPattern)
            band = pg.LinearRegionItem((x0, x1), movable=False, brush=brush, pen=pg.mkPen(None))
            band.setZValue(5)
            band.setToolTip(span.label)
            self._add_decor(band)

    def _add_band_label(self, span: Span) -> None:
        """The band's name, placed and shown by ``_place_band_labels``."""
        label = pg.TextItem(color=self.theme.foreground, anchor=(0, 0))
        label.setFont(_font(9))
        label.setVisible(False)
        names = []
        for text in dict.fromkeys((span.label, span.kind.name.lower())):
            label.setText(text)
            names.append((text, label.boundingRect().width()))  # text and margins, in px
        x0, x1 = span.x_range(self.axis)
        height = label.textItem.boundingRect().height()
        self._band_labels.append(BandLabel(label, x0, x1, names, height))
        self._add_decor(label)

    def _place_labels(self) -> None:
        """Show and place the labels at the top of the main plot (``place_labels``)."""
        geometry = LabelGeometry.of(self.main.getPlotItem().getViewBox())
        projected = self._plan_decor[1] if len(self._plan_decor) > 1 else None
        peaks = [(self._peak_label, PEAK_SIDES), (projected, PROJECTED_SIDES)]
        self._placed = place_labels(geometry, peaks, self._marks.values(), self._band_labels)

    def _draw_peak(self, run: Run) -> None:
        x = float(run.x(self.axis)[run.peak.point])
        dot = pg.ScatterPlotItem(
            [x], [run.peak.bytes], size=11, brush=pg.mkBrush(PEAK_COLOR), pen=pg.mkPen("w")
        )
        dot.setZValue(50)
        label = pg.TextItem(
            f"peak {format_bytes(run.peak.bytes)}",
            color=self.theme.peak_text,
            anchor=(0.5, PEAK_SIDES[0]),
            fill=pg.mkBrush(color(self.theme.label_fill)),
            border=pg.mkPen(PEAK_COLOR),
        )
        label.setFont(_font(10, bold=True))
        label.setPos(x, run.peak.bytes)
        label.setZValue(50)
        self._peak_label = label
        self._add_decor(dot, label)

    def _draw_device(self, run: Run) -> None:
        """The OOM marker, and horizontal lines at the device's capacity and the most the CUDA
        allocator reserved (the capacity is drawn only when it is within the y range)."""
        top = self._y_top()
        for label, nbytes in run.device_lines():
            if nbytes > top:
                continue
            line = pg.InfiniteLine(
                pos=nbytes,
                angle=0,
                movable=False,
                pen=pg.mkPen(self.theme.foreground, width=1.2, style=Qt.PenStyle.DashLine),
                label=label,
                labelOpts={
                    "position": 0.98,
                    "color": self.theme.foreground,
                    "anchors": [(1, 1), (1, 1)],
                },
            )
            line.setZValue(40)
            self._add_decor(line)
        point = run.oom_point
        if point is None or run.oom is None:
            return
        line = pg.InfiniteLine(
            pos=float(run.x(self.axis)[point]),
            angle=90,
            movable=False,
            pen=pg.mkPen(PEAK_COLOR, width=2, style=Qt.PenStyle.DashLine),
            label=f"OOM, asked for {run.oom.asked()}",
            labelOpts={"position": 0.55, "color": PEAK_COLOR, "anchors": [(0, 0), (0, 0)]},
        )
        line.setZValue(45)
        line.setToolTip(run.oom.headline())
        self._add_decor(line)

    def _draw_reserved(self, xs: np.ndarray) -> None:
        """The reserved-memory line (``reserved``) as steps. Reserved memory changes only when
        a segment is reserved or released, so the line has a handful of corners and needs no
        downsampling."""
        if self.reserved is None:
            return
        x, y = _steps(xs, self.reserved)
        pen = pg.mkPen(self.theme.foreground, width=1.5, style=Qt.PenStyle.DashDotLine)
        line = pg.PlotDataItem(x, y, pen=pen)
        line.setZValue(35)
        self._add_decor(line)

    def _draw_projection(self) -> None:
        """The projected curve, its peak and recompute marks. A toggle redraws them with the
        items of the previous outcome: making and adding pyqtgraph items costs milliseconds."""
        run, outcome = self.run, self.outcome
        if run is None or outcome is None:
            self._draw_host(None)
            if self._projected is not None:
                self._projected.remove()
                self._projected = None
                self._fill_legend()
            self._clear_plan_decor()
            self._keep_marks({})
            return
        envelope = self._curve_envelope(run, outcome, outcome.total)
        self._draw_host(outcome)
        if self._projected is None:  # NOTE [ Projected curve halo ] in style
            pen = pg.mkPen(PROJECTION_COLOR, width=PROJECTION_PEN_WIDTH, style=Qt.PenStyle.DashLine)
            halo = pg.mkPen(self.theme.background, width=PROJECTION_HALO_WIDTH)
            plot = self.main.getPlotItem()
            self._projected = EnvelopeCurves(plot, envelope, [pen], z=40, halos=[halo])
        else:
            self._projected.set_envelope(envelope)
        self._fill_legend()
        peak_at = int(np.argmax(outcome.total))
        x = float(envelope.shown(envelope.levels_x[0][peak_at : peak_at + 1])[0])
        text = f"projected {format_bytes(outcome.peak_bytes)}"
        if not self._plan_decor:
            dot = pg.ScatterPlotItem(
                size=10,
                symbol="d",
                brush=pg.mkBrush(PROJECTION_COLOR),
                pen=pg.mkPen("w"),
            )
            dot.setZValue(51)
            label = pg.TextItem(
                text,
                color=self.theme.projection_text,
                anchor=(0.5, PROJECTED_SIDES[0]),
                fill=pg.mkBrush(color(self.theme.label_fill)),
                border=pg.mkPen(PROJECTION_COLOR),
            )
            label.setFont(_font(10, bold=True))
            label.setZValue(52)
            self._plan_decor += [dot, label]
            self.main.addItem(dot)
            self.main.addItem(label)
        dot, label = self._plan_decor
        dot.setData([x], [outcome.peak_bytes])
        label.setText(text)
        label.setPos(x, outcome.peak_bytes)
        self._draw_recompute_marks(run, outcome)

    def _curve_envelope(
        self, run: Run, outcome: PlanOutcome, values: np.ndarray, keep: np.ndarray | None = None
    ) -> Envelope:
        """``values`` on the states of the outcome's curve (those ``keep`` lists, if given),
        placed on the current axis."""
        time_ns, point = outcome.time_ns, outcome.point
        if keep is not None:
            time_ns, point, values = time_ns[keep], point[keep], values[keep]
        if self.axis is Axis.TIME:  # times stay int64 ns: only what is drawn becomes ms
            return Envelope(time_ns, values, x_offset=run.t0_ns, x_divisor=1e6)
        return Envelope(run.x_op[point], values)

    def _draw_host(self, outcome: PlanOutcome | None) -> None:
        """The host curve of an offload plan (NOTE [ Host curve ] in
        ckview.analysis.projection), a solid line with the projection's halo; removed while no
        region offloads. Drawn under the projected curve: both may run along the same bytes."""
        if outcome is None or not outcome.host_peak_bytes:
            if self._host is not None:
                self._host.remove()
                self._host = None
            return
        assert self.run is not None
        # The host changes at a few states: its steps drawn from those alone are the same steps
        # (NOTE [ Max envelope ]), and a toggle skips a pyramid over every state.
        changes = np.flatnonzero(np.diff(outcome.host, prepend=-1))
        keep = np.union1d(changes, [len(outcome.host) - 1])  # the steps run to the end
        envelope = self._curve_envelope(self.run, outcome, outcome.host, keep)
        if self._host is None:
            pen = pg.mkPen(self.theme.host_color, width=PROJECTION_PEN_WIDTH)
            halo = pg.mkPen(self.theme.background, width=PROJECTION_HALO_WIDTH)
            plot = self.main.getPlotItem()
            self._host = EnvelopeCurves(plot, envelope, [pen], z=38, halos=[halo])
        else:
            self._host.set_envelope(envelope)

    def _draw_recompute_marks(self, run: Run, outcome: PlanOutcome) -> None:
        """A dotted line per recompute. A toggle changes the marks of one region, so the lines
        of marks already drawn stay: making and adding a line costs ~1 ms."""
        labelled = len(outcome.recomputes) <= MAX_MARK_LABELS
        if self.axis is Axis.TIME:
            xs = run.x_of_time_ns(np.asarray([m.time_ns for m in outcome.recomputes]))
        else:
            points = np.asarray([m.point for m in outcome.recomputes], dtype=np.int64)
            xs = run.x_op[np.minimum(points, len(run.x_op) - 1)]
        wanted: dict[tuple[float, str | None, str], pg.InfiniteLine | None] = {}
        for mark, x in zip(outcome.recomputes, xs.tolist(), strict=True):
            label = f"↻ {'.'.join(mark.label.split('.')[-2:])}" if labelled else None
            tip = f"recompute {mark.label}: +{mark.compute_ns / 1e6:.1f} ms"
            wanted[(x, label, tip)] = self._marks.get((x, label, tip))
        for (x, label, tip), line in wanted.items():
            if line is None:
                line = pg.InfiniteLine(
                    x,
                    angle=90,
                    movable=False,
                    pen=pg.mkPen(PROJECTION_COLOR, width=1, style=Qt.PenStyle.DotLine),
                    label=label,
                    # Anchored at its end just under the top, the label runs down the line:
                    # never out of the plot, whatever its length.
                    labelOpts={
                        "position": MARK_LABEL_AT,
                        "color": self.theme.projection_text,
                        "fill": pg.mkBrush(color(self.theme.label_fill)),
                        "rotateAxis": (1, 0),
                        "anchors": [(1, 0), (1, 0)],
                    },
                )
                line.setToolTip(tip)
                line.setZValue(30)
                wanted[(x, label, tip)] = line
        self._keep_marks(wanted)  # placed with the other labels by the caller's redraw

    def _keep_marks(self, wanted: dict[tuple[float, str | None, str], pg.InfiniteLine]) -> None:
        """Show exactly the lines of ``wanted``, removing the others."""
        for key, line in self._marks.items():
            if wanted.get(key) is not line:
                self.main.removeItem(line)
        for key, line in wanted.items():
            if self._marks.get(key) is not line:
                self.main.addItem(line, ignoreBounds=True)
        self._marks = dict(wanted)

    def _add_decor(self, *items: pg.GraphicsObject) -> None:
        for item in items:
            self.main.addItem(item, ignoreBounds=True)
            self._decor.append(item)

    # -- view range

    def _y_top(self) -> float:
        run = self.run
        high = run.peak.bytes if run is not None else 1
        if run is not None:
            high = max([high, *_near(high, [b for _, b in run.device_lines()])])
        if self.outcome is not None:
            high = max(high, self.outcome.peak_bytes)
        if self.reserved is not None:
            high = max(high, int(self.reserved.max()))
        return max(float(high) * 1.14, 1.0)

    def _fit_y(self) -> None:
        top = self._y_top()
        self.main.setYRange(0, top, padding=0)
        self.overview.setYRange(0, top, padding=0)
        self._place_labels()

    def _visible_points(self) -> tuple[int, int] | None:
        if self.run is None:
            return None
        (x0, x1), _ = self.main.getPlotItem().getViewBox().viewRange()
        return self.run.point_at(self.axis, x0), self.run.point_at(self.axis, x1)

    def _show_points(self, first: int, last: int) -> None:
        assert self.run is not None
        xs = self.run.x(self.axis)
        self.main.setXRange(float(xs[first]), float(xs[last]), padding=0)

    def _on_range(self) -> None:
        (x0, x1), _ = self.main.getPlotItem().getViewBox().viewRange()
        self.region.blockSignals(True)
        self.region.setRegion((x0, x1))
        self.region.blockSignals(False)
        self._redraw()

    def _on_region(self) -> None:
        x0, x1 = self.region.getRegion()
        if x1 > x0:
            self.main.setXRange(x0, x1, padding=0)

    def _redraw(self) -> None:
        """Redraw the visible slice of every curve (NOTE [ Max envelope ])."""
        (x0, x1), _ = self.main.getPlotItem().getViewBox().viewRange()
        pixels = visible_pixels(self.main.getPlotItem())
        for curves in (self._layers, self._projected, self._host):
            if curves is not None:
                curves.update(x0, x1, pixels)
        self._place_labels()

    # -- mouse

    def _on_mouse_moved(self, event: tuple[QPointF]) -> None:
        run = self.run
        pos = event[0]
        vb = self.main.getPlotItem().getViewBox()
        if run is None or not vb.sceneBoundingRect().contains(pos):
            self.hover_text.setVisible(False)
            self.hover_line.setVisible(False)
            return
        p = vb.mapSceneToView(pos)
        point = run.point_under(self.axis, p.x(), vb.viewPixelSize()[0])
        text = run.describe_point(point)
        if self.outcome is not None:
            text += self._projected_line(run, point)
        self.hover_text.setText(text)
        (x0, x1), (_, y1) = vb.viewRange()
        anchor_x = 1.0 if p.x() > (x0 + x1) / 2 else 0.0
        self.hover_text.setAnchor((anchor_x, 0))
        self.hover_text.setPos(p.x(), y1)
        self.hover_text.setVisible(True)
        self.hover_line.setValue(float(run.x(self.axis)[point]))
        self.hover_line.setVisible(True)
        self.hovered.emit(text.splitlines()[0] + " · " + text.splitlines()[2])

    def _projected_line(self, run: Run, point: int) -> str:
        outcome = self.outcome
        assert outcome is not None
        at = int(np.searchsorted(outcome.point, point, side="right")) - 1
        if at < 0:
            return ""
        line = f"\nprojected {format_bytes(int(outcome.total[at]))}"
        if outcome.host.size:
            line += f" · host {format_bytes(int(outcome.host[at]))}"
        return line

    def _on_click(self, event: object) -> None:
        run = self.run
        vb = self.main.getPlotItem().getViewBox()
        pos = event.scenePos()  # type: ignore[attr-defined]
        button = event.button()  # type: ignore[attr-defined]
        if run is None or button != Qt.MouseButton.LeftButton:
            return
        if not vb.sceneBoundingRect().contains(pos):
            return
        self.select_point(
            run.point_under(self.axis, vb.mapSceneToView(pos).x(), vb.viewPixelSize()[0])
        )


def _steps(xs: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The corners of the step line through ``values`` at ``xs`` (each value held until the
    next change)."""
    change = np.flatnonzero(np.diff(values)) + 1
    at = np.concatenate(([0], change))
    x = np.repeat(xs[at], 2)[1:]
    y = np.repeat(values[at], 2)[:-1]
    return np.append(x, xs[-1]), np.append(y, values[-1])


def _font(points: int, bold: bool = False) -> QFont:
    font = QFont()
    font.setPointSize(points)
    font.setBold(bold)
    return font


def _near(high: float, levels: list[int]) -> list[int]:
    """The device lines worth fitting the y range to: within 3x of the curve's top (a 80 GiB
    device under a 2 GiB step would flatten the curve)."""
    return [level for level in levels if level <= 3 * high]
