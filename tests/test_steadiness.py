"""NOTE [ Steps that are not alike ]: recorded steps whose peaks differ are reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ckview.analysis.steadiness import STEADY_TOLERANCE, step_peaks, unlike_steps
from recorder import Recorder
from tests.conftest import read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]


class WarmingCache(nn.Module):
    """A model that builds a 4 MiB cache in its second iteration, as lazily created state does,
    and keeps it: the first recorded step peaks higher than the ones after it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 64)
        self.calls = 0
        self.cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            scratch = torch.ones(1 << 20)  # built once, from a 4 MiB scratch buffer
            self.cache = scratch[:16].clone()
            del scratch
        return self.layer(x)


def _record(tmp_path: Path, model: nn.Module, steps: int) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=steps, warmup=1, progress=False):
        for _ in range(steps + 1):
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return read_run(tmp_path / "t.h5")


def test_a_step_with_lazily_created_state_is_reported(tmp_path: Path) -> None:
    run = _record(tmp_path, WarmingCache(), steps=3)
    peaks = step_peaks(run["storages"], run["memory_events"], run["steps"])
    assert peaks[0] - peaks[1] > 3 << 20 and peaks[1] == peaks[2]  # the scratch buffer
    found = unlike_steps(run["storages"], run["memory_events"], run["steps"])
    assert found is not None and (found.step, found.last) == (0, 2)
    assert found.relative > STEADY_TOLERANCE
    text = found.describe()
    assert "step 0" in text and "step 2" in text and "--warmup" in text and "\n" not in text


def test_steps_of_a_steady_loop_are_alike(tmp_path: Path) -> None:
    torch.manual_seed(0)
    run = _record(tmp_path, nn.Sequential(nn.Linear(64, 64), nn.ReLU()), steps=3)
    peaks = step_peaks(run["storages"], run["memory_events"], run["steps"])
    assert np.all(peaks == peaks[-1])
    assert unlike_steps(run["storages"], run["memory_events"], run["steps"]) is None


LAZY = """\
import torch
from torch import nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer, self.calls, self.cache = nn.Linear(64, 64), 0, None
    def forward(self, x):
        self.calls += 1
        if self.calls == 2:  # lazily created state, from a 4 MiB scratch buffer
            scratch = torch.ones(1 << 20)
            self.cache = scratch[:16].clone()
        return self.layer(x)
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_record_and_summary_say_the_steps_are_not_alike(tmp_path: Path, run_cli: Any) -> None:
    (tmp_path / "lazy.py").write_text(LAZY)
    trace = str(tmp_path / "lazy.h5")
    code, _, err = run_cli("record", "-o", trace, "--steps", "3", str(tmp_path / "lazy.py"))
    assert code == 0, err
    assert "ckview: warning: run 'main': recorded steps are not alike: step 0" in err
    code, out, _ = run_cli("summary", trace)
    assert code == 0 and "  warning: recorded steps are not alike" in out
    code, out, _ = run_cli("summary", "--json", trace)
    unlike = json.loads(out)["runs"]["main"]["unlike_steps"]
    assert (unlike["step"], unlike["last"]) == (0, 2) and unlike["relative"] > 1
