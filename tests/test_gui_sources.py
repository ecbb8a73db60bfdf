"""Source lines in the explorer (issue 13): a trace recorded with stacks names the line of the
user's code that made each tensor in the hover and the inspector's tooltips, and the inspector
groups the live tensors by that line with their bytes summed."""

from __future__ import annotations

import numpy as np
import pytest
from PyQt6.QtCore import Qt
from pytestqt.qtbot import QtBot

from ckview.app.run import BEFORE_RECORDING, NO_SITE, Run, group_by_site, load_trace
from ckview.gui.inspector import Inspector
from tests.conftest import ROOT
from tests.factory import TANH_SITE, record_stack_net

pytestmark = [pytest.mark.torch, pytest.mark.gui]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    path = record_stack_net(tmp_path_factory.mktemp("stacks") / "t.h5")
    (main,) = load_trace(path).runs
    return main


def _tanh_point(run: Run) -> int:
    """The timeline point of the allocation of Tanh's output."""
    ops = run.tables["ops"]
    names = np.array([run.tables["strings"][n] for n in ops["name"]])
    tanh = int(np.flatnonzero(names == "aten.tanh.default")[0])
    row = int(np.flatnonzero(run.tables["storages"]["op"] == tanh)[0])
    return int(np.flatnonzero(run.tables["memory_events"]["storage"] == row)[0]) + 1


def test_hover_names_the_source_line(run: Run) -> None:
    point = _tanh_point(run)
    assert run.source_line(point) == TANH_SITE
    assert run.describe_point(point).splitlines()[-1] == f"made at {TANH_SITE}"
    assert run.source_line(0) == ""


def test_live_tensors_grouped_by_source_line(run: Run) -> None:
    point = _tanh_point(run)
    rows = run.live_tensors(point)
    tanh = next(r for r in rows if r.op == "aten.tanh.default")
    assert tanh.site == TANH_SITE
    groups = group_by_site(rows, run.no_site)
    assert sum(g.nbytes for g in groups) == sum(r.nbytes for r in rows)
    assert sum(g.count for g in groups) == len(rows)
    assert [g.nbytes for g in groups] == sorted((g.nbytes for g in groups), reverse=True)
    line = next(g for g in groups if g.site == TANH_SITE)
    assert line.nbytes == sum(r.nbytes for r in rows if r.site == TANH_SITE)
    # Parameters were made before recording: no stack, so no line (said, not guessed).
    assert run.no_site == BEFORE_RECORDING
    assert any(g.site == BEFORE_RECORDING and "parameters" in g.categories for g in groups)


def test_inspector_groups_by_source_line(qtbot: QtBot, run: Run) -> None:
    inspector = Inspector()
    qtbot.addWidget(inspector)
    point = _tanh_point(run)
    inspector.show_point(run, point)
    proxy = inspector.proxy
    tips = [
        proxy.data(proxy.index(r, 0), Qt.ItemDataRole.ToolTipRole) for r in range(proxy.rowCount())
    ]
    assert any(tip.endswith(f"\nat {TANH_SITE}") for tip in tips)
    inspector.grouping.setCurrentIndex(1)
    assert inspector.by_site() and proxy.sourceModel() is inspector.sites
    groups = group_by_site(run.live_tensors(point), run.no_site)
    shown = [proxy.data(proxy.index(r, 2)) for r in range(proxy.rowCount())]
    assert sorted(shown) == sorted(g.site for g in groups)
    first = proxy.data(proxy.index(0, 0), Qt.ItemDataRole.UserRole)
    assert first == groups[0].nbytes  # sorted by bytes, largest first
    inspector.filter.setText("Net.forward")
    assert [proxy.data(proxy.index(r, 2)) for r in range(proxy.rowCount())] == [
        g.site for g in groups if "Net.forward" in g.site
    ]
    inspector.grouping.setCurrentIndex(0)
    assert proxy.sourceModel() is inspector.model


def test_a_trace_without_stacks_says_so() -> None:
    (main,) = load_trace(ROOT / "sample_traces" / "mlp.h5").runs
    point = main.peak.point
    assert main.source_line(point) == "" and "made at" not in main.describe_point(point)
    assert main.no_site == NO_SITE
    assert [g.site for g in group_by_site(main.live_tensors(point), main.no_site)] == [NO_SITE]


def test_sites_are_named_in_the_trace(run: Run) -> None:
    """The grouping reads what the recorder wrote: every allocated storage has a line."""
    storages = run.tables["storages"]
    allocated = np.flatnonzero(np.asarray(storages["alloc_ns"]) >= 0)
    assert all(run.site(int(r)) for r in allocated)
