"""A recorded step is one training iteration (NOTE [ Step = one optimizer iteration ]): gradient
accumulation, optimizer.step(closure), two optimizers, no optimizer, mark_step, --step-every."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ckview.trace.schema import Category, Phase
from recorder import Recorder
from recorder.steps import StepRule, StepRuleError
from tests.conftest import read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 16), torch.randn(8, 4)


def _held(tables: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    steps = tables["steps"]
    return list(
        zip(
            steps["forwards"].tolist(),
            steps["backwards"].tolist(),
            steps["optimizer_steps"].tolist(),
            steps["complete"].tolist(),
            strict=True,
        )
    )


def _record(path: Path, loop: Callable[[], None], **kwargs: Any) -> dict[str, Any]:
    kwargs = {"steps": 2, "warmup": 1, "progress": False, **kwargs}
    with Recorder(path, **kwargs):
        loop()
    return read_run(path)


def _accumulating_loop(iterations: int, k: int = 4) -> Callable[[], None]:
    def loop() -> None:
        model = _mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(iterations):
            for _ in range(k):
                x, y = _batch()
                (((model(x) - y) ** 2).mean() / k).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return loop


def test_gradient_accumulation_is_one_step(tmp_path: Path) -> None:
    tables = _record(tmp_path / "t.h5", _accumulating_loop(3))
    assert _held(tables) == [(4, 4, 1, 1), (4, 4, 1, 1)]
    # The optimizer state is part of every step: Adam's moments, 2 per parameter.
    st = tables["storages"]
    param_bytes = int(st["nbytes"][st["category"] == Category.PARAMETER].sum())
    assert st["nbytes"][st["category"] == Category.OPTIMIZER_STATE].sum() >= 2 * param_bytes
    assert "the optimizer (Adam)" in tables["meta"].step_rule
    assert "4 forwards, 4 backwards, 1 optimizer step" in tables["meta"].step_rule


def test_warmup_counts_iterations_not_micro_batches(tmp_path: Path) -> None:
    # 3 iterations of 4 micro-batches: warmup 1, then 2 recorded and a third begun. Counted per
    # micro-batch (the old rule before the first optimizer step), warmup would end after the
    # first micro-batch and the first recorded step would hold 3 of them.
    tables = _record(tmp_path / "t.h5", _accumulating_loop(3), steps=5)
    assert tables["meta"].steps_recorded == 2
    assert _held(tables) == [(4, 4, 1, 1), (4, 4, 1, 1), (0, 0, 0, 0)]


def test_lbfgs_closure_runs_forward_and_backward(tmp_path: Path) -> None:
    def loop() -> None:
        model = _mlp()
        opt = torch.optim.LBFGS(model.parameters(), max_iter=3, history_size=3)
        x, y = _batch()
        for _ in range(3):

            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                return loss

            opt.step(closure)

    tables = _record(tmp_path / "t.h5", loop)
    held = _held(tables)
    assert all(f == b and f >= 2 and o == 1 and c == 1 for f, b, o, c in held), held
    ops, calls = tables["ops"], tables["module_calls"]
    forward = ops["phase"] == Phase.FORWARD
    assert forward.sum() > 0, "the closure's forward was labelled optimizer"
    assert (ops["phase"] == Phase.BACKWARD).sum() > 0
    assert (ops["phase"] == Phase.OPTIMIZER).sum() > 0
    # Every forward op inside a module call is attributed to it.
    assert (calls["phase"] == Phase.FORWARD).sum() == 4 * int(tables["steps"]["forwards"].sum())


def test_lightning_like_closure_keyword(tmp_path: Path) -> None:
    """Lightning's automatic optimization: ``optimizer.step(closure=...)`` where the closure
    runs training_step (forward, loss), zero_grad and backward."""

    def loop() -> None:
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            batch = _batch()

            def closure(x: torch.Tensor = batch[0], y: torch.Tensor = batch[1]) -> torch.Tensor:
                loss = ((model(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                return loss

            opt.step(closure=closure)

    tables = _record(tmp_path / "t.h5", loop)
    assert _held(tables) == [(1, 1, 1, 1), (1, 1, 1, 1)]
    ops = tables["ops"]
    phases = set(ops["phase"].tolist())
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= phases
    # The saved activations are seen as such (ReLU output 8x32 and the 8x4 difference).
    st = tables["storages"]
    activation = int(st["nbytes"][st["category"] == Category.ACTIVATION].sum())
    assert activation == 2 * (8 * 32 + 8 * 4) * 4


def test_two_optimizers_step_in_one_iteration(tmp_path: Path) -> None:
    """A GAN: the discriminator's step and the generator's step make one iteration."""

    def loop() -> None:
        torch.manual_seed(0)
        gen = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        disc = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
        opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
        opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
        for _ in range(3):
            real, z = torch.randn(8, 16), torch.randn(8, 8)
            fake = gen(z)
            d_loss = disc(real).mean() - disc(fake.detach()).mean()
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = -disc(fake).mean()
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()

    tables = _record(tmp_path / "t.h5", loop)
    assert _held(tables) == [(4, 2, 2, 1), (4, 2, 2, 1)]
    assert "each of the 2 optimizers (Adam, Adam)" in tables["meta"].step_rule


def test_an_optimizer_that_never_steps_does_not_hold_steps_open(tmp_path: Path) -> None:
    def loop() -> None:
        model = _mlp()
        unused = torch.optim.SGD(model.parameters(), lr=0.1)  # built, kept, never stepped
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            x, y = _batch()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        del unused

    tables = _record(tmp_path / "t.h5", loop)
    # The first warmup iteration waits for it; once one optimizer steps twice it is not waited
    # for, and every later step is one iteration.
    assert _held(tables) == [(1, 1, 1, 1), (1, 1, 1, 1)]


def test_manual_sgd_without_optimizer(tmp_path: Path) -> None:
    def loop() -> None:
        model = _mlp()
        for _ in range(4):
            x, y = _batch()
            ((model(x) - y) ** 2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad  # type: ignore[operator]
                    p.grad = None

    tables = _record(tmp_path / "t.h5", loop)
    assert _held(tables) == [(1, 1, 0, 1), (1, 1, 0, 1)]
    assert "no optimizer" in tables["meta"].step_rule
    # The update belongs to the step it follows: each step holds its in-place parameter updates.
    names = [tables["strings"][i] for i in tables["ops"]["name"]]
    updates = np.array([n.startswith("aten.sub_") for n in names])
    assert set(tables["ops"]["step"][updates].tolist()) == {0, 1}


def _plain_parameters() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [(torch.randn(16, 32) / 4).requires_grad_(), torch.zeros(32, requires_grad=True)]


def _function(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ params[0] + params[1]).sum(dim=1, keepdim=True)


@pytest.mark.parametrize("optimizer", [False, True])
def test_loop_without_modules(tmp_path: Path, optimizer: bool) -> None:
    # NOTE [ A forward without modules ] (recorder/hooks.py): no nn.Module at all, the
    # model a function of plain tensors; a step is one optimizer iteration, or per backward
    # without optimizer, and the tensors trained are parameters (their grads gradients).
    def loop() -> None:
        params = _plain_parameters()
        opt = torch.optim.SGD(params, lr=0.1) if optimizer else None
        for _ in range(4):
            x, y = _batch()
            ((_function(params, x) - y[:, :1]) ** 2).mean().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
                continue
            with torch.no_grad():
                for p in params:
                    p -= 0.1 * p.grad  # type: ignore[operator]
                    p.grad = None

    tables = _record(tmp_path / "t.h5", loop)
    assert _held(tables) == [(1, 1, int(optimizer), 1)] * 2
    assert len(tables["modules"]["path"]) == 0
    storages = tables["storages"]
    params = storages["nbytes"][storages["category"] == Category.PARAMETER]
    assert sorted(params.tolist()) == [32 * 4, 16 * 32 * 4]
    assert (storages["category"] == Category.GRADIENT).any()
    forward = tables["ops"]["phase"] == Phase.FORWARD
    names = {tables["strings"][i] for i in tables["ops"]["name"][forward]}
    # x @ w: aten.mm below autograd (Python path), aten.matmul around it (the native path's
    # outermost ops, NOTE [ Outermost ops ])
    assert "aten.tanh.default" in names and names & {"aten.mm.default", "aten.matmul.default"}


def test_step_every_backward(tmp_path: Path) -> None:
    """Manual SGD with 2 micro-batches per update: not learnable, so the user says it."""

    def loop() -> None:
        model = _mlp()
        for _ in range(4):
            for _ in range(2):
                x, y = _batch()
                ((model(x) - y) ** 2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad  # type: ignore[operator]
                    p.grad = None

    tables = _record(tmp_path / "t.h5", loop, step_every="backward:2")
    assert _held(tables) == [(2, 2, 0, 1), (2, 2, 0, 1)]
    assert tables["meta"].step_rule.startswith("given: backward:2")


def test_step_every_optimizer(tmp_path: Path) -> None:
    tables = _record(tmp_path / "t.h5", _accumulating_loop(6, k=1), step_every="optimizer:2")
    assert _held(tables) == [(2, 2, 2, 1), (2, 2, 2, 1)]


def test_mark_step_is_the_only_boundary(tmp_path: Path) -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False, step_every="manual")
    with rec:
        for i in range(9):
            x, y = _batch()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            if i % 3 == 2:
                rec.mark_step()
    tables = read_run(tmp_path / "t.h5")
    assert _held(tables) == [(3, 3, 3, 1), (3, 3, 3, 1)]
    assert tables["meta"].step_rule.startswith("manual")


def test_mark_step_after_optimizer_step_confirms_the_boundary(tmp_path: Path) -> None:
    """``opt.step(); rec.mark_step()`` each iteration: one step per iteration, none empty."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False) as rec:
        for _ in range(3):
            x, y = _batch()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            rec.mark_step()
    assert _held(read_run(tmp_path / "t.h5")) == [(1, 1, 1, 1), (1, 1, 1, 1)]


