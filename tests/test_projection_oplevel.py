"""Op-level plans projected as the runtime runs them (NOTE [ Op-level instances ] in
ckview.analysis.projection): a TransformerEncoder step with dropout, recorded in process as
``ckview verify`` records it (run 'baseline', then one run per plan), each op-level plan's
projected peak within 0.1% of the peak measured in its own run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ckview.analysis import ProjectionModel, project
from ckview.analysis.plans import resolve_on_trace
from ckview.analysis.projection.oplevel import op_names
from ckview.analysis.regions import ModuleRegion
from ckview.cli.common import read_tables
from ckview.cli.recording import load_plans
from ckview.cli.verify import Check, _verify
from ckview.trace import open_trace
from recorder import Recorder
from recorder.plans import plan_runs
from tests.synthetic import on_cuda

pytestmark = pytest.mark.torch

TOLERANCE = 0.001  # 0.1% of the measured peak, as module plans (the issue asks 0.5%)


def doc(name: str, regions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": "ckview-plan", "version": 2, "name": name, "regions": regions}


PLANS = {
    "matmuls": doc("matmuls", [{"module": "layers.*", "save": ["aten.mm*", "aten.bmm"]}]),
    # The attention's first matmul is freed in forward: the cache keeps it to the recompute.
    "attention": doc(
        "attention", [{"module": "layers.*", "save": ["aten._safe_softmax", "*bmm*"]}]
    ),
    "auto-names": doc(
        "auto-names", [{"module": "layers.*", "save": ["layers.*.linear1.addmm_0", "*.bmm_1"]}]
    ),
    "mixed": doc(
        "mixed",
        [
            {"module": "layers.[0-1]", "save": ["aten.addmm", "aten.relu"]},
            {"module": "layers.3"},
        ],
    ),
}


def encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Check]]:
    """The trace (baseline, 'all' and every plan of PLANS) and verify's checks."""
    folder = tmp_path_factory.mktemp("oplevel")
    sources = ["all"]
    for name, plan in PLANS.items():
        (folder / f"{name}.json").write_text(json.dumps(plan))
        sources.append(str(folder / f"{name}.json"))
    plans = load_plans(sources)
    runs = plan_runs(plans, True, False)
    path = folder / "encoder.h5"
    model = encoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(path, steps=1, warmup=1, runs=runs, progress=False, timing_steps=1):
        for _ in range(1 + len(runs) * 3 + 1):
            model(torch.randn(16, 32, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    checks, missing, _ = _verify(path, plans)
    assert not missing
    return path, checks


def baseline(path: Path) -> Any:
    with open_trace(path) as trace:
        return read_tables(trace, "baseline")


def test_op_level_plans_project_their_measured_peak(recorded: tuple[Path, list[Check]]) -> None:
    _, checks = recorded
    errors = {c.projection.plan: round(100 * c.peak_error, 3) for c in checks}
    assert set(errors) == {"all", *PLANS}
    assert all(abs(e) <= 100 * TOLERANCE for e in errors.values()), errors
    by_name = {c.projection.plan: c for c in checks}
    # The measured op-level peaks lie well above the whole-module recompute ('all'): a
    # projection that ignored 'save' would miss them by far more than the tolerance.
    whole = by_name["all"].measured_peak_bytes
    assert by_name["matmuls"].measured_peak_bytes > 1.2 * whole


def test_saved_ops_are_not_recomputed(recorded: tuple[Path, list[Check]]) -> None:
    """The extra compute of an op-level region is its replayed ops but the saved ones."""
    path, _ = recorded
    tables = baseline(path)
    modules, strings = tables["modules"], tables["strings"]
    whole = resolve_on_trace("all", modules, strings).regions
    saving = resolve_on_trace(PLANS["matmuls"], modules, strings).regions
    model = ProjectionModel(tables, [*whole, *saving])
    n = len(whole)
    for i in range(n):
        full, op_level = model.extra_compute_ns([i]), model.extra_compute_ns([n + i])
        assert 0 < op_level < full


def test_incremental_equals_exact_with_op_level_candidates(
    recorded: tuple[Path, list[Check]],
) -> None:
    """NOTE [ Incremental peak ] holds for op-level candidates (held outputs freed inside the
    replay included): random selections, one candidate per block."""
    path, _ = recorded
    tables = baseline(path)
    modules, strings = tables["modules"], tables["strings"]
    variants = [
        list(resolve_on_trace(p, modules, strings).regions)
        for p in ("all", PLANS["matmuls"], PLANS["attention"], PLANS["auto-names"])
    ]
    candidates = [r for regions in variants for r in regions]
    model = ProjectionModel(tables, candidates)
    rng = np.random.default_rng(0)
    blocks = len(variants[0])
    for _ in range(30):
        pick = [rng.integers(-1, len(variants)) for _ in range(blocks)]
        chosen = [v * blocks + b for b, v in enumerate(pick) if v >= 0]
        exact = model.project(chosen).projected_peak
        assert model.peak(chosen) == exact
        assert model.curve(chosen).total.max() == exact.bytes


def test_auto_names_follow_the_runtime(recorded: tuple[Path, list[Check]]) -> None:
    """The trace names each forward op as the selective checkpoint policy does."""
    path, _ = recorded
    tables = baseline(path)
    names = op_names(tables)
    ops = tables["ops"]
    forward = np.flatnonzero(np.asarray(ops["phase"]) == 0)
    autos = {names.names(int(op))[2] for op in forward}
    assert {"layers.0.self_attn.bmm_0", "layers.0.self_attn.bmm_1"} <= autos
    assert "layers.3.linear1.addmm_0" in autos
    assert names.names(int(forward[0]))[1].count(".") == 2  # aten.x.overload


def test_module_regions_print_as_before() -> None:
    assert repr(ModuleRegion(3)) == "ModuleRegion(module=3)"
    assert ModuleRegion(3) == ModuleRegion(3, None, False)
    assert ModuleRegion(3, ("aten.mm",)).op_level


# ----------------------------------------------------------------------------- offload

OFFLOAD = doc("offload", [{"module": "layers.*", "save": ["*"], "offload": True}])


def test_offload_changes_nothing_on_the_cpu(recorded: tuple[Path, list[Check]]) -> None:
    """NOTE [ Offloaded instances ]: CPU tensors stay where they are."""
    path, _ = recorded
    tables = baseline(path)
    regions = resolve_on_trace(OFFLOAD, tables["modules"], tables["strings"]).regions
    projection = project(tables, list(regions))
    assert projection.peak.bytes == project(tables, []).peak.bytes
    assert projection.extra_compute_ns == 0 and projection.offloaded_bytes == 0


def test_offload_on_cuda_moves_the_saved_tensors(recorded: tuple[Path, list[Check]]) -> None:
    """On a CUDA trace the saved activations leave the device until backward needs them: the
    device peak falls, the host holds them, nothing is recomputed; incremental equals exact."""
    path, _ = recorded
    tables = on_cuda(baseline(path))
    modules, strings = tables["modules"], tables["strings"]
    offload = list(resolve_on_trace(OFFLOAD, modules, strings).regions)
    whole = list(resolve_on_trace("all", modules, strings).regions)
    base = project(tables, []).peak.bytes
    moved = project(tables, offload)
    assert moved.peak.bytes < base and moved.extra_compute_ns == 0
    assert moved.offloaded_bytes > 0 and 0 < moved.host_peak_bytes <= moved.offloaded_bytes
    assert moved.transfer_ns(1e9) == round(2 * moved.offloaded_bytes)
    # All saved activations are on the host at once, after the last block's forward.
    assert moved.host_peak_bytes == moved.offloaded_bytes
    model = ProjectionModel(tables, [*offload, *whole])
    rng = np.random.default_rng(1)
    for _ in range(20):
        pick = [b + len(offload) * int(rng.integers(0, 2)) for b in range(len(offload))]
        pick = [p for p in pick if rng.random() < 0.8]
        assert model.peak(pick) == model.project(pick).projected_peak
