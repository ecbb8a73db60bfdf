"""The explorer driven through its real widgets, offscreen (pytest-qt)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PyQt6.QtCore import QMimeData, QPoint, QPointF, QSettings, Qt, QUrl
from PyQt6.QtGui import QDropEvent, QImage
from PyQt6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from ckview.analysis import (
    ModuleRegion,
    Planner,
    SegmentRegion,
    format_bytes,
    live_storages,
    project,
    regions_from_plan,
)
from ckview.app.run import Axis
from ckview.app.style import DARK, LIGHT
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT, open_trace_in

pytestmark = pytest.mark.gui

SAMPLES = ROOT / "sample_traces"


@pytest.fixture
def window(qtbot: QtBot, window: MainWindow) -> MainWindow:
    """conftest's window, made active: shortcuts (Qt.WindowShortcut) fire only there."""
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    return window


def open_traces(qtbot: QtBot, w: MainWindow, *names: str) -> None:
    """Open sample traces and wait until they are shown and the plan model is built."""
    for name in names:
        with qtbot.waitSignal(w.loaded, timeout=20000):
            w.open_paths([str(SAMPLES / name)])
    qtbot.waitUntil(w.plan.is_ready, timeout=20000)


def press(
    qtbot: QtBot,
    w: MainWindow,
    key: Qt.Key,
    modifier: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier,
) -> None:
    """A shortcut key in the window. Window shortcuts need the window active, which the
    offscreen platform does not always keep (a progress dialog shown and hidden under load)."""
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    qtbot.keyClick(w, key, modifier)


def readout_peak(w: MainWindow) -> str:
    return w.plan.readout.text()


def test_open_shows_runs_timeline_and_peak(qtbot: QtBot, window: MainWindow) -> None:
    with qtbot.waitSignals([window._progress, window.loaded], timeout=20000):
        window.open_paths([str(SAMPLES / "transformer_compare.h5")])
    qtbot.waitUntil(window.plan.is_ready, timeout=20000)
    assert [window.run_box.itemText(i).split("  ")[0] for i in range(window.run_box.count())] == [
        "transformer_compare.h5 · baseline",
        "transformer_compare.h5 · checkpointed",
    ]
    run = window.current_run()
    assert run is not None and run.name == "baseline"
    assert format_bytes(run.peak.bytes) in window.status_run.text()
    assert "transformer_compare.h5" in window.windowTitle()
    layers = window.timeline._layers
    assert layers is not None and all(item.xData is not None for item in layers.items)
    assert float(np.max(layers.items[-1].yData)) == run.peak.bytes
    assert "Recorded peak" in readout_peak(window)


def test_a_status_message_shows_over_the_hover_readout(qtbot: QtBot, window: MainWindow) -> None:
    """A message ("opened ...", "exported ...", an error) shows in the status bar: the hover
    readout gives way while it does, and comes back after."""
    open_trace_in(qtbot, window, SAMPLES / "transformer_compare.h5")
    bar = window.statusBar()
    assert bar is not None and bar.currentMessage().startswith("opened ")
    assert not window.status_point.isVisible()  # the message's room is free
    assert window.status_run.isVisible()  # the run and its peak stay, at the right
    bar.clearMessage()
    qtbot.waitUntil(window.status_point.isVisible, timeout=2000)


def test_toggling_a_module_shows_the_projected_peak(qtbot: QtBot, window: MainWindow) -> None:
    """Tick a layer in the module tree: the readout and the curve show ``project``'s peak."""
    open_traces(qtbot, window, "transformer_compare.h5")
    session = window.plan.session
    assert session is not None and session.chain is not None
    row = session.chain.blocks[1]
    window.plan._items[row].setCheckState(0, Qt.CheckState.Checked)
    expected = project(session.run.tables, [ModuleRegion(row)])
    peak = expected.projected_peak.bytes
    assert f"Projected peak {format_bytes(peak)}" in readout_peak(window)
    assert window.timeline.outcome is not None and window.timeline.outcome.peak_bytes == peak
    assert window.timeline._projected is not None
    window.plan._items[row].setCheckState(0, Qt.CheckState.Unchecked)
    assert window.timeline.outcome is None and "Recorded peak" in readout_peak(window)


