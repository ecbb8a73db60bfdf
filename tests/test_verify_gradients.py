"""The gradient gate of ``ckview verify`` (issue 22, item 6; NOTE [ The gradient gate ] in
recorder/gradient_gate.py): each plan's loss and gradients against the un-checkpointed step's,
bitwise unless ``--grad-tolerance``; a step that does not repeat is said in one line and fails
nothing; loops where a step's gradients cannot be taken say "not checked" and why."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ckview.analysis.gradients import GradientCheck, GradientGate
from recorder.gradient_gate import GateSpec, run_gate
from tests.conftest import ckview

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

ENCODER = """
import argparse, torch
from torch import nn
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--unseeded", action="store_true")
args = p.parse_args()
if not args.unseeded:
    torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(args.steps):
    loss = model(torch.randn(16, 32, 16)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def plan_doc(name: str, regions: list[dict[str, Any]], **options: bool) -> dict[str, Any]:
    return {"format": "ckview-plan", "version": 2, "name": name, "regions": regions,
            "options": options}  # fmt: skip


OP_LEVEL = plan_doc("matmuls", [{"module": "layers.*", "save": ["aten.mm*", "aten.addmm"]}])
NO_RNG = plan_doc(
    "no-rng", [{"module": "layers.*", "save": ["aten.mm*"]}], preserve_rng_state=False
)
"""Recomputes dropout without its RNG state: another mask in backward (NOTE [ Exact gradients
under an op-level plan ] in ckpt_runtime/oplevel.py)."""


def write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(text) if name.endswith(".py") else text)
    return str(path)


def verify(folder: Path, script: str, *args: str) -> tuple[int, dict[str, Any], str]:
    """``ckview verify --json ... SCRIPT ARGS`` (args after ``--`` are the script's)."""
    cut = args.index("--") if "--" in args else len(args)
    proc = ckview(
        "verify", "--json", "--no-progress", "--timing-steps", "0", "--stop-after",
        "-o", str(folder / "v.h5"), *args[:cut], script, *args[cut + 1 :],
        cwd=folder,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else {}, proc.stderr


def gate_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "changes the step's" in line]


# ----------------------------------------------------------------------------- acceptance


