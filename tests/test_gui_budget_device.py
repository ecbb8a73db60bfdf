"""The budget ``device`` in the explorer's plan panel: the capacity of the device the trace was
recorded on, read with the same grammar (``parse_budget``, ``Budget.on_device``) and answered in
the same words as ``ckview plan --budget device``; a trace that does not know its device's
capacity says so under the field, as the CLI does."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from ckview.analysis import Budget, Planner, budget_answer, parse_budget
from ckview.analysis.units import NO_DEVICE_CAPACITY
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT, ask_budget, open_trace_in
from tests.factory import fake_devices, record_small
from tests.fake_cuda import FakeCuda, FakePynvml, GiB

pytestmark = [pytest.mark.torch, pytest.mark.gui]

CPU_TRACE = ROOT / "sample_traces" / "mlp.h5"
TINY = 64
"""A device capacity (bytes) below any plan's peak: the budget is not met."""


def _record_on(monkeypatch: pytest.MonkeyPatch, path: Path, total: int) -> Path:
    """A small CPU step recorded with fake CUDA device samples of capacity ``total`` (the
    sampler reads a device whose allocator reserved something)."""
    cuda = FakeCuda(total=total, allocated=16, reserved=32, grow=0, peak_extra=0)
    fake_devices(monkeypatch, cuda, FakePynvml(total=total, mine=32, others=0))
    record_small(path)
    return path


def _ask(qtbot: QtBot, w: MainWindow, budget: str, planned: bool) -> str:
    """The plan panel's answer to ``budget``, as plain text."""
    note = ask_budget(qtbot, w, budget, planned)
    return html.unescape(note[note.index(">") + 1 : note.rindex("</span>")])


def test_device_is_read_as_the_recorded_capacity() -> None:
    for text in ("device", " Device ", "DEVICE"):
        assert parse_budget(text) == Budget(device=True)
    assert parse_budget("device").on_device(16 * GiB).bytes(1) == 16 * GiB
    assert parse_budget("device").on_device(16 * GiB).describe(1) == (
        "16.0 GiB (the device's capacity)"
    )
    assert parse_budget("60%").on_device(16 * GiB) == Budget(share=0.6)  # not a device budget
    with pytest.raises(ValueError, match="no device capacity"):
        parse_budget("device").on_device(-1)
    with pytest.raises(ValueError, match="or 'device'"):  # a typo hears of it
        parse_budget("devices")


def test_the_panel_plans_for_the_device(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run_cli: Any
) -> None:
    path = _record_on(monkeypatch, tmp_path / "tiny_device.h5", TINY)
    open_trace_in(qtbot, window, path)
    run = window.current_run()
    assert run is not None and run.device_total_bytes == TINY
    note = _ask(qtbot, window, "device", planned=True)
    expected = Planner(run.tables).for_budget(TINY)
    assert not expected.fits
    answer = budget_answer(expected, "64 B (the device's capacity)")
    assert note.startswith(answer + "; ")
    assert window.last_error is None
    code, out, _ = run_cli("plan", str(path), "--budget", "device")
    assert code == 1 and answer in out.splitlines()  # the CLI's own line, word for word


def test_a_capacity_the_baseline_fits(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    open_trace_in(qtbot, window, _record_on(monkeypatch, tmp_path / "big_device.h5", 16 * GiB))
    note = _ask(qtbot, window, "Device", planned=True)
    assert note.startswith("budget 16.0 GiB (the device's capacity) is met: nothing checkpointed")


def test_a_trace_without_capacity_says_why_in_the_panel(
    qtbot: QtBot, window: MainWindow, run_cli: Any
) -> None:
    open_trace_in(qtbot, window, CPU_TRACE)
    run = window.current_run()
    assert run is not None and run.device_total_bytes == -1
    note = _ask(qtbot, window, "device", planned=False)
    assert note == NO_DEVICE_CAPACITY
    assert window.last_error is None  # an answer under the field, not an error dialog
    assert window.plan.plan_button.isEnabled()
    code, _, err = run_cli("plan", str(CPU_TRACE), "--budget", "device")
    assert code == 2 and err.strip() == f"ckview: error: {CPU_TRACE}: {NO_DEVICE_CAPACITY}"
