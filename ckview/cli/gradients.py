"""``ckview verify``'s gradient gate: run the script's step again under each plan in a process
of its own and compare loss and gradients with the un-checkpointed step's (NOTE [ The gradient
gate ] in recorder/gradient_gate.py)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckview.analysis.gradients import GradientGate
from ckview.cli.errors import CLIError

LOG_LINES = 3
"""Lines of the gate process's output quoted when it fails."""


def add_options(parser: argparse.ArgumentParser) -> None:
    """verify's gate options."""
    parser.add_argument(
        "--grad-tolerance",
        type=_tolerance,
        default=0.0,
        metavar="X",
        help="largest absolute difference of the loss and each gradient that the gradient gate "
        "allows (default 0: bitwise equal)",
    )
    parser.add_argument(
        "--no-grad-check",
        action="store_true",
        help="skip the gradient gate (it runs the script's step once more per plan, plus twice "
        "without checkpointing)",
    )


OPTIONS = ("--grad-tolerance", "--no-grad-check")
"""The gate's options (for hint_misplaced)."""


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def run_gate(args: argparse.Namespace, plans: Sequence[tuple[str, Any]]) -> GradientGate:
    """The gate over ``plans`` ((source, ckpt_runtime Plan) pairs) for the script of ``args``;
    not checked, with why, where it cannot run."""
    from ckview.trace.ranks import launcher_rank

    tolerance = args.grad_tolerance
    if args.no_grad_check:
        return GradientGate.not_checked("--no-grad-check", tolerance)
    if launcher_rank() is not None:
        return GradientGate.not_checked("a rank of a distributed launch", tolerance)
    spec = {
        "target": args.target,
        "args": list(args.args),
        "module": bool(args.module),
        "warmup": args.warmup,
        "step_every": args.step_every,
        "plans": [plan.to_json() for _, plan in plans],
        "tolerance": tolerance,
    }
    if args.progress or (args.progress is None and sys.stderr.isatty()):
        print(
            f"ckview: gradient gate: running the script's first recorded step {2 + len(plans)} "
            "more times (twice without checkpointing, once per plan)",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory(prefix="ckview-grad-") as folder:
        spec_path, result, log = (Path(folder, n) for n in ("spec.json", "result.json", "log"))
        spec_path.write_text(json.dumps(spec))
        with log.open("wb") as out:
            code = subprocess.call(
                [sys.executable, "-m", "recorder.gradient_gate", str(spec_path), str(result)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(),
            )
        if code != 0 or not result.exists():
            return GradientGate.not_checked(_failed(code, log), tolerance)
        return GradientGate.from_json(json.loads(result.read_text()), tolerance)


def _env() -> dict[str, str]:
    """The environment of the gate's process: this one's, with ckview importable as here."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _failed(code: int, log: Path) -> str:
    tail = log.read_text(errors="replace").strip().splitlines()[-LOG_LINES:]
    said = " | ".join(line.strip() for line in tail) or "no output"
    return f"the gate's process failed with exit code {code}: {said}"


def check_args(args: argparse.Namespace) -> None:
    """One line for gate options that cannot work together."""
    if args.no_grad_check and args.grad_tolerance:
        raise CLIError(
            "--grad-tolerance sets the gradient gate that --no-grad-check skips; drop one"
        )
