"""Runs of the same step with and without checkpointing in one trace (`record --compare`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ckview.analysis import summarize_run
from ckview.trace import open_trace
from ckview.trace.schema import Phase
from tests.conftest import ckview, read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]


def _peak(tables: dict) -> int:
    return summarize_run(tables, tables["modules"], tables["strings"]).peak_bytes


@pytest.mark.parametrize(
    ("example", "blocks"),
    [
        ("transformer", [f"CausalLM.encoder.layers.{i}" for i in (3, 2, 1, 0)]),
        ("gpt2", [f"GPT2LMHeadModel.transformer.h.{i}" for i in (3, 2, 1, 0)]),
    ],
)
def test_compare_records_baseline_and_checkpointed(
    example: str, blocks: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "cmp.h5"
    proc = ckview("record", "-o", str(out), "--compare", f"examples/{example}.py", "--checkpoint")
    assert proc.returncode == 0, proc.stderr
    with open_trace(out) as trace:
        assert trace.run_names == ["baseline", "checkpointed"]
    baseline, checkpointed = read_run(out, "baseline"), read_run(out, "checkpointed")
    # The baseline bypasses the script's checkpointing: no recompute, a higher peak.
    assert not (baseline["ops"]["phase"] == Phase.RECOMPUTE).any()
    assert len(baseline["recompute_regions"]["step"]) == 0
    assert _peak(checkpointed) < 0.7 * _peak(baseline)
    regions = checkpointed["recompute_regions"]
    assert [checkpointed["strings"][i] for i in regions["name"]] == blocks
    # Ops inside each region are the recompute.
    phases = checkpointed["ops"]["phase"]
    for first, end in zip(regions["first_op"], regions["end_op"], strict=True):
        assert end > first and (phases[first:end] == Phase.RECOMPUTE).all()
    # The same forward ops in both runs, in the same order (aligned by position).
    fwd = [
        run["ops"]["name"][run["ops"]["phase"] == Phase.FORWARD] for run in (baseline, checkpointed)
    ]
    names = [[baseline["strings"][i] for i in fwd[0]], [checkpointed["strings"][i] for i in fwd[1]]]
    assert [n for n in names[0] if n != "aten.detach.default"] == [
        n for n in names[1] if n != "aten.detach.default"
    ]
    summary = json.loads(ckview("summary", str(out), "--json").stdout)["runs"]
    assert summary["checkpointed"]["recompute_ns"] > 0 == summary["baseline"]["recompute_ns"]


def test_compare_keeps_losses(tmp_path: Path) -> None:
    plain = ckview("record", "-o", str(tmp_path / "a.h5"), "examples/mlp.py", "--depth", "2")
    cmp = ckview(
        "record", "-o", str(tmp_path / "b.h5"), "--compare",
        "examples/mlp.py", "--depth", "2", "--checkpoint",
    )  # fmt: skip
    assert plain.returncode == cmp.returncode == 0
    assert plain.stdout == cmp.stdout
    assert np.isfinite([float(line.split()[-1]) for line in cmp.stdout.splitlines()]).all()


def test_plan_runs_lower_the_peak_as_planned_and_keep_losses(tmp_path: Path) -> None:
    out = tmp_path / "plans.h5"
    plain = ckview("record", "-o", str(tmp_path / "p.h5"), "examples/transformer.py")
    proc = ckview(
        "record", "-o", str(out), "--plan", "none", "--plan", "sqrt", "--plan", "all",
        "examples/transformer.py",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout  # the plans change memory, never the losses
    with open_trace(out) as trace:
        assert trace.run_names == ["plan:none", "plan:sqrt", "plan:all"]
    runs = {name: read_run(out, name) for name in ("plan:none", "plan:sqrt", "plan:all")}
    peaks = {name: _peak(tables) for name, tables in runs.items()}
    assert peaks["plan:all"] < peaks["plan:sqrt"] < peaks["plan:none"]
    assert len(runs["plan:none"]["recompute_regions"]["step"]) == 0
    regions = runs["plan:all"]["recompute_regions"]
    assert len(regions["step"]) == 4 and (regions["region"] >= 0).all()  # ckpt_runtime markers


def test_plan_file_and_bad_plans(tmp_path: Path) -> None:
    plan = tmp_path / "two.json"
    plan.write_text(
        json.dumps(
            {
                "format": "ckview-plan",
                "version": 1,
                "name": "two",
                "regions": [{"module": "encoder.layers.0"}, {"module": "encoder.layers.1"}],
            }
        )
    )
    out = tmp_path / "t.h5"
    proc = ckview("record", "-o", str(out), "--plan", str(plan), "examples/transformer.py")
    assert proc.returncode == 0, proc.stderr
    regions = read_run(out, "plan:two")["recompute_regions"]
    assert len(regions["step"]) == 2
    nowhere = tmp_path / "nowhere.json"
    nowhere.write_text(
        json.dumps({"format": "ckview-plan", "version": 1, "regions": [{"module": "no.such"}]})
    )
    proc = ckview("record", "-o", str(tmp_path / "n.h5"), "--plan", str(nowhere),
                  "examples/transformer.py")  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "no.such" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "n.h5").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something-else"}')
    for source in (str(bad), str(tmp_path / "missing.json"), "every:zero"):
        proc = ckview("record", "-o", str(out), "--plan", source, "examples/transformer.py")
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
