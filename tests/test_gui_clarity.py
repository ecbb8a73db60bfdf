"""The explorer's clarity list (issue 13, item 3), through the real widgets offscreen: legends
beside the plots, labels that read and are not cut, binary byte ticks, clean titled exports,
and a message with no trace open. On traces recorded for it (an 80-block chain, a trace
without a step): tests/test_gui_long_chain.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyqtgraph as pg
import pytest
from PyQt6.QtCore import QRectF, Qt
from PyQt6.QtGui import QColor, QImage
from pytestqt.qtbot import QtBot

from ckview.app.style import DARK, LIGHT, PEAK_COLOR, PROJECTION_COLOR, THEMES, Theme
from ckview.gui.axes import BytesAxis, byte_step, byte_ticks, tick_label
from ckview.gui.export import export_title
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT, open_trace_in
from tests.gui_helpers import window_rect

pytestmark = pytest.mark.gui

SAMPLES = ROOT / "sample_traces"


@pytest.fixture(params=[LIGHT, DARK], ids=["light", "dark"])
def theme(request: pytest.FixtureRequest) -> Theme:
    return request.param  # type: ignore[no-any-return]


def scene_rect(view: pg.GraphicsView, item: pg.GraphicsObject) -> QRectF:
    """An item's bounding rectangle in the view's scene."""
    return item.mapRectToScene(item.boundingRect())


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two colours."""

    def luminance(hex_color: str) -> float:
        c = QColor(hex_color[:7])
        lin = [
            v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
            for v in (c.redF(), c.greenF(), c.blueF())
        ]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


# ----------------------------------------------------------------------------- byte ticks


