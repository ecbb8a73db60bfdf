"""A long trace file name (an experiment directory's: 120 characters, no space) never makes the
explorer wider (NOTE [ Long names never widen the window ] in ckview/gui/fit.py): the window's
least width is the same as with a short name on every tab, and what is elided to fit keeps the
whole name in its tooltip; checked on the real window."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyqtgraph as pg
import pytest
from PyQt6.QtGui import QTextDocument
from pytestqt.qtbot import QtBot

from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT
from tests.gui_helpers import cut_lines

pytestmark = [pytest.mark.torch, pytest.mark.gui]

SAMPLES = ROOT / "sample_traces"
LONG = (
    "lr3e-4_bs64_seq2048_warmup1000_cosine_fsdp_gradckpt_activation_offload_experiment_"
    "directory_2026_11_26_seed12345_run"
)
"""117 characters: with ``{i}.h5``, a 120-character file name."""
TABS = ("timeline", "compare", "side by side", "diff")


def _copies(folder: Path, stem: str) -> list[Path]:
    """Two sample traces (a run and its checkpointed twin) under ``{stem}{0,1}.h5``."""
    folder.mkdir(exist_ok=True)
    paths = []
    for i, sample in enumerate(("mlp.h5", "mlp_checkpointed.h5")):
        paths.append(folder / f"{stem}{i}.h5")
        shutil.copy(SAMPLES / sample, paths[-1])
    return paths


def _open(qtbot: QtBot, window: MainWindow, paths: list[Path]) -> None:
    for path in paths:
        with qtbot.waitSignal(window.loaded, timeout=20000):
            window.open_paths([str(path)])
    qtbot.waitUntil(window.plan.is_ready, timeout=20000)


def _show(qtbot: QtBot, window: MainWindow, tab: str) -> None:
    if tab == "timeline":
        window.tabs.setCurrentWidget(window.timeline)
    elif tab == "diff":
        window.tabs.setCurrentWidget(window.diff)
    else:
        window.show_compare(side_by_side=tab == "side by side")
    qtbot.wait(50)


def _plain(rich: str) -> str:
    doc = QTextDocument()
    doc.setHtml(rich)
    return doc.toPlainText()


@pytest.mark.parametrize("tab", TABS)
def test_a_long_file_name_does_not_widen_the_window(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, tab: str
) -> None:
    """The same window's least width with two traces of short names, then of long ones (a
    window made earlier in the process has other least widths: compare within one)."""
    widths = []
    for stem in ("s", LONG):
        window.close_all()
        _open(qtbot, window, _copies(tmp_path / stem[:8], stem))
        _show(qtbot, window, tab)
        widths.append(window.minimumSizeHint().width())
    assert widths[1] <= widths[0] + 4, f"least width {widths[0]} px short, {widths[1]} px long"


def test_what_a_long_name_elides_keeps_it_whole_in_a_tooltip(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """At 1000 x 700 (the Diff tab at 700 px, where its header cannot hold the name): the
    status bar, the run box, the Compare header and panel titles, the Diff tab's run boxes,
    header and legend show the name elided (…, never cut mid-letter) and whole on hover."""
    _open(qtbot, window, _copies(tmp_path, LONG))
    window.resize(1000, 700)
    run = window.current_run()
    assert run is not None and len(run.source.rsplit("/", 1)[-1]) == 120
    names = [r.label for r in window.runs()]

    status = window.status_run
    qtbot.waitUntil(lambda: "…" in status.shown_text())
    assert run.label in status.toolTip()
    shown = status.shown_text()
    assert status.fontMetrics().horizontalAdvance(shown) <= status.contentsRect().width()
    box = window.run_box
    assert "…" in box.shown_text() and run.label in box.toolTip()

    window.show_compare(side_by_side=True)
    header = window.compare.summary
    qtbot.waitUntil(lambda: "…" in header.text())
    qtbot.wait(50)
    assert cut_lines(header) == []
    assert all(name in _plain(header.toolTip()) for name in names)
    assert "270 MiB" in _plain(header.text())  # the peaks stay: only the name is elided
    panels = [i for i in window.compare.plots.ci.items if isinstance(i, pg.PlotItem)]
    assert len(panels) == 2
    view = window.compare.plots.viewport()
    assert view is not None
    for panel, name in zip(panels, names, strict=True):
        title = panel.titleLabel
        assert "…" in title.text and name in title.toolTip()
        assert panel.sceneBoundingRect().right() <= view.width()
        assert title.item.sceneBoundingRect().right() <= view.width()

    window.tabs.setCurrentWidget(window.diff)  # the docks hide: the window may be narrower

    def narrowed() -> bool:
        window.resize(700, 700)
        return window.width() == 700

    qtbot.waitUntil(narrowed)
    diff = window.diff
    qtbot.waitUntil(lambda: "…" in diff.header.text())
    qtbot.wait(50)
    assert cut_lines(diff.header) == []
    assert all(name in _plain(diff.header.toolTip()) for name in names)
    for box, name in ((diff.box_a, names[0]), (diff.box_b, names[1])):
        assert "…" in box.shown_text() and name in box.toolTip()
    legend = diff.legend
    assert all("…" in text for text in legend.shown_texts())
    assert all(name in legend.toolTip() for name in names)


def test_a_run_without_a_step_and_a_long_name_does_not_widen_the_window(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """The timeline's message for a run without a step names the run: its file name wraps
    after a ``_`` instead of being one word of the message's least width."""
    from recorder import Recorder

    empty = tmp_path / "empty.h5"
    with Recorder(empty, steps=1, warmup=1, progress=False):
        pass
    widths = []
    for stem in ("s", LONG):
        window.close_all()
        path = tmp_path / f"{stem}0.h5"
        shutil.copy(empty, path)
        with qtbot.waitSignal(window.loaded, timeout=20000):
            window.open_paths([str(path)])
        qtbot.wait(50)
        assert window.timeline.pages.currentWidget() is window.timeline.message
        assert "holds no step" in window.timeline.message.text()
        widths.append(window.minimumSizeHint().width())
    assert widths[1] <= widths[0] + 4, f"least width {widths[0]} px short, {widths[1]} px long"


def test_side_by_side_titles_that_fit_stay_whole(qtbot: QtBot, window: MainWindow) -> None:
    """A panel title is elided only when it does not fit: titles of short names, in a window
    of ordinary size, show whole (each label once took only the room the others left)."""
    window.resize(1200, 760)
    _open(qtbot, window, [SAMPLES / "transformer_compare.h5"])
    _show(qtbot, window, "side by side")
    panels = [i for i in window.compare.plots.ci.items if isinstance(i, pg.PlotItem)]
    assert len(panels) == 2
    for panel in panels:
        title = panel.titleLabel
        assert "…" not in title.text and title.toolTip() == ""
        assert "transformer_compare.h5" in title.text
