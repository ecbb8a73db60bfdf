"""The explorer on damaged and hostile traces: a one-line error in a dialog, escaped names."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import pytest
from PyQt6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT

pytestmark = pytest.mark.gui

SAMPLE = ROOT / "sample_traces" / "mlp.h5"


def cyclic(tmp_path: Path) -> Path:
    path = tmp_path / "cyclic.h5"
    shutil.copyfile(SAMPLE, path)
    with h5py.File(path, "r+") as f:
        parent = f["modules/parent"][...]
        parent[1], parent[2] = 2, 1
        f["modules/parent"][...] = parent
    return path


def test_a_cycle_in_a_trace_shows_one_line(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    with qtbot.waitSignal(window.load_failed, timeout=20000):
        window.open_paths([str(cyclic(tmp_path))])
    assert window.last_error is not None and "modules.parent" in window.last_error
    assert "cycle" in window.last_error and "\n" not in window.last_error
    boxes = [b for b in window.findChildren(QMessageBox) if b.isVisible()]
    assert boxes and window.last_error in boxes[0].text()
    boxes[0].grab().save(str(tmp_path / "cycle.png"))


def test_module_names_with_terminal_controls_are_drawn_escaped(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    path = tmp_path / "names.h5"
    shutil.copyfile(SAMPLE, path)
    with h5py.File(path, "r+") as f:
        values = f["strings"].asstr()[...]
        for i, value in enumerate(values):
            if value.startswith("blocks"):
                values[i] = value + "\x1b[2J\u202e"
        f["strings"][...] = values
    with qtbot.waitSignal(window.loaded, timeout=20000):
        window.open_paths([str(path)])
    run = window.current_run()
    assert run is not None
    names = list(run.paths)
    window.grab().save(str(tmp_path / "names.png"))
    assert any(n.endswith("\\x1b[2J\\u202e") for n in names)
    assert not any("\x1b" in n or "\u202e" in n for n in names)


def test_a_hostile_plan_file_is_one_line_in_the_plan_panel(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    with qtbot.waitSignal(window.loaded, timeout=20000):
        window.open_paths([str(SAMPLE)])
    qtbot.waitUntil(lambda: window.plan.session is not None, timeout=20000)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    for plan in (deep, Path("/dev/zero")):
        with qtbot.waitSignal(window.plan.error, timeout=20000) as signal:
            window.plan.load_plan(str(plan))
        message = signal.args[0]
        assert "\n" not in message and len(message) < 700
        assert ("nested too deeply" in message) or ("larger than 16 MiB" in message)
