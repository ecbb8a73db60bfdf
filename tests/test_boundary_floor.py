"""benchmarks/boundary_floor.py runs: it replaces recorder methods by name for its cut rows,
so a renamed method must break a test, not the next measurement."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_COMPILER, ROOT

pytestmark = [pytest.mark.torch, NEEDS_COMPILER]


def test_every_row_is_measured() -> None:
    script = ROOT / "benchmarks" / "boundary_floor.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKVIEW_RECORDER": "native"}
    done = subprocess.run(
        [sys.executable, str(script), "--rounds", "1", "--steps", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.strip() for line in done.stdout.splitlines()[2:]]
    names = (
        "plain",
        "ckview default",
        "boundary cut",
        "... and no",
        "native extension",
        "extension",
    )
    assert len(rows) == len(names), done.stdout
    for row, name in zip(rows, names, strict=True):
        assert row.startswith(name) and row.endswith(("ms", "x")), done.stdout
