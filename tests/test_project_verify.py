"""``ckview project`` (plans projected over a recorded run) and ``ckview verify`` (projected vs
measured, end to end), with their bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckview.analysis import find_peak, memory_timeline
from tests.conftest import EXAMPLES, ROOT, ckview, read_run

pytestmark = pytest.mark.torch

COMPARE = ROOT / "sample_traces" / "transformer_compare.h5"


def one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("ckview: error: ")
    return lines[0]


def measured_peak(path: Path, run: str) -> int:
    tables = read_run(path, run)
    return find_peak(memory_timeline(tables["storages"], tables["memory_events"])).bytes


def plan_file(folder: Path, name: str, doc: dict[str, Any]) -> Path:
    path = folder / name
    path.write_text(json.dumps({"format": "ckview-plan", "version": 1, **doc}), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- project


def test_project_all_matches_the_checkpointed_run(run_cli: Any) -> None:
    """Preset 'all' over 'baseline' (the default run) predicts the 'checkpointed' run's peak,
    which checkpoints every layer with torch.utils.checkpoint, within 2%."""
    code, out, err = run_cli("project", str(COMPARE), "--plan", "all", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["run"] == "baseline"
    (plan,) = doc["plans"]
    measured = measured_peak(COMPARE, "checkpointed")
    assert abs(plan["projected_peak_bytes"] - measured) <= 0.02 * measured
    assert plan["saving_bytes"] == doc["run_peak_bytes"] - plan["projected_peak_bytes"] > 0
    assert [r["region"] for r in plan["recomputes"]] == [f"encoder.layers.{i}" for i in range(4)]
    assert plan["extra_compute_ns"] == sum(r["compute_ns"] for r in plan["recomputes"]) > 0
    assert plan["extra_compute_low_ns"] <= plan["extra_compute_ns"] <= plan["extra_compute_high_ns"]
    assert 0 < plan["extra_compute_percent"] < 100


def test_project_text_and_a_plan_file(run_cli: Any, tmp_path: Path) -> None:
    """A plan file without a name is named after its stem; it projects like the preset that
    picks the same blocks; 'none' is the run itself."""
    path = plan_file(tmp_path, "odd.json", {"regions": [{"module": "encoder.layers.[02]"}]})
    code, out, err = run_cli(
        "project",
        str(COMPARE),
        "--plan",
        str(path),
        "--plan",
        "every:2",
        "--plan",
        "none",
        "--json",
    )
    assert code == 0, err
    by_file, preset, none = json.loads(out)["plans"]
    assert (by_file["plan"], preset["plan"]) == ("odd", "every:2")
    assert by_file["projected_peak_bytes"] == preset["projected_peak_bytes"]
    assert by_file["recomputes"] == preset["recomputes"]
    assert none["saving_bytes"] == 0 and none["recomputes"] == []
    code, out, err = run_cli("project", str(COMPARE), "--plan", str(path), "--run", "checkpointed")
    assert code == 0, err
    assert "run 'checkpointed'" in out and f"plan odd ({path})" in out
    assert "projected peak" in out and "of the step time" in out and "encoder.layers.2" in out


def test_project_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from ckview.cli.main import main\n"
        f"assert main(['project', {str(COMPARE)!r}, '--plan', 'sqrt']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "plan sqrt" in proc.stdout


BAD_PLANS = {
    "unknown preset": ("every:0", "K must be >= 1"),
    "missing file": ("nope.json", "no plan file 'nope.json'"),
    "not a preset, no file": ("fastest", "no plan file 'fastest'"),
    "invalid JSON": ("{broken", "not valid JSON"),
    "no such module": ({"regions": [{"module": "decoder.*"}]}, "matches no module"),
    "typo in a key": ({"region": [], "name": "x"}, "unknown key"),
}


@pytest.mark.parametrize("case", BAD_PLANS, ids=list(BAD_PLANS))
def test_project_bad_plan(case: str, run_cli: Any, tmp_path: Path) -> None:
    plan, wanted = BAD_PLANS[case]
    if isinstance(plan, dict):
        plan = str(plan_file(tmp_path, "bad.json", plan))
    elif plan.startswith("{"):
        (tmp_path / "bad.json").write_text(plan, encoding="utf-8")
        plan = str(tmp_path / "bad.json")
    code, out, err = run_cli("project", str(COMPARE), "--plan", "all", "--plan", plan)
    assert wanted in one_line_error(code, err)
    assert out == ""


def test_project_bad_trace_or_run(run_cli: Any, tmp_path: Path) -> None:
    code, _, err = run_cli("project", str(tmp_path / "none.h5"), "--plan", "all")
    assert "does not exist" in one_line_error(code, err)
    code, _, err = run_cli("project", str(COMPARE), "--plan", "all", "--run", "main")
    assert "no run 'main'; runs: baseline, checkpointed" in one_line_error(code, err)


# ----------------------------------------------------------------------------- verify


def test_verify_transformer_end_to_end(tmp_path: Path) -> None:
    """One run of the script records baseline, plan:all and plan:none; each projected peak is
    within 2% of its measured one; stdout is pure JSON although the script prints."""
    out = tmp_path / "v.h5"
    proc = ckview(
        "verify",
        "--plan",
        "all",
        "--json",
        "--plan",
        "none",
        "-o",
        str(out),
        "--no-progress",
        "--stop-after",
        "--timing-steps",
        "2",
        str(EXAMPLES / "transformer.py"),
        "--steps",
        "26",  # 1 warmup + 3 runs + 2 rounds x (3 runs x 3 steps + plan all's warm-up + timed)
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "step 0 loss" in proc.stderr  # the script's own output, moved to stderr
    assert [p["run"] for p in doc["plans"]] == ["plan:all", "plan:none"]
    for plan in doc["plans"]:
        assert abs(plan["peak_error_percent"]) <= 2, plan
        error = plan["projected_peak_bytes"] / plan["measured_peak_bytes"] - 1
        assert abs(error) <= 0.02
    every, none = doc["plans"]
    assert every["projected_extra_ns"] > 0 and every["measured_extra_ns"] > 0
    assert none["projected_extra_ns"] == none["measured_extra_ns"] == 0
    assert none["measured_peak_bytes"] > every["measured_peak_bytes"]
    assert doc["missing_runs"] == [] and doc["trace"] == str(out)
    assert "'baseline' (the script's checkpointing bypassed)" in doc["compared"]
    assert doc["baseline_checkpointing"] == "bypassed" and doc["baseline_recompute"] is None
    for plan in doc["plans"]:
        assert plan["checkpointing"] == "plan" and plan["leftover_recompute"] is None
        timed = plan["extra_time_per_step"]
        assert timed["plain_steps"] and timed["steps"] == 2
        assert timed["measured_low_ns"] <= timed["measured_median_ns"] <= timed["measured_high_ns"]
    assert none["extra_time_per_step"]["projected_ns"] == 0
    every_time = every["extra_time_per_step"]
    assert every_time["projected_low_ns"] <= every_time["projected_ns"] > 0
    assert every_time["projected_ns"] <= every_time["projected_high_ns"]
    from ckview.trace import open_trace

    with open_trace(out) as trace:
        assert trace.run_names == ["baseline", "plan:all", "plan:none"]
        assert trace.meta.command[:2] == ["ckview", "verify"]


def test_verify_table_and_too_few_steps(tmp_path: Path) -> None:
    """The text table; a script that ends before every plan run is recorded verifies what it
    has, says what to do, and exits 1."""
    proc = ckview(
        "verify",
        "--plan",
        "sqrt",
        "--plan",
        "all",
        "-o",
        str(tmp_path / "m.h5"),
        "--no-progress",
        "--timing-steps",
        "0",
        str(EXAMPLES / "mlp.py"),
        "--steps",
        "3",
        "--depth",
        "2",
    )
    assert proc.returncode == 1, proc.stderr
    assert "projected peak" in proc.stdout and "measured peak" in proc.stdout
    assert "\nsqrt " in proc.stdout and "\nall " not in proc.stdout
    assert "before 1 run (plan:all) was recorded" in proc.stderr
    assert "compared: each plan projected over run 'baseline'" in proc.stdout
    assert "extra times are from recorded steps" in proc.stdout


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["--plan", "all", "missing.py"], "script missing.py not found"),
        (["--plan", "every:0", "{mlp}"], "K must be >= 1"),
        (["--plan", "nope.json", "{mlp}"], "no plan file 'nope.json'"),
        (["{mlp}"], "verify needs a plan"),
        (["--plan", "{bad}", "{mlp}", "--depth", "2"], "plan {bad}: module pattern"),
    ],
    ids=["missing script", "bad preset", "missing plan file", "no plan", "plan misses model"],
)
def test_verify_bad_inputs(args: list[str], wanted: str, tmp_path: Path) -> None:
    bad = plan_file(tmp_path, "bad.json", {"regions": [{"module": "decoder"}]})
    fill = {"mlp": str(EXAMPLES / "mlp.py"), "bad": str(bad)}
    argv = [a.format(**fill) for a in args]
    proc = ckview("verify", "-o", str(tmp_path / "v.h5"), "--no-progress", *argv, cwd=tmp_path)
    assert wanted.format(**fill) in one_line_error(proc.returncode, proc.stderr)
    assert proc.stdout == ""
