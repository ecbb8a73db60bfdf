"""The structure walk is remembered for settled files only (NOTE [ Reading damaged and hostile
files ] in ckview/trace/structure.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import ckview.trace.structure as structure
from ckview.trace.errors import CorruptTraceError

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "mlp.h5"


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths walked, in order (the walk itself is the real one)."""
    seen: list[str] = []
    real = structure._in_fork

    def counting(path: str, limit: int, seconds: float) -> str | None:
        seen.append(path)
        return real(path, limit, seconds)

    monkeypatch.setattr(structure, "_in_fork", counting)
    monkeypatch.setattr(structure, "_passed", {})
    return seen


def _settle(path: Path) -> None:
    old = os.stat(path).st_mtime_ns - 10**10
    os.utime(path, ns=(old, old))


def test_a_just_written_file_is_walked_each_time(tmp_path: Path, walks: list[str]) -> None:
    path = tmp_path / "t.h5"
    shutil.copy(SAMPLE, path)
    structure.check_structure(str(path))
    structure.check_structure(str(path))
    assert len(walks) == 2


def test_a_settled_file_is_walked_once_until_it_changes(tmp_path: Path, walks: list[str]) -> None:
    path = tmp_path / "t.h5"
    shutil.copy(SAMPLE, path)
    _settle(path)
    structure.check_structure(str(path))
    structure.check_structure(str(path))
    assert len(walks) == 1
    with open(path, "r+b") as f:  # a change moves its time on
        f.seek(0, os.SEEK_END)
        f.write(b"\0")
    structure.check_structure(str(path))
    assert len(walks) == 2


def test_a_refused_file_is_never_remembered(tmp_path: Path, walks: list[str]) -> None:
    path = tmp_path / "t.h5"
    data = bytearray(SAMPLE.read_bytes())
    data[:64] = bytes(64)  # no HDF5 superblock
    path.write_bytes(bytes(data))
    _settle(path)
    for _ in range(2):
        with pytest.raises(CorruptTraceError):
            structure.check_structure(str(path))
    assert len(walks) == 2


def test_a_lower_memory_limit_walks_again(
    tmp_path: Path, walks: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.h5"
    shutil.copy(SAMPLE, path)
    _settle(path)
    monkeypatch.setenv("CKVIEW_MEMORY_LIMIT", str(1 << 30))
    structure.check_structure(str(path))
    monkeypatch.setenv("CKVIEW_MEMORY_LIMIT", "1000")
    with pytest.raises(CorruptTraceError, match="CKVIEW_MEMORY_LIMIT"):
        structure.check_structure(str(path))
    assert len(walks) == 2
