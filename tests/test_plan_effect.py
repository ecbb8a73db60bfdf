"""Plans that cannot take effect say why, on every surface (issue 9, item 4).

Three kinds of recorded model where a resolved plan wraps nothing (NOTE [ Regions that cannot
take effect ] in ckpt_runtime/resolve.py): an ``nn.Sequential`` looped over in Python, one
handed to ``torch.utils.checkpoint.checkpoint_sequential``, and blocks checkpointed at function
level (``checkpoint(block.forward, x)``: the block's module call never happens). Each is
recorded with the Recorder; ``project`` (text and JSON), ``plan``, the planner, the GUI plan
readout and ``export`` must each say which regions will not run, why, and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from ckview.analysis import (
    Planner,
    SegmentRegion,
    chain_candidates,
    resolve_on_trace,
)
from recorder import Recorder
from tests.conftest import read_run

pytestmark = [pytest.mark.torch, pytest.mark.gui]

WIDTH = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x)))


class Looped(nn.Module):
    """Loops over its Sequential in Python: the Sequential's forward never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class CheckpointSequential(Looped):
    """Hands its Sequential to torch's checkpoint_sequential (which calls the children)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)


class FunctionLevel(nn.Module):
    """Checkpoints each block's forward as a function: the blocks are never called."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block.forward, x, use_reentrant=False)
        return x


