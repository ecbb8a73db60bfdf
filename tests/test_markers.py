"""Every test file that needs torch or Qt says so (NOTE [ Test markers ] in conftest.py), and
conftest itself imports neither: ``pytest -m "not torch and not gui"`` runs where neither is
installed."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.conftest import file_markers

TESTS = Path(__file__).resolve().parent
NEEDS = {
    "torch": ("torch", "recorder", "ckpt_runtime", "tests.factory", "tests.fake_cuda"),
    "gui": ("PyQt6", "pyqtgraph", "pytestqt", "ckview.gui", "tests.gui_helpers"),
}
"""What a file that imports it needs (NOTE [ Test markers ])."""
WITHOUT = ("ckpt_runtime.plan", "ckpt_runtime.resolve", "ckview.gui.display")
"""Modules under those that import neither torch nor Qt (import-linter contracts)."""
QT_FIXTURES = {"qtbot", "window"}


def _imports(nodes: Iterable[ast.AST]) -> set[str]:
    """Every module the ``nodes`` import (``from a import b``: ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


def _under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def needed(path: Path) -> set[str]:
    """The markers a test file needs by what it imports and the Qt fixtures it asks for."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {n for n in _imports(ast.walk(tree)) if not _under(n, WITHOUT)}
    imported.discard("ckpt_runtime")  # its face is lazy: what is taken from it counts
    out = {marker for marker, roots in NEEDS.items() if any(_under(n, roots) for n in imported)}
    tests = [  # tests and fixtures: where an argument is a fixture
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and (n.name.startswith("test_") or n.decorator_list)
    ]
    if {a.arg for f in tests for a in f.args.args} & QT_FIXTURES:
        out.add("gui")
    return out


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_a_file_that_needs_torch_or_qt_is_marked(path: Path) -> None:
    missing = needed(path) - file_markers(path)
    assert not missing, f"{path.name} needs pytestmark = pytest.mark.{sorted(missing)[0]}"


def test_needed_sees_imports_anywhere_and_qt_fixtures(tmp_path: Path) -> None:
    path = tmp_path / "test_x.py"
    path.write_text("def test_a(qtbot):\n    from recorder import Recorder\n", encoding="utf-8")
    assert needed(path) == {"torch", "gui"}
    path.write_text("def window(start, stop):\n    return start\n", encoding="utf-8")
    assert needed(path) == set()  # a helper's argument is no fixture
    text = "from ckpt_runtime.plan import load_plan\nimport ckview.gui.display\n"
    path.write_text(text, encoding="utf-8")
    assert needed(path) == set()


def test_no_test_file_imports_another() -> None:
    """Shared test code lives in conftest.py or a helper module (factory, synthetic,
    gui_helpers, fake_cuda, snapshot_helpers), never in a test module."""
    for path in TESTS.glob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [n for n in _imports(ast.walk(tree)) if n.startswith("tests.test_")]
        assert not imported, f"{path.name} imports {imported[0]}"


def test_conftest_imports_neither_torch_nor_qt_at_module_level() -> None:
    tree = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    top = _imports(tree.body)  # module level only: fixtures import Qt inside
    heavy = [n for n in top if any(_under(n, roots) for roots in NEEDS.values())]
    assert not heavy, heavy
