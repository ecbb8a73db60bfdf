"""The trace format: writer/reader round trips, errors on bad files, versioning, validation."""

from __future__ import annotations

import array
import dataclasses
import itertools
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ckview.trace import (
    CorruptTraceError,
    NewerVersionError,
    NotATraceError,
    TraceError,
    TraceKeyError,
    TraceMeta,
    TraceNotFoundError,
    TraceWriter,
    open_trace,
    validate_trace,
)
from ckview.trace.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    META_FIELDS,
    MODULES,
    ROOT_TABLES,
    RUN_TABLES,
    TIMING_TABLES,
    Column,
    MemoryEventKind,
    SavedEventKind,
)
from ckview.trace.writer import _deflate_padded, _shuffle

Rows = dict[str, Any]


# --- a small, fully consistent trace ---------------------------------------------------------


def write_valid_trace(path: Path, **writer_options: Any) -> None:
    """One module call tree, four ops, three storages with matching events."""
    with TraceWriter(
        path, meta={"device": "cpu", "command": ["python", "train.py"]}, **writer_options
    ) as w:
        s = w.intern
        w.append_modules(
            {
                "path": [s(""), s("layer")],
                "type": [s("Net"), s("Linear")],
                "parent": [-1, 0],
                "param_bytes": [0, 64],
                "container": [0, 0],
                "sequential_forward": [0, 0],
            }
        )
        run = w.run("main")
        run.append(
            "steps",
            {
                "step": [0],
                "start_ns": [0],
                "end_ns": [100],
                "first_op": [0],
                "first_memory_event": [0],
                "forwards": [1],
                "backwards": [1],
                "optimizer_steps": [1],
                "complete": [1],
            },
        )
        run.append(
            "module_calls",
            {
                "module": [0, 1],
                "parent": [-1, 0],
                "phase": [0, 0],
                "step": [0, 0],
                "start_ns": [0, 10],
                "end_ns": [100, 50],
                "seq_begin": [0, 0],
                "seq_end": [2, 1],
            },
        )
        run.append(
            "ops",
            {
                "name": [
                    s("aten.mm.default"),
                    s("aten.relu.default"),
                    s("aten.mm.default"),
                    s("aten.add_.Tensor"),
                ],
                "phase": [0, 0, 1, 3],
                "module_call": [1, 1, -1, -1],
                "step": [0, 0, 0, 0],
                "start_ns": [10, 20, 60, 80],
                "end_ns": [15, 25, 65, 85],
                "seq_nr": [-1, -1, 0, -1],
            },
        )
        run.append(
            "storages",
            {
                "nbytes": [256, 64, 64],
                "device": [s("cpu")] * 3,
                "category": [0, 3, 4],
                "dtype": [s("float32")] * 3,
                "shape": [s("8x8"), s("4x4"), s("4x4")],
                "op": [-1, 0, 1],
                "module_call": [-1, 1, 1],
                "module": [1, 1, 1],
                "alloc_ns": [-1, 10, 20],
                "free_ns": [-1, 70, 26],
                "stack": [-1, -1, -1],
            },
        )
        run.append(
            "memory_events",
            {
                "kind": [MemoryEventKind.SEEN, 0, 0, 1, 1],
                "storage": [0, 1, 2, 2, 1],
                "op": [-1, 0, 1, 1, 2],
                "time_ns": [0, 10, 20, 26, 70],
            },
        )
        run.append(
            "saved_events",
            {
                "kind": [SavedEventKind.PACK, SavedEventKind.UNPACK],
                "storage": [1, 1],
                "op": [0, 2],
                "module_call": [1, -1],
                "shape": [s("4x4")] * 2,
                "dtype": [s("float32")] * 2,
                "nbytes": [64, 64],
                "time_ns": [12, 61],
            },
        )
        run.set_attrs(steps_recorded=1)
        run.close()
        w.update_meta(steps_recorded=1, steps_requested=1)


@pytest.fixture
def valid_trace(tmp_path: Path) -> Path:
    path = tmp_path / "valid.h5"
    write_valid_trace(path)
    return path


def assert_one_line_naming(error: BaseException, path: Path) -> None:
    message = str(error)
    assert "\n" not in message
    assert str(path) in message


# --- the spec and the schema agree ----------------------------------------------------------


