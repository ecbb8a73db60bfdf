"""Trace format v4 as far as snapshots need it: root tables ``frames`` and ``stacks``,
``storages.stack``, run table ``segments``, meta ``source``, ``Category.UNKNOWN``, and the
migration that reads v3 files (NOTE [ Migrations build views ])."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from ckview.trace import TraceWriter, open_trace, validate_trace
from ckview.trace.schema import FORMAT_VERSION, ROOT_TABLES, RUN_TABLES, Category

ROOT = Path(__file__).resolve().parent.parent


def _version(path: Path) -> int:
    with h5py.File(path, "r") as f:
        return int(f.attrs["format_version"])


V3_TRACES = sorted(
    p
    for p in [
        *(ROOT / "tests" / "data" / "traces_v3").glob("*.h5"),
        *ROOT.glob("sample_traces/*.h5"),
    ]
    if _version(p) == 3
)


def test_this_is_version_5() -> None:
    assert FORMAT_VERSION == 5
    assert Category.UNKNOWN == 10
    assert set(ROOT_TABLES) == {"modules", "frames", "stacks"}
    assert "segments" in RUN_TABLES and "stack" in [c.name for c in RUN_TABLES["storages"]]


@pytest.mark.skipif(not V3_TRACES, reason="no version-3 trace to read here")
@pytest.mark.parametrize("path", V3_TRACES[:3], ids=lambda p: p.stem)
def test_version_3_files_read_through_the_migration(path: Path) -> None:
    report = validate_trace(path)
    assert report.ok, report.problems
    with open_trace(path) as t:
        assert t.format_version == 3 and t.meta.source == "record"
        for table in ("frames", "stacks"):
            columns = t.root_table(table).read()
            assert set(columns) == {c.name for c in ROOT_TABLES[table]}
            assert all(len(v) == 0 for v in columns.values())
        for name in t.run_names:
            run = t.run(name)
            assert (run.table("storages").column("stack") == -1).all()
            assert run.table("storages").column("stack").dtype == np.int32
            assert len(run.table("segments")) == 0
            tables = t.read_run(name)
            assert {"frames", "stacks", "segments", "modules"} <= set(tables)
    with h5py.File(path, "r") as f:  # read-only: nothing was written
        assert "frames" not in f


def _write(path: Path, parent: list[int]) -> None:
    with TraceWriter(path, {"source": "snapshot"}) as w:
        f = w.intern("a.py")
        w.append_root("frames", {"file": [f, f], "line": [1, 2], "name": [f, f]})
        w.append_root("stacks", {"frame": [0, 1], "parent": parent})
        run = w.run("main")
        run.append(
            "segments",
            {
                "device": [w.intern("cuda:0")],
                "address": [1 << 40],
                "nbytes": [2 << 20],
                "alloc_ns": [-1],
                "free_ns": [-1],
                "stream": [0],
            },
        )


def test_root_tables_round_trip_and_validate(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    _write(path, [-1, 0])
    assert validate_trace(path).ok
    with open_trace(path) as t:
        assert t.meta.source == "snapshot"
        assert t.root_table("stacks").column("parent").tolist() == [-1, 0]
        assert t.root_table("frames").column("line").tolist() == [1, 2]
        assert t.run("main").table("segments").column("nbytes").tolist() == [2 << 20]


def test_a_stack_whose_parent_is_not_earlier_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    _write(path, [1, -1])  # a cycle would need this
    problems = validate_trace(path).problems
    assert any("stacks.parent has 1 values not before their own row" in p for p in problems)


def test_an_unknown_root_table_or_source_is_refused(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        with pytest.raises(ValueError, match="unknown root table"):
            w.append_root("nope", {})
        with pytest.raises(ValueError, match="source"):
            w.update_meta(source="guess")
    with open_trace(tmp_path / "t.h5") as t:
        assert t.meta.source == "record"  # the default
        with pytest.raises(KeyError, match="root tables are modules, frames, stacks"):
            t.root_table("nope")
