"""The explorer's Diff view (issue 13), driven through its real widgets offscreen, and the
analysis it draws from (``storage_mask``, ``live_bytes_of``) against ``diff_runs``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PyQt6.QtCore import Qt
from pytestqt.qtbot import QtBot

from ckview.analysis import format_bytes, memory_timeline
from ckview.analysis.diff import HELD_CLASSES, diff_runs, held_mask, live_bytes_of, storage_mask
from ckview.app.run import Axis, load_trace
from ckview.app.style import DARK
from ckview.gui.diff_view import PROMPT, DiffTable, table_texts
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT

pytestmark = pytest.mark.gui

SAMPLES = ROOT / "sample_traces"
COMPARE = SAMPLES / "transformer_compare.h5"


def open_traces(qtbot: QtBot, w: MainWindow, *paths: Path) -> None:
    for path in paths:
        with qtbot.waitSignal(w.loaded, timeout=20000):
            w.open_paths([str(path)])


def click_row(qtbot: QtBot, table: DiffTable, row: int) -> None:
    viewport = table.viewport()
    assert viewport is not None
    rect = table.visualRect(table.model().index(row, 1))
    qtbot.mouseClick(viewport, Qt.MouseButton.LeftButton, pos=rect.center())


# -- analysis: a diff's rows found again in each run


def test_masks_give_the_diffs_bytes_at_each_peak() -> None:
    """``live_bytes_of(storage_mask(row))`` at each run's peak is the row's A and B bytes, for
    every category, module and kind of tensor the diff lists; all storages give the total."""
    a, b = load_trace(COMPARE).runs
    diff = diff_runs(a.tables, b.tables, top=1000)
    assert diff.by_module and diff.tensors
    for run, side in ((a, 1), (b, 2)):
        point = run.peak.point

        def at_peak(mask: np.ndarray, run=run, point=point) -> int:  # type: ignore[no-untyped-def]
            return int(live_bytes_of(run.tables, mask)[point])

        for row in diff.by_category:
            assert at_peak(storage_mask(run.tables, category=row[0])) == row[side]
        for row in diff.by_module:
            assert at_peak(storage_mask(run.tables, module=row[0])) == row[side]
        for kind in diff.tensors:
            want = kind.a_bytes if side == 1 else kind.b_bytes
            assert at_peak(storage_mask(run.tables, kind=kind)) == want
        everything = np.ones(len(run.tables["storages"]["nbytes"]), dtype=bool)
        total = memory_timeline(run.tables["storages"], run.tables["memory_events"]).total
        assert np.array_equal(live_bytes_of(run.tables, everything), total)
    # What held B's peak up, class by class; A has no recompute regions, so no class.
    assert diff.held_b is not None and diff.held_a is None
    for name in HELD_CLASSES:
        held = live_bytes_of(b.tables, held_mask(b.tables, name))[b.peak.point]
        assert held == diff.held_b.bytes_by_class[name]
        assert not held_mask(a.tables, name).any()


# -- the view


def test_diff_tab_shows_both_peaks_and_the_tables(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, COMPARE)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    view = window.diff
    assert window.tabs.currentWidget() is view
    assert not any(dock.isVisible() for dock in window.docks)  # the diff takes the window
    a, b = load_trace(COMPARE).runs
    diff = diff_runs(a.tables, b.tables, top=50)
    assert view.diff == diff
    header = view.header.text()
    for text in (format_bytes(a.peak.bytes), format_bytes(b.peak.bytes), "(−58.8%)"):
        assert text in header
    assert f"at {diff.a.time_ns / 1e6:.1f} ms (step 0, backward" in header
    categories = {row[0]: row[1:] for row in table_texts(view.categories)}
    for name, in_a, in_b in diff.by_category:
        if in_a or in_b:
            assert categories[name][:2] == [format_bytes(in_a), format_bytes(in_b)]
    assert categories["activation"][2] == "−50.5 MiB"
    assert {row[0] for row in table_texts(view.modules)} == {path for path, *_ in diff.by_module}
    deltas = [view.modules.item(r, 3).data(Qt.ItemDataRole.UserRole) for r in range(3)]
    assert deltas == sorted(b - a for _, a, b in diff.by_module)[:3]  # largest decrease first
    assert len(table_texts(view.tensors)) == len(diff.tensors)
    held = {row[0]: row[1:] for row in table_texts(view.held)}
    assert diff.held_b is not None and diff.held_a is None
    assert held["recompute"] == ["—", format_bytes(diff.held_b.bytes_by_class["recompute"])]
    window.tabs.setCurrentIndex(0)
    assert all(dock.isVisible() for dock in window.docks)


def test_tables_sort_by_bytes_not_text(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, COMPARE)
    table = window.diff.categories
    for column in (1, 3):
        table.sortItems(column, Qt.SortOrder.DescendingOrder)
        keys = [
            table.item(r, column).data(Qt.ItemDataRole.UserRole) for r in range(table.rowCount())
        ]
        assert keys == sorted(keys, reverse=True)
    table.sortItems(0, Qt.SortOrder.AscendingOrder)
    names = [row[0] for row in table_texts(table)]
    assert names == sorted(names)


def test_clicking_rows_shades_them_under_both_curves(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, COMPARE)
    view = window.diff
    window.tabs.setCurrentWidget(view)
    pair = view.pair()
    assert pair is not None and view.highlighted() == []
    click_row(qtbot, view.modules, 0)  # the largest decrease
    selection = view.selection
    assert selection is not None and selection.module == table_texts(view.modules)[0][0]
    parts = view.highlighted()
    assert len(parts) == 2 and len(view._curves) == 4  # two totals, two shaded parts
    row = next(r for r in view.diff.by_module if r[0] == selection.module)  # type: ignore[union-attr]
    assert [int(p[run.peak.point]) for p, run in zip(parts, pair, strict=True)] == [row[1], row[2]]
    assert format_bytes(row[1]) in view.plot.getPlotItem().titleLabel.text
    click_row(qtbot, view.tensors, 0)
    assert view.selection is not None and view.selection.kind is not None
    assert view.modules.selectedItems() == []  # one selection at a time
    kind = view.selection.kind
    parts = view.highlighted()
    assert int(parts[0][pair[0].peak.point]) == kind.a_bytes
    assert int(parts[1][pair[1].peak.point]) == kind.b_bytes
    recompute = next(r for r, row in enumerate(table_texts(view.held)) if row[0] == "recompute")
    click_row(qtbot, view.held, recompute)
    assert view.selection is not None and view.selection.held == "recompute"
    parts = view.highlighted()
    assert view.diff is not None and view.diff.held_b is not None
    assert int(parts[1][pair[1].peak.point]) == view.diff.held_b.bytes_by_class["recompute"]
    assert not parts[0].any()


def test_swap_and_runs_of_two_traces(qtbot: QtBot, window: MainWindow) -> None:
    """Runs of two traces (before and after a change) are offered together; Swap flips the
    sign of the difference."""
    open_traces(qtbot, window, SAMPLES / "transformer.h5", SAMPLES / "transformer_checkpointed.h5")
    view = window.diff
    assert view.box_a.count() == view.box_b.count() == 2
    assert view.diff is not None and view.diff.delta < 0
    assert "transformer.h5 · main" in view.header.text()
    assert "transformer_checkpointed.h5 · main" in view.header.text()
    view.swap.click()
    assert view.diff is not None and view.diff.delta > 0
    pair = view.pair()
    assert pair is not None and pair[0].source.endswith("transformer_checkpointed.h5")
    window.set_axis(Axis.OP)
    assert "op index" in view.plot.getPlotItem().getAxis("bottom").labelText
    window.set_theme(DARK)
    assert view.plot.backgroundBrush().color().name().lower() == DARK.background.lower()


def test_one_run_says_what_to_open(qtbot: QtBot, window: MainWindow) -> None:
    open_traces(qtbot, window, SAMPLES / "mlp.h5")
    view = window.diff
    assert view.diff is None and view.header.text() == PROMPT
    assert not view.swap.isEnabled() and view.modules.rowCount() == 0
    window.close_all()
    assert view.diff is None and view.box_a.count() == 0
