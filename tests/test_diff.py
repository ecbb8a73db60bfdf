"""``ckview diff`` on runs whose difference is known by construction (ckview/analysis/diff.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ckpt_runtime.checkpoint import checkpoint
from ckview.analysis import summarize_run
from ckview.analysis.diff import diff_runs
from ckview.cli.main import main
from ckview.cli.recording import load_plans
from ckview.trace import open_trace
from recorder.plans import plan_runs
from tests.factory import record_model

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
COMPARE = ROOT / "sample_traces" / "transformer_compare.h5"
EXTRA = (256, 1024)  # float32: exactly 1 MiB
MiB = 1 << 20


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class Extra(nn.Module):
    """Keeps one known tensor alive until the next step when ``keep`` is set."""

    keep = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.keep:
            self.kept = torch.ones(*EXTRA)
        return x


class Net(nn.Module):
    def __init__(self, cache_inside: bool = False) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(4)])
        self.extra = Extra()
        self.cache_inside = cache_inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra(self.blocks(x))


def _record(path: Path, model: nn.Module, plans: Sequence[str] = ()) -> Path:
    """``model`` recorded for one step after a warm-up, then once with each plan."""
    runs = plan_runs(load_plans(list(plans)), False, False) if plans else ()
    return record_model(path, model, (512, 256), iterations=2 + len(runs), lr=0.01, runs=runs)


def _read(path: Path, run: str) -> dict[str, Any]:
    with open_trace(path) as trace:
        return trace.read_run(run)


def test_one_known_tensor_is_named_with_its_module_and_bytes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    a = _record(tmp_path / "a.h5", model)
    model.extra.keep = True
    b = _record(tmp_path / "b.h5", model)
    diff = diff_runs(_read(a, "main"), _read(b, "main"))
    assert diff.delta == MiB
    kind = diff.tensors[0]
    assert (kind.module, kind.op, kind.shape, kind.dtype) == (
        "Net.extra",
        "aten.ones.default",
        "256x1024",
        "float32",
    )
    assert (kind.a_bytes, kind.b_bytes, kind.a_count, kind.b_count) == (0, MiB, 0, 1)
    assert diff.by_module[0] == ("Net.extra", 0, MiB)
    assert diff.held_a is None and diff.held_b is None


def test_baseline_against_checkpointed_says_what_the_checkpointed_peak_holds() -> None:
    base, ckpt = _read(COMPARE, "baseline"), _read(COMPARE, "checkpointed")
    diff = diff_runs(base, ckpt)
    for side, run in ((diff.a, base), (diff.b, ckpt)):
        assert side.bytes == summarize_run(run, run["modules"], run["strings"]).peak_bytes
    assert diff.delta < 0
    categories = {name: (a, b) for name, a, b in diff.by_category}
    activation = categories["activation"]
    assert activation[1] < activation[0]
    assert diff.held_a is None and diff.held_b is not None
    held = diff.held_b.bytes_by_class
    assert sum(held.values()) == diff.b.bytes
    assert held["gradients"] == categories["gradient"][1]
    assert held["recompute"] > 0 and held["kept inside regions"] == 0


def test_two_plans_of_one_trace(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = _record(tmp_path / "plans.h5", Net(), ["none", "all"])
    none, every = _read(path, "plan:none"), _read(path, "plan:all")
    diff = diff_runs(none, every)
    assert diff.held_a is None  # 'none' recomputes nothing
    held = diff.held_b
    assert held is not None and held.bytes_by_class["kept inside regions"] == 0
    assert sum(held.bytes_by_class.values()) == diff.b.bytes
    assert held.bytes_by_class["region inputs"] > 0  # checkpoint keeps each block's input
    assert diff.delta <= 0


class Caching(nn.Module):
    """A checkpointed block that keeps an intermediate on itself: checkpointing cannot drop it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)
        self.out = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._inner, x)

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        if torch.is_grad_enabled() and not getattr(self, "replaying", False):
            self.cached = h  # held from outside the region: stays at the peak
        return self.out(h)


def test_a_tensor_kept_inside_a_checkpointed_region_is_named(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Caching(), Caching())
    path = _record(tmp_path / "c.h5", model)
    run = _read(path, "main")
    diff = diff_runs(run, run)
    assert diff.delta == 0 and diff.tensors == []
    held = diff.held_b
    assert held is not None and held.bytes_by_class["kept inside regions"] > 0
    kinds = {(t.module, t.op, t.shape) for t in held.kept_inside}
    assert ("Sequential.0", "aten.tanh.default", "512x256") in kinds


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(COMPARE)]) == 0
    text = capsys.readouterr().out
    assert "B - A" in text and "by kind of tensor" in text
    assert "what B holds at its peak (it has checkpointed regions):" in text
    assert main(["diff", str(COMPARE), "--runs", "checkpointed", "baseline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_a"].endswith(":checkpointed") and out["delta"] > 0
    assert out["held_a"]["bytes_by_class"]["recompute"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "baseline", "nope"], "has no run 'nope'; runs: baseline, checkpointed"),
        (["--top", "0"], "--top must be 1 or more"),
    ],
)
def test_cli_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(COMPARE), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_one_run_needs_a_second_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(ROOT / "sample_traces" / "mlp.h5")]) == 2
    assert "give a second trace" in capsys.readouterr().err