def test_manual_rule_ignores_optimizer_steps(tmp_path: Path) -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=1, warmup=0, progress=False, step_every="manual"):
        for _ in range(3):
            x, y = _batch()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    tables = read_run(tmp_path / "t.h5")
    # No mark_step: the one step stays open to the end and is cut there.
    assert _held(tables) == [(3, 3, 3, 0)]
    assert tables["meta"].steps_recorded == 0


def test_a_step_cut_short_is_marked_partial(tmp_path: Path) -> None:
    tables = _record(tmp_path / "t.h5", _accumulating_loop(2), steps=3)
    assert _held(tables) == [(4, 4, 1, 1), (0, 0, 0, 0)]


def test_warmup_zero_says_so(tmp_path: Path) -> None:
    tables = _record(tmp_path / "t.h5", _accumulating_loop(2), warmup=0)
    assert "warmup 0" in tables["meta"].step_rule
    # Recording began at the with-block: the model and optimizer were made inside step 0.
    assert _held(tables) == [(4, 4, 1, 1), (4, 4, 1, 1)]


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("auto", StepRule("auto")),
        ("manual", StepRule("manual")),
        ("optimizer", StepRule("optimizer", 1)),
        ("optimizer:2", StepRule("optimizer", 2)),
        (" backward:16 ", StepRule("backward", 16)),
    ],
)
def test_step_rule_parse(text: str, rule: StepRule) -> None:
    assert StepRule.parse(text) == rule
    assert StepRule.parse(str(rule)) == rule


