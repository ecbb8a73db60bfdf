"""``ckview fit`` and ``ckview.analysis.fit``: a step recorded at two sizes projected at a third
(NOTE [ One step at two sizes ], NOTE [ Scaling from shapes ]), checked against a real
recording at that size; the largest size under a budget; a step whose control flow depends on
the size refused in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from ckview.analysis import find_peak, memory_timeline
from ckview.analysis.fit import StreamsPart, fit_sizes, largest_size
from recorder import Recorder
from tests.conftest import ROOT, read_run
from tests.factory import attention_model, encoder, record_lm
from tests.fit_helpers import GIB, as_cuda

pytestmark = pytest.mark.torch


def peak(path: Path) -> int:
    tables = read_run(path)
    return int(find_peak(memory_timeline(tables["storages"], tables["memory_events"])).bytes)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int, int], Path]:
    """``get(model, batch, seq)``: the trace of that model at that size, recorded once."""
    folder = tmp_path_factory.mktemp("fit")
    made: dict[tuple[str, int, int], Path] = {}
    models = {"encoder": encoder, "attention": attention_model}

    def get(model: str, batch: int, seq: int) -> Path:
        key = (model, batch, seq)
        if key not in made:
            made[key] = record_lm(folder / f"{model}-{batch}x{seq}.h5", models[model](), *key[1:])
        return made[key]

    return get


def fit_at(run_cli: Any, a: Path, b: Path, sizes: tuple[int, int], n: int, *more: str) -> Any:
    code, out, err = run_cli(
        "fit", str(a), str(b), "--sizes", *map(str, sizes), "--at", str(n), "--json", *more
    )
    assert code == 0, err
    return json.loads(out)


# ----------------------------------------------------------------------------- acceptance


def test_batch_4_and_8_give_16(run_cli: Any, traces: Any) -> None:
    """Issue 23's acceptance: batch 4 and 8 projected at 16 within 1% of a recording at 16."""
    doc = fit_at(run_cli, traces("encoder", 4, 32), traces("encoder", 8, 32), (4, 8), 16)
    real = peak(traces("encoder", 16, 32))
    assert doc["at"] == 16 and doc["plan"] == "none"
    assert abs(doc["projected_peak_bytes"] - real) <= 0.01 * real
    assert doc["scaling"]["linear"] > 0 and doc["scaling"]["constant"] > 0
    assert sum(doc["by_category"].values()) == doc["projected_peak_bytes"]


def test_sequence_64_and_128_give_256(run_cli: Any, traces: Any) -> None:
    """Issue 23's acceptance: sequence 64 and 128 projected at 256 within 2% of a recording."""
    doc = fit_at(run_cli, traces("encoder", 2, 64), traces("encoder", 2, 128), (64, 128), 256)
    real = peak(traces("encoder", 2, 256))
    assert abs(doc["projected_peak_bytes"] - real) <= 0.02 * real


def test_attention_scores_grow_quadratically(traces: Any) -> None:
    """NOTE [ Scaling from shapes ]: scores B x S x S over the sequence are quadratic, and every
    storage of the step at 128 has the bytes the fit from 32 and 64 gives it."""
    a, b, c = (read_run(traces("attention", 2, s)) for s in (32, 64, 128))
    fit = fit_sizes(a, b, (32, 64))
    assert fit.counts()["quadratic"] >= 2
    assert np.array_equal(fit.nbytes_at(128), c["storages"]["nbytes"])
    projected = fit.tables_at(128)
    shapes = [projected["strings"][i] for i in projected["storages"]["shape"]]
    assert shapes == [c["strings"][i] for i in c["storages"]["shape"]]


def test_a_plan_applies_at_the_new_size(run_cli: Any, traces: Any) -> None:
    """--plan projects the step at N with the plan, as ``ckview project`` projects a run."""
    a, b = traces("encoder", 4, 32), traces("encoder", 8, 32)
    none = fit_at(run_cli, a, b, (4, 8), 16)
    every = fit_at(run_cli, a, b, (4, 8), 16, "--plan", "all")
    assert every["plan"] == "all"
    assert every["projected_peak_bytes"] < none["projected_peak_bytes"]
    assert every["extra_compute_ns"] > 0


