"""The timeline's labels never overlap (NOTE [ Labels never overlap ] in ckview/gui/labels.py):
the peak labels always show, a recompute label that would cover one starts below it, a phase
name that would cover one hides, and recompute labels and phase names never cover each other;
checked on the real explorer from the boxes Qt draws the labels in. Also the Compare tab's header
line, never cut at the right edge."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pyqtgraph as pg
import pytest
from PyQt6.QtCore import QPointF, QRectF
from PyQt6.QtGui import QTextDocument
from PyQt6.QtWidgets import QLabel, QVBoxLayout, QWidget
from pytestqt.qtbot import QtBot

from ckview.gui import timeline as timeline_module
from ckview.gui.compare import EntriesLabel
from ckview.gui.main_window import MainWindow
from ckview.gui.timeline import TimelineView
from tests.conftest import ROOT, open_trace_in
from tests.gui_helpers import cut_lines

pytestmark = pytest.mark.gui

SAMPLES = ROOT / "sample_traces"


def _labels(timeline: TimelineView) -> dict[str, pg.TextItem]:
    """Every text label at the top of the main plot, by a name for messages."""
    labels: dict[str, pg.TextItem] = {}
    if timeline._peak_label is not None:
        labels["peak"] = timeline._peak_label
    for item in timeline._plan_decor[1:]:
        labels["projected"] = item
    for line in timeline._marks.values():
        label = getattr(line, "label", None)  # none beyond MAX_MARK_LABELS marks
        if label is not None:
            labels[f"mark {label.toPlainText()} at {line.value():.1f}"] = label
    for band in timeline._band_labels:
        labels[f"band {band.names[0][0]} at {band.x0:.1f}"] = band.item
    return labels


def _drawn(qtbot: QtBot, w: MainWindow) -> dict[str, QRectF]:
    """The visible labels' boxes in the scene, as painted (a grab paints the scene, and the
    labels' transforms follow the view range in its preparation)."""
    qtbot.wait(20)
    w.timeline.main.grab()
    return {
        name: item.sceneBoundingRect()
        for name, item in _labels(w.timeline).items()
        if item.isVisible()
    }


def _overlaps(boxes: dict[str, QRectF]) -> list[tuple[str, str]]:
    return [
        (a, b) for (a, ra), (b, rb) in itertools.combinations(boxes.items(), 2) if ra.intersects(rb)
    ]


def _scene_x(timeline: TimelineView, x: float) -> float:
    vb = timeline.main.getPlotItem().getViewBox()
    return float(vb.mapViewToScene(QPointF(x, 0.0)).x())


def _laid_out(qtbot: QtBot, w: MainWindow) -> None:
    """Wait until the main plot's width holds (the legend and the axes settle after a trace
    opens): a zoom set in pixels before then shifts as the plot narrows."""
    vb = w.timeline.main.getPlotItem().getViewBox()
    widths = [-1.0]

    def steady() -> bool:
        widths.append(vb.width())
        return widths[-1] == widths[-2] and w.timeline.legend.width() > 0

    qtbot.waitUntil(steady, timeout=5000)


def _meet_at_the_peak(qtbot: QtBot, w: MainWindow) -> tuple[float, float]:
    """Zoom out around the recorded peak (in backward) until the nearest recompute mark is 10
    pixels from it: its label and the backward band's name fall on the peak label. Returns the
    peak's x and the mark's."""
    _laid_out(qtbot, w)
    timeline = w.timeline
    run = w.runs()[0]
    peak_x = float(run.x(timeline.axis)[run.peak.point])
    marks = [line.value() for line in timeline._marks.values()]
    mark_x = min(marks, key=lambda x: abs(x - peak_x))
    width = timeline.main.getPlotItem().getViewBox().width()
    span = abs(mark_x - peak_x) * width / 10
    timeline.main.setXRange(peak_x - span / 2, peak_x + span / 2, padding=0)
    return peak_x, mark_x


