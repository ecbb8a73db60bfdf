"""Take the explorer screenshots shown in the README, offscreen, from the real app.

    QT_QPA_PLATFORM=offscreen python docs/screenshots.py

Writes docs/images/explorer-*.png from the sample traces (explorer-export.png through File ->
Export View), and docs/images/snapshot-import.png from the CUDA snapshot fixture when it is
there. ``--diff-only``: only the Diff view's and the budget answers' images (explorer-diff*.png,
explorer-budget*.png).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PyQt6.QtCore import QSettings
from PyQt6.QtWidgets import QApplication, QWidget

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
OUT = ROOT / "docs" / "images"


def main() -> int:
    app = QApplication(sys.argv[:1])
    from ckview.gui.main_window import MainWindow
    from ckview.gui.style import DARK

    opened: list[MainWindow] = []
    """Every window stays referenced: a shown window dropped into a reference cycle can be
    collected by the cyclic GC in the middle of its own paint event."""

    def window(*traces: str) -> MainWindow:
        settings = QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat)
        w = MainWindow(settings=settings)
        opened.append(w)
        w.resize(1600, 1000)
        w.show()
        w.open_paths([str(SAMPLES / t) for t in traces])
        settle(lambda: len(w.traces) == len(traces) and w.plan.is_ready())
        return w

    def settle(done: object = None, timeout: float = 30.0) -> None:
        end = time.time() + timeout
        while time.time() < end and not (done() if callable(done) else True):
            app.processEvents()
            time.sleep(0.01)
        for _ in range(5):
            app.processEvents()

    def save(w: QWidget, name: str) -> None:
        settle()
        w.grab().save(str(OUT / name))
        print(f"wrote docs/images/{name}")

    OUT.mkdir(parents=True, exist_ok=True)
    _diff_and_budget_shots(window, save, settle)
    if "--diff-only" in sys.argv[1:]:
        return 0
    w = window("transformer_compare.h5")
    w.plan.apply_preset("sqrt")
    w.timeline.select_point(w.runs()[0].peak.point)
    save(w, "explorer-timeline.png")

    w = window("transformer_compare.h5")  # the timeline and the plan panel, dark
    w.set_theme(DARK)
    w.plan.apply_preset("sqrt")
    w.timeline.jump_to_peak()
    save(w, "explorer-timeline-dark.png")

    for theme, name in ((None, "explorer-empty.png"), (DARK, "explorer-empty-dark.png")):
        w = window()  # no trace open: how to open or record one
        if theme is not None:
            w.set_theme(theme)
        w.resize(1200, 700)
        save(w, name)

    w = window("gpt2_compare.h5")
    w.plan.budget.setText("60%")
    w.plan.plan_for_budget()
    settle(lambda: w.plan.plan_button.isEnabled())
    w.timeline.jump_to_peak()
    save(w, "explorer-plan.png")

    w = window("transformer_compare.h5")
    w.plan.apply_preset("all")
    w.tabs.setCurrentIndex(1)
    save(w, "explorer-compare.png")

    w = window("gpt2_compare.h5")
    w.set_theme(DARK)
    w.plan.apply_preset("sqrt")
    w.side_action.setChecked(True)
    w.tabs.setCurrentIndex(1)
    save(w, "explorer-dark-side-by-side.png")

    w = window("gpt2_compare.h5")  # File -> Export View: titled, no hover or selection
    w.plan.apply_preset("sqrt")
    w.timeline.select_point(w.runs()[0].peak.point)
    settle()
    w.export_view(str(OUT / "explorer-export.png"))
    print("wrote docs/images/explorer-export.png")

    snapshot = _fixture_snapshot()
    if snapshot is None:
        print("no CUDA snapshot fixture (../shared/fixtures/cuda_snapshots): skipped its image")
        return 0
    from ckview.snapshot import load_snapshot, snapshot_to_trace

    trace = Path(tempfile.mkdtemp()) / "cnn_fwd_bwd.h5"
    snapshot_to_trace(load_snapshot(snapshot), trace)
    settings = QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    w.resize(1400, 900)
    w.show()
    w.open_paths([str(trace)])
    settle(lambda: len(w.traces) == 1)  # nothing to plan: no module tree in a snapshot
    w.timeline.jump_to_peak()
    save(w, "snapshot-import.png")
    return 0


def _diff_and_budget_shots(window: Any, save: Any, settle: Any) -> None:
    """The Diff view (a module's row clicked: its bytes shaded under both curves) and the
    planner's answers to a budget no plan meets, in the light and dark themes."""
    from ckview.gui.style import DARK

    for theme, name in ((None, "explorer-diff.png"), (DARK, "explorer-diff-dark.png")):
        w = window("transformer_compare.h5")
        if theme is not None:
            w.set_theme(theme)
        w.tabs.setCurrentWidget(w.diff)
        w.diff.modules.selectRow(1)
        save(w, name)
    for theme, trace, budget, name in (
        (None, "transformer.h5", "10%", "explorer-budget.png"),
        (DARK, "transformer_checkpointed.h5", "30 MiB", "explorer-budget-dark.png"),
    ):
        w = window(trace)
        if theme is not None:
            w.set_theme(theme)
        w.resize(1400, 700)
        w.plan.budget.setText(budget)
        w.plan.plan_for_budget()
        settle(lambda w=w: w.plan.plan_button.isEnabled())
        save(w.plan, name)


def _fixture_snapshot() -> Path | None:
    """The real CUDA snapshot beside the repository (../shared/fixtures/cuda_snapshots)."""
    for parent in ROOT.parents[:3]:
        found = sorted((parent / "shared" / "fixtures" / "cuda_snapshots").glob("*.pickle"))
        if found:
            return found[0]
    return None


if __name__ == "__main__":
    sys.exit(main())
