"""The floor benchmarks run every row: ``benchmarks/boundary_floor.py`` replaces recorder methods
by name for its cut rows, and ``benchmarks/capture_parts.py`` turns the extension's captures on
one by one through ``record_overhead.extension_running``, so a renamed method or flag must break
a test, not the next measurement."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import NEEDS_COMPILER, ROOT

pytestmark = [pytest.mark.torch, NEEDS_COMPILER]


def _rows(script: str, *args: str) -> tuple[str, list[str]]:
    """The first line the benchmark prints, and its rows (after the column heads)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKVIEW_RECORDER": "native"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return lines[0], [line.strip() for line in lines[2:]]


def _check(rows: list[str], names: tuple[str, ...]) -> None:
    assert len(rows) == len(names), rows
    for row, name in zip(rows, names, strict=True):
        assert row.startswith(name) and row.endswith(("ms", "x")), rows


def test_boundary_floor_measures_every_row() -> None:
    _, rows = _rows("boundary_floor.py", "--rounds", "1", "--steps", "3")
    names = ("plain", "ckview default", "boundary cut", "... and no", "native extension", "ext")
    _check(rows, names)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_capture_parts_measures_every_row(optimizer: str) -> None:
    args = ("--blocks", "1", "--steps", "2", "--optimizer", optimizer)
    head, rows = _rows("capture_parts.py", *args)
    assert f", {optimizer}:" in head
    names = ("plain", "torch.profiler", "op ranges", "+ allocator", "+ op outputs", "+ saved")
    _check(rows, (*names, "+ module"))