def test_labels_that_meet_the_peak_label_give_way_and_it_shows(
    qtbot: QtBot, window: MainWindow
) -> None:
    """NOTE [ Labels never overlap ]: on a planned run whose peak is in backward, zoomed out so
    that a recompute mark and the backward band start a few pixels from the peak: the mark's
    label starts below the peak label, the band's name hides."""
    window.resize(1200, 800)
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5", "all")
    timeline = window.timeline
    peak_x, mark_x = _meet_at_the_peak(qtbot, window)
    backward = next(b for b in timeline._band_labels if b.names[0][0] == "backward 0")
    peak_at = _scene_x(timeline, peak_x)
    assert abs(_scene_x(timeline, mark_x) - peak_at) < 12  # the premise: they would meet
    assert abs(_scene_x(timeline, backward.x0) - peak_at) < 40
    boxes = _drawn(qtbot, window)
    assert "peak" in boxes  # the number users came for
    assert _overlaps(boxes) == []
    assert any(name.startswith("band forward") for name in boxes)  # it meets none: it shows
    assert not any(name.startswith("band backward") for name in boxes)
    nearest = next(
        name for name in boxes if name.startswith("mark ") and f"at {mark_x:.1f}" in name
    )
    assert boxes[nearest].top() >= boxes["peak"].bottom()  # below the peak label, not hidden
    # Zoomed in on the marks, the peak out of view: every recompute label shows again.
    last = max(line.value() for line in timeline._marks.values())
    timeline.main.setXRange((peak_x + mark_x) / 2, last + (last - mark_x) / 4, padding=0)
    boxes = _drawn(qtbot, window)
    assert _overlaps(boxes) == []
    assert sum(name.startswith("mark ") for name in boxes) == len(timeline._marks)


@pytest.mark.parametrize(
    ("trace", "preset"),
    [
        ("transformer_compare.h5", "all"),
        ("transformer_compare.h5", "sqrt"),
        ("gpt2_compare.h5", "all"),
        ("transformer_checkpointed.h5", None),
    ],
)
@pytest.mark.parametrize("size", [(1400, 900), (1000, 560)])
def test_no_two_visible_labels_meet_at_any_zoom(
    qtbot: QtBot, window: MainWindow, trace: str, preset: str | None, size: tuple[int, int]
) -> None:
    """Zoomed to fit, on the peak, out and in, panned, at two window sizes; after a plan
    toggle too. The peak labels show whenever their dot is in view."""
    window.resize(*size)
    open_trace_in(qtbot, window, SAMPLES / trace, preset)
    timeline = window.timeline
    run = window.runs()[0]
    peak_x = float(run.x(timeline.axis)[run.peak.point])
    vb = timeline.main.getPlotItem().getViewBox()

    def check(where: str) -> None:
        boxes = _drawn(qtbot, window)
        assert _overlaps(boxes) == [], where
        (x0, x1), _ = vb.viewRange()
        assert ("peak" in boxes) == (x0 <= peak_x <= x1), where

    timeline.zoom_to_fit()
    check("fit")
    timeline.jump_to_peak()
    check("on the peak")
    for factor in (3.0, 2.0, 0.2, 4.0):
        timeline.zoom(factor)
        check(f"zoomed by {factor}")
    timeline.pan(0.3)
    check("panned")
    if preset is not None:
        window.plan.apply_preset("none")
        check("no plan")
        window.plan.apply_preset(preset)
        check("plan again")