@pytest.fixture(scope="module")
def encoder_verify(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    """One verify of the encoder with dropout: presets, a hand-written op-level plan, the
    planner's op-level plan for 70% of the peak, and a plan that recomputes dropout without its
    RNG state."""
    folder = tmp_path_factory.mktemp("encoder")
    script = write(folder, "encoder.py", ENCODER)
    recorded = ckview("record", "--no-progress", "--stop-after", "--timing-steps", "0",
                      "-o", "r.h5", script, cwd=folder)  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    planned = ckview("plan", "r.h5", "--level", "op", "--budget", "70%", "-o", "planner.json",
                     cwd=folder)  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    plans = [write(folder, f"{d['name']}.json", json.dumps(d)) for d in (OP_LEVEL, NO_RNG)]
    options = [a for p in ["none", "sqrt", "all", plans[0], "planner.json", plans[1]]
               for a in ("--plan", p)]  # fmt: skip
    return verify(folder, script, *options)


def test_every_exact_plan_keeps_the_gradients_bitwise(
    encoder_verify: tuple[int, dict[str, Any], str],
) -> None:
    _, doc, stderr = encoder_verify
    plans = {p["plan"]: p["gradients"] for p in doc["plans"]}
    names = list(plans)
    assert names[:4] == ["none", "sqrt", "all", "matmuls"] and names[5] == "no-rng", stderr
    assert names[4].startswith("budget-")  # the planner's
    for name in names[:5]:
        assert plans[name]["checked"] and plans[name]["equal"], (name, plans[name])
        assert plans[name]["max_abs_diff"] == 0.0 and plans[name]["first_differing"] is None
    assert doc["gradient_gate"] == {
        "checked": True,
        "why_not": None,
        "tolerance": 0.0,
        "failed": ["no-rng"],
    }


def test_dropout_recomputed_without_its_rng_state_fails_in_one_line(
    encoder_verify: tuple[int, dict[str, Any], str],
) -> None:
    code, doc, stderr = encoder_verify
    assert code == 1
    broken = next(p["gradients"] for p in doc["plans"] if p["plan"] == "no-rng")
    assert broken["checked"] and broken["equal"] is False and broken["max_abs_diff"] > 0
    # The loss is equal (forward is the plain one); the first parameter to differ is the first
    # whose gradient goes through a recomputed dropout.
    assert broken["first_differing"] == "layers.0.self_attn.in_proj_weight"
    assert 0 < broken["first_differing_abs_diff"] <= broken["max_abs_diff"]
    (line,) = gate_lines(stderr)
    assert line.startswith(
        "ckview: plan no-rng changes the step's gradients: layers.0.self_attn.in_proj_weight "
        f"differs by {broken['first_differing_abs_diff']:.3g} from the un-checkpointed run"
    )
    assert "--grad-tolerance" in line


def test_a_tolerance_lets_the_difference_pass(tmp_path: Path) -> None:
    script = write(tmp_path, "encoder.py", ENCODER)
    plan = write(tmp_path, "no-rng.json", json.dumps(NO_RNG))
    code, doc, stderr = verify(tmp_path, script, "--plan", plan, "--grad-tolerance", "10")
    assert code == 0, stderr
    (gradients,) = (p["gradients"] for p in doc["plans"])
    assert gradients["equal"] and gradients["max_abs_diff"] > 0  # the difference, still shown
    assert doc["gradient_gate"]["tolerance"] == 10 and not gate_lines(stderr)


def test_a_step_that_does_not_repeat_is_said_once_and_fails_nothing(tmp_path: Path) -> None:
    script = write(tmp_path, "encoder.py", ENCODER)
    code, doc, stderr = verify(tmp_path, script, "--plan", "all", "--", "--unseeded")
    assert code == 0, stderr
    gate = doc["gradient_gate"]
    assert not gate["checked"] and gate["failed"] == []
    assert gate["why_not"].startswith(
        "the script's step is not reproducible: two un-checkpointed runs of it differ, the loss "
        "differs by"
    )
    assert "seed it" in gate["why_not"] and "\n" not in gate["why_not"]
    assert doc["plans"][0]["gradients"]["checked"] is False
    assert not gate_lines(stderr)


INPLACE = """
import argparse, torch
from torch import nn
p = argparse.ArgumentParser()
p.add_argument("--write", default="fresh")
p.add_argument("--steps", type=int, default=8)
args = p.parse_args()
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.norm = nn.Linear(8, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        if args.write == "input":
            x.add_(1)  # an input of the region: a recompute would add again
        y = self.linear(x)
        if args.write == "fresh":
            y = y * 2
            y.mul_(2)  # a tensor of the region itself: recomputed exactly
        return self.norm(y).relu()

model = nn.Sequential(nn.Linear(8, 8), Block())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    model(torch.randn(6, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_in_place_ops_in_a_recomputed_region(tmp_path: Path) -> None:
    """An in-place op on a tensor of the region recomputes exactly (the gate passes); one on an
    input of the region is refused when the plan's region first runs, in one line."""
    script = write(tmp_path, "inplace.py", INPLACE)
    region = plan_doc("block", [{"module": "1", "save": ["aten.addmm"]}])
    plan = write(tmp_path, "block.json", json.dumps(region))
    code, doc, stderr = verify(tmp_path, script, "--plan", plan, "--", "--write", "fresh")
    assert code == 0, stderr
    assert doc["plans"][0]["gradients"]["equal"] is True
    assert doc["plans"][0]["gradients"]["max_abs_diff"] == 0.0
    code, doc, stderr = verify(tmp_path, script, "--plan", plan, "--", "--write", "input")
    assert code != 0 and doc == {}
    assert "Traceback" not in stderr  # a plan refused is one line, not the script's traceback
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ckview: the script failed (PlanError: op-level region '1': aten.add_.Tensor "
        "(1.add__0) writes in place an input of the region"
    )


# ----------------------------------------------------------------------------- loops


LOOPS = {
    "accumulation": (
        """
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            for _ in range(2):
                model(torch.randn(4, 8)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        """,
        "",
    ),
    "two optimizers": (
        """
        critic = nn.Linear(8, 1)
        opts = [torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam(critic.parameters())]
        for _ in range(6):
            critic(model(torch.randn(4, 8))).mean().backward()
            for opt in opts:
                opt.step()
                opt.zero_grad()
        """,
        "",
    ),
    "closure": (
        """
        opt = torch.optim.LBFGS(model.parameters(), max_iter=2)
        x = torch.randn(4, 8)
        def closure():
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss
        for _ in range(6):
            opt.step(closure)
        """,
        "LBFGS steps with a closure (the gradients are computed inside its step)",
    ),
    "no optimizer": (
        """
        for _ in range(6):
            model(torch.randn(4, 8)).square().mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
        """,
        "the loop has no optimizer step, the moment where a step's gradients are compared",
    ),
}
"""Loop bodies after ``model`` is made, and why the gate cannot check them ('' if it can)."""

LOOP_HEAD = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8))
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_loops_are_checked_or_say_why_not(tmp_path: Path, loop: str) -> None:
    """In process (run_gate, as the gate's process runs it): accumulated gradients and several
    optimizers are compared; a closure and a loop without optimizer are not, with why."""
    body, why = LOOPS[loop]
    script = write(tmp_path, "loop.py", LOOP_HEAD + textwrap.dedent(body))
    plan = {"format": "ckview-plan", "version": 1, "name": "all", "preset": "all"}
    spec = GateSpec(script, [], False, 1, "auto", [plan])
    doc = run_gate(spec, tmp_path)
    gate = GradientGate.from_json(doc, 0.0)
    if why:
        assert gate.why_not == why and gate.checks == {}
        assert gate.lines(["all"]) == [f"gradients: not checked ({why})"]
        return
    check = gate.check("all")
    assert check == GradientCheck(True, 0.0, None, None), doc
    assert gate.failed() == []


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["--grad-tolerance", "-1"], "argument --grad-tolerance: must be a number >= 0, got '-1'"),
        (["--grad-tolerance", "nan"], "must be a number >= 0, got 'nan'"),
        (["--grad-tolerance", "1e-6", "--no-grad-check"], "drop one"),
    ],
)
def test_bad_gate_options_fail_in_one_line(tmp_path: Path, args: list[str], wanted: str) -> None:
    script = write(tmp_path, "encoder.py", ENCODER)
    code, doc, stderr = verify(tmp_path, script, "--plan", "all", *args)
    assert code == 2 and doc == {}
    assert wanted in stderr.strip().splitlines()[-1]  # after argparse's usage


