"""The recorder's size bounds (issue 20's acceptance), held in CI: a merge that grows a class or
a file past them fails here instead of in a review."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDER = ROOT / "recorder"


def _methods_per_class(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text())
    return {
        f"{path.relative_to(ROOT)}:{node.name}": sum(
            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_recorder_class_has_over_30_methods() -> None:
    counts: dict[str, int] = {}
    for path in sorted(RECORDER.rglob("*.py")):
        counts |= _methods_per_class(path)
    assert counts and {name: n for name, n in counts.items() if n > 30} == {}


def test_recorder_files_stay_small() -> None:
    assert _lines(RECORDER / "session.py") <= 400
    sources = [p for pattern in ("*.py", "*.cpp", "*.h") for p in RECORDER.rglob(pattern)]
    assert any(p.suffix == ".cpp" for p in sources) and any(p.suffix == ".h" for p in sources)
    too_long = {str(p.relative_to(ROOT)): _lines(p) for p in sources}
    assert {name: n for name, n in too_long.items() if n > 600} == {}


def test_the_record_verb_is_small_and_no_verb_imports_it() -> None:
    cli = ROOT / "ckview" / "cli"
    assert _lines(cli / "record.py") <= 250
    importers = [
        path.name
        for path in cli.glob("*.py")
        if path.name not in ("record.py", "main.py")  # main registers every verb
        and any(
            isinstance(node, ast.ImportFrom)
            and (
                node.module == "ckview.cli.record"
                or (node.module == "ckview.cli" and any(a.name == "record" for a in node.names))
                or (node.level == 1 and node.module == "record")
            )
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert importers == []
