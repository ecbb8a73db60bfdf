"""The explorer's clarity list (issue 13, item 3) on traces recorded here: an 80-block chain
(a strip of clickable blocks, recompute labels that give way) and a trace without a step."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyqtgraph as pg
import pytest
from PyQt6.QtCore import QPoint, QPointF, QRectF, Qt
from PyQt6.QtGui import QWheelEvent
from PyQt6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from ckview.gui.main_window import MainWindow
from tests.conftest import open_trace_in
from tests.gui_helpers import window_rect

pytestmark = [pytest.mark.torch, pytest.mark.gui]

CHAIN = 80


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two traces recorded here: an 80-block ``nn.Sequential`` step, and a trace whose
    recording saw no step at all (an empty block under the recorder)."""
    import torch

    from recorder import Recorder

    folder = tmp_path_factory.mktemp("clarity")
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(CHAIN)]
    model = torch.nn.Sequential(*blocks)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    chain = folder / "chain80.h5"
    with Recorder(chain, steps=1, warmup=0, progress=False):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    empty = folder / "no_step.h5"
    with Recorder(empty, steps=1, warmup=1, progress=False):
        pass
    return {"chain": chain, "empty": empty}


def test_close_recompute_labels_do_not_cover_each_other(
    qtbot: QtBot, window: MainWindow, recorded: dict[str, Path]
) -> None:
    open_trace_in(qtbot, window, recorded["chain"])
    window.plan.apply_preset("sqrt")  # 9 recomputes
    timeline = window.timeline
    marks = sorted(timeline._marks.values(), key=lambda m: m.value())
    assert len(marks) == 9
    vb = timeline.main.getPlotItem().getViewBox()
    gap, at = min((b.value() - a.value(), i) for i, (a, b) in enumerate(itertools.pairwise(marks)))
    pair = marks[at : at + 2]

    def show_gap(pixels: float) -> None:
        """Zoom so that the closest two marks lie ``pixels`` apart, in the middle."""
        half = gap * vb.width() / pixels / 2
        middle = (pair[0].value() + pair[1].value()) / 2
        timeline.main.setXRange(middle - half, middle + half, padding=0)

    def rects() -> list[QRectF]:
        return [m.label.sceneBoundingRect() for m in marks if m.label.isVisible()]

    def gives_way_to_a_peak(mark: pg.InfiniteLine) -> bool:
        """Where the mark's label would run (down its line from under the top, right of it)
        meets a peak label shown (NOTE [ Labels never overlap ]), or its line is out of view."""
        area = vb.sceneBoundingRect()
        x = vb.mapViewToScene(QPointF(mark.value(), 0)).x()
        size = mark.label.textItem.boundingRect().size()
        would = QRectF(x, area.top() + 0.06 * area.height(), size.height(), size.width())
        would.adjust(-2, -2, 2, 2)
        peaks = [timeline._peak_label, *timeline._plan_decor[1:]]
        met = any(p.isVisible() and would.intersects(p.sceneBoundingRect()) for p in peaks)
        return met or not area.left() <= x <= area.right()

    show_gap(8)  # closer than a label is tall: one gives way (its tooltip stays)
    assert not all(m.label.isVisible() for m in pair)
    assert rects() or all(gives_way_to_a_peak(m) for m in pair)
    qtbot.waitUntil(lambda: not any(a.intersects(b) for a, b in itertools.combinations(rects(), 2)))
    show_gap(100)  # every mark now lies at least 100 pixels from the next: all labelled
    qtbot.wait(20)
    timeline.main.grab()  # a paint: the peak labels' transforms follow the new range
    assert rects() and all(m.label.isVisible() or gives_way_to_a_peak(m) for m in marks)


# ----------------------------------------------------------------------------- chain strip


def test_an_80_block_chain_can_be_clicked_block_by_block(
    qtbot: QtBot, window: MainWindow, recorded: dict[str, Path]
) -> None:
    open_trace_in(qtbot, window, recorded["chain"])
    view, strip = window.plan.chain_view, window.plan.strip
    session = window.plan.session
    assert session is not None and session.chain is not None
    assert len(session.chain.blocks) == CHAIN and view.isVisible()
    assert "80 blocks" in view.title.text() and "scroll" in view.title.text()
    # The heading is its own widget above the strip: nothing is drawn over it.
    assert window_rect(view.title, window).bottom() <= window_rect(view.area, window).top()
    rects = strip._geometry()
    assert strip.width() > view.area.viewport().width()  # wider than the panel: it scrolls
    assert min(r.width() for r in rects) >= strip.fontMetrics().horizontalAdvance("79") + 4
    clicked: list[int] = []
    strip.blockClicked.connect(clicked.append)
    for rect in rects:
        view.area.ensureVisible(rect.center().x(), rect.center().y())
        assert strip.visibleRegion().contains(rect.center())
        qtbot.mouseClick(strip, Qt.MouseButton.LeftButton, pos=rect.center())
    assert clicked == list(range(CHAIN))
    assert all(session.segment_selected(i, i + 1) for i in range(CHAIN))
    bar = view.area.horizontalScrollBar()
    assert bar is not None and bar.value() == bar.maximum() > 0
    wheel = QWheelEvent(
        QPointF(10, 10),
        QPointF(10, 10),
        QPoint(0, 0),
        QPoint(0, 120),  # the wheel turned up (away): towards the chain's start
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(view.area.viewport(), wheel)
    assert bar.value() == bar.maximum() - 120
    gap = QPoint((rects[40].left() + rects[39].right()) // 2, rects[40].center().y())
    assert strip.hit(gap) == ("gap", 40)


def test_a_trace_without_a_step_says_so(
    qtbot: QtBot, window: MainWindow, recorded: dict[str, Path]
) -> None:
    open_trace_in(qtbot, window, recorded["empty"], ready=False)
    run = window.current_run()
    assert run is not None and run.n_events == 0
    timeline = window.timeline
    assert timeline.showing_message() and "holds no step" in timeline.message.text()
    assert timeline._layers is None and not timeline.plots.isVisible()
    window.timeline.jump_to_peak()  # nothing to centre on: no error
    window.toggle_theme()
    assert timeline.showing_message()
    assert window.plan.readout.text() == "This run holds no step: nothing to plan."
    window.show_compare(side_by_side=True)  # its comparison draws, empty, without an error
    qtbot.waitUntil(lambda: len(window.compare._curves) == 1)
    assert window.run_box.currentText().endswith("(no step)")
    assert window.status_run.text().endswith("0 events · no step")