def test_clicking_segment_boundaries(qtbot: QtBot, window: MainWindow) -> None:
    """On the CNN's Sequential chain: click block 1, then the gap before block 2 to join them
    into one segment; the readout follows ``project`` of that segment."""
    open_traces(qtbot, window, "cnn.h5")
    strip = window.plan.strip
    session = window.plan.session
    assert session is not None and session.chain is not None and strip.isVisible()
    rects = strip._geometry()
    qtbot.mouseClick(strip, Qt.MouseButton.LeftButton, pos=rects[1].center())
    assert session.selection == {ModuleRegion(session.chain.blocks[1])}
    gap = QPoint((rects[1].right() + rects[2].left()) // 2, rects[1].center().y())
    assert strip.hit(gap) == ("gap", 2)
    qtbot.mouseClick(strip, Qt.MouseButton.LeftButton, pos=gap)
    assert session.selection == {SegmentRegion(session.chain.row, 1, 3)}
    peak = project(session.run.tables, [SegmentRegion(session.chain.row, 1, 3)]).projected_peak
    assert f"Projected peak {format_bytes(peak.bytes)}" in readout_peak(window)
    assert window.timeline.outcome is not None
    assert window.timeline.outcome.peak_bytes == peak.bytes


def test_jump_to_peak_and_inspect(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, "gpt2.h5")
    run = window.current_run()
    assert run is not None
    press(qtbot, window, Qt.Key.Key_P)
    assert window.timeline.selected_point == run.peak.point
    (x0, x1), _ = window.timeline.main.getPlotItem().getViewBox().viewRange()
    assert x0 <= run.x_time[run.peak.point] <= x1 and x1 - x0 < run.x_time[-1] / 5
    rows = window.inspector.model.rows
    live = live_storages(run.tables["storages"], run.tables["memory_events"], run.peak.event)
    assert sorted(r.storage for r in rows) == live.tolist()
    assert sum(r.nbytes for r in rows) == run.peak.bytes
    first = window.inspector.proxy.index(0, 0)
    assert window.inspector.proxy.data(first) == format_bytes(max(r.nbytes for r in rows))
    assert "(the peak)" in window.inspector.header.text()
    window.inspector.filter.setText("attn")
    assert 0 < window.inspector.proxy.rowCount() < len(rows)


def test_click_on_the_timeline_fills_the_inspector(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, "mlp.h5")
    run = window.current_run()
    assert run is not None
    plot = window.timeline.main
    vb = plot.getPlotItem().getViewBox()
    target = float(run.x_time[run.n_events // 2])
    scene = vb.mapViewToScene(QPointF(target, run.peak.bytes / 2))
    pos = plot.mapFromScene(scene)
    with qtbot.waitSignal(window.timeline.pointClicked) as signal:
        qtbot.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    point = signal.args[0]
    assert abs(run.x_time[point] - target) <= (run.x_time[-1] - run.x_time[0]) / 200
    assert sum(r.nbytes for r in window.inspector.model.rows) == run.timeline.total[point]


def test_hover_describes_the_point(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, "mlp.h5")
    run = window.current_run()
    assert run is not None
    vb = window.timeline.main.getPlotItem().getViewBox()
    scene = vb.mapViewToScene(QPointF(float(run.x_time[run.peak.point]), 1.0))
    window.timeline._on_mouse_moved((scene,))
    assert window.timeline.hover_text.isVisible()
    assert f"live {format_bytes(run.peak.bytes)}" in window.timeline.hover_text.toPlainText()


def test_presets_and_budget(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, "transformer_compare.h5")
    session = window.plan.session
    assert session is not None
    t = session.run.tables
    qtbot.mouseClick(window.plan.presets["sqrt"], Qt.MouseButton.LeftButton)
    assert session.selection == set(regions_from_plan("sqrt", t["modules"], t["strings"]))
    window.plan.budget.setText("60%")
    with qtbot.waitSignal(window.plan.message, timeout=20000, check_params_cb=lambda m: "→" in m):
        qtbot.keyClick(window.plan.budget, Qt.Key.Key_Return)
    best = Planner(t).for_budget(int(session.run.peak.bytes * 0.6))
    assert session.selection == set(best.regions)
    assert f"Projected peak {format_bytes(best.peak_bytes)}" in readout_peak(window)
    window.plan.budget.setText("lots")
    qtbot.keyClick(window.plan.budget, Qt.Key.Key_Return)
    assert window.last_error is not None and "budget 'lots'" in window.last_error
    qtbot.mouseClick(window.plan.presets["none"], Qt.MouseButton.LeftButton)
    assert not session.selection


def test_save_and_load_plan(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    open_traces(qtbot, window, "transformer_compare.h5")
    session = window.plan.session
    assert session is not None
    window.plan.apply_preset("all")
    chosen = set(session.selection)
    window.plan.save_plan(str(tmp_path / "all.json"))
    window.plan.apply_preset("none")
    window.plan.load_plan(str(tmp_path / "all.json"))
    assert session.selection == chosen
    (tmp_path / "broken.json").write_text("[")
    window.plan.load_plan(str(tmp_path / "broken.json"))
    assert window.last_error is not None and "not valid JSON" in window.last_error
    assert session.selection == chosen


def test_compare_runs_and_traces(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, "transformer_compare.h5", "gpt2.h5")
    runs = window.runs()
    assert [r.name for r in runs] == ["baseline", "checkpointed", "main"]
    press(qtbot, window, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentWidget() is window.compare
    change = runs[1].peak.bytes / runs[0].peak.bytes - 1
    text = window.compare.summary.text()
    assert f"{change:+.1%} vs baseline".replace("-", "−") in text
    assert format_bytes(runs[2].peak.bytes) in text
    assert len(window.compare._curves) == 3
    press(qtbot, window, Qt.Key.Key_S)
    assert window.compare.side_by_side and len(window.compare._curves) == 3
    window.plan.apply_preset("all")
    assert "plan over" in window.compare.summary.text()


def test_axis_theme_and_export(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    open_traces(qtbot, window, "transformer_compare.h5")
    window.plan.apply_preset("sqrt")
    press(qtbot, window, Qt.Key.Key_T)
    assert window.timeline.axis is Axis.OP
    assert window.timeline.main.getPlotItem().getAxis("bottom").labelText == "op index"
    projected = window.timeline._projected
    assert projected is not None and np.all(np.diff(projected.envelope.levels_x[0]) >= 0)
    press(qtbot, window, Qt.Key.Key_D, Qt.KeyboardModifier.ControlModifier)
    assert window.theme is DARK
    png, svg = tmp_path / "view.png", tmp_path / "view.svg"
    window.export_view(str(png))
    window.export_view(str(svg))
    image = QImage(str(png))
    assert image.width() == window.tabs.currentWidget().width()
    colors = {
        image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)
    }
    assert len(colors) > 30
    assert ET.parse(svg).getroot().tag.endswith("svg")
    window.export_view(str(tmp_path / "view.gif"))
    assert window.last_error is not None and ".png or .svg" in window.last_error


def test_bad_file_opens_an_error_dialog(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    bad = tmp_path / "notes.h5"
    bad.write_text("not a trace")
    with qtbot.waitSignal(window.load_failed, timeout=10000):
        window.open_paths([str(bad)])
    assert window.last_error is not None and "notes.h5" in window.last_error
    assert "\n" not in window.last_error
    boxes = [b for b in window.findChildren(QMessageBox) if b.isVisible()]
    assert boxes and window.last_error in boxes[0].text()
    assert window.isVisible() and window.current_run() is None
    assert str(bad) not in window.recent_files()


def test_recent_files_and_drop(qtbot: QtBot, window: MainWindow) -> None:
    path = str(SAMPLES / "mlp.h5")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(path)])
    drop = QDropEvent(
        QPointF(50, 50),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    with qtbot.waitSignal(window.loaded, timeout=10000):
        window.dropEvent(drop)
    assert window.recent_files()[0] == path
    actions = window.recent_menu.actions()
    assert actions and actions[0].text() == path
    window.close_all()
    assert window.current_run() is None
    assert window.timeline.run is None and window.timeline._layers is None
    assert not window.inspector.model.rows
    with qtbot.waitSignal(window.loaded, timeout=10000):
        actions[0].trigger()
    assert window.current_run() is not None


def test_viewing_never_imports_torch(tmp_path: Path) -> None:
    """Open a trace in the window, plan, inspect and export, in a fresh interpreter."""
    script = f"""
import os, sys, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from PyQt6.QtCore import QSettings
from PyQt6.QtWidgets import QApplication
app = QApplication([])
from ckview.gui.main_window import MainWindow
w = MainWindow(settings=QSettings({str(tmp_path / "s.ini")!r}, QSettings.Format.IniFormat))
w.show()
w.open_paths([{str(SAMPLES / "transformer_compare.h5")!r}])
end = time.time() + 30
while not (w.runs() and w.plan.is_ready()) and time.time() < end:
    app.processEvents(); time.sleep(0.01)
w.plan.apply_preset("sqrt"); w.timeline.jump_to_peak(); w.tabs.setCurrentIndex(1)
app.processEvents()
w.export_view({str(tmp_path / "v.png")!r})
assert w.runs() and w.inspector.model.rows, "nothing shown"
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_view_command_errors(run_cli: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad paths and no display: one line, exit 2, before any window."""
    code, _, err = run_cli("view", "nosuch.h5")  # type: ignore[operator]
    assert code == 2 and err.startswith("ckview: error:") and err.count("\n") == 1
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    code, _, err = run_cli(str(SAMPLES / "mlp.h5"))  # type: ignore[operator]
    assert code == 2 and "no display" in err and "ckview export" in err


def test_a_bug_in_a_slot_opens_a_dialog(
    window: MainWindow, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app's excepthook: traceback on stderr, a dialog, the window lives on."""
    from ckview.gui.app import error_hook

    try:
        raise IndexError("index 0 is out of bounds")
    except IndexError as exc:
        error_hook(window)(IndexError, exc, exc.__traceback__)
    assert window.last_error is not None
    assert window.last_error.startswith("unexpected error: IndexError: index 0")
    assert "Traceback" in capsys.readouterr().err
    assert window.isVisible()


def test_view_command_opens_the_window(
    qtbot: QtBot, run_cli: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``ckview TRACE --theme dark`` end to end, with the event loop replaced by a wait for the
    trace to show (offscreen)."""
    from PyQt6.QtWidgets import QApplication

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the app installs its own
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    QSettings.setPath(QSettings.Format.NativeFormat, QSettings.Scope.UserScope, str(tmp_path))
    shown: list[MainWindow] = []

    def event_loop(app: QApplication) -> int:
        windows = [w for w in app.topLevelWidgets() if isinstance(w, MainWindow)]
        (window,) = [w for w in windows if w.isVisible()]  # earlier tests' windows are closed
        qtbot.waitUntil(lambda: window.current_run() is not None, timeout=20000)
        shown.append(window)
        return 0

    monkeypatch.setattr(QApplication, "exec", event_loop)
    code, _, err = run_cli(str(SAMPLES / "cnn.h5"), "--theme", "dark")  # type: ignore[operator]
    assert code == 0, err
    window = shown[0]
    run = window.current_run()
    assert window.theme is DARK and run is not None and run.label == "cnn.h5 · main"
    window.set_theme(LIGHT)
    window.close()