def test_spec_lists_every_column_with_its_dtype() -> None:
    spec = (Path(__file__).parent.parent / "docs" / "trace-format.md").read_text()
    sections = re.split(r"^#+ ", spec, flags=re.MULTILINE)
    for table, columns in {**ROOT_TABLES, **RUN_TABLES}.items():
        [section] = [s for s in sections if re.match(rf"[\d. ]*`/?{table}`", s)]
        for column in columns:
            row = f"| `{column.name}` | `{column.dtype.str.replace('|', '')}` |"
            assert row in section, f"docs/trace-format.md: {table}.{column.name} {row}"


# --- round trips -----------------------------------------------------------------------------


def column_data(column: Column, rows: int) -> st.SearchStrategy[np.ndarray]:
    return arrays(column.dtype, rows)


@st.composite
def table_data(draw: st.DrawFn, columns: tuple[Column, ...]) -> dict[str, np.ndarray]:
    rows = draw(st.integers(0, 40))
    return {c.name: draw(column_data(c, rows)) for c in columns}


def batches(data: dict[str, np.ndarray], cuts: list[int]) -> list[dict[str, np.ndarray]]:
    rows = len(next(iter(data.values())))
    edges = sorted({0, rows, *(c % (rows + 1) for c in cuts)})
    return [{k: v[a:b] for k, v in data.items()} for a, b in itertools.pairwise(edges)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tables=st.fixed_dictionaries(
        {"modules": table_data(MODULES)} | {t: table_data(c) for t, c in RUN_TABLES.items()}
    ),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    threads=st.sampled_from([None, 0]),
    flush_between=st.booleans(),
)
def test_every_table_round_trips(
    tables: dict[str, dict[str, np.ndarray]],
    cuts: list[int],
    threads: int | None,
    flush_between: bool,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.h5"
        # Tiny chunks so that batches straddle chunk boundaries and partial chunks get flushed.
        with TraceWriter(path, chunk_rows=8, threads=threads) as w:
            run = w.run("main")
            for table, data in tables.items():
                for batch in batches(data, cuts):
                    if table == "modules":
                        w.append_modules(batch)
                    else:
                        run.append(table, batch)
                    if flush_between:
                        w.flush()
        with open_trace(path) as t:
            for table, data in tables.items():
                got = t.modules if table == "modules" else t.run("main").table(table)
                assert len(got) == len(data["path" if table == "modules" else got.columns[0]])
                read = got.read(check=False)  # random values: a round trip, not a valid trace
                assert tuple(read) == got.columns == tuple(data)
                for name, values in data.items():
                    assert read[name].dtype == values.dtype
                    np.testing.assert_array_equal(read[name], values)


@pytest.mark.parametrize("threads", [None, 0])
@pytest.mark.parametrize("flush_between", [False, True])
def test_patched_rows_read_back(tmp_path: Path, threads: int | None, flush_between: bool) -> None:
    """RunWriter.patch writes rows appended before again, wherever they are: in whole chunks on
    disk, in the partial last chunk in memory, or in one flushed (NOTE [ Kept rows ] in
    recorder/storage_rows.py)."""
    columns = RUN_TABLES["storages"]
    data = {c.name: np.arange(20, dtype=c.dtype) for c in columns}
    rows = np.array([0, 6, 9, 17, 19])
    new = {c.name: np.full(len(rows), 7, dtype=c.dtype) for c in columns}
    path = tmp_path / "t.h5"
    with TraceWriter(path, chunk_rows=8, threads=threads) as w:
        run = w.run("main")
        for batch in batches(data, [7]):
            run.append("storages", batch)
            if flush_between:
                w.flush()
        run.patch("storages", rows, new)
        with pytest.raises(ValueError, match="beyond"):
            run.patch("storages", np.array([20]), {c.name: [1] for c in columns})
    with open_trace(path) as t:
        read = t.run("main").table("storages").read(check=False)
    for c in columns:
        expected = data[c.name].copy()
        expected[rows] = 7
        np.testing.assert_array_equal(read[c.name], expected)


def test_many_chunks_round_trip(tmp_path: Path) -> None:
    """Full 64 Ki-row chunks (compressed on threads) and a partial one, in odd-sized batches."""
    rng = np.random.default_rng(0)
    rows = 200_000
    data = {
        "kind": rng.integers(0, 3, rows),
        "storage": rng.integers(0, 5000, rows),
        "op": rng.integers(-1, 9000, rows),
        "time_ns": np.cumsum(rng.integers(0, 900, rows)),
    }
    path = tmp_path / "big.h5"
    with TraceWriter(path) as w:
        run = w.run("main")
        for start in range(0, rows, 50_000 - 1):
            run.append("memory_events", {k: v[start : start + 49_999] for k, v in data.items()})
            w.flush()
    with open_trace(path) as t:
        read = (
            t.run("main").table("memory_events").read(check=False)
        )  # a storage round trip, no storages table
    for name, values in data.items():
        np.testing.assert_array_equal(read[name], values)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["<i1", "<u1", "<i2", "<i4", "<i8", "<f4", "<f8"]),
    rows=st.integers(1, 600),
    padding=st.integers(1, 2000),
    level=st.integers(1, 9),
    data=st.data(),
)
def test_a_partial_chunk_deflates_as_hdf5_would(
    dtype: str, rows: int, padding: int, level: int, data: st.DataObject
) -> None:
    """NOTE [ A partial chunk, deflated without its padding ]: the pieces' zlib stream inflates
    to the shuffled chunk, zeros included, and its checksum holds (zlib checks it)."""
    values = data.draw(arrays(dtype, rows))
    padded = np.zeros(rows + padding, dtype)
    padded[:rows] = values
    blob = _deflate_padded(values, rows + padding, level)
    assert zlib.decompress(blob) == _shuffle(padded)


