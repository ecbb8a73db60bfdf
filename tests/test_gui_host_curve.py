"""The host curve of an offload plan in the explorer (issue 22, item 5; NOTE [ Host curve ] in
ckview.analysis.projection.host): drawn with its legend entry while a region offloads on a
CUDA run, gone when none does."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
from PyQt6.QtCore import Qt
from pytestqt.qtbot import QtBot

from ckview.analysis import ModuleRegion, format_bytes, project
from ckview.analysis.device import DeviceState
from ckview.app.planning import PlanSession
from ckview.app.style import DARK
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT
from tests.synthetic import on_cuda

pytestmark = [pytest.mark.torch, pytest.mark.gui]

TRACE = ROOT / "sample_traces" / "transformer_compare.h5"


def cuda_session(qtbot: QtBot, window: MainWindow) -> PlanSession:
    """The bundled transformer as if recorded on CUDA (its storages on cuda:0), in the panel."""
    with qtbot.waitSignal(window.loaded, timeout=20000):
        window.open_paths([str(TRACE)])
    assert window.plan.session is not None
    run = window.plan.session.run
    gpu = DeviceState("cuda:0", *([-1] * 8))
    session = PlanSession(dataclasses.replace(run, devices=(gpu,), tables=on_cuda(run.tables)))
    window.plan.set_session(session)
    qtbot.waitUntil(window.plan.is_ready, timeout=20000)  # toggles answer from the model
    return session


def host_items(window: MainWindow) -> list[object]:
    """The host curve's items on the main plot (none while it is hidden)."""
    host = window.timeline._host
    plotted = window.timeline.main.getPlotItem().items
    return [item for item in (host.items if host else []) if item in plotted]


def test_offload_draws_the_host_curve(qtbot: QtBot, window: MainWindow) -> None:
    session = cuda_session(qtbot, window)
    row = session.chain.blocks[0] if session.chain else -1
    window.plan._items[row].setCheckState(0, Qt.CheckState.Checked)
    assert not host_items(window)  # recompute: nothing on the host
    window.plan.show_op_groups(row)
    window.plan.op_groups.offload.setChecked(True)
    outcome = window.timeline.outcome
    expected = project(session.run.tables, [ModuleRegion(row, ("*",), True)])
    assert outcome is not None and outcome.incremental and expected.host_peak_bytes > 0
    assert outcome.host_peak_bytes == expected.host_peak_bytes == int(outcome.host.max())
    assert len(outcome.host) == len(outcome.total)
    assert outcome.recomputes == ()  # its tensors come back from the host: no recompute mark
    assert len(host_items(window)) == 1
    # Drawn from its changes alone, the steps are the curve's (at the last state of each time).
    drawn = window.timeline._host.envelope if window.timeline._host else None
    assert drawn is not None and len(drawn.levels_x[0]) < len(outcome.host)
    last = np.append(outcome.time_ns[1:] != outcome.time_ns[:-1], True)
    at = np.searchsorted(drawn.levels_x[0], outcome.time_ns[last], side="right") - 1
    np.testing.assert_array_equal(drawn.levels_y[0][0][at], outcome.host[last])
    host = f"host ({format_bytes(expected.host_peak_bytes)})"
    assert host in window.timeline.legend.texts()
    assert f"host peak {format_bytes(expected.host_peak_bytes)}" in window.plan.readout.text()
    at = int(np.argmax(outcome.host))
    line = window.timeline._projected_line(session.run, int(outcome.point[at]))
    assert "· host " in line
    window.set_theme(DARK)  # a rebuild draws it again, in the dark theme's colour
    assert len(host_items(window)) == 1 and host in window.timeline.legend.texts()
    pen = window.timeline._host.items[0].opts["pen"] if window.timeline._host else None
    assert pen is not None and pen.color().name().upper() == DARK.host_color.upper()
    window.plan.op_groups.offload.setChecked(False)
    assert not host_items(window) and window.timeline._host is None
    assert not any(t.startswith("host") for t in window.timeline.legend.texts())


def test_the_offload_benchmark_runs_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/offload_toggle.py at a tiny size: both medians, and its check agrees."""
    path = ROOT / "benchmarks" / "offload_toggle.py"
    spec = importlib.util.spec_from_file_location("offload_toggle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--events", "20000", "--blocks", "12", "--toggles", "3"]) == 0
    out = capsys.readouterr().out
    assert "incremental True, host curve drawn True: OK" in out
    assert "offload toggle -> redraw: median" in out and "module toggle -> redraw" in out
