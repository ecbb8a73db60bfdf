"""Op-level choices in the plan panel (issue 22, item 5): a checkpointed module's saved-tensor
groups, ticked to save their ops (NOTE [ One region per module ] in ckview.app.planning)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from PyQt6.QtCore import Qt
from pytestqt.qtbot import QtBot

from ckview.analysis import ModuleRegion, format_bytes, project
from ckview.analysis.device import DeviceState
from ckview.app.planning import PlanSession
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT

pytestmark = pytest.mark.gui

TRACE = ROOT / "sample_traces" / "transformer_compare.h5"


def opened(qtbot: QtBot, window: MainWindow) -> PlanSession:
    """The bundled transformer opened, its plan model built."""
    with qtbot.waitSignal(window.loaded, timeout=20000):
        window.open_paths([str(TRACE)])
    qtbot.waitUntil(window.plan.is_ready, timeout=20000)
    session = window.plan.session
    assert session is not None and session.chain is not None
    return session


def tick_group(window: MainWindow, packet: str, on: bool = True) -> None:
    view = window.plan.op_groups.groups
    for i in range(view.topLevelItemCount()):
        item = view.topLevelItem(i)
        assert item is not None
        if item.text(0) == packet:
            item.setCheckState(0, Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
            return
    raise AssertionError(f"no group {packet}")


def group_ticks(window: MainWindow) -> dict[str, bool]:
    view = window.plan.op_groups.groups
    items = [view.topLevelItem(i) for i in range(view.topLevelItemCount())]
    return {it.text(0): it.checkState(0) == Qt.CheckState.Checked for it in items if it}


def test_ticking_a_group_projects_the_op_level_plan(qtbot: QtBot, window: MainWindow) -> None:
    session = opened(qtbot, window)
    row = session.chain.blocks[1] if session.chain else -1
    window.plan._items[row].setCheckState(0, Qt.CheckState.Checked)
    window.plan.show_op_groups(row)
    assert window.plan.op_groups.groups.isEnabled()  # enabled once the module is ticked
    tick_group(window, "aten.addmm")
    tick_group(window, "aten._safe_softmax")
    region = ModuleRegion(row, ("aten._safe_softmax", "aten.addmm"))
    assert session.selection == {region}
    peak = project(session.run.tables, [region]).projected_peak.bytes
    whole = project(session.run.tables, [ModuleRegion(row)]).projected_peak.bytes
    assert peak != whole  # saving the ops keeps their outputs: the test can tell
    assert window.timeline.outcome is not None and window.timeline.outcome.peak_bytes == peak
    assert f"Projected peak {format_bytes(peak)}" in window.plan.readout.text()
    assert window.plan._items[row].checkState(0) == Qt.CheckState.Checked
    tick_group(window, "aten.addmm", on=False)
    tick_group(window, "aten._safe_softmax", on=False)
    assert session.selection == {ModuleRegion(row)}  # back to recompute-all
    assert window.timeline.outcome is not None and window.timeline.outcome.peak_bytes == whole
    window.plan._items[row].setCheckState(0, Qt.CheckState.Unchecked)
    assert not session.selection and not window.plan.op_groups.groups.isEnabled()


def test_a_loaded_op_level_plan_shows_ticked(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    session = opened(qtbot, window)
    row = session.chain.blocks[2] if session.chain else -1
    plan = {
        "format": "ckview-plan",
        "version": 2,
        "name": "ops",
        "regions": [{"module": "encoder.layers.2", "save": ["aten.bmm", "aten.mm"]}],
    }
    assert session.run.paths[row].endswith(".encoder.layers.2")
    path = tmp_path / "ops.json"
    path.write_text(json.dumps(plan))
    window.plan.load_plan(str(path))
    assert window.last_error is None
    assert session.selection == {ModuleRegion(row, ("aten.bmm", "aten.mm"))}
    assert window.plan._items[row].checkState(0) == Qt.CheckState.Checked
    assert session.segment_selected(2, 3)  # the strip shows the block checkpointed
    window.plan.show_op_groups(row)
    ticks = group_ticks(window)
    assert {p for p, on in ticks.items() if on} == {"aten.bmm", "aten.mm"} and len(ticks) > 2
    peak = project(session.run.tables, list(session.selection)).projected_peak.bytes
    assert window.timeline.outcome is not None and window.timeline.outcome.peak_bytes == peak


def test_a_loaded_plan_saving_a_view_is_applied_with_a_warning(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """NOTE [ Saves the projection cannot hold ] in ckview/analysis/planner_ops.py: the readout
    says which save entry projects low, and the plan is selected all the same."""
    session = opened(qtbot, window)
    row = session.chain.blocks[2] if session.chain else -1
    region = {"module": "encoder.layers.2", "save": ["aten.addmm", "aten.view"]}
    plan = {"format": "ckview-plan", "version": 2, "name": "view", "regions": [region]}
    path = tmp_path / "view.json"
    path.write_text(json.dumps(plan))
    window.plan.load_plan(str(path))
    assert window.last_error is None
    assert session.selection == {ModuleRegion(row, ("aten.addmm", "aten.view"))}
    text = window.plan.readout.text()
    assert "The projection can be low" in text
    assert "block encoder.layers.2 saves aten.view, which is a view in the recorded step" in text


def test_export_writes_a_format_2_plan_that_reloads(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    session = opened(qtbot, window)
    blocks = session.chain.blocks if session.chain else ()
    window.plan._items[blocks[0]].setCheckState(0, Qt.CheckState.Checked)
    window.plan._items[blocks[3]].setCheckState(0, Qt.CheckState.Checked)
    window.plan.show_op_groups(blocks[3])
    tick_group(window, "aten.mul")
    chosen = set(session.selection)
    path = tmp_path / "mixed.json"
    window.plan.save_plan(str(path))
    document = json.loads(path.read_text())
    assert document["version"] == 2
    assert [r.get("save") for r in document["regions"]] == [None, ["aten.mul"]]
    window.plan.apply_preset("none")
    assert not session.selection
    window.plan.load_plan(str(path))
    assert session.selection == chosen


def test_offload_is_off_on_a_cpu_trace(qtbot: QtBot, window: MainWindow) -> None:
    session = opened(qtbot, window)
    row = session.chain.blocks[0] if session.chain else -1
    window.plan._items[row].setCheckState(0, Qt.CheckState.Checked)
    window.plan.show_op_groups(row)
    box = window.plan.op_groups.offload
    assert session.run.device is None and not box.isEnabled()
    assert "CPU trace" in box.toolTip()


def test_the_strip_counts_an_op_level_block_as_checkpointed(
    qtbot: QtBot, window: MainWindow
) -> None:
    """A block saving some ops is its segment's region: clicking the block unticks it."""
    session = opened(qtbot, window)
    row = session.chain.blocks[1] if session.chain else -1
    session.set_selection([ModuleRegion(row, ("aten.addmm",))])
    assert session.segment_selected(1, 2)
    window.plan.toggle_block(1)
    assert not session.selection


def test_offload_on_a_cuda_run(qtbot: QtBot, window: MainWindow) -> None:
    """On a run with a CUDA device the checkbox is on: ticking it makes the region offload
    what it saves (its groups then off), unticking recomputes every op again."""
    session = opened(qtbot, window)
    gpu = DeviceState("cuda:0", *([-1] * 8))
    cuda = PlanSession(dataclasses.replace(session.run, devices=(gpu,)))
    window.plan.set_session(cuda)
    row = cuda.chain.blocks[0] if cuda.chain else -1
    window.plan._items[row].setCheckState(0, Qt.CheckState.Checked)
    window.plan.show_op_groups(row)
    box = window.plan.op_groups.offload
    assert box.isEnabled()
    box.setChecked(True)
    assert cuda.selection == {ModuleRegion(row, ("*",), True)}
    assert not window.plan.op_groups.groups.isEnabled()
    expected = project(cuda.run.tables, [ModuleRegion(row, ("*",), True)])
    assert window.timeline.outcome is not None
    assert window.timeline.outcome.offloaded_bytes == expected.offloaded_bytes
    assert window.timeline.outcome.peak_bytes == expected.projected_peak.bytes
    box.setChecked(False)
    assert cuda.selection == {ModuleRegion(row)}
