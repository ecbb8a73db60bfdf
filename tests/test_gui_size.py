"""The explorer's size field (ckview/gui/size_panel.py over ckview/app/sizing.py): a second
recording of the step at another size, the step shown at any size with the current plan,
whether it fits the budget, and on a CUDA trace the reserved-memory curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PyQt6.QtCore import Qt

from ckview.analysis import find_peak, memory_timeline
from ckview.app.sizing import size_of_path
from tests.conftest import open_trace_in, read_run
from tests.factory import attention_model, encoder, record_lm
from tests.fit_helpers import GIB, as_cuda

pytestmark = [pytest.mark.torch, pytest.mark.gui]


def show_size(qtbot: Any, w: Any, n: int) -> str:
    """Type size ``n`` in the size field and press Enter; the answer under it (HTML)."""
    w.sizes.field.setText(str(n))
    qtbot.keyClick(w.sizes.field, Qt.Key.Key_Return)
    return str(w.sizes.note.text())


def test_size_of_path() -> None:
    assert size_of_path("/x/train.batch4.h5") == ("batch", 4)
    assert size_of_path("lm.seq128.hdf5") == ("seq", 128)
    assert size_of_path("train.h5") is None


def test_the_step_at_another_size_with_the_plan(qtbot: Any, window: Any, tmp_path: Path) -> None:
    a = record_lm(tmp_path / "lm.batch4.h5", encoder(), 4, 16)
    b = record_lm(tmp_path / "lm.batch8.h5", encoder(), 8, 16)
    recorded_16 = record_lm(tmp_path / "lm.batch16.h5", encoder(), 16, 16)
    open_trace_in(qtbot, window, a, preset="sqrt")
    assert not window.sizes.field.isEnabled()
    window.open_second(str(b))
    assert window.sizes.sizes() == (4, 8) and window.sizes.field.isEnabled()
    plan = window.plan.session.regions()
    assert plan

    note = show_size(qtbot, window, 16)
    run = window.current_run()
    assert run.name == "main at batch 16, projected"
    assert window.run_box.currentText().startswith("lm.batch4.h5 · main at batch 16, projected")
    assert window.plan.session.regions() == plan  # the plan comes along
    assert window.outcome is not None and window.outcome.peak_bytes < run.peak.bytes
    assert "batch 16: projected peak" in note and f"with {len(plan)} checkpointed" in note
    assert "give a budget to check it" in note

    real = read_run(recorded_16)  # the same step, recorded at 16
    peak_16 = find_peak(memory_timeline(real["storages"], real["memory_events"])).bytes
    assert abs(run.peak.bytes - peak_16) <= 0.01 * peak_16

    budget = window.outcome.peak_bytes
    window.plan.budget.setText(f"{budget} B")
    assert "fits the budget" in show_size(qtbot, window, 16)
    note = show_size(qtbot, window, 24)
    assert "does NOT fit the budget" in note and "over" in note and "color:" in note
    assert len([r for r in window.runs() if "projected" in r.name]) == 2  # 16 and 24


def test_another_model_is_refused_in_one_line(qtbot: Any, window: Any, tmp_path: Path) -> None:
    a = record_lm(tmp_path / "lm.batch4.h5", encoder(), 4, 16)
    b = record_lm(tmp_path / "other.batch8.h5", attention_model(), 8, 16)
    open_trace_in(qtbot, window, a)
    window.open_second(str(b))
    runs = len(window.runs())
    note = show_size(qtbot, window, 16)
    assert "hold different models" in note and len(window.runs()) == runs
    assert "a size is a whole number" in show_size(qtbot, window, 0)


def test_cuda_trace_draws_reserved_and_checks_the_device(
    qtbot: Any, window: Any, tmp_path: Path
) -> None:
    a = as_cuda(
        record_lm(tmp_path / "cpu4.h5", encoder(), 4, 16), tmp_path / "lm.batch4.h5", GIB, 200 << 20
    )
    b = as_cuda(
        record_lm(tmp_path / "cpu8.h5", encoder(), 8, 16), tmp_path / "lm.batch8.h5", GIB, 200 << 20
    )
    open_trace_in(qtbot, window, a)
    reserved = window.timeline.reserved
    assert reserved is not None and reserved.max() % (2 << 20) == 0  # whole segments
    assert reserved.max() >= window.current_run().peak.bytes
    assert any("reserved, model" in e.text for e in window.timeline.legend.entries)
    window.open_second(str(b))
    window.plan.budget.setText("device")
    note = show_size(qtbot, window, 16)
    assert "reserved" in note and "(allocator model)" in note and "fits the budget" in note
    assert window.timeline.reserved is not None  # the step at 16 has its curve too