def test_chunks_fit_a_table_first_written_at_close(tmp_path: Path) -> None:
    """NOTE [ Datasets made when first written ]: a table that reaches the disk only when the
    file closes gets chunks that fit its rows; one with a whole chunk written during the run,
    or flushed while the run goes on, the usual 64 Ki rows. Every column of every table is a
    dataset in the closed file, empty tables too."""
    events = {"kind": np.zeros(70_000, np.int64), "storage": np.arange(70_000)}
    events |= {"op": np.arange(70_000), "time_ns": np.arange(70_000)}
    steps = {c.name: np.arange(3, dtype=c.dtype) for c in RUN_TABLES["steps"]}
    calls = {c.name: np.arange(1500, dtype=c.dtype) for c in RUN_TABLES["module_calls"]}
    with TraceWriter(tmp_path / "t.h5") as w:
        early = w.run("early")
        early.append("module_calls", calls)
        w.flush()
        early.append("module_calls", calls)
        run = w.run("main")
        run.append("memory_events", events)
        run.append("steps", steps)
    with h5py.File(tmp_path / "t.h5", "r") as f:
        main, early_run = f["runs"]["main"], f["runs"]["early"]
        assert main["memory_events"]["op"].chunks == (65536,)
        assert main["steps"]["step"].chunks == (1024,)
        assert early_run["module_calls"]["module"].chunks == (65536,)
        assert len(early_run["module_calls"]["module"]) == 3000
        for run_group in (main, early_run):
            for table, columns in RUN_TABLES.items():
                assert set(run_group[table]) == {c.name for c in columns}, table
        assert main["ops"]["name"].shape == (0,)
    with open_trace(tmp_path / "t.h5") as t:
        read = t.run("main").table("memory_events").read(check=False)
    np.testing.assert_array_equal(read["time_ns"], events["time_ns"])


def test_file_is_plain_hdf5_with_documented_layout(valid_trace: Path) -> None:
    with h5py.File(valid_trace, "r") as f:
        assert f.attrs["format"] == FORMAT_NAME
        assert f.attrs["format_version"] == FORMAT_VERSION
        assert f["meta"].attrs["ckview_type"] == "ckview.meta"
        assert f["strings"].attrs["ckview_type"] == "ckview.strings"
        assert f["modules"].attrs["ckview_type"] == "ckview.table"
        run = f["runs"]["main"]
        assert (run.attrs["ckview_type"], run.attrs["ckview_type_version"]) == ("ckview.run", 1)
        ops = run["ops"]["start_ns"]
        assert ops.maxshape == (None,)
        assert (ops.compression, ops.shuffle) == ("gzip", True)