@pytest.mark.parametrize("text", ["", "optimizer:0", "optimizer:x", "forward:2", "auto:2"])
def test_step_rule_rejects(text: str) -> None:
    with pytest.raises(StepRuleError, match="step rule"):
        StepRule.parse(text)


ACCUMULATING_SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for it in range(4):
    for _ in range(3):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        ((model(x) - y) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_cli_step_every_and_summary(tmp_path: Path, run_cli: Any) -> None:
    script = tmp_path / "accumulate.py"
    script.write_text(ACCUMULATING_SCRIPT)
    trace = tmp_path / "t.h5"
    code, _, err = run_cli("record", "-o", str(trace), "--steps", "2", str(script))
    assert code == 0, err
    code, out, _ = run_cli("summary", str(trace))
    assert code == 0
    assert "steps: auto: a step ends once the optimizer (SGD) has stepped" in out
    assert out.count("3 fwd, 3 bwd, 1 opt") == 2
    code, out, _ = run_cli("summary", str(trace), "--json")
    doc = json.loads(out)
    assert doc["meta"]["step_rule"].startswith("auto")
    assert doc["meta"]["compiled"] == "no"
    steps = doc["runs"]["main"]["steps"]
    assert [(s["forwards"], s["backwards"], s["optimizer_steps"]) for s in steps] == [(3, 3, 1)] * 2

    code, _, err = run_cli(
        "record", "-o", str(tmp_path / "u.h5"), "--step-every", "optimizer:3", str(script)
    )
    # Warmup: 3 optimizer steps (iterations 1-3); the 4th iteration begins a step, and the
    # script ends before the step does: no step was recorded (a failure), the partial one kept.
    assert code == 1 and "no step was recorded" in err, err
    assert _held(read_run(tmp_path / "u.h5")) == [(3, 3, 1, 0)]


def test_cli_rejects_a_bad_step_rule(tmp_path: Path, run_cli: Any) -> None:
    script = tmp_path / "accumulate.py"
    script.write_text(ACCUMULATING_SCRIPT)
    code, _, err = run_cli("record", "--step-every", "epoch:1", str(script))
    assert code != 0
    assert "--step-every: cannot read step rule 'epoch:1'" in err
    assert "Traceback" not in err
