"""Shared test helpers: loading examples, reading a run's tables, the explorer window; which
test files need torch or Qt (NOTE [ Test markers ]).

Imports neither torch nor Qt at module level: the torch-free tests run where neither is
installed."""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# One intra-op thread per test process: the workers (pytest-xdist) share the cores, and a
# two-thread torch step on two busy cores sometimes runs 100x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

CKVIEW = [sys.executable, "-m", "ckview"]
"""The ``ckview`` command, run by this interpreter."""

# One intra-op thread: float sums then do not depend on how many threads MKL's dynamic
# threading hands out on a loaded machine, so two recordings of a script print equal losses.
DETERMINISTIC = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONPATH": str(ROOT),
}
"""The environment of a ``ckview`` subprocess (this checkout's ckview, from any folder)."""


def ckview(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``ckview ARGS`` in a subprocess (``DETERMINISTIC``); its exit code and output."""
    return subprocess.run(
        [*CKVIEW, *args], capture_output=True, text=True, cwd=cwd, timeout=600, env=DETERMINISTIC
    )


# NOTE [ Test markers ]
# A test file that needs torch (it records, checkpoints, or runs a script that does) or Qt
# (widgets, the report figure) says so in one line after its imports: ``pytestmark =
# pytest.mark.torch``, ``pytest.mark.gui``, or a list of both. That line is the one place that
# decides: pytest marks the file's tests with it, so ``pytest -m "not torch and not gui"`` runs
# the trace, analysis, application-model and CLI-reading tests alone; and where the package a
# marker needs is not installed, the file is not collected at all (``pytest_ignore_collect``
# reads the line from the file's source, as its module-level imports would fail), which the
# session header reports. A test in a file that needs neither may carry the marker itself
# (``@pytest.mark.gui``) when only it needs the package, inside its body or a subprocess.
# tests/test_markers.py checks that every file importing torch, the recorder, Qt or the GUI
# carries its marker. A file that tests what the recorder records adds ``pytest.mark.recorder``
# to the list: CI runs those files a second time with ``CKVIEW_RECORDER=python``, so both
# recorder paths are held to them.

NATIVE = os.environ.get("CKVIEW_RECORDER", "auto").strip().lower() != "python"
"""Whether recordings in this test run take the native path (the default, ``auto``; CI builds
it first) or the Python recorder (``CKVIEW_RECORDER=python``)."""

NEEDS_COMPILER = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None,
    reason="no C++ compiler: the native recorder cannot be built here",
)

PYTHON_PATH_ONLY = pytest.mark.skipif(
    NATIVE,
    reason="the Python recorder's forced eager (NOTE [ torch.compile under the recorder ]); "
    "tests/test_recorder_compile_native.py holds the native path to running compiled",
)
"""For a test of how the Python recorder runs compiled code eagerly (NOTE [ Test markers ])."""

MARKER_PACKAGES = {"torch": ("torch",), "gui": ("PyQt6", "pyqtgraph", "pytestqt")}
"""The packages each marker stands for (NOTE [ Test markers ])."""


def file_markers(path: Path) -> set[str]:
    """The markers of ``MARKER_PACKAGES`` that a test file's module-level ``pytestmark`` names
    (NOTE [ Test markers ])."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            names = (n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute))
            return {name for name in names if name in MARKER_PACKAGES}
    return set()


@functools.cache
def missing_packages(marker: str) -> tuple[str, ...]:
    """The packages ``marker`` needs that are not installed here."""
    return tuple(p for p in MARKER_PACKAGES[marker] if importlib.util.find_spec(p) is None)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out a test file whose marker needs a package not installed here."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if any(missing_packages(m) for m in file_markers(collection_path)):
        return True
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    missing = sorted({p for m in MARKER_PACKAGES for p in missing_packages(m)})
    if not missing:
        return None
    return (
        f"not installed: {', '.join(missing)}; the test files that need them are not "
        "collected (NOTE [ Test markers ] in tests/conftest.py)"
    )


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"ckview_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


FIXTURES = (ROOT / "sample_traces", ROOT / "tests" / "data")
"""Folders of trace files that tests only read."""


def read_run(path: Path, run: str = "main") -> dict[str, Any]:
    """All tables of one run, plus the trace's modules, strings and meta.

    A run of a fixture trace (``FIXTURES``) is read once per session (opening and reading a
    sample trace takes about a second, and many tests read the same ones); each call gets its
    own deep copy, so a test that changes its tables changes nobody else's."""
    path = Path(path).resolve()
    if path.parent.is_relative_to(FIXTURES[0]) or path.parent.is_relative_to(FIXTURES[1]):
        return copy.deepcopy(_read_fixture(path, run, path.stat().st_mtime_ns))
    return _read_run(path, run)


@functools.cache
def _read_fixture(path: Path, run: str, mtime_ns: int) -> dict[str, Any]:
    """``_read_run`` of a fixture, cached by path, run and modification time."""
    return _read_run(path, run)


def _read_run(path: Path, run: str) -> dict[str, Any]:
    from ckview.trace import open_trace

    with open_trace(path) as trace:
        tables = trace.read_run(run)
        tables["meta"] = trace.meta
    return tables


def copy_on_two_devices(source: Path, out: Path) -> Any:
    """``source``'s run with its INPUT storages left on the CPU and all others on cuda:0, as a
    CUDA recording would hold them; returns the mask of storages on cuda:0."""
    from ckview.trace import TraceWriter, open_trace
    from ckview.trace.schema import Category

    with open_trace(source) as trace:
        tables = trace.read_run("main", all_devices=True)
        meta = {"device": "cuda", "steps_recorded": trace.meta.steps_recorded}
    writer = TraceWriter(out, meta=meta)
    for text in tables["strings"]:
        writer.intern(text)
    cuda = writer.intern("cuda:0")
    on_cuda = tables["storages"]["category"] != Category.INPUT
    tables["storages"]["device"][on_cuda] = cuda
    write_main_run(writer, tables)
    return on_cuda


def write_main_run(writer: Any, tables: dict[str, Any]) -> None:
    """Write ``tables`` (a run as ``read_run`` gives it) as run ``main`` and close the trace."""
    from ckview.trace.schema import RUN_TABLES

    writer.append_modules(tables["modules"])
    run = writer.run("main")
    for table in RUN_TABLES:
        run.append(table, tables[table])
    run.close()
    writer.close()


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


@pytest.fixture
def window(qtbot: Any, tmp_path: Path) -> Any:
    """A shown explorer window with its own settings file, back in the light theme after."""
    from PyQt6.QtCore import QSettings

    from ckview.app.style import LIGHT
    from ckview.gui.main_window import MainWindow

    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    yield w
    w.set_theme(LIGHT)


def open_trace_in(
    qtbot: Any, w: Any, path: Path, preset: str | None = None, ready: bool = True
) -> None:
    """Open ``path`` in explorer window ``w``, wait until its plan panel is ready (unless not
    ``ready``: a run without a plan model never is), and apply plan ``preset`` if one is
    given."""
    with qtbot.waitSignal(w.loaded, timeout=20000):
        w.open_paths([str(path)])
    if ready:
        qtbot.waitUntil(w.plan.is_ready, timeout=20000)
    if preset is not None:
        w.plan.apply_preset(preset)


def ask_budget(qtbot: Any, w: Any, budget: str, planned: bool = True) -> str:
    """Type a budget in the plan panel, press Enter (waiting for the planner if ``planned``);
    the answer under the field, as its HTML."""
    from PyQt6.QtCore import Qt

    w.plan.budget.setText(budget)
    if planned:
        with qtbot.waitSignal(w.plan._planned, timeout=30000):
            qtbot.keyClick(w.plan.budget, Qt.Key.Key_Return)
    else:
        qtbot.keyClick(w.plan.budget, Qt.Key.Key_Return)
    assert w.plan.budget_note.isVisible()
    return str(w.plan.budget_note.text())
