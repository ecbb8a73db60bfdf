"""``ckview view TRACE --plan PLAN``: the explorer opens with the plan ticked and projected; a
plan that cannot apply is one line and a non-zero exit before any window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PyQt6.QtCore import Qt
from pytestqt.qtbot import QtBot

from ckpt_runtime.plan import load_plan
from ckview.analysis import ModuleRegion, format_bytes, project
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT

pytestmark = [pytest.mark.torch, pytest.mark.gui]

TRACE = ROOT / "sample_traces" / "transformer_compare.h5"


def write_plan(folder: Path, regions: list[dict[str, Any]], name: str = "mine") -> Path:
    path = folder / f"{name}.json"
    doc = {"format": "ckview-plan", "version": 2, "name": name, "regions": regions}
    path.write_text(json.dumps(doc))
    return path


def test_the_window_opens_with_the_plan_applied(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    path = write_plan(
        tmp_path,
        [{"module": "encoder.layers.0", "save": ["aten.addmm"]}, {"module": "encoder.layers.2"}],
    )
    window.apply_plan_on_open(load_plan(path), str(path))
    with qtbot.waitSignal(window.loaded, timeout=20000):
        window.open_paths([str(TRACE)])
    session = window.plan.session
    assert session is not None
    t = session.run.tables
    paths = [t["strings"][int(p)] for p in t["modules"]["path"]]
    rows = {paths.index(f"encoder.layers.{i}") for i in (0, 2)}
    first, third = sorted(rows)
    expected = {ModuleRegion(first, ("aten.addmm",)), ModuleRegion(third)}
    assert session.selection == expected
    assert all(window.plan._items[r].checkState(0) == Qt.CheckState.Checked for r in rows)
    peak = project(session.run.tables, sorted(expected, key=lambda r: r.module))
    outcome = window.timeline.outcome
    assert outcome is not None and outcome.peak_bytes == peak.projected_peak.bytes
    assert window.timeline._projected is not None  # the projected curve is drawn
    assert f"Projected peak {format_bytes(outcome.peak_bytes)}" in window.plan.readout.text()
    window.open_paths([str(ROOT / "sample_traces" / "mlp.h5")])  # the plan was for one run
    qtbot.waitUntil(lambda: window.plan.session is not session, timeout=20000)
    assert window.plan.session is not None and not window.plan.session.selection


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The calls that would open a window (``ckview.gui.app.run``), recorded instead."""
    calls: list[dict[str, Any]] = []

    def fake_run(paths: list[str], **kwargs: Any) -> int:
        calls.append({"paths": paths, **kwargs})
        return 0

    monkeypatch.setattr("ckview.gui.app.run", fake_run)
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    return calls


def test_view_passes_the_plan_to_the_window(
    run_cli: Any, opened: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = write_plan(tmp_path, [{"module": "encoder.layers.1", "save": ["*"], "offload": True}])
    code, _, err = run_cli("view", str(TRACE), "--plan", str(path))
    assert code == 0, err
    (call,) = opened
    plan, source = call["plan"]
    assert source == str(path) and plan.name == "mine" and plan.regions[0].offload
    code, _, err = run_cli("view", str(TRACE), "--plan", "sqrt")  # a preset too
    assert code == 0 and opened[1]["plan"][0].name == "sqrt"


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        ([{"module": "decoder.*"}], "matches no module"),
        ([{"module": "encoder.layers.0", "offload": True}], "offload"),
        ("not json", "plan"),
    ],
)
def test_a_bad_plan_is_one_line_and_no_window(
    run_cli: Any, opened: list[dict[str, Any]], tmp_path: Path, plan: Any, says: str
) -> None:
    if isinstance(plan, str):
        path = tmp_path / "broken.json"
        path.write_text(plan)
    else:
        path = write_plan(tmp_path, plan)
    code, _, err = run_cli("view", str(TRACE), "--plan", str(path))
    assert code != 0 and not opened
    assert err.startswith("ckview: error:") and err.count("\n") == 1 and says in err


def test_a_plan_is_for_one_trace(run_cli: Any, opened: list[dict[str, Any]]) -> None:
    mlp = ROOT / "sample_traces" / "mlp.h5"
    code, _, err = run_cli("view", str(TRACE), str(mlp), "--plan", "all")
    assert code != 0 and not opened and "--plan applies to one trace" in err
    code, _, err = run_cli("view", "--plan", "all")
    assert code != 0 and not opened and err.count("\n") == 1
