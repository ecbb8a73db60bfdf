"""Run the example training scripts as a user would, in subprocesses.

Each example runs twice (plain and with --checkpoint). All eight runs are started at
once, single-threaded, so that they overlap: most of each run is importing torch (and
torch._dynamo, which torch.optim pulls in), not training. That keeps the whole file
around 25 s on 2 cores instead of ~40 s one after the other.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
EXAMPLES = ["mlp", "cnn", "transformer", "gpt2"]
STEPS = 2
STEP_LINE = re.compile(r"step (\d+) loss (\S+)")
# One intra-op thread per run: the concurrent runs would otherwise oversubscribe the cores
# (OpenMP threads spin while waiting) and the file would take ~50% longer. Both runs of an
# example use the same setting, so the loss comparison is unaffected.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, bool], subprocess.CompletedProcess[str]]:
    """Run every example with and without --checkpoint, all at once; keyed by (name, ckpt)."""
    procs = {
        (name, ckpt): subprocess.Popen(
            [sys.executable, str(EXAMPLES_DIR / f"{name}.py"), "--steps", str(STEPS)]
            + (["--checkpoint"] if ckpt else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )
        for name in EXAMPLES
        for ckpt in (False, True)
    }
    results = {}
    for key, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def losses(result: subprocess.CompletedProcess[str]) -> list[str]:
    """Check the output format and return the printed losses (as printed, for exact compare)."""
    assert result.returncode == 0, f"exit code {result.returncode}\nstderr:\n{result.stderr}"
    lines = result.stdout.splitlines()
    assert len(lines) == STEPS, f"expected exactly {STEPS} lines on stdout, got:\n{result.stdout}"
    printed = []
    for i, line in enumerate(lines):
        match = STEP_LINE.fullmatch(line)
        assert match is not None, f"unexpected stdout line: {line!r}"
        assert int(match.group(1)) == i
        assert math.isfinite(float(match.group(2))), line
        printed.append(match.group(2))
    return printed


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpoint"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(
    runs: dict[tuple[str, bool], subprocess.CompletedProcess[str]], name: str, checkpoint: bool
) -> None:
    result = runs[name, checkpoint]
    losses(result)
    # The examples are meant to be copied: no warnings (Python or transformers logging).
    assert result.stderr.strip() == "", f"unexpected stderr:\n{result.stderr}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_checkpoint_gives_same_losses(
    runs: dict[tuple[str, bool], subprocess.CompletedProcess[str]], name: str
) -> None:
    # Exact equality for all four examples. On CPU, non-reentrant checkpointing replays
    # the same kernels on the same inputs and restores the RNG state before the
    # recompute, so dropout (cnn, transformer, gpt2) draws the same masks: the losses
    # were found to be bitwise identical over 6 steps (compared with float.hex()), so
    # comparing the printed 6-decimal strings is safe. BatchNorm running stats in the
    # cnn are updated twice under checkpointing, but train-mode losses use batch stats.
    assert losses(runs[name, True]) == losses(runs[name, False])
