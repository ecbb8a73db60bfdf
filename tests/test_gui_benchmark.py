"""Smoke test of benchmarks/gui_performance.py: its pieces run at a tiny size. Timings are never
asserted, only that every measurement returns positive numbers and the toggle check agrees."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pytestqt.qtbot import QtBot

from ckview.app.run import load_trace
from ckview.cli.main import main as ckview_main
from ckview.gui.export import title_height
from tests.conftest import ROOT

pytestmark = pytest.mark.gui

EVENTS, BLOCKS = 20_000, 12


def _load_benchmark() -> ModuleType:
    path = ROOT / "benchmarks" / "gui_performance.py"
    spec = importlib.util.spec_from_file_location("gui_performance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load_benchmark()


@pytest.fixture
def trace(bench: ModuleType, tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "synthetic.h5"
    return path, bench.write_synthetic_trace(path, EVENTS, BLOCKS, seed=1)


def test_synthetic_trace_opens_and_validates(
    trace: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, events = trace
    assert 0.9 * EVENTS <= events <= 1.1 * EVENTS
    data = load_trace(path)
    assert [run.name for run in data.runs] == ["main"]
    assert data.runs[0].n_events == events
    assert ckview_main(["validate", str(path)]) == 0
    assert "valid ckview trace" in capsys.readouterr().out


def test_window_measurements(
    bench: ModuleType, trace: tuple[Path, int], tmp_path: Path, qtbot: QtBot
) -> None:
    path, _ = trace
    (first,) = bench.measure_first_paint(str(path), 1, str(tmp_path))
    assert 0 < first.loaded_s <= first.handled_s <= first.first_paint_s <= first.ready_s
    assert first.paints >= 1

    window = bench.new_window(str(tmp_path))
    try:
        opened = bench.open_to_first_paint(window, str(path))
        assert opened.first_paint_s > 0 and bench.curves_shown(window.timeline)
        rows = bench.block_rows(window)
        assert len(rows) == BLOCKS
        check = bench.check_toggle(window, rows[BLOCKS // 2])
        assert check.incremental and check.readout_shows_it and check.drawn
        assert check.readout_peak == check.model_peak == check.exact_peak
        assert check.ok
        toggles = bench.measure_toggles(window, 3)
        assert len(toggles) == 3 and min(toggles) > 0
        exports = bench.measure_export(window, str(tmp_path), 1)
        assert min(exports.seconds) > 0 and min(exports.grab_seconds) > 0
        assert exports.png_bytes > bench.MIN_PNG_BYTES
        tab = window.tabs.currentWidget()
        title = title_height(window.export_title(), tab.width())
        assert exports.png_size == (tab.width(), tab.height() + title)  # the tab under its title
    finally:
        bench.close_window(window)


def test_redraws(bench: ModuleType, qtbot: QtBot) -> None:
    ranges = bench.pan_zoom_ranges(0.0, 1.0)
    assert len(ranges) == 50
    assert ranges[13 + 12 + 12] == (0.0, 1.0)  # 13 zooms in, 12 pans, 13 zooms out: the whole
    run = bench.synthetic_run_data(5_000, BLOCKS)
    redraws = bench.measure_redraws(run, passes=1)
    assert len(redraws.seconds) == len(redraws.paint_seconds) == 50
    assert min(redraws.seconds) > 0 and min(redraws.paint_seconds) > 0
    assert redraws.points_in_view == run.n_events + 1
    assert 0 < redraws.drawn_zoomed_out <= redraws.points_in_view


def test_table_and_verdicts(bench: ModuleType) -> None:
    met = bench.Result("fast", 0.1, [0.05, 0.07, 0.06, 0.05, 0.09])
    missed = bench.Result("slow", 0.1, [0.2, 0.3])
    info = bench.Result("context", 0, [1.5], informative=True)
    assert (met.verdict, missed.verdict, info.verdict) == ("MET", "MISSED", "(info)")
    assert met.p90 is not None and missed.p90 is None
    assert missed.ratio == pytest.approx(2.5)
    table = bench.format_table([met, missed, info])
    assert "MISSED" in table and "2.50x" in table and "1.50 s" in table


def test_main_prints_every_target(
    bench: ModuleType, qtbot: QtBot, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--events", "5000", "--points", "5000", "--rounds", "1", "--toggles", "2"]
    assert bench.main([*argv, "--blocks", "6"]) == 0
    out = capsys.readouterr().out
    for row in ("1. open", "2. pan/zoom redraw", "3. toggle -> redraw", "4. PNG export"):
        assert row in out
    assert "check of one toggle" in out and ": OK" in out
    assert "machine:" in out and "pyqtgraph" in out
