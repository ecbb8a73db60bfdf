"""The README's commands and CI stay in sync."""

from __future__ import annotations

import re

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
