"""benchmarks/capture_parts.py runs every row: it turns the extension's captures on one by one
through ``record_overhead.extension_running``, so a renamed flag must break a test, not the next
measurement."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_COMPILER, ROOT

pytestmark = [pytest.mark.torch, NEEDS_COMPILER]


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_every_row_is_measured(optimizer: str) -> None:
    script = ROOT / "benchmarks" / "capture_parts.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKVIEW_RECORDER": "native"}
    done = subprocess.run(
        [sys.executable, str(script), "--blocks", "1", "--steps", "2", "--optimizer", optimizer],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert f", {optimizer}:" in done.stdout.splitlines()[0], done.stdout
    rows = [line.strip() for line in done.stdout.splitlines()[2:]]
    names = (
        "plain",
        "torch.profiler",
        "op ranges",
        "+ allocator",
        "+ op outputs",
        "+ saved",
        "+ module",
    )
    assert len(rows) == len(names), done.stdout
    for row, name in zip(rows, names, strict=True):
        assert row.startswith(name) and row.endswith(("ms", "x")), done.stdout
