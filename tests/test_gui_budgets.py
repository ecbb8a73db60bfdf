"""Budgets that answer (issue 13): a budget no plan reaches says by how much, a run that cannot
be planned on says why, a percentage says what it is a percentage of; in the explorer's plan
panel and in ``ckview plan``, with one wording (``budget_answer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pytestqt.qtbot import QtBot
from torch import nn

from ckview.analysis import Budget, Planner, already_checkpointed, budget_answer, format_bytes
from ckview.gui.main_window import MainWindow
from tests.conftest import ROOT, ask_budget, open_trace_in, read_run
from tests.factory import record_model

pytestmark = [pytest.mark.torch, pytest.mark.gui]

SAMPLES = ROOT / "sample_traces"
TRANSFORMER = SAMPLES / "transformer.h5"
CHECKPOINTED = SAMPLES / "transformer_checkpointed.h5"


# -- analysis


def test_budget_answer_and_what_a_share_is_of() -> None:
    planner = Planner(read_run(TRANSFORMER))
    peak = planner.baseline_peak
    unmet = planner.for_budget(2**20)
    best = unmet.best_reachable_peak
    assert not unmet.fits and best > 2**20
    assert budget_answer(unmet) == (
        f"budget 1.00 MiB is not met: the best plan peaks at {format_bytes(best)} "
        f"(+{format_bytes(best - 2**20)})"
    )
    met = planner.for_budget(round(peak * 0.8))
    assert met.fits and budget_answer(met, "X").startswith("budget X is met: the plan peaks at ")
    assert Budget(share=0.1).describe(peak) == (
        f"{format_bytes(round(peak * 0.1))} (10% of the recorded peak {format_bytes(peak)})"
    )
    assert Budget(size=3 * 2**30).describe(peak) == "3.00 GiB"


def test_a_checkpointed_run_says_why_plans_do_nothing() -> None:
    assert already_checkpointed(read_run(TRANSFORMER)) is None
    why = already_checkpointed(read_run(CHECKPOINTED))
    assert why is not None and "checkpointed already" in why and "baseline run" in why
    assert why in Planner(read_run(CHECKPOINTED)).notes()


# -- the explorer


def test_unmet_budget_says_by_how_much(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, TRANSFORMER)
    run = window.current_run()
    assert run is not None
    expected = Planner(run.tables).for_budget(round(run.peak.bytes * 0.1))
    note = ask_budget(qtbot, window, "10%")
    best = expected.best_reachable_peak
    assert "is not met: the best plan peaks at" in note
    assert format_bytes(best) in note and f"(+{format_bytes(best - expected.budget_bytes)})" in note
    assert "(10% of the recorded peak 88.8 MiB)" in note
    assert window.statusBar().currentMessage().startswith("budget ")
    # The lowest-peak plan is selected all the same: the curve shows how close it gets.
    assert window.plan.session is not None and window.plan.session.selection
    note = ask_budget(qtbot, window, "80 MiB")
    assert "budget 80.0 MiB is met: " in note and "→" in note and "extra compute" in note
    assert "color" not in note  # an answer that is met is not shown as a warning


def test_checkpointed_run_is_not_planned_on(qtbot: QtBot, window: MainWindow) -> None:
    open_trace_in(qtbot, window, CHECKPOINTED)
    note = ask_budget(qtbot, window, "30 MiB", planned=False)
    assert "No plan for budget 30.0 MiB: this run is checkpointed already" in note
    assert window.plan.plan_button.isEnabled()
    assert window.plan.session is not None and not window.plan.session.selection
    window.plan.apply_preset("sqrt")  # a preset says the same, rather than nothing
    assert "No plan for the sqrt preset: this run is checkpointed" in window.plan.budget_note.text()
    assert not window.plan.session.selection


class TwoLayers(nn.Module):
    """No ModuleList or Sequential: no chain of blocks for the planner."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_run_without_chain_says_why(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = record_model(tmp_path / "two.h5", TwoLayers(), (4, 8), iterations=3)
    open_trace_in(qtbot, window, path)
    note = ask_budget(qtbot, window, "50%")
    assert note.startswith("<span") and "No plan for budget" in note
    assert "no chain of blocks" in note and "% of the recorded peak" in note
    assert window.last_error is None  # an answer, not an error dialog


# -- the CLI says the same


def test_cli_plan_says_the_same(run_cli: Any) -> None:
    code, out, err = run_cli("plan", str(TRANSFORMER), "--budget", "10%")
    assert code == 1
    assert "budget 8.88 MiB (10% of the recorded peak 88.8 MiB) is not met: " in out
    code, out, _ = run_cli("plan", str(TRANSFORMER), "--budget", "80MiB")
    assert code == 0 and "\nbudget 80.0 MiB is met: the plan peaks at " in out
    assert err.startswith(
        "ckview: budget 8.88 MiB (10% of the recorded peak 88.8 MiB) is not met: "
    )
    assert "the best plan peaks at" in err and "raise the budget" in err
    code, out, err = run_cli("plan", str(CHECKPOINTED), "--budget", "30MiB")
    assert code == 1 and "note: this run is checkpointed already" in out
    assert "is not met" in err and "checkpointed already" in err and "Traceback" not in err
