"""torch.compile under the recorder (NOTE [ torch.compile under the recorder ]): compiled code
runs eagerly while recorded, the trace says so, and it runs compiled again afterwards."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ckview.trace.schema import Phase
from recorder import Recorder
from tests.conftest import PYTHON_PATH_ONLY, ROOT, read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]


class CountingBackend:
    """A dynamo backend that counts graphs compiled and compiled graphs run."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.counts["compiled"] += 1

        def run(*args: Any) -> Any:
            self.counts["ran"] += 1
            return gm.forward(*args)

        return run


@PYTHON_PATH_ONLY
def test_code_compiled_before_recording_runs_eagerly_then_compiled_again(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    backend = CountingBackend()
    forward = torch.compile(lambda x: model(x), backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration() -> None:
        forward(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    iteration()
    assert backend.counts == {"compiled": 1, "ran": 1}
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        iteration()
        iteration()
    assert backend.counts == {"compiled": 1, "ran": 1}, "compiled code ran under the recorder"
    iteration()
    assert backend.counts == {"compiled": 1, "ran": 2}, "not compiled again after recording"

    tables = read_run(tmp_path / "t.h5")
    assert tables["meta"].compiled == "eager"
    ops = tables["ops"]
    names = {tables["strings"][i] for i in ops["name"][ops["phase"] == Phase.FORWARD]}
    assert {"aten.addmm.default", "aten.gelu.default"} <= names  # the eager ops that ran
    assert len(tables["modules"]["path"]) == 4  # module hooks saw every layer


ITERATIONS = 200
"""Enough for the warmup, the recorded steps and every timing step (at most 15 rounds of each
timed run, the steps under plan all among them), and then compiled steps."""
SCRIPT = f"""
import collections, torch
from torch import nn
runs = collections.Counter()
def backend(gm, example_inputs):
    runs["compiled"] += 1
    def run(*args):
        runs["ran"] += 1
        return gm.forward(*args)
    return run
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
forward = torch.compile(lambda x: model(x), backend=backend)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({ITERATIONS}):
    forward(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
print("runs", runs["compiled"], runs["ran"])
"""


@PYTHON_PATH_ONLY
def test_script_that_compiles_under_ckview_record(tmp_path: Path) -> None:
    """``ckview record`` enters the recorder before the script imports dynamo: the script's
    first ``torch.compile`` sets the eager stance. No dynamo warnings about the recorder's own
    code (it used to hit the recompile limit compiling ``__torch_dispatch__``)."""
    script = tmp_path / "compiled.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "t.h5"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ckview", "record", "-o", str(trace), "--steps", "2", str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert "recompile" not in done.stderr
    assert not any(f"recorder/{part}.py" in done.stderr for part in ("session", "hooks", "ledger"))
    # The warmup, the two recorded steps and the timing steps (rounds are added until the
    # times are precise: NOTE [ Enough plain steps ], at most 15) ran eagerly; the first step
    # after them compiled once, and the rest ran compiled.
    compiled, ran = (int(n) for n in done.stdout.split("runs ")[1].split()[:2])
    assert compiled == 1 and 1 <= ran <= ITERATIONS - (1 + 2)
    tables = read_run(trace)
    assert tables["meta"].compiled == "eager"
    assert (tables["ops"]["phase"] == Phase.FORWARD).sum() > 0


# torch warns on every call of a compiled module while global module hooks (the recorder's)
# are installed: they fire for the wrapper too, which the recorder passes through.
@PYTHON_PATH_ONLY
@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks")
def test_compiled_model_is_named_as_the_model(tmp_path: Path) -> None:
    """NOTE [ A compiled model is named as the user's model ] (ckpt_runtime/presets.py): the
    trace's paths are the model's (no ``_orig_mod.``), a plan resolves to the same modules
    over ``torch.compile(model)`` as over the model, and a plan run recorded through the
    wrapper recomputes the modules the plan names."""
    from ckpt_runtime import ModuleRegion, Plan, resolve_plan
    from recorder.plans import plan_runs

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.Sequential(nn.Linear(32, 32), nn.Tanh()), nn.Linear(32, 4)
    )
    compiled = torch.compile(model, backend=CountingBackend())
    assert isinstance(compiled, nn.Module)  # the OptimizedModule wrapper
    plan = Plan("mid", (ModuleRegion("1"),))
    assert resolve_plan(compiled, plan) == resolve_plan(model, plan)
    assert resolve_plan(compiled, "all") == resolve_plan(model, "all")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    runs = plan_runs([("mid", plan)], baseline=True, checkpointed=False)
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, runs=runs, progress=False):
        for _ in range(3):
            compiled(torch.randn(8, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()

    tables = read_run(tmp_path / "t.h5", "plan:mid")
    strings = tables["strings"]
    paths = [strings[i] for i in tables["modules"]["path"]]
    assert paths == [path for path, _ in model.named_modules()]
    assert tables["meta"].compiled == "eager"
    names = {strings[i] for i in tables["recompute_regions"]["name"]}
    assert names == {"Sequential.1"}