def test_a_plan_that_saves_a_view_is_warned_of(run_cli: Any, traces: Any, tmp_path: Path) -> None:
    """NOTE [ Saves the projection cannot hold ]: --plan's save entries warn as in project."""
    a, b = traces("encoder", 4, 32), traces("encoder", 8, 32)
    region = {"module": "1.layers.*", "save": ["aten.addmm", "aten.view"]}
    plan = tmp_path / "view.json"
    plan.write_text(json.dumps({"format": "ckview-plan", "version": 2, "regions": [region]}))
    code, _, err = run_cli(
        "fit", str(a), str(b), "--sizes", "4", "8", "--at", "16", "--plan", str(plan)
    )
    assert code == 0, err
    assert "ckview: warning: plan view: blocks 1.layers.0, 1.layers.1 save aten.view" in err, err


def test_budget_names_the_largest_batch_that_fits(run_cli: Any, traces: Any) -> None:
    """With the recorded peak at batch 12 as the budget, the largest batch is 12, for the
    baseline; the presets and the planner reach at least as far."""
    a, b = traces("encoder", 4, 32), traces("encoder", 8, 32)
    budget = peak(traces("encoder", 12, 32))
    code, out, err = run_cli(
        "fit", str(a), str(b), "--sizes", "4", "8", "--budget", f"{budget}B", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["largest"] == 12 and doc["budget_bytes"] == budget
    rows = {r["plan"]: r for r in doc["plans"]}
    assert list(rows)[:1] == ["none"] and {"all", "sqrt", "planner"} <= set(rows)
    assert all(r["largest"] >= 12 and r["projected_peak_bytes"] <= budget for r in rows.values())
    assert rows["all"]["largest"] > 12
    code, out, _ = run_cli("fit", str(a), str(b), "--sizes", "4", "8", "--budget", f"{budget}B")
    assert code == 0 and "none     largest size      12" in out


def test_budget_with_a_plan_and_a_model_without_a_chain(
    run_cli: Any, traces: Any, tmp_path: Path
) -> None:
    """--plan adds its row; where the model has no chain of blocks, only the baseline and
    --plan rows are judged and a note says why."""
    a, b = traces("encoder", 4, 32), traces("encoder", 8, 32)
    code, out, _ = run_cli(
        "fit", str(a), str(b), "--sizes", "4", "8", "--budget", "4MiB", "--plan", "all", "--json"
    )
    rows = {r["plan"]: r for r in json.loads(out)["plans"]}
    assert code == 0 and rows["--plan all"]["largest"] == rows["all"]["largest"]
    code, out, _ = run_cli("fit", str(a), str(b), "--sizes", "4", "8", "--budget", "4MiB")
    assert "extra compute: from the first recording's op times, not scaled" in out
    small = [record_branchy(tmp_path, n) for n in (2, 4)]  # no ReLU at either: one step
    code, out, _ = run_cli("fit", *small, "--sizes", "2", "4", "--budget", "64KiB", "--json")
    doc = json.loads(out)
    assert code == 0 and [r["plan"] for r in doc["plans"]] == ["none"] and doc["largest"] > 4
    assert doc["notes"][0].startswith("no presets nor planner: the run's model has no chain")


def test_no_size_fits(run_cli: Any, traces: Any) -> None:
    a, b = traces("encoder", 4, 32), traces("encoder", 8, 32)
    code, out, _ = run_cli("fit", str(a), str(b), "--sizes", "4", "8", "--budget", "1KiB")
    assert code == 1 and "no size fits, not even 1" in out


# ----------------------------------------------------------------------------- refusals


class Branchy(nn.Module):
    """A ReLU only for batches above 6: the step at 8 runs an op the step at 4 does not."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if x.shape[0] > 6:
            x = torch.relu(x)
        return self.b(x)


def record_branchy(folder: Path, n: int) -> str:
    torch.manual_seed(0)
    model, path = Branchy(), folder / f"branchy{n}.h5"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(path, steps=1, warmup=1, progress=False):
        for _ in range(2):
            model(torch.randn(n, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
    return str(path)


def test_control_flow_that_depends_on_the_size_is_refused(run_cli: Any, tmp_path: Path) -> None:
    paths = [record_branchy(tmp_path, n) for n in (4, 8)]
    code, out, err = run_cli("fit", *paths, "--sizes", "4", "8", "--at", "16")
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    # where they part: the op in the Linear (aten.t on the Python path, which sees the ops
    # below aten.linear; aten.linear on the native path, NOTE [ Outermost ops ]) against ReLU
    assert re.search(
        r"part at op \d+: aten\.\w+\.default in Branchy\.b \(forward\) at 4, "
        r"aten\.relu\.default in ",
        err,
    ), err
    assert "control flow that depends on the size cannot be fitted" in err


def test_two_models_are_refused(traces: Any) -> None:
    with pytest.raises(StreamsPart, match="hold different models"):
        fit_sizes(read_run(traces("encoder", 4, 32)), read_run(traces("attention", 2, 32)), (4, 8))
    with pytest.raises(ValueError, match="two different positive"):
        same = read_run(traces("encoder", 4, 32))
        fit_sizes(same, same, (4, 4))


def test_device_budget_on_a_cpu_trace(run_cli: Any, traces: Any) -> None:
    a, b = traces("encoder", 4, 32), traces("encoder", 8, 32)
    code, _, err = run_cli("fit", str(a), str(b), "--sizes", "4", "8", "--budget", "device")
    assert code == 2
    assert err.strip().endswith(
        "was recorded on the CPU: --budget device needs a CUDA trace "
        "(or give a size, e.g. --budget 16GiB)"
    )


# ----------------------------------------------------------------------------- device budget


def test_device_budget_counts_reserved_and_what_cuda_took(
    run_cli: Any, traces: Any, tmp_path: Path
) -> None:
    """On a CUDA trace, --budget device fits reserved memory (allocator model: 2 MiB small
    segments, 20 MiB large ones) plus NVML's use outside PyTorch into the device; --at says
    the same sum."""
    total, outside = 1 * GIB, 300 << 20
    a = as_cuda(traces("encoder", 4, 32), tmp_path / "a.h5", total, outside)
    b = as_cuda(traces("encoder", 8, 32), tmp_path / "b.h5", total, outside)
    code, out, err = run_cli(
        "fit", str(a), str(b), "--sizes", "4", "8", "--budget", "device", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["device"] and doc["budget_bytes"] == total and doc["not_by_pytorch_bytes"] == outside
    n = doc["largest"]
    assert n is not None and n > 8
    for size, fits in ((n, True), (n + 1, False)):
        at = fit_at(run_cli, a, b, (4, 8), size)
        used = at["projected_reserved_bytes"] + at["not_by_pytorch_bytes"]
        assert (used <= total) == fits
        assert at["projected_reserved_bytes"] >= at["projected_peak_bytes"]


# ----------------------------------------------------------------------------- the search


@given(threshold=st.integers(0, 5000), start=st.integers(1, 300))
def test_largest_size_finds_the_threshold(threshold: int, start: int) -> None:
    asked: list[int] = []

    def fits(n: int) -> bool:
        asked.append(n)
        return n <= threshold

    assert largest_size(fits, start, limit=4096) == (None if threshold >= 4096 else threshold)
    assert len(asked) <= 2 * 13 + 2  # doubling, then bisecting


def test_fit_reproduces_its_own_sizes(traces: Any) -> None:
    """At the two recorded sizes the fit gives the recorded bytes back."""
    a, b = (read_run(traces("encoder", n, 32)) for n in (4, 8))
    fit = fit_sizes(a, b, (4, 8))
    assert np.array_equal(fit.nbytes_at(4), a["storages"]["nbytes"])
    assert np.array_equal(fit.nbytes_at(8), b["storages"]["nbytes"])


def test_fit_imports_neither_torch_nor_qt(traces: Any) -> None:
    """Like the other reading verbs: a laptop without torch can fit traces from a GPU box."""
    a, b = str(traces("encoder", 4, 32)), str(traces("encoder", 8, 32))
    code = (
        "import contextlib, io, sys\n"
        "from ckview.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['fit', {a!r}, {b!r}, '--sizes', '4', '8', '--at', '16']) == 0\n"
        f"    assert main(['fit', {a!r}, {b!r}, '--sizes', '4', '8', '--budget', '8MiB']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'PyQt6', 'pyqtgraph') if m in sys.modules)\n"
        "assert not heavy, f'imported {heavy}'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
