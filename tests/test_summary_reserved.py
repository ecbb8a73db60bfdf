"""``ckview summary`` on a CUDA trace: reserved memory as recorded and as the model of the
caching allocator projects it from the run's allocations (ckview/analysis/reserved.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from snapshot_helpers import fixture_path
from torch import nn

from tests.factory import record_model
from tests.fit_helpers import GIB, as_cuda

pytestmark = pytest.mark.torch

MIB = 1 << 20
FIXTURE = fixture_path()


def summary_json(run_cli: Any, path: Path) -> dict[str, Any]:
    code, out, err = run_cli("summary", str(path), "--json")
    assert code == 0, err
    (run,) = json.loads(out)["runs"].values()
    return dict(run)


@pytest.mark.skipif(FIXTURE is None, reason="the CUDA snapshot fixture is absent")
def test_the_snapshot_fixture_reserved_is_projected_exactly(run_cli: Any, tmp_path: Path) -> None:
    """The real snapshot's allocations, replayed by the model from an empty allocator, reserve
    at most what its segments did (128 MiB)."""
    trace = tmp_path / "snap.h5"
    assert run_cli("import", str(FIXTURE), "-o", str(trace))[0] == 0
    run = summary_json(run_cli, trace)
    assert run["reserved_peak_bytes"] == run["modelled_reserved_peak_bytes"] == 128 * MIB
    code, out, _ = run_cli("summary", str(trace))
    assert code == 0
    assert "  reserved        128 MiB  at most (CUDA caching allocator segments)\n" in out
    assert (
        "  reserved        128 MiB  projected by the allocator model from the allocations "
        "(+0.0% vs recorded)\n" in out
    )


def test_small_tensors_take_whole_small_segments(run_cli: Any, tmp_path: Path) -> None:
    """A small model on a (faked) CUDA device: every block is under 1 MiB, so the model
    reserves 2 MiB small-pool segments, at least the peak of live bytes; the recorded figure
    is the device samples' (no segments here). A CPU trace has neither line."""
    cpu = record_model(
        tmp_path / "cpu.h5",
        nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 8)),
        (16, 32),
        loss=torch.sum,
    )
    run = summary_json(run_cli, cpu)
    assert run["modelled_reserved_peak_bytes"] is None and run["reserved_peak_bytes"] == 0
    assert "\n  reserved " not in run_cli("summary", str(cpu))[1]
    cuda = as_cuda(cpu, tmp_path / "cuda.h5", GIB, 0)
    run = summary_json(run_cli, cuda)
    modelled = run["modelled_reserved_peak_bytes"]
    assert modelled == 2 * MIB  # a few KiB of tensors: one small segment
    assert run["reserved_peak_bytes"] == 2 * MIB  # as_cuda's device sample
    out = run_cli("summary", str(cuda))[1]
    assert "projected by the allocator model from the allocations (+0.0% vs recorded)" in out


H200_TRACE = Path(__file__).parent / "data" / "cuda_h200_transformer_native.h5"
"""``ckview record --steps 2 examples/transformer.py --device cuda --steps 6`` on the native
path, on an NVIDIA H200 (torch 2.11.0+cu130): a real CUDA recording."""


def test_a_real_cuda_recording_says_what_the_allocator_held_beyond_it(run_cli: Any) -> None:
    """NOTE [ Allocated beyond the recorded tensors ]: the allocator's peak less the recorded
    one (cuBLAS's workspaces: 65 MiB), and the allocator model, with it held in segments of
    its own, reserves what the recording's segments did."""
    run = summary_json(run_cli, H200_TRACE)
    untracked = run["allocator_allocated_peak_bytes"] - run["peak_bytes"]
    assert run["untracked_bytes"] == untracked == 65 * MIB
    assert run["modelled_reserved_peak_bytes"] == run["reserved_peak_bytes"] == 156 * MIB
    out = run_cli("summary", str(H200_TRACE))[1]
    assert "  allocated      65.0 MiB  more at the allocator's peak: workspaces," in out