def test_meta_round_trips_with_types(valid_trace: Path) -> None:
    with open_trace(valid_trace) as t:
        meta = t.meta
        assert t.format_version == FORMAT_VERSION
        assert t.path == str(valid_trace)
    assert meta.command == ["python", "train.py"]
    assert meta.complete is True
    assert meta.error == ""
    assert (meta.device, meta.steps_recorded, meta.steps_requested, meta.warmup) == ("cpu", 1, 1, 0)
    assert isinstance(meta.steps_recorded, int)
    assert meta.start_time and meta.python_version
    assert [f.name for f in dataclasses.fields(TraceMeta)] == list(META_FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.device = "cuda"  # type: ignore[misc]


def test_meta_rejects_bad_fields(tmp_path: Path) -> None:
    for bad in ({"nope": 1}, {"warmup": "2"}, {"command": "python x.py"}, {"complete": True}):
        with pytest.raises((ValueError, TypeError)):
            TraceWriter(tmp_path / "m.h5", meta=bad)
    with TraceWriter(tmp_path / "m.h5") as w, pytest.raises(ValueError, match="close"):
        w.update_meta(error="x")


def test_writer_reports_an_uncreatable_file(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "t.h5"
    with pytest.raises(TraceError, match="No such file or directory") as caught:
        TraceWriter(path)
    assert_one_line_naming(caught.value, path)


def test_append_casts_array_likes_and_rejects_bad_batches(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "c.h5") as w:
        run = w.run("main")
        run.append(
            "memory_events",
            {
                "kind": [0, 1],
                "storage": array.array("i", [3, 4]),
                "op": np.array([1, 2], np.uint64),
                "time_ns": np.array([5, 6], np.int16),
            },
        )
        bad_batches: list[Rows] = [
            {"kind": [0], "storage": [0], "op": [0]},  # missing column
            {"kind": [0], "storage": [0], "op": [0], "time_ns": [0], "extra": [0]},
            {"kind": [0, 1], "storage": [0], "op": [0], "time_ns": [0]},  # unequal lengths
            {"kind": [256], "storage": [0], "op": [0], "time_ns": [0]},  # does not fit uint8
            {"kind": [0], "storage": [0.5], "op": [0], "time_ns": [0]},  # not integers
            {"kind": [[0]], "storage": [[0]], "op": [[0]], "time_ns": [[0]]},  # not 1-D
        ]
        for batch in bad_batches:
            with pytest.raises(ValueError):
                run.append("memory_events", batch)
        with pytest.raises(ValueError, match="unknown table"):
            run.append("nope", {})
    with open_trace(tmp_path / "c.h5") as t:
        read = t.run("main").table("memory_events").read(check=False)
    assert {k: v.tolist() for k, v in read.items()} == {
        "kind": [0, 1],
        "storage": [3, 4],
        "op": [1, 2],
        "time_ns": [5, 6],
    }
    assert read["kind"].dtype == np.uint8


def test_column_reads_only_the_slice_asked(
    valid_trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[object] = []
    original = h5py.Dataset.__getitem__

    def spy(self: h5py.Dataset, key: object) -> Any:
        asked.append(key)
        return original(self, key)

    with open_trace(valid_trace) as t:
        table = t.run("main").table("memory_events")
        full = table.column("time_ns")
        monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
        np.testing.assert_array_equal(table.column("time_ns", 1, 3), full[1:3])
        assert asked == [slice(1, 3)]
        for start, stop in [(None, None), (-2, None), (3, 1), (0, 99), (-99, 2), (5, 5)]:
            np.testing.assert_array_equal(table.column("time_ns", start, stop), full[start:stop])
        subset = table.read(1, 4, columns=["kind", "op"])
        assert list(subset) == ["kind", "op"]
        np.testing.assert_array_equal(subset["op"], [0, 1, 1])
        with pytest.raises(TraceKeyError, match="no column"):
            table.column("nope")


# --- strings ---------------------------------------------------------------------------------


def test_strings_are_interned_and_looked_up(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    with TraceWriter(path) as w:
        ids = [w.intern(s) for s in ["aten.mm.default", "", "größe ∑", "aten.mm.default"]]
        assert ids == [0, 1, 2, 0]
        w.flush()
        copy = tmp_path / "copy.h5"
        shutil.copy(path, copy)
        assert w.intern("late") == 3
    with open_trace(copy) as t:
        assert list(t.strings) == ["aten.mm.default", "", "größe ∑"]
    with open_trace(path) as t:
        strings = t.strings
        assert len(strings) == 4
        assert strings[2] == "größe ∑"
        looked = strings.lookup(np.array([[3, 0], [1, 1]], np.int32))
        assert looked.dtype == object and looked.shape == (2, 2)
        assert looked.tolist() == [["late", "aten.mm.default"], ["", ""]]
        assert strings.lookup([]).shape == (0,)
        for bad in (-1, 4):
            with pytest.raises(IndexError, match="out of range"):
                strings[bad]
            with pytest.raises(IndexError, match="out of range"):
                strings.lookup(np.array([0, bad]))


# --- runs ------------------------------------------------------------------------------------


def test_several_runs_keep_names_and_order(tmp_path: Path) -> None:
    names = ["baseline", "checkpointed", "plan:sqrt", "odd/name", ".dot", "100%"]
    path = tmp_path / "r.h5"
    with TraceWriter(path) as w:
        for i, name in enumerate(names):
            run = w.run(name)
            assert w.run(name) is run
            run.append(
                "steps",
                {
                    "step": [i],
                    "start_ns": [0],
                    "end_ns": [1],
                    "first_op": [0],
                    "first_memory_event": [0],
                    "forwards": [1],
                    "backwards": [1],
                    "optimizer_steps": [1],
                    "complete": [1],
                },
            )
            run.set_attrs(steps_recorded=i)
            if name != "checkpointed":
                run.close()
        with pytest.raises(ValueError, match="closed"):
            w.run("baseline").append("steps", {})
        with pytest.raises(ValueError):
            w.run("")
    with h5py.File(path, "r") as f:
        assert "plan:sqrt" in f["runs"] and "odd%2Fname" in f["runs"] and "%2Edot" in f["runs"]
    with open_trace(path) as t:
        assert t.run_names == names
        for i, name in enumerate(names):
            read = t.run(name)
            assert (read.name, read.steps_recorded) == (name, i)
            assert read.complete is (name != "checkpointed")
            assert read.table("steps").column("step").tolist() == [i]
        with pytest.raises(TraceKeyError) as caught:
            t.run("plan:nope")
        with pytest.raises(TraceKeyError):
            t.run("main").table("nope")
    assert isinstance(caught.value, KeyError)
    assert_one_line_naming(caught.value, path)
    assert "'plan:sqrt'" in str(caught.value) and "'baseline'" in str(caught.value)


# --- incomplete traces -----------------------------------------------------------------------


def test_exception_in_writer_leaves_a_readable_incomplete_trace(tmp_path: Path) -> None:
    path = tmp_path / "crash.h5"
    with pytest.raises(RuntimeError), TraceWriter(path) as w:
        run = w.run("main")
        run.append("memory_events", {"kind": [0], "storage": [0], "op": [-1], "time_ns": [5]})
        raise RuntimeError("out of memory")
    with open_trace(path) as t:
        assert t.meta.complete is False
        assert t.meta.error == "RuntimeError: out of memory"
        read = t.run("main")
        assert read.complete is False
        assert read.table("memory_events").column("time_ns").tolist() == [5]
        assert len(read.table("ops")) == 0
    report = validate_trace(path)
    assert "trace is incomplete: RuntimeError: out of memory" in report.notes


def test_flushed_file_is_readable_while_writing(tmp_path: Path) -> None:
    path, snapshot = tmp_path / "live.h5", tmp_path / "snapshot.h5"
    with TraceWriter(path) as w:
        run = w.run("main")
        run.append(
            "ops",
            {
                "name": [w.intern("aten.mm.default")],
                "phase": [0],
                "module_call": [-1],
                "step": [0],
                "start_ns": [1],
                "end_ns": [2],
                "seq_nr": [-1],
            },
        )
        w.flush()
        shutil.copy(path, snapshot)  # what a crash right now would leave behind
    with open_trace(snapshot) as t:
        assert t.meta.complete is False
        assert t.strings.lookup(t.run("main").table("ops").column("name")).tolist() == [
            "aten.mm.default"
        ]


def test_interrupted_append_keeps_columns_equal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "interrupted.h5"
    original = h5py.Dataset.__setitem__
    calls = []

    def interrupt_second_column(self: h5py.Dataset, key: object, value: object) -> None:
        calls.append(key)
        if len(calls) == 2:  # Ctrl-C after the first column of the batch was written
            raise KeyboardInterrupt
        original(self, key, value)

    batch = {"kind": [0], "storage": [0], "op": [0], "time_ns": [0]}
    with pytest.raises(KeyboardInterrupt), TraceWriter(path, threads=0) as w:
        run = w.run("main")
        run.append("memory_events", batch)
        monkeypatch.setattr(h5py.Dataset, "__setitem__", interrupt_second_column)
        run.append("memory_events", batch)
    monkeypatch.undo()
    with open_trace(path) as t:
        assert t.meta.error == "KeyboardInterrupt"
        read = t.run("main").table("memory_events").read(check=False)  # raises if lengths differ
    assert {name: len(values) for name, values in read.items()} == dict.fromkeys(batch, 1)


def test_chunks_compressed_meanwhile_survive_an_interrupted_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [ Chunks compressed while the caller runs on ]: a batch's whole chunks are written
    at the next append; Ctrl-C while writing them leaves the columns equal, the next append is
    not made, and closing the file writes them."""
    path = tmp_path / "later.h5"
    rows = 20  # two whole chunks of 8 rows, and 4 in the tail
    first = {"kind": [0] * rows, "storage": list(range(rows)), "op": [1] * rows}
    first["time_ns"] = list(range(100, 100 + rows))
    original = h5py.Dataset.resize
    calls = []

    def interrupt_second_column(self: h5py.Dataset, *args: Any, **kwargs: Any) -> None:
        calls.append(args)
        if len(calls) == 2:  # the first column is resized for the chunks, then Ctrl-C
            raise KeyboardInterrupt
        original(self, *args, **kwargs)

    with pytest.raises(KeyboardInterrupt), TraceWriter(path, chunk_rows=8, threads=2) as w:
        run = w.run("main")
        run.append("memory_events", first)
        monkeypatch.setattr(h5py.Dataset, "resize", interrupt_second_column)
        run.append("memory_events", {name: values[:1] for name, values in first.items()})
    monkeypatch.undo()
    with open_trace(path) as t:
        assert t.meta.error == "KeyboardInterrupt"
        read = t.run("main").table("memory_events").read(check=False)  # raises if lengths differ
    for name, values in first.items():
        np.testing.assert_array_equal(read[name], values, err_msg=name)


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "c.h5")
    run = w.run("main")
    w.close(complete=False, error="stopped")
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.intern("x")
    with pytest.raises(ValueError, match="closed"):
        run.set_attrs(steps_recorded=1)
    with open_trace(tmp_path / "c.h5") as t:
        assert (t.meta.complete, t.meta.error) == (False, "stopped")
        assert t.run("main").complete is False  # closed by the writer, not by the recorder


# --- files that are not (good) traces --------------------------------------------------------


def plain_hdf5(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)


def text_file(path: Path) -> None:
    path.write_text("not a trace\n" * 100)


def empty_file(path: Path) -> None:
    path.write_bytes(b"")


def other_format(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "memray"


def truncated(keep: float | int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        full = path.with_name("full.h5")
        write_valid_trace(full)
        data = full.read_bytes()
        path.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])

    return make


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (plain_hdf5, NotATraceError, "no 'format' attribute"),
        (text_file, NotATraceError, "not an HDF5 file"),
        (other_format, NotATraceError, "'memray'"),
        (empty_file, CorruptTraceError, "empty"),
        (truncated(0.5), CorruptTraceError, "truncated"),
        (truncated(1000), CorruptTraceError, "truncated"),
        (truncated(8), CorruptTraceError, "truncated"),
    ],
)
def test_bad_files_raise_one_line_errors(
    tmp_path: Path, make: Callable[[Path], None], error: type[TraceError], words: str
) -> None:
    path = tmp_path / "bad.h5"
    make(path)
    with pytest.raises(error) as caught:
        open_trace(path)
    assert words in str(caught.value)
    assert_one_line_naming(caught.value, path)
    with pytest.raises(error):
        validate_trace(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceNotFoundError) as caught:
        open_trace(tmp_path / "nope.h5")
    assert isinstance(caught.value, FileNotFoundError)
    assert_one_line_naming(caught.value, tmp_path / "nope.h5")
    with pytest.raises(NotATraceError, match="directory"):
        open_trace(tmp_path)


def set_attr(path: Path, where: str, name: str, value: Any) -> None:
    with h5py.File(path, "r+") as f:
        f[where].attrs[name] = value


def test_newer_format_version_is_rejected(valid_trace: Path) -> None:
    set_attr(valid_trace, "/", "format_version", 99)
    with pytest.raises(NewerVersionError) as caught:
        open_trace(valid_trace)
    assert "v99" in str(caught.value) and "upgrade ckview" in str(caught.value)
    assert_one_line_naming(caught.value, valid_trace)


def test_newer_group_type_version_is_rejected(valid_trace: Path) -> None:
    set_attr(valid_trace, "/runs/main/ops", "ckview_type_version", 2)
    with open_trace(valid_trace) as t, pytest.raises(NewerVersionError, match=r"ckview\.table v2"):
        t.run("main").table("ops")


def test_a_version_without_migration_is_damaged(valid_trace: Path) -> None:
    set_attr(valid_trace, "/", "format_version", 0)
    with pytest.raises(CorruptTraceError, match="unknown trace format v0"):
        open_trace(valid_trace)


V1_TRACES = sorted((Path(__file__).parent / "data" / "traces_v1").glob("*.h5"))


@pytest.mark.parametrize("path", V1_TRACES, ids=lambda p: p.stem)
def test_version_1_files_read_through_the_migration(path: Path) -> None:
    """NOTE [ Migrations build views ]: a v1 file reads as current, with "unknown" values."""
    report = validate_trace(path)
    assert report.ok, report.problems
    with open_trace(path) as t:
        assert t.format_version == 1
        assert (t.meta.step_rule, t.meta.compiled) == ("", "")
        modules = t.modules.read()
        types = t.strings.lookup(modules["type"])
        assert set(modules) == {c.name for c in MODULES}
        assert all(modules[c.name].dtype == c.dtype for c in MODULES)
        expected = np.select(
            [types == "Sequential", types == "ModuleList", types == "ModuleDict"], [1, 2, 3], 0
        )
        np.testing.assert_array_equal(modules["container"], expected)
        np.testing.assert_array_equal(modules["sequential_forward"], types == "Sequential")
        for name in t.run_names:
            run = t.run(name)
            assert run.checkpointing == ""
            steps = run.table("steps").read()
            assert len(steps["step"]) == run.steps_recorded
            for column in ("forwards", "backwards", "optimizer_steps"):
                assert (steps[column] == -1).all()
            assert (steps["complete"] == 1).all()
            assert steps["complete"].dtype == np.uint8
    with h5py.File(path, "r") as f:  # read-only: nothing was written
        assert "container" not in f["modules"]


def test_version_1_files_are_kept() -> None:
    assert {p.stem for p in V1_TRACES} >= {"mlp", "transformer_compare"}


V2_TRACES = sorted((Path(__file__).parent / "data" / "traces_v2").glob("*.h5"))


@pytest.mark.parametrize("path", V2_TRACES, ids=lambda p: p.stem)
def test_version_2_files_read_through_the_migration(path: Path) -> None:
    """NOTE [ Migrations build views ]: a v2 file reads as v3, its timing tables empty and the
    checkpoint call cost unknown."""
    report = validate_trace(path)
    assert report.ok, report.problems
    with open_trace(path) as t:
        assert t.format_version == 2
        meta = t.meta
        cost = (meta.checkpoint_call_ns, meta.checkpoint_call_low_ns, meta.checkpoint_call_high_ns)
        assert cost == (-1, -1, -1)
        assert t.meta.step_rule  # v2's own fields are stored
        for name in t.run_names:
            for table in TIMING_TABLES:
                columns = t.run(name).table(table).read()
                assert set(columns) == {c.name for c in RUN_TABLES[table]}
                assert all(
                    len(v) == 0 and v.dtype == c.dtype
                    for c, v in zip(RUN_TABLES[table], columns.values(), strict=True)
                )
    with h5py.File(path, "r") as f:  # read-only: nothing was written
        assert "timing_steps" not in f["runs"][next(iter(f["runs"]))]


def test_version_2_files_are_kept() -> None:
    assert {p.stem for p in V2_TRACES} >= {"mlp", "transformer_compare"}


V3_TRACES = sorted((Path(__file__).parent / "data" / "traces_v3").glob("*.h5"))


@pytest.mark.parametrize("path", V3_TRACES, ids=lambda p: p.stem)
def test_version_3_files_read_through_the_migration(path: Path) -> None:
    """NOTE [ Migrations build views ]: a v3 file reads as v4, with ``allocator_events`` unknown
    (its storages are what the op hook saw)."""
    report = validate_trace(path)
    assert report.ok, report.problems
    with open_trace(path) as t:
        assert t.format_version == 3
        assert t.meta.allocator_events == ""
        assert t.meta.checkpoint_call_ns > 0  # v3's own fields are stored
    with h5py.File(path, "r") as f:  # read-only: nothing was written
        assert "allocator_events" not in f["meta"].attrs


def test_version_3_files_are_kept() -> None:
    assert {p.stem for p in V3_TRACES} >= {"mlp", "transformer_compare"}


V4_TRACES = sorted((Path(__file__).parent / "data" / "traces_v4").glob("*.h5"))


@pytest.mark.parametrize("path", V4_TRACES, ids=lambda p: p.stem)
def test_version_4_files_read_through_the_migration(path: Path) -> None:
    """A v4 file (the sample traces as v4 wrote them) reads as v5, its allocator settings
    unknown."""
    report = validate_trace(path)
    assert report.ok, report.problems
    with open_trace(path) as t:
        assert t.format_version == 4
        assert t.meta.allocator_settings == ""
        assert t.meta.allocator_events == "allocator"  # v4's own fields are stored
    with h5py.File(path, "r") as f:  # read-only: nothing was written
        assert "allocator_settings" not in f["meta"].attrs


def test_version_4_files_are_kept() -> None:
    assert {p.stem for p in V4_TRACES} >= {"mlp", "transformer_compare"}


def test_damaged_meta_is_corrupt(valid_trace: Path) -> None:
    with h5py.File(valid_trace, "r+") as f:
        del f["meta"].attrs["device"]
    with pytest.raises(CorruptTraceError, match="device"):
        open_trace(valid_trace)


# --- validation ------------------------------------------------------------------------------


def test_valid_trace_validates(valid_trace: Path) -> None:
    report = validate_trace(valid_trace)
    assert report.problems == []
    assert report.ok
    assert report.notes == []


def corrupt_column(table: str, column: str, row: int, value: int) -> Callable[[h5py.File], None]:
    def apply(f: h5py.File) -> None:
        group = f["modules"] if table == "modules" else f["runs/main"][table]
        group[column][row] = value

    return apply


def shorten(f: h5py.File) -> None:
    f["runs/main/ops/end_ns"].resize((2,))


def drop_column(f: h5py.File) -> None:
    del f["runs/main/storages/nbytes"]


def widen_dtype(f: h5py.File) -> None:
    group = f["runs/main/steps"]
    values = group["step"][...]
    del group["step"]
    group.create_dataset("step", data=values.astype(np.int64), maxshape=(None,))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (corrupt_column("memory_events", "storage", 0, 999), "memory_events.storage has 1 values"),
        (corrupt_column("memory_events", "op", 1, -2), "memory_events.op"),
        (corrupt_column("ops", "module_call", 0, 2), "ops.module_call"),
        (corrupt_column("modules", "parent", 1, 5), "modules.parent"),
        (corrupt_column("module_calls", "module", 0, 2), "module_calls.module"),
        (corrupt_column("saved_events", "storage", 1, 3), "saved_events.storage"),
        (corrupt_column("storages", "op", 1, 4), "storages.op"),
        (corrupt_column("ops", "name", 0, 1000), "ops.name has 1 values outside strings"),
        (corrupt_column("storages", "category", 0, 11), "not a Category"),
        (corrupt_column("ops", "phase", 0, 9), "not a Phase"),
        (corrupt_column("memory_events", "kind", 0, 3), "not a MemoryEventKind"),
        (corrupt_column("memory_events", "time_ns", 2, 5), "time_ns decreases 1 times"),
        (corrupt_column("memory_events", "kind", 3, 0), "more than one ALLOC/SEEN"),
        (corrupt_column("memory_events", "kind", 1, 1), "more than one FREE"),
        (corrupt_column("memory_events", "kind", 0, 1), "FREE events before any ALLOC"),
        (shorten, "unequal lengths (name=4, phase=4, module_call=4"),
        (drop_column, "no 1-D column 'nbytes'"),
        (widen_dtype, "has dtype int64, expected int32"),
    ],
)
def test_validation_finds_damage(
    valid_trace: Path, damage: Callable[[h5py.File], None], expected: str
) -> None:
    with h5py.File(valid_trace, "r+") as f:
        damage(f)
    report = validate_trace(valid_trace)
    assert not report.ok
    assert any(expected in problem for problem in report.problems), report.problems


def test_damaged_table_raises_when_read(valid_trace: Path) -> None:
    with h5py.File(valid_trace, "r+") as f:
        shorten(f)
    with open_trace(valid_trace) as t:
        assert len(t.run("main").table("steps")) == 1  # other tables stay readable
        with pytest.raises(CorruptTraceError) as caught:
            t.run("main").table("ops")
    assert "unequal lengths" in str(caught.value)
    assert_one_line_naming(caught.value, valid_trace)


def test_unsorted_steps_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "steps.h5"
    with TraceWriter(path) as w:
        w.run("main").append(
            "steps",
            {
                "step": [1, 0],
                "start_ns": [5, 0],
                "end_ns": [9, 4],
                "first_op": [0, 0],
                "first_memory_event": [0, 0],
                "forwards": [1, 1],
                "backwards": [1, 1],
                "optimizer_steps": [1, 1],
                "complete": [1, 1],
            },
        )
    problems = validate_trace(path).problems
    assert any("step does not increase" in p for p in problems)
    assert any("start_ns decreases" in p for p in problems)
