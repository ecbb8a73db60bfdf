"""The native recording path (``CKVIEW_RECORDER=native``, NOTE [ The native ledger ] in
recorder/native_ledger.py) against the Python path on the same steps: peaks, categories,
phases, module calls, saved tensors; the trace is valid; a SIGKILL keeps its steps."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ckview.analysis.breakdown import bytes_by_category
from ckview.analysis.timeline import find_peak, live_storages, memory_timeline
from ckview.trace import open_trace
from ckview.trace.schema import Category, Phase
from recorder import Recorder
from tests.conftest import NEEDS_COMPILER, ROOT

pytestmark = [
    pytest.mark.torch,
    pytest.mark.recorder,
    NEEDS_COMPILER,
]


class _Net(nn.Module):
    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)
        )
        self.ckpt = ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.ckpt else block(x)
        return x


def _record(path: Path, which: str, ckpt: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKVIEW_RECORDER", which)
    torch.manual_seed(0)
    model = _Net(ckpt)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Recorder(path, steps=2, warmup=1, progress=False):
        for _ in range(4):
            x = torch.randn(32, 64)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()


def _facts(path: Path) -> dict[str, Any]:
    with open_trace(path) as trace:
        run = trace.run("main")
        tables = {
            name: run.table(name).read()
            for name in ("storages", "memory_events", "ops", "steps", "saved_events")
        }
        calls = run.table("module_calls").read()
        recorder = trace.meta.recorder
        devices = {trace.strings[i] for i in np.unique(tables["storages"]["device"])}
        ops = tables["ops"]
        in_modules = (ops["phase"] == Phase.FORWARD) & (ops["module_call"] >= 0)
        forward = [trace.strings[i] for i in ops["name"][in_modules]]
    assert devices == {"cpu"}
    st, ev = tables["storages"], tables["memory_events"]
    timeline = memory_timeline(st, ev)
    bounds = [*tables["steps"]["first_memory_event"].tolist(), len(ev["kind"])]
    peaks = [int(timeline.total[a : b + 1].max()) for a, b in itertools.pairwise(bounds)]
    peak = find_peak(timeline)
    at_peak = bytes_by_category(st, live_storages(st, ev, peak.event))
    return {
        "recorder": recorder,
        "peaks": peaks,
        "at_peak": {c: b for c, b in at_peak.items() if b},
        "ops": tables["ops"],
        "forward_ops": forward,
        "saved": len(tables["saved_events"]["kind"]),
        "calls": len(calls["module"]),
    }


@pytest.mark.parametrize("ckpt", [False, True])
def test_native_path_matches_the_python_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: Any, ckpt: bool
) -> None:
    facts = {}
    for which in ("python", "native"):
        path = tmp_path / f"{which}.h5"
        _record(path, which, ckpt, monkeypatch)
        code, out, err = run_cli("validate", str(path))
        assert code == 0, out + err
        facts[which] = _facts(path)
    py, nat = facts["python"], facts["native"]
    assert (py["recorder"], nat["recorder"]) == ("python", "native")
    for a, b in zip(py["peaks"], nat["peaks"], strict=True):
        assert abs(b - a) <= 0.005 * a, (py["peaks"], nat["peaks"])
    for category in (Category.PARAMETER, Category.GRADIENT, Category.OPTIMIZER_STATE):
        assert nat["at_peak"].get(category, 0) == py["at_peak"].get(category, 0), category
    assert nat["calls"] == py["calls"]  # the Python hooks' module calls, on both paths
    phases = set(np.unique(nat["ops"]["phase"]).tolist())
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= phases
    assert (Phase.RECOMPUTE in phases) == ckpt
    if not ckpt:  # inside checkpoint, its own hooks save (packs the native hooks do not see)
        assert nat["saved"] == py["saved"]
    assert (nat["ops"]["module_call"] >= 0).any()
    # NOTE [ Ops as a dispatch mode sees them ] in ckrec_ops.cpp: aten.addmm, not aten.linear
    assert nat["forward_ops"] == py["forward_ops"]
    assert "aten.addmm.default" in nat["forward_ops"]


SCRIPT = """
import os, signal, sys, torch
from torch import nn
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    if step == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    model(torch.randn(16, 32)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_native_journal_survives_sigkill(tmp_path: Path, run_cli: Any) -> None:
    """NOTE [ The recording journal ]: each step's rows are journaled at its boundary."""
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["CKVIEW_RECORDER"] = "native"
    command = [sys.executable, "-m", "ckview", "record", "-o", "out.h5", "--steps=10"]
    done = subprocess.run(
        [*command, "train.py", "6"], cwd=tmp_path, env=env, capture_output=True, timeout=300
    )
    assert done.returncode == -9, done.stderr
    code, _, err = run_cli("recover", str(tmp_path / "out.h5"))
    assert code == 0 and "recovered 5 step" in err, err
    with open_trace(tmp_path / "out.h5") as trace:
        assert trace.meta.recorder == "native"
        run = trace.run("main")
        assert len(run.table("ops")) > 0 and len(run.table("storages")) > 0


def test_forced_native_path_that_cannot_build_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.update(CKVIEW_RECORDER="native", CXX="/nonexistent/g++", CKVIEW_CACHE=str(tmp_path))
    (tmp_path / "train.py").write_text("print('ran')\n")
    done = subprocess.run(
        [sys.executable, "-m", "ckview", "record", "-o", "out.h5", "train.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0, done.stderr  # one line, no traceback
    assert "CKVIEW_RECORDER=native" in done.stderr and "CXX" in done.stderr
    assert not (tmp_path / "out.h5").exists()


def test_the_default_path_falls_back_to_the_python_recorder_in_one_line(tmp_path: Path) -> None:
    """``auto`` (the default) records with the Python recorder where the extension cannot be
    built, says why in one line, and the trace says which recorder ran."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("CKVIEW_RECORDER", None)
    env.update(CXX="/nonexistent/g++", CKVIEW_CACHE=str(tmp_path / "cache"))
    (tmp_path / "train.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "ckview", "record", "-o", "out.h5", "--steps=2", "train.py", "99"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    fallback = [line for line in done.stderr.splitlines() if "native recorder" in line]
    assert fallback == [
        "ckview: the native recorder is not available (no C++ compiler (/nonexistent/g++ not "
        "found; install g++ or set CXX)); recording with the Python recorder (slower; "
        "CKVIEW_RECORDER=python chooses it without this line)"
    ]
    with open_trace(tmp_path / "out.h5") as trace:
        assert trace.meta.recorder == "python"


@dataclass
class _Out:
    y: torch.Tensor
    extra: tuple[torch.Tensor, int]


class _Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class _Shapes(nn.Module):
    """Module calls whose inputs and outputs take each shape that ``tensors_in`` walks: the
    flat ones the extension notes itself and those it leaves to Python (NOTE [ Module I/O in
    one call ] in ckrec_hooks.cpp)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.flat = _Call(lambda x, k, scale=1.0: (x * scale, None, 3, "s"))
        self.nested = _Call(lambda x, rest: {"y": x + rest[0][0], "n": 2})
        self.pair = _Call(lambda x: _Pair(x.view(-1), x.t()))
        self.data = _Call(lambda x, *, w: _Out(x * w, (x.exp(), 1)))
        self.view = _Call(lambda x: x.view(-1))  # of a storage from before the run

    def forward(self, x: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h = self.flat(h, 7, scale=2.0)[0]
        h = self.nested(h, ((h,), 1))["y"]
        h = self.pair(h).a.view(h.shape)
        h = self.data(h, w=before).y
        return h.sum() + self.view(before).sum()


class _Call(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def test_module_io_is_the_python_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every module call's inputs and outputs, in order, on the native path as on the Python
    path, whatever their structure (NOTE [ Module I/O in one call ] in ckrec_hooks.cpp)."""
    found = {}
    for which in ("python", "native"):
        monkeypatch.setenv("CKVIEW_RECORDER", which)
        torch.manual_seed(0)
        model, before = _Shapes(), torch.randn(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = tmp_path / f"{which}.h5"
        with Recorder(path, steps=2, warmup=1, progress=False, timing_steps=0):
            for _ in range(3):
                model(torch.randn(16, 16), before).backward()
                opt.step()
                opt.zero_grad()
        with open_trace(path) as trace:
            run = trace.run("main")
            io, st = run.table("module_io").read(), run.table("storages").read()
        order = np.argsort(io["call"], kind="stable")  # each call's rows in the order noted
        rows = np.stack([io["call"], io["kind"], st["nbytes"][io["storage"]]], axis=1)[order]
        found[which] = rows.tolist()
    assert found["native"] == found["python"]
    assert len(found["native"]) > 20


class _Replacing(torch.optim.Optimizer):
    """SGD with momentum whose buffer is a new tensor at every step, as after
    ``load_state_dict``, made just after the old one is freed: in its memory."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 0.01})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                buf = self.state[p].pop("buf", None)
                value = p.grad.clone() if buf is None else buf * 0.9 + p.grad
                del buf
                self.state[p]["buf"] = value.clone()
                p.add_(value, alpha=-group["lr"])


def test_optimizer_state_replaced_every_step_is_marked_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state tensor that replaces one marked before is marked too, also where it took the
    old one's memory (NOTE [ Marks already noted ] in ckrec_hooks.cpp): as many optimizer-state
    storages as on the Python path."""
    found = {}
    for which in ("python", "native"):
        monkeypatch.setenv("CKVIEW_RECORDER", which)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32))
        opt = _Replacing(model.parameters())
        path = tmp_path / f"{which}.h5"
        with Recorder(path, steps=4, warmup=1, progress=False, timing_steps=0):
            for _ in range(5):
                model(torch.randn(8, 32)).square().mean().backward()
                opt.step()
                opt.zero_grad()
        with open_trace(path) as trace:
            st = trace.run("main").table("storages").read()
        state = st["category"] == Category.OPTIMIZER_STATE
        found[which] = sorted(st["nbytes"][state].tolist())
    assert found["native"] == found["python"]
    assert len(found["native"]) >= 4 * 4  # a buffer per parameter per recorded step


class _Nested(torch.optim.SGD):
    """SGD that also keeps a history of gradients in its state, nested in a list of lists: a
    value only Python's walk reads (NOTE [ Marks in one call ] in ckrec_marks.cpp)."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["history"] = [[p.grad.clone()]]


@pytest.mark.parametrize("nested", [False, True])
def test_marks_in_one_call_are_the_python_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nested: bool
) -> None:
    """Gradients and optimizer state, noted by the extension's walks (or, for a nested state
    value, by Python's) get the category and owner the Python path gives them; a parameter no
    module owns too."""
    found = {}
    for which in ("python", "native"):
        monkeypatch.setenv("CKVIEW_RECORDER", which)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 48), nn.Tanh(), nn.Linear(48, 32))
        scale = nn.Parameter(torch.ones(32))  # the optimizer's, no module's
        params = [*model.parameters(), scale]
        opt = _Nested(params, lr=0.01) if nested else torch.optim.Adam(params, lr=0.01)
        path = tmp_path / f"{which}.h5"
        with Recorder(path, steps=3, warmup=1, progress=False, timing_steps=0):
            for _ in range(4):
                (model(torch.randn(8, 32)) * scale).square().mean().backward()
                opt.step()
                opt.zero_grad()
        with open_trace(path) as trace:
            st = trace.run("main").table("storages").read()
        marked = np.isin(st["category"], [Category.GRADIENT, Category.OPTIMIZER_STATE])
        rows = np.stack([st["category"], st["nbytes"], st["module"]], axis=1)[marked]
        found[which] = sorted(map(tuple, rows.tolist()))
    assert found["native"] == found["python"]
    unowned = [row for row in found["native"] if row[1] == 32 * 4 and row[2] < 0]
    assert unowned, "the loose parameter's gradient and state have no module"
