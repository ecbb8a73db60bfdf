"""The explorer names the device of a run held on several devices (NOTE [ One device per
timeline ] in ckview/trace/devices.py): beside the run box, the figures' device and what was
left out, as ``ckview summary`` says it; nothing for a run on one device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pytestqt.qtbot import QtBot

from ckview.app.run import load_trace
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT, copy_on_two_devices

pytestmark = pytest.mark.gui

SAMPLE = ROOT / "sample_traces" / "mlp.h5"


def _open(qtbot: QtBot, w: MainWindow, *paths: Path) -> None:
    for path in paths:
        with qtbot.waitSignal(w.loaded, timeout=20000):
            w.open_paths([str(path)])


def test_scope_of_a_run_on_two_devices(tmp_path: Path, run_cli: Any) -> None:
    path = tmp_path / "two.h5"
    on_cuda = copy_on_two_devices(SAMPLE, path)
    left = int(np.count_nonzero(~on_cuda))
    assert left > 1
    [run] = load_trace(path).runs
    assert run.scope == f"on cuda:0; left out: {left:,} storages on cpu"
    code, out, _ = run_cli("summary", str(path))
    assert code == 0 and f"memory on cuda:0 only; left out: storages {left:,} on cpu" in out
    [one] = load_trace(SAMPLE).runs
    assert one.scope == ""


def test_scope_counts_one_storage_and_several_devices() -> None:
    [run] = load_trace(SAMPLE).runs
    run.tables["timeline_device"] = "cuda:1"
    run.tables["left_out"] = {"cpu": 1, "cuda:0": 1200}
    assert run.scope == "on cuda:1; left out: 1 storage on cpu, 1,200 storages on cuda:0"


def test_the_window_shows_the_scope_beside_the_run(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    path = tmp_path / "two.h5"
    copy_on_two_devices(SAMPLE, path)
    _open(qtbot, window, SAMPLE, path)
    assert [r.scope == "" for r in window.runs()] == [True, False]
    shown = window.run_scope_action  # the toolbar shows and hides the label as it lays out
    assert shown is not None
    window.run_box.setCurrentIndex(1)
    assert shown.isVisible() and window.run_scope.text() == window.runs()[1].scope
    assert window.run_scope.text().startswith("on cuda:0; left out: ")
    qtbot.waitUntil(window.run_scope.isVisible, timeout=5000)
    window.run_box.setCurrentIndex(0)  # a run on one device: nothing to say
    assert not shown.isVisible()
    qtbot.waitUntil(lambda: not window.run_scope.isVisible(), timeout=5000)
    window.run_box.setCurrentIndex(1)
    assert shown.isVisible()
    window.close_all()
    assert not shown.isVisible() and window.run_scope.text() == ""