def test_the_gate_can_be_skipped(tmp_path: Path) -> None:
    script = write(tmp_path, "encoder.py", ENCODER)
    proc = ckview(
        "verify", "--no-progress", "--timing-steps", "0", "--stop-after", "--no-grad-check",
        "--plan", "all", "-o", str(tmp_path / "v.h5"), script, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "gradients: not checked (--no-grad-check)"


# ----------------------------------------------------------------------------- wording


def test_gate_wording_without_torch() -> None:
    gate = GradientGate.from_json(
        {
            "why_not": "",
            "reproducible": {"why_not": "", "equal": True, "max_abs_diff": 0.0},
            "plans": {
                "a": {"why_not": "", "equal": True, "max_abs_diff": 0.0},
                "b": {
                    "equal": False,
                    "max_abs_diff": 2e-3,
                    "first_differing": "loss",
                    "first_diff": 1e-3,
                },
                "c": {
                    "equal": False,
                    "max_abs_diff": None,
                    "first_differing": "w",
                    "first_diff": None,
                },
                "d": {"why_not": "the script failed in the gate's run plan:d: boom"},
            },
        },
        1e-4,
    )
    assert gate.failed() == ["b", "c"]
    assert gate.failure_line("b").startswith(
        "plan b changes the step's loss: the loss differs by 0.001 from the un-checkpointed run "
        "(largest difference 0.002, allowed 0.0001)"
    )
    assert "w cannot be compared (missing on one side" in gate.failure_line("c")
    assert gate.lines(["a", "b", "c", "d"]) == [
        "gradients: the loss and gradients of plan(s) a equal the un-checkpointed run's (within "
        "0.0001; a second un-checkpointed run matched the first)",
        "gradients: plan d not checked (the script failed in the gate's run plan:d: boom)",
    ]
    assert gate.check("d").to_json()["checked"] is False
    assert GradientGate.not_checked("--no-grad-check").check("x").why_not == "--no-grad-check"
