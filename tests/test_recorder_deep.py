"""A graph of 120,000 autograd nodes records, and freeing it does not crash the process
(NOTE [ Autograd nodes stay unwrapped ]): the checkpointing tutorial's HeavyModel, scaled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckview.analysis import summarize_run
from ckview.trace import validate_trace
from ckview.trace.schema import Phase
from tests.conftest import ROOT, read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

NODES = 120_000

# Run in a child process: the bug this guards against kills the process with SIGSEGV.
SCRIPT = f"""
import sys
import torch
from torch import nn
from recorder import Recorder


class HeavyModel(nn.Module):
    \"\"\"A function of 100 scalar adds, called {NODES // 100} times per forward.\"\"\"

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        for _ in range({NODES // 100}):
            for _ in range(100):
                x = x + self.a
        return x


model = HeavyModel()
with Recorder(sys.argv[1], steps=1, warmup=0, progress=False):
    y = model(torch.tensor(1.0))
    y.backward()
    del y  # frees 120,000 nodes; each with a Python object, recursively: SIGSEGV
    with torch.no_grad():
        model.a -= 1e-6 * model.a.grad
print("freed", model.a.grad.item())
"""


def test_deep_graph_records_and_is_freed(tmp_path: Path) -> None:
    script = tmp_path / "heavy.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "t.h5"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(trace)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert f"freed {float(NODES)}" in done.stdout
    assert validate_trace(trace).ok
    tables = read_run(trace)
    ops = tables["ops"]
    backward = ops["phase"] == Phase.BACKWARD
    assert backward.sum() >= NODES  # each AddBackward0 accumulates a's gradient
    # Every backward op belongs to the model's one call. The Python path resolves the first
    # nodes through their sequence numbers, and the nodes past its budget keep the last
    # attribution (NOTE [ Autograd nodes stay unwrapped ]). The native path reads every node's
    # number without a budget; the ops AccumulateGrad runs have no node number, no forward op
    # and so no call (NOTE [ Backward blocks and modules ]).
    attributed = backward
    if tables["meta"].recorder == "native":
        attributed = backward & (ops["seq_nr"] >= 0)
    assert (ops["module_call"][attributed] == 0).all()
    with_seq = (ops["seq_nr"][backward] >= 0).sum()
    if tables["meta"].recorder == "python":
        assert with_seq < NODES
    else:  # every backward op has its node's number, but the one AccumulateGrad runs
        assert with_seq >= backward.sum() - 1
    summary = summarize_run(tables, tables["modules"], tables["strings"])
    assert summary.n_ops == len(ops["name"])
    assert summary.steps[0]["backwards"] == 1 and summary.steps[0]["complete"] == 1
