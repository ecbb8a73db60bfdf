"""The README's commands and CI stay in sync."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_readme_starts_with_run_and_test_commands() -> None:
    run, test = _readme_commands()[:2]
    assert re.search(r"ckview record (-\S+ \S+ )*examples/", run) and "ckview summary" in run
    assert "pytest" in test and "pip install -q torch==2.13.0" in test


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci


@pytest.mark.gui  # the script imports Qt before it parses its options
def test_screenshots_help_prints_its_options_and_writes_nothing() -> None:
    """``docs/screenshots.py --help`` exits 0 with its usage; it once took every screenshot."""
    images = ROOT / "docs" / "images"
    before = {p.name: p.stat().st_mtime_ns for p in images.iterdir()}
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "screenshots.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert done.returncode == 0, done.stderr
    assert "--diff-only" in done.stdout and "--oom-ranks-only" in done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in images.iterdir()} == before
