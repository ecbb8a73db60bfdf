"""Shared test helpers: loading examples, reading a run's tables."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"ckview_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_run(path: Path, run: str = "main") -> dict[str, Any]:
    """All tables of one run, plus the trace's modules, strings and meta."""
    from ckview.trace import open_trace

    with open_trace(path) as trace:
        tables = trace.read_run(run)
        tables["meta"] = trace.meta
    return tables


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Call ``ckview`` in-process; returns (exit code, stdout, stderr)."""
    from ckview.cli.main import main

    def call(*argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["ckview", *argv])
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return call
