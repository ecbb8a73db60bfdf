"""Projected vs measured peaks on small real models, recorded in process as ``ckview verify``
records them: run 'baseline' (the script's checkpointing bypassed), then one run per plan.

Each model is a pattern that projected 2-14% off before NOTE [ Released outputs ] (blocks ending
in an op that saves its own output, DDP, a DenseNet with BatchNorm, an LSTM, an alternating
Linear/ReLU Sequential with sqrt segments), or a loop that made plan runs measure something else
than the projection: a loop without optimizer (NOTE [ Early run context ] in recorder/runs.py)
and a model that checkpoints itself (NOTE [ A plan that replaces the script's checkpointing ]).
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ckview.cli.recording import load_plans
from ckview.cli.verify import Check, _verify, format_table
from ckview.trace import open_trace
from ckview.trace.schema import Category
from recorder import Recorder
from recorder.plans import plan_runs

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

PLANS = ("none", "sqrt", "all")
TOLERANCE = 0.001  # the target: 0.1% of the measured peak


class Block(nn.Module):
    """Linear then an activation that saves its own output (Tanh) or its input (GELU)."""

    def __init__(self, d: int, act: type[nn.Module]) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class MLPBlock(nn.Module):
    """A residual MLP block with a 4x hidden layer: most of its activations stay inside."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(c_in)
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(c_in, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.conv(self.relu(self.bn(x)))], 1)


class DenseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layers = nn.Sequential(*[DenseLayer(8 + 4 * i, 4) for i in range(5)])
        self.head = nn.Linear(28, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)).mean((2, 3)))


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(16, 32)
        self.lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True)
        self.blocks = nn.Sequential(*[Block(32, nn.GELU) for _ in range(3)])
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(self.emb(x))
        return self.head(self.blocks(y)).mean(1)


class SelfCheckpointed(nn.Module):
    """Checkpoints its own blocks with torch.utils.checkpoint: the script's checkpointing."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([MLPBlock(64) for _ in range(6)])
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def tanh_mlp() -> tuple[nn.Module, tuple[int, ...]]:
    return nn.Sequential(*[Block(64, nn.Tanh) for _ in range(6)], nn.Linear(64, 4)), (512, 64)


def linear_relu() -> tuple[nn.Module, tuple[int, ...]]:
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(64, 4)), (512, 64)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[int, ...]]]] = {
    "tanh_mlp": tanh_mlp,
    "linear_relu": linear_relu,
    "densenet_bn": lambda: (DenseNet(), (32, 3, 16, 16)),
    "lstm": lambda: (LSTMNet(), (64, 24, 16)),
    "self_checkpointed": lambda: (SelfCheckpointed(), (1024, 64)),
}


def train(model: nn.Module, shape: tuple[int, ...], steps: int, optimizer: bool) -> None:
    """A plain training loop; without optimizer, a manual SGD update under no_grad."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if optimizer else None
    for _ in range(steps):
        loss = model(torch.randn(*shape)).pow(2).mean()
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
            continue
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(0.01 * p.grad)
                    p.grad = None


TIMING_STEPS = 2