@pytest.mark.parametrize("high", [819.2 * 1.14, 171 * 1024 * 1.14, 88.8 * 2**20 * 1.14, 3e9])
@pytest.mark.parametrize("target", [3, 6, 9])
def test_ticks_step_by_a_power_of_two_and_read_exactly(high: float, target: int) -> None:
    step = byte_step(0, high, target)
    assert step & (step - 1) == 0  # a power of two
    assert step == 1 or high / (step // 2) > target  # the smallest such step
    ticks = byte_ticks(0, high, target)
    assert ticks[0] == 0 and all(b - a == step for a, b in itertools.pairwise(ticks))
    assert len(ticks) <= target + 1 and ticks[-1] <= high < ticks[-1] + step
    for value, label in zip(ticks, map(tick_label, ticks), strict=True):
        number, _, unit = label.partition(" ")
        scale = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
        assert float(number) * scale == value, label  # exact: no rounding


def test_a_small_model_reads_256_byte_steps_not_decimal_ones() -> None:
    assert [tick_label(v) for v in byte_ticks(0, 1000, 4)] == ["0", "256 B", "512 B", "768 B"]
    assert tick_label(1.125 * 2**20) == "1.125 MiB"


def test_every_panel_and_the_report_use_the_binary_axis(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    from ckview.gui.report import _plot

    open_trace_in(qtbot, window, SAMPLES / "mlp.h5")
    window.show_compare(side_by_side=True)
    qtbot.waitUntil(lambda: bool(window.compare._curves))
    plots = [
        window.timeline.main.getPlotItem(),
        window.timeline.overview.getPlotItem(),
        *(plot for plot, _ in window.compare._curves),
        _plot(LIGHT, window.axis, show_x_label=True),
    ]
    for plot in plots:
        axis = plot.getAxis("left")
        assert isinstance(axis, BytesAxis)
        low, high = 0.0, 270 * 2**20 * 1.14
        [(_, values)] = axis.tickValues(low, high, 300)
        assert values and all(v % byte_step(low, high, len(values)) == 0 for v in values)
        assert axis.tickStrings(values, 1, 1) == [tick_label(v) for v in values]


# ----------------------------------------------------------------------------- the timeline


def test_legend_sits_beside_the_plot_area(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    window.plan.apply_preset("all")
    window.timeline.jump_to_peak()
    legend = window.timeline.legend
    assert legend.texts()[0] == "other" and legend.texts()[-1].startswith("projected (")
    qtbot.waitUntil(lambda: legend.width() > 0)  # laid out once the event loop runs
    assert legend.isVisible()
    main = window.timeline.main
    box = main.mapFromScene(main.getPlotItem().getViewBox().sceneBoundingRect()).boundingRect()
    plot_area = QRectF(box).translated(QRectF(window_rect(main, window)).topLeft())
    assert not window_rect(legend, window).intersects(plot_area)
    # The overlay names its curves in the summary line above the plot, not on it.
    window.show_compare(side_by_side=False)
    qtbot.waitUntil(lambda: bool(window.compare._curves))
    assert all(plot.legend is None for plot, _ in window.compare._curves)


def test_projected_curve_has_a_halo_in_the_theme_background(
    qtbot: QtBot, window: MainWindow, theme: Theme
) -> None:
    """NOTE [ Projected curve halo ]: a wider solid line under the dashes, in the background
    colour, so that the curve reads on the orange activation fill."""
    window.set_theme(theme)
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    window.plan.apply_preset("sqrt")
    projected = window.timeline._projected
    assert projected is not None and len(projected.halos) == 1
    line, (index, halo) = projected.items[0], projected.halos[0]
    assert index == 0 and halo.zValue() < line.zValue()
    assert halo.opts["pen"].widthF() > line.opts["pen"].widthF() + 2
    assert halo.opts["pen"].color().name() == QColor(theme.background).name()
    assert line.opts["pen"].style() == Qt.PenStyle.DashLine
    assert halo.xData is not None and len(halo.xData) == len(line.xData)


@pytest.mark.parametrize("name", [t for t in THEMES])
def test_value_label_colours_read_on_their_background(name: str) -> None:
    theme = THEMES[name]
    fill = theme.label_fill[:7]
    for text in (theme.peak_text, theme.projection_text, theme.foreground):
        assert contrast(text, fill) >= 4.5
    assert contrast(theme.peak_text, theme.background) > contrast(PEAK_COLOR, theme.background)
    assert theme.projection_text != PROJECTION_COLOR or contrast(PROJECTION_COLOR, fill) >= 4.5


def test_recompute_labels_are_whole_and_inside_the_plot(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    window.plan.apply_preset("all")
    vb = window.timeline.main.getPlotItem().getViewBox()
    marks = list(window.timeline._marks.values())
    assert len(marks) == 4
    for line in marks:
        text = line.label.toPlainText()
        assert text.startswith("↻ layers.") and text[-1].isdigit()
    qtbot.waitUntil(  # once laid out, every label lies wholly inside the plot
        lambda: all(vb.sceneBoundingRect().contains(m.label.sceneBoundingRect()) for m in marks)
    )


def test_phase_names_never_overprint(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, SAMPLES / "transformer_checkpointed.h5", ready=False)
    timeline = window.timeline
    qtbot.wait(50)

    def shown() -> list[QRectF]:
        return [b.item.sceneBoundingRect() for b in timeline._band_labels if b.item.isVisible()]

    whole = shown()
    assert whole and len(whole) < len(timeline._band_labels)  # narrow bands go unnamed
    assert not any(a.intersects(b) for a, b in itertools.combinations(whole, 2))
    recompute = next(b for b in timeline._band_labels if b.names[0][0].startswith("recompute"))
    timeline.main.setXRange(recompute.x0, recompute.x1 + (recompute.x1 - recompute.x0), padding=0)
    qtbot.wait(50)  # the items' scene transforms follow the new range
    assert recompute.item.isVisible()  # zoomed in, its name fits and shows
    assert not any(a.intersects(b) for a, b in itertools.combinations(shown(), 2))


def test_peak_label_stays_inside_the_view_or_hides(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, SAMPLES / "mlp.h5", ready=False)
    timeline = window.timeline
    label = timeline._peak_label
    assert label is not None
    vb = timeline.main.getPlotItem().getViewBox()
    hidden = 0
    for shift in (-0.45, -0.3, 0.0, 0.3, 0.45, 0.6, -0.6):  # the peak near each edge, then out
        timeline.jump_to_peak()
        timeline.pan(shift)
        (x0, x1), _ = vb.viewRange()
        if x0 <= label.pos().x() <= x1:
            qtbot.waitUntil(lambda: vb.sceneBoundingRect().contains(label.sceneBoundingRect()))
        else:
            hidden += 1
            assert not label.isVisible()
    assert hidden == 2


def test_shadowed_rows_are_marked_and_unmarked(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    panel = window.plan
    session = panel.session
    assert session is not None
    root = next(info.row for info in session.modules if info.calls and info.parent < 0)
    inner = next(i for i in session.modules if i.calls and i.row != root and "layers.0" in i.path)
    item = panel._items[inner.row]
    before = item.toolTip(0)
    panel.toggle_module(inner.row)
    panel.toggle_module(root)  # selected inside a selected module: shadowed
    assert item.font(0).italic() and "outer one wins" in item.toolTip(0)
    panel.toggle_module(root)
    assert not item.font(0).italic() and item.toolTip(0) == before


def test_module_names_are_not_truncated(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    tree = window.plan.tree
    header = tree.header()
    assert header is not None
    qtbot.waitUntil(lambda: header.sectionSize(0) >= tree.sizeHintForColumn(0))
    assert header.sectionResizeMode(1) == header.ResizeMode.Stretch


# ----------------------------------------------------------------------------- comparison


def test_side_by_side_peak_labels_are_boxed_inside_their_plots(
    qtbot: QtBot, window: MainWindow, theme: Theme
) -> None:
    window.set_theme(theme)
    window.resize(1200, 700)  # short panels, where labels above the dot were cut
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    window.plan.apply_preset("sqrt")
    window.show_compare(side_by_side=True)
    qtbot.waitUntil(lambda: len(window.compare._curves) == 3)

    def labels_of() -> dict[pg.PlotItem, list[pg.TextItem]]:
        plots = {plot for plot, _ in window.compare._curves}
        return {plot: [i for i in plot.items if isinstance(i, pg.TextItem)] for plot in plots}

    def inside() -> bool:  # once the panels are laid out
        return all(
            plot.vb.sceneBoundingRect().contains(item.sceneBoundingRect())
            for plot, items in labels_of().items()
            for item in items
        )

    qtbot.waitUntil(inside, timeout=5000)
    shown = labels_of()
    labels = []
    for items in shown.values():
        for item in items:
            assert item.fill.color().name() == QColor(theme.label_fill[:7]).name()
            assert item.color.name() == QColor(theme.foreground).name()
        rects = [item.sceneBoundingRect() for item in items]
        assert not any(a.intersects(b) for a, b in itertools.combinations(rects, 2))
        labels += items
    assert len(labels) == 3  # two run peaks and the projected one (at the baseline's peak)


# ----------------------------------------------------------------------------- export


def test_export_has_a_title_and_no_transient_ui(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    window.plan.apply_preset("all")
    timeline = window.timeline
    vb = timeline.main.getPlotItem().getViewBox()
    timeline._on_mouse_moved((vb.sceneBoundingRect().center(),))
    timeline.select_point(window.runs()[0].peak.point)
    assert timeline.hover_text.isVisible() and timeline.hover_line.isVisible()
    painted: list[str] = []
    for name in ("hover_text", "hover_line", "selection_line"):
        item = getattr(timeline, name)
        paint = item.paint
        item.paint = lambda *a, _p=paint, _n=name: (painted.append(_n), _p(*a))[1]
    png, svg = tmp_path / "view.png", tmp_path / "view.svg"
    window.export_view(str(png))
    window.export_view(str(svg))
    assert painted == []
    assert timeline.hover_text.isVisible() and timeline.selection_line.isVisible()  # given back
    title = window.export_title()
    assert title.startswith("transformer_compare.h5 · baseline (peak ")
    assert "plan → projected " in title and "layers.0" in title
    image = QImage(str(png))
    assert image.width() == timeline.width() and image.height() > timeline.height()
    assert f"<title>{title}</title>" in svg.read_text(encoding="utf-8")


def test_export_title_names_every_compared_run() -> None:
    from ckview.app.run import load_trace

    runs = load_trace(SAMPLES / "transformer_compare.h5").runs
    title = export_title(runs)
    assert title == (
        "transformer_compare.h5 · baseline (peak 88.8 MiB) vs checkpointed (peak 36.6 MiB)"
    )


# ----------------------------------------------------------------------------- nothing to draw


def test_no_trace_says_how_to_open_or_record_one(qtbot: QtBot, window: MainWindow) -> None:
    timeline = window.timeline
    assert timeline.showing_message() and not timeline.plots.isVisible()
    text = timeline.message.text()
    assert "ckview record -o trace.h5 train.py" in text and "File → Open" in text
    open_trace_in(qtbot, window, SAMPLES / "mlp.h5", ready=False)
    assert not timeline.showing_message() and timeline.plots.isVisible()
    window.close_all()
    assert timeline.showing_message()