def test_marks_without_labels_place_nothing(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More recomputes than MAX_MARK_LABELS: lines without labels, the peak's still placed."""
    monkeypatch.setattr(timeline_module, "MAX_MARK_LABELS", 2)
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5", "all")
    timeline = window.timeline
    _meet_at_the_peak(qtbot, window)
    assert len(timeline._marks) == 4
    assert not any(hasattr(line, "label") for line in timeline._marks.values())
    boxes = _drawn(qtbot, window)
    assert "peak" in boxes and _overlaps(boxes) == []
    assert timeline._placed[0][0] is timeline._peak_label


def test_arithmetic_boxes_are_the_drawn_ones(qtbot: QtBot, window: MainWindow) -> None:
    """The boxes the timeline places labels by (arithmetic on the view range, no scene query)
    are those Qt paints, within a pixel."""
    window.resize(1200, 800)
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5", "all")
    timeline = window.timeline
    _meet_at_the_peak(qtbot, window)
    timeline.zoom(0.5)
    drawn = _drawn(qtbot, window)
    shown = {id(item): name for name, item in _labels(timeline).items() if name in drawn}
    assert len(shown) >= 4
    for item, box in timeline._placed:
        if id(item) in shown:
            real = drawn[shown[id(item)]]
            for a, b in zip(box.getCoords(), real.getCoords(), strict=True):
                assert abs(a - b) <= 1.0, (shown[id(item)], box, real)


# ----------------------------------------------------------------------------- compare header


def _lines(label: QLabel) -> list[str]:
    doc = QTextDocument()
    doc.setHtml(label.text().replace("<br>", "\n<br>"))
    return doc.toPlainText().split("\n")


def _ranks(tmp_path: Path, stem: str) -> list[Path]:
    """Two rank files of one run (a sample trace twice, as ``ckview view`` opens ranks)."""
    paths = [tmp_path / f"{stem}.rank{rank}.h5" for rank in (0, 1)]
    for path in paths:
        shutil.copy(SAMPLES / "transformer_compare.h5", path)
    return paths


@pytest.mark.parametrize("width", [1400, 1000, 760])
def test_compare_header_wraps_between_entries_and_is_nevercut_lines(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, width: int
) -> None:
    """The header that names runs and ranks (``... baseline: ranks balanced``) goes onto as
    many lines as it needs, each entry whole on one line, inside the Compare tab."""
    for path in _ranks(tmp_path, "fsdp"):
        with qtbot.waitSignal(window.loaded, timeout=20000):
            window.open_paths([str(path)])
    window.plan.apply_preset("all")
    window.resize(width, 800)
    window.show_compare(side_by_side=True)
    header = window.compare.summary
    qtbot.waitUntil(lambda: header.entries[-1].startswith("checkpointed: ranks"), timeout=5000)
    qtbot.wait(20)
    assert len(header.entries) == 7  # four runs, the plan, the ranks of two run names
    assert cut_lines(header) == []
    assert header.geometry().right() < window.compare.width()
    assert header.toolTip() == ""  # nothing elided
    lines = _lines(header)
    for entry in header.entries:
        doc = QTextDocument()
        doc.setHtml(entry)
        assert any(doc.toPlainText() in line for line in lines), (entry, lines)  # whole


def test_compare_header_elides_what_cannot_wrap_with_the_whole_in_a_tooltip(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """A run name with no space to wrap at, wider than the header: elided, the whole header in
    the tooltip. (In the window the Diff tab's header and the status bar make the window as
    wide as such a name, so the header is tried alone at a narrower width too.)"""
    stem = "a_trace_name_without_a_single_space_to_wrap_at_" * 3
    for path in _ranks(tmp_path, stem):
        with qtbot.waitSignal(window.loaded, timeout=20000):
            window.open_paths([str(path)])
    window.show_compare(side_by_side=False)
    header = window.compare.summary
    qtbot.waitUntil(lambda: len(header.entries) == 6, timeout=5000)
    assert window.compare.minimumSizeHint().width() < 200  # it asks for no width of its own
    qtbot.wait(20)
    assert cut_lines(header) == []
    alone = QWidget()
    qtbot.addWidget(alone)
    layout = QVBoxLayout(alone)
    narrow = EntriesLabel()
    layout.addWidget(narrow)
    layout.addStretch(1)
    narrow.set_entries(header.entries)
    alone.resize(600, 300)
    alone.show()
    qtbot.waitUntil(lambda: "…" in narrow.text())
    assert alone.width() == 600 and cut_lines(narrow) == []
    assert _lines(narrow)[-1] == "baseline: ranks balanced  ·  checkpointed: ranks balanced"
    doc = QTextDocument()
    doc.setHtml(narrow.toolTip())
    assert all(f"{stem}.rank{r}.h5 · baseline: 88.8 MiB" in doc.toPlainText() for r in (0, 1))