class Called(Looped):
    """Calls its Sequential: every plan takes effect (the control)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "looped": Looped,
    "checkpoint_sequential": CheckpointSequential,
    "function": FunctionLevel,
    "called": Called,
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, build in MODELS.items():
        torch.manual_seed(0)
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        path = tmp_path_factory.mktemp(name) / "t.h5"
        with Recorder(path, steps=1, warmup=1, progress=False):
            for _ in range(2):
                model(torch.randn(256, WIDTH)).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        out[name] = path
    return out


def _resolve(path: Path, plan: Any) -> Any:
    t = read_run(path)
    return resolve_on_trace(plan, t["modules"], t["strings"], t["module_calls"])


# ----------------------------------------------------------------------------- resolution


@pytest.mark.parametrize("name", ["looped", "checkpoint_sequential"])
def test_segments_on_a_sequential_that_is_not_called(traces: dict[str, Path], name: str) -> None:
    plan = _resolve(traces[name], "sqrt")
    assert len(plan.regions) == 2 and all(isinstance(r, SegmentRegion) for r in plan.regions)
    assert len(plan.idle) == 2 and not plan.effective
    (note,) = plan.notes()
    assert "blocks is an nn.Sequential whose forward never ran" in note
    assert "checkpoint_sequential" in note and "`blocks.*`" in note
    # What the note advises takes effect.
    assert not _resolve(traces[name], {**_doc(), "regions": [{"module": "blocks.*"}]}).idle


def test_module_regions_whose_module_is_never_called(traces: dict[str, Path]) -> None:
    plan = _resolve(traces["function"], "all")
    assert len(plan.regions) == 4 and len(plan.idle) == 4
    (note,) = plan.notes()
    assert note.startswith("blocks.0, blocks.1, blocks.2, blocks.3: the module is never called")
    assert "`blocks.*.*`" in note
    assert not _resolve(traces["function"], {**_doc(), "regions": [{"module": "blocks.*.fc"}]}).idle


def test_called_sequential_takes_effect(traces: dict[str, Path]) -> None:
    for preset in ("sqrt", "all", "every:2"):
        plan = _resolve(traces["called"], preset)
        assert plan.regions and not plan.idle and plan.summary() is None


def _doc() -> dict[str, Any]:
    return {"format": "ckview-plan", "version": 1, "name": "d"}


# ----------------------------------------------------------------------------- planner


def test_planner_only_considers_candidates_that_take_effect(traces: dict[str, Path]) -> None:
    t = read_run(traces["looped"])
    assert not any(
        isinstance(r, SegmentRegion)
        for r in chain_candidates(t["modules"], t["strings"], t["module_calls"])
    )
    planner = Planner(t)
    assert any("looped over" in note for note in planner.notes())
    result = planner.for_budget(planner.baseline_peak // 2)
    assert result.regions and not _resolve_regions(t, result.regions).idle
    sqrt = result.preset("sqrt")
    assert sqrt is not None and sqrt.idle is not None and "never ran" in sqrt.idle
    # On a called Sequential, segments are candidates.
    t = read_run(traces["called"])
    assert any(isinstance(r, SegmentRegion) for r in Planner(t).candidates)
    assert not Planner(t).notes()


def _resolve_regions(t: Any, regions: Any) -> Any:
    from ckview.analysis import plan_on_trace

    return plan_on_trace(regions, t["modules"], t["strings"], "p", calls=t["module_calls"])


def test_planner_with_no_candidate_that_runs(traces: dict[str, Path]) -> None:
    planner = Planner(read_run(traces["function"]))
    assert not planner.search
    assert any("no candidate region ran forward" in note for note in planner.notes())
    result = planner.for_budget(1)
    assert not result.fits and not result.regions


# ----------------------------------------------------------------------------- CLI


def test_project_says_why(traces: dict[str, Path], run_cli: Any) -> None:
    code, out, _ = run_cli("project", str(traces["looped"]), "--plan", "sqrt", "--plan", "all")
    assert code == 0
    sqrt, everything = out.split("\nplan all")
    assert "not in effect   2 of 2 regions will not run in this step, so the plan" in sqrt
    assert "whose forward never ran" in sqrt and "`blocks.*`" in sqrt
    assert "not in effect" not in everything
    code, out, _ = run_cli("project", str(traces["looped"]), "--plan", "sqrt", "--json")
    (doc,) = json.loads(out)["plans"]
    assert doc["idle_regions"] == 2 and doc["saving_bytes"] == 0
    assert [r["takes_effect"] for r in doc["regions"]] == [False, False]
    assert all("looped over" in r["why"] for r in doc["regions"])
    assert doc["notes"] == ["blocks[0:2], blocks[2:4]: " + doc["regions"][0]["why"]]


def test_project_function_level(traces: dict[str, Path], run_cli: Any) -> None:
    code, out, _ = run_cli("project", str(traces["function"]), "--plan", "every:2")
    assert code == 0 and "not in effect   2 of 2 regions" in out and "never called" in out


@pytest.mark.parametrize("name", ["looped", "function", "called"])
def test_plan_never_says_no_plan_fits_and_the_baseline_fits(
    traces: dict[str, Path], name: str, run_cli: Any
) -> None:
    code, out, err = run_cli("plan", str(traces[name]), "--budget", "1B")
    assert code == 1
    assert "no plan fits" in out and "the baseline already fits" not in out
    if name == "function":
        assert "no candidate region ran forward" in out and "no candidate region" in err
    if name == "looped":
        assert "note: blocks is an nn.Sequential whose forward never ran" in out
        assert "  sqrt: 2 of 2 regions cannot take effect" in out
    code, out, _ = run_cli("plan", str(traces[name]), "--budget", "1B", "--json")
    doc = json.loads(out)
    assert bool(doc["notes"]) == (name != "called")


# ----------------------------------------------------------------------------- GUI and export


def _session(path: Path) -> Any:
    from ckview.app.planning import PlanSession
    from ckview.app.run import load_trace

    return PlanSession(load_trace(path).runs[0])


def test_gui_readout_says_why(traces: dict[str, Path]) -> None:
    from ckview.gui.plan_panel import readout_html

    session = _session(traces["looped"])
    assert session.chain is not None and not session.chain.sequential  # no segments offered
    session.apply_preset("sqrt")
    outcome = session.outcome()
    assert outcome.regions == 2 and outcome.idle_regions == 2
    html = readout_html(outcome, len(session.selection))
    assert "None of them will run in the recorded step" in html and "blocks.*" in html
    session.apply_preset("all")
    outcome = session.outcome()
    assert outcome.idle_regions == 0 and outcome.saving_bytes > 0
    assert "will run" not in readout_html(outcome, len(session.selection))


def test_export_says_why(traces: dict[str, Path], run_cli: Any, tmp_path: Path) -> None:
    code, out, _ = run_cli(
        "export", str(traces["looped"]), "--plan", "sqrt", "--plan", "all",
        "-o", str(tmp_path / "r.png"),
    )  # fmt: skip
    assert code == 0
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: plan sqrt: none of its 2 region(s)")
    assert "looped over" in notes[0]
    from ckview.app.report import plan_notes
    from ckview.app.run import Axis, load_trace
    from ckview.gui.report import _comparison_curves

    run = load_trace(traces["looped"]).runs[0]
    session = _session(traces["looped"])
    session.prepare()
    session.apply_preset("sqrt")
    plans = [("sqrt", session.outcome(), run)]
    labels = [c.label for c in _comparison_curves([run], plans, Axis.TIME)]
    assert labels[-1].endswith("(not in effect)")
    assert plan_notes(plans)[0].startswith("plan sqrt: none of its 2 region(s) will run")