def verify(model: nn.Module, shape: tuple[int, ...], path: Path, optimizer: bool) -> list[Check]:
    """Record 'baseline' and one run per plan of ``PLANS``, then their plain timing steps
    (NOTE [ Plain timing steps ]), as ``ckview verify`` does; each plan's projected vs measured.
    """
    plans = load_plans(list(PLANS))
    runs = plan_runs(plans, True, False)
    recorder = Recorder(
        path, steps=1, warmup=1, runs=runs, progress=False, timing_steps=TIMING_STEPS
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a segment that does not take effect warns
        with recorder:
            # each run's timing steps, and plan all's (NOTE [ Timing steps under plan all ])
            steps = 1 + len(runs) * (1 + 3 * TIMING_STEPS) + 2 * TIMING_STEPS + 1
            train(model, shape, steps, optimizer)
    assert_timed(path, [r.name for r in runs])
    checks, missing, _ = _verify(path, plans)
    assert not missing
    assert all(c.time is not None and c.time.plain for c in checks)
    return checks


def assert_timed(path: Path, runs: list[str]) -> None:
    """Every run kept one timing step per round (warm-ups dropped), each with its module calls,
    and the trace holds checkpoint's cost per call."""
    with open_trace(path) as trace:
        assert trace.meta.checkpoint_call_low_ns <= trace.meta.checkpoint_call_ns
        assert trace.meta.checkpoint_call_ns <= trace.meta.checkpoint_call_high_ns
        assert trace.meta.checkpoint_call_low_ns >= 0
        for name in runs:
            steps = trace.run(name).table("timing_steps").read()
            calls = trace.run(name).table("timed_calls").read()
            assert steps["round"].tolist() == list(range(TIMING_STEPS))
            assert (steps["duration_ns"] > 0).all()
            assert set(calls["timing_step"].tolist()) == set(range(TIMING_STEPS))
            assert (calls["duration_ns"] > 0).all()


def assert_exact(checks: list[Check]) -> None:
    errors = {c.projection.plan: round(100 * c.peak_error, 3) for c in checks}
    assert all(abs(e) <= 100 * TOLERANCE for e in errors.values()), errors
    saved = [c.projection.saving_bytes for c in checks if c.projection.plan != "none"]
    assert any(s > 0 for s in saved), "no plan changed the peak: the model tests nothing"


def assert_incremental_is_exact(path: Path) -> None:
    """NOTE [ Incremental peak ] holds with released outputs and early stops: the fast peak and
    curve of random selections of every preset region (nested ones included) equal the exact
    projection's."""
    from ckview.analysis import ProjectionModel
    from ckview.analysis.plans import regions_from_plan
    from ckview.cli.common import read_tables
    from ckview.trace import open_trace

    with open_trace(path) as trace:
        tables = read_tables(trace, "baseline")
    modules, strings = tables["modules"], tables["strings"]
    candidates = [r for p in ("all", "sqrt") for r in regions_from_plan(p, modules, strings)]
    model = ProjectionModel(tables, candidates)
    rng = np.random.default_rng(0)
    for _ in range(40):
        picks = rng.random(len(candidates)) < 0.5
        exact = model.project(picks).projected_peak
        assert model.peak(picks) == exact
        assert model.curve(picks).total.max() == exact.bytes


@pytest.mark.parametrize("name", sorted(MODELS))
def test_projection_matches_measured_peak(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, shape = MODELS[name]()
    path = tmp_path / f"{name}.h5"
    assert_exact(verify(model, shape, path, optimizer=True))
    assert_incremental_is_exact(path)


@pytest.mark.parametrize("name", ["tanh_mlp", "linear_relu"])
def test_loop_without_optimizer(name: str, tmp_path: Path) -> None:
    """The step ends in the root's forward pre-hook; sqrt's segments of the root Sequential
    still take effect on the first recorded step (the recorder would warn otherwise)."""
    torch.manual_seed(0)
    model, shape = MODELS[name]()
    assert_exact(verify(model, shape, tmp_path / f"{name}.h5", optimizer=False))


@pytest.fixture
def process_group() -> Iterator[None]:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ddp_model(process_group: None, tmp_path: Path) -> None:
    """DDP wraps the model in one more module call whose output is the script's."""
    torch.manual_seed(0)
    model, shape = tanh_mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    assert_exact(verify(ddp, shape, tmp_path / "ddp.h5", optimizer=True))


def test_plan_none_is_the_baseline_of_a_self_checkpointing_model(tmp_path: Path) -> None:
    """Like for like: plan 'none' bypasses the script's own checkpointing, so it measures the
    baseline's peak (it measured the script's checkpointed peak before)."""
    torch.manual_seed(0)
    model, shape = MODELS["self_checkpointed"]()
    checks = verify(model, shape, tmp_path / "self.h5", optimizer=True)
    none = next(c for c in checks if c.projection.plan == "none")
    assert none.measured_peak_bytes == none.projection.run_peak_bytes
    assert none.projection.saving_bytes == 0


def hf_gpt2() -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=2, n_positions=64, vocab_size=97, use_cache=False
    )
    model = transformers.GPT2LMHeadModel(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def test_hf_gradient_checkpointing_is_replaced_by_the_plan(tmp_path: Path) -> None:
    """HF's own gradient checkpointing is bypassed in every plan run: 'none' measures the
    baseline, and the presets land on their projections."""
    torch.manual_seed(0)
    model = hf_gpt2()
    plans = load_plans(list(PLANS))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = tmp_path / "gpt2.h5"
    with Recorder(path, steps=1, warmup=1, runs=plan_runs(plans, True, False), progress=False):
        for _ in range(2 + len(PLANS) + 1):
            ids = torch.randint(0, 97, (4, 48))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    checks, missing, _ = _verify(path, plans)
    assert not missing
    none = next(c for c in checks if c.projection.plan == "none")
    assert none.measured_peak_bytes == none.projection.run_peak_bytes
    assert_exact(checks)


class _Recompute(torch.autograd.Function):
    """A hand-written checkpoint: forward without grad, forward again in backward (as the
    efficient DenseNet of csrhddlam/pytorch-checkpoint does); ckpt_runtime cannot bypass it."""

    @staticmethod
    def forward(ctx: Any, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        ctx.block = block
        ctx.save_for_backward(x)
        with torch.no_grad():
            return block(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.enable_grad():
            out = ctx.block(x)
        torch.autograd.backward(out, grad)
        return None, x.grad


class HandCheckpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(32, 32)
        self.blocks = nn.ModuleList([MLPBlock(32) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = _Recompute.apply(block, x)
        return x


@pytest.mark.parametrize("hand", [True, False], ids=["hand-written recompute", "plain"])
def test_recompute_left_in_a_bypassed_run_is_reported(hand: bool, tmp_path: Path) -> None:
    """NOTE [ Recompute in a bypassed run ]: what bypass cannot reach shows as recompute in
    'baseline' and in the plan runs, and record / verify / summary say so; a plain model
    shows none."""
    from ckview.cli.record import leftover_warnings

    torch.manual_seed(0)
    model: nn.Module = HandCheckpointed() if hand else nn.Sequential(MLPBlock(32), MLPBlock(32))
    plans = load_plans(["none", "all"])
    path = tmp_path / "hand.h5"
    with Recorder(path, steps=1, warmup=1, runs=plan_runs(plans, True, True), progress=False):
        train(model, (64, 32), 6, optimizer=True)
    lines = leftover_warnings(path)
    checks, missing, baseline = _verify(path, plans)
    assert not missing and baseline is not None
    if not hand:
        assert lines == [] and baseline.leftover is None
        return
    # 'checkpointed' runs the script as it is: its recompute is expected there, not reported.
    # One line names every run that holds it (not one line per run).
    (line,) = lines
    assert line.startswith("runs 'baseline', 'plan:none', 'plan:all' still recompute ")
    assert "cannot switch off" in line and "blocks" in line
    assert baseline.leftover is not None and baseline.leftover.ops > 0
    assert all(c.leftover is not None for c in checks)
    text = format_table(path, checks, baseline)
    assert text.count("still recompute") == 1
    assert "warning: runs 'baseline', 'plan:none', 'plan:all' still recompute" in text


def test_a_script_that_ends_before_the_timing_steps_loses_no_run(tmp_path: Path) -> None:
    """NOTE [ Plain timing steps ]: timing comes after every run is recorded, so a script that
    stops there still verifies every plan, its extra times from the recorded steps."""
    torch.manual_seed(0)
    model, shape = tanh_mlp()
    plans = load_plans(list(PLANS))
    runs = plan_runs(plans, True, False)
    path = tmp_path / "short.h5"
    recorder = Recorder(path, steps=1, warmup=1, runs=runs, progress=False, timing_steps=3)
    with recorder:
        train(model, shape, 1 + len(runs) + 2, optimizer=True)  # 2 steps into the timing
    with open_trace(path) as trace:  # one round began: baseline's kept step, none of plan:none
        kept = {name: len(trace.run(name).table("timing_steps")) for name in trace.run_names}
    assert kept == {"baseline": 1, "plan:none": 0, "plan:sqrt": 0, "plan:all": 0}
    checks, missing, _ = _verify(path, plans)
    assert not missing
    assert all(c.time is not None and not c.time.plain for c in checks)
    assert_exact(checks)


class FreshModules(nn.Module):
    """Builds a module on every call (as HF builds its loss module per step)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[MLPBlock(32) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.Tanh()(self.blocks(x))


def test_modules_first_seen_in_the_timing_steps(tmp_path: Path) -> None:
    """Timing steps run after the trace is written: a module made then is not followed, and
    recording, timing and the projection go on."""
    torch.manual_seed(0)
    assert_exact(verify(FreshModules(), (256, 32), tmp_path / "fresh.h5", optimizer=True))


class StatefulLSTM(nn.Module):
    """Stacked LSTMs that return their state, ``(output, (h_n, c_n))``: the state is two
    levels deep in each block's result, and the loop carries it on (truncated BPTT)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnns = nn.ModuleList([nn.LSTM(32, 32, batch_first=True) for _ in range(3)])
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, state: list[Any]) -> tuple[torch.Tensor, list[Any]]:
        new_state = []
        for rnn, hc in zip(self.rnns, state, strict=True):
            x, hc = rnn(x, hc)
            new_state.append(hc)
        return self.head(x), new_state


def test_state_returned_two_levels_deep_stays_live(tmp_path: Path) -> None:
    """An LSTM's (h_n, c_n) is an output of its call (NOTE [ What the projection leaves out ]):
    checkpointed, it is kept, as the measured run keeps it (it was dropped, -0.4%)."""
    torch.manual_seed(0)
    model = StatefulLSTM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plans = load_plans(list(PLANS))
    path = tmp_path / "lstm.h5"
    with Recorder(path, steps=1, warmup=1, runs=plan_runs(plans, True, False), progress=False):
        state = [(torch.zeros(1, 16, 32), torch.zeros(1, 16, 32)) for _ in model.rnns]
        for _ in range(2 + len(PLANS) + 1):
            out, state = model(torch.randn(16, 12, 32), state)
            state = [(h.detach(), c.detach()) for h, c in state]
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    checks, missing, _ = _verify(path, plans)
    assert not missing
    assert_exact(checks)


def test_module_buffers_are_in_every_run(tmp_path: Path) -> None:
    """NOTE [ Buffers are noted at a run's start ]: each run holds the running statistics from
    its first step, whether or not an op wrote them in place, so the plans over a BatchNorm
    model project to the byte (the native path missed them in the baseline: -5,312 B on
    DenseNet's sqrt plan)."""
    torch.manual_seed(0)
    model = DenseNet()
    plans = load_plans(["sqrt", "all"])
    path = tmp_path / "bn.h5"
    with Recorder(path, steps=1, warmup=1, runs=plan_runs(plans, True, False), progress=False):
        train(model, (8, 3, 16, 16), 1 + 3, optimizer=True)
    buffer_bytes = sorted(b.nbytes for b in model.buffers())
    with open_trace(path) as trace:
        for name in trace.run_names:
            storages = trace.read_run(name)["storages"]
            before = storages["alloc_ns"] < 0
            inputs = storages["category"] == int(Category.INPUT)
            held = sorted(storages["nbytes"][before & inputs].tolist())
            assert all(held.count(n) >= buffer_bytes.count(n) for n in buffer_bytes), name
    checks, missing, _ = _verify(path, plans)
    assert not missing
    for check in checks:
        assert check.projection.peak_bytes == check.measured_peak_bytes, check.projection.plan
