"""Hand-written op-level plans whose save lists the projection cannot hold (NOTE [ Saves the
projection cannot hold ] in ckview/analysis/planner_ops.py): ``ckview record``, ``project``,
``verify`` and ``export`` and the explorer's plan session warn, one line per save entry, and
still run the plan; a plan the op-level planner writes gets no warning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckview.analysis import ModuleRegion
from ckview.app.planning import PlanSession
from ckview.app.run import read_run as read_app_run
from ckview.cli.recording import load_plans
from ckview.cli.verify import _verify, format_table
from ckview.trace import open_trace
from tests.conftest import ckview, read_run

pytestmark = pytest.mark.torch

SCRIPT = """\
import torch
from torch import nn

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=True)
model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(20):
    model(torch.randn(16, 32, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""

SAVE_ADD = {"module": "layers.1", "save": ["aten.addmm", "aten.add"]}
"""The packed q/k/v projection of ``layers.1.self_attn`` adds its bias with ``aten.add_`` in
the recorded step (native path), out of place under the selective checkpoint's mode."""
SAVE_VIEW = {"module": "layers.*", "save": ["aten.addmm", "aten.view"]}

ADD_LINE = (
    "ckview: warning: plan save-add: block layers.1 saves aten.add, which runs in place in the "
    "recorded step (aten.add_): under selective checkpointing it may run out of place into new "
    "tensors, which the projection does not count, so the projection can be low; leave "
    "aten.add out of the save list (ckview plan --level op never saves it)"
)
VIEW_LINE = (
    "ckview: warning: plan save-view: blocks layers.0, layers.1 save aten.view, which is a view "
    "in the recorded step (no storage of its own): saving it keeps the viewed tensor alive, "
    "which the projection does not count, so the projection can be low; leave aten.view out of "
    "the save list (ckview plan --level op never saves it)"
)


def plan_file(folder: Path, name: str, *regions: dict[str, Any]) -> Path:
    path = folder / f"{name}.json"
    doc = {"format": "ckview-plan", "version": 2, "name": name, "regions": list(regions)}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], str]:
    """The trace of ``ckview record --compare`` with both plans, the plan files, and what
    ``record`` printed on stderr."""
    folder = tmp_path_factory.mktemp("save_warnings")
    (folder / "train.py").write_text(SCRIPT, encoding="utf-8")
    plans = [plan_file(folder, "save-add", SAVE_ADD), plan_file(folder, "save-view", SAVE_VIEW)]
    trace = folder / "trace.h5"
    out = ckview(
        "record", "--compare", "--timing-steps", "0", "--stop-after", "-o", str(trace),
        *(arg for p in plans for arg in ("--plan", str(p))), "train.py", cwd=folder,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return trace, plans, out.stderr


def native(trace: Path) -> bool:
    """Whether the native recorder recorded the baseline: the Python recorder's own dispatch
    mode records the bias add out of place, as the plan runs it (nothing to warn of)."""
    return bool(read_run(trace, "baseline")["meta"].recorder == "native")


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ckview: warning: plan ")]


def test_record_warns_once_per_entry_and_records_the_plans(
    recorded: tuple[Path, list[Path], str],
) -> None:
    trace, _, stderr = recorded
    assert warnings_of(stderr) == ([ADD_LINE, VIEW_LINE] if native(trace) else [VIEW_LINE])
    with open_trace(trace) as t:  # a warning, not an error: both plans ran
        assert {"plan:save-add", "plan:save-view"} <= set(t.run_names)


def test_project_warns_of_add_in_an_attention_block(
    recorded: tuple[Path, list[Path], str],
) -> None:
    trace, (add, _), _ = recorded
    out = ckview("project", str(trace), "--plan", str(add))
    assert out.returncode == 0, out.stderr
    assert "projected peak" in out.stdout
    assert warnings_of(out.stderr) == ([ADD_LINE] if native(trace) else [])
    doc = json.loads(ckview("project", str(trace), "--plan", str(add), "--json").stdout)
    (plan,) = doc["plans"]
    expected = {
        "blocks": ["layers.1"],
        "entries": ["aten.add"],
        "reason": "out_of_place",
        "ops": ["aten.add"],
        "message": ADD_LINE.removeprefix("ckview: warning: plan save-add: "),
    }
    assert plan["warnings"] == ([expected] if native(trace) else [])


def test_project_warns_of_a_view_and_the_run_measures_above_it(
    recorded: tuple[Path, list[Path], str],
) -> None:
    trace, (_, view), _ = recorded
    out = ckview("project", str(trace), "--plan", str(view), "--json")
    assert out.returncode == 0, out.stderr
    assert warnings_of(out.stderr) == [VIEW_LINE]
    (plan,) = json.loads(out.stdout)["plans"]
    assert [(w["reason"], w["ops"]) for w in plan["warnings"]] == [("view", ["aten.view"])]
    # the warning is warranted: the run keeps the viewed tensors, over the projection
    (check,) = _verify(trace, load_plans([str(view)]))[0]
    assert check.measured_peak_bytes > 1.1 * check.projected_peak_bytes


def test_verify_lists_the_warnings_under_its_table(
    recorded: tuple[Path, list[Path], str],
) -> None:
    trace, plans, _ = recorded
    checks, missing, baseline = _verify(trace, load_plans([str(p) for p in plans]))
    assert not missing
    table = format_table(trace, checks, baseline).splitlines()
    wanted = [ADD_LINE, VIEW_LINE] if native(trace) else [VIEW_LINE]
    assert [line for line in table if line.startswith("warning: plan ")] == [
        line.removeprefix("ckview: ") for line in wanted
    ]
    assert [len(c.to_json()["projection"]["warnings"]) for c in checks] == [native(trace), 1]


def test_a_plan_the_planner_writes_does_not_warn(
    recorded: tuple[Path, list[Path], str], tmp_path: Path
) -> None:
    """The planner never saves what the rule leaves out; the same plan with ``aten.add`` in a
    block's save list does warn (so the check can tell)."""
    trace, _, _ = recorded
    written = tmp_path / "op.json"
    out = ckview("plan", str(trace), "--budget", "70%", "--level", "op", "-o", str(written))
    assert out.returncode == 0, out.stderr
    doc = json.loads(written.read_text())
    saving = [r for r in doc["regions"] if "save" in r]
    assert saving, doc  # an op-level plan: the test tests the rule
    out = ckview("project", str(trace), "--plan", str(written), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plans"][0]["warnings"] == []
    assert not warnings_of(out.stderr)
    saving[0]["save"].append("aten.add")
    doc["name"] = "with-add"
    edited = tmp_path / "with-add.json"
    edited.write_text(json.dumps(doc), encoding="utf-8")
    out = ckview("project", str(trace), "--plan", str(edited))
    assert out.returncode == 0, out.stderr
    expected = f"block {saving[0]['module']} saves aten.add, which runs in place"
    lines = warnings_of(out.stderr)
    assert len(lines) == native(trace) and all(expected in line for line in lines), lines


def test_the_explorer_warns_of_a_loaded_plan_not_of_its_groups(
    recorded: tuple[Path, list[Path], str],
) -> None:
    trace, (add, view), _ = recorded
    with open_trace(trace) as t:
        session = PlanSession(read_app_run(t, "baseline"))
    session.load_plan(str(view))
    line = VIEW_LINE.removeprefix("ckview: warning: plan save-view: ")
    assert session.outcome().warnings == (line,)
    session.load_plan(str(add))
    assert len(session.outcome().warnings) == native(trace)
    (loaded,) = session.regions()  # layers.1
    row = loaded.module
    session.set_selection([ModuleRegion(row)])
    session.set_saved(row, [g.packet for g in session.op_groups(row)])  # every group ticked
    assert session.outcome().warnings == ()


def test_export_warns_and_still_writes_the_plan(
    recorded: tuple[Path, list[Path], str], tmp_path: Path
) -> None:
    trace, (_, view), _ = recorded
    csv = tmp_path / "curves.csv"
    out = ckview("export", str(trace), "--run", "baseline", "--plan", str(view), "--csv", str(csv))
    assert out.returncode == 0, out.stderr
    assert warnings_of(out.stderr) == [VIEW_LINE]
    assert "plan:save-view over" in csv.read_text(encoding="utf-8")
