"""What reading a trace costs in imports: ``ckview summary`` and ``ckview export --csv`` load
neither Qt nor torch (the application model, ``ckview.app``, is Qt-free; issue 24)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACE = str(ROOT / "sample_traces" / "transformer_compare.h5")


@pytest.mark.parametrize(
    "argv",
    [
        ["summary", TRACE],
        ["summary", "--json", TRACE],
        ["export", TRACE, "--plan", "sqrt", "--csv", "{tmp}/c.csv"],
        ["project", TRACE, "--plan", "sqrt"],
        ["plan", TRACE, "--budget", "60%"],
    ],
)
def test_reading_verbs_import_neither_qt_nor_torch(tmp_path: Path, argv: list[str]) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = (
        "import contextlib, io, sys\n"
        "from ckview.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main({argv!r}) == 0\n"
        "heavy = sorted(m for m in ('torch', 'PyQt6', 'pyqtgraph') if m in sys.modules)\n"
        "assert not heavy, f'imported {heavy}'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    if argv[0] == "export":
        assert [p.name for p in tmp_path.iterdir()] == ["c.csv"]  # and no report.png
