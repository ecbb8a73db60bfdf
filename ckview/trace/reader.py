"""open_trace: the read-only view of a trace, and the only way the rest of ckview reads traces.

Columns are read lazily, slice by slice; nothing of h5py leaks out (numpy arrays, str, int and
small classes only). Every failure to read becomes a one-line ``TraceError``.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from . import _layout as L
from ._layout import TraceMeta
from .checks import value_problems
from .devices import main_device, on_device
from .errors import (
    TraceError,
    TraceKeyError,
    corrupt,
    newer,
    not_a_trace,
    not_found,
    one_line,
)
from .migrations import (
    MIGRATIONS,
    added_table,
    added_values,
    computed_column,
    stored_columns,
)
from .schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    GROUP_TYPES,
    META_FIELDS,
    ROOT_TABLES,
    RUN_STR_FIELDS,
    RUN_TABLES,
)
from .schema import Column as SchemaColumn
from .structure import check_structure
from .text import printable

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def open_trace(path: str | os.PathLike[str]) -> Trace:
    """Open a trace for reading; raise a ``TraceError`` subclass if it cannot be read.

    Use as a context manager, or call ``close()``.
    """
    label = os.fspath(path)
    handle = _open_hdf5(label)
    try:
        return Trace(label, handle)
    except BaseException:
        handle.close()
        raise


@contextmanager
def _reading(path: str) -> Iterator[None]:
    """Turn what h5py raises on a damaged file into CorruptTraceError."""
    try:
        yield
    except TraceError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise corrupt(path, one_line(e)) from e


def _open_hdf5(path: str) -> h5py.File:
    if not os.path.exists(path):
        raise not_found(path)
    if os.path.isdir(path):
        raise not_a_trace(path, "it is a directory", "pass the trace file itself")
    if os.path.getsize(path) == 0:
        raise corrupt(path, "the file is empty")
    try:
        handle = h5py.File(path, "r")
    except OSError as e:  # also PermissionError, BlockingIOError
        raise _open_error(path, e) from e
    try:
        check_structure(path)  # NOTE [ Reading damaged and hostile files ]
    except BaseException:
        handle.close()
        raise
    return handle


def _open_error(path: str, error: OSError) -> TraceError:
    text = one_line(error)
    if "unable to lock file" in text:
        return TraceError(
            f"{path} is locked by another process (a recording still writing it?); wait for it "
            "to finish, or set HDF5_USE_FILE_LOCKING=FALSE to read it anyway",
            path=path,
        )
    if isinstance(error, PermissionError):
        return TraceError(
            f"{path} cannot be read (permission denied); check its permissions", path=path
        )
    if not _has_hdf5_signature(path):
        return not_a_trace(path, "not an HDF5 file")
    inner = re.search(r"\((.*)\)$", text)
    return corrupt(path, f"unable to open: {inner.group(1) if inner else text}")


def _has_hdf5_signature(path: str) -> bool:
    """HDF5 puts its signature at 0, 512, 1024, 2048... (after an optional user block)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            offset = 0
            while offset + len(_HDF5_SIGNATURE) <= size:
                f.seek(offset)
                if f.read(len(_HDF5_SIGNATURE)) == _HDF5_SIGNATURE:
                    return True
                offset = 512 if offset == 0 else offset * 2
    except OSError:
        return True  # cannot tell: let the caller report the file as damaged
    return False


def _check_type(node: h5py.HLObject, kind: str, path: str) -> None:
    """Check the ``ckview_type`` of a group: right type, and a version this ckview reads."""
    expected, supported = GROUP_TYPES[kind]
    got = L.decode_str(node.attrs.get(L.TYPE_ATTR))
    if got != expected:
        raise corrupt(path, f"{node.name} has {L.TYPE_ATTR} {got!r}, expected {expected!r}")
    version = node.attrs.get(L.TYPE_VERSION_ATTR)
    if version is None:
        raise corrupt(path, f"{node.name} has no {L.TYPE_VERSION_ATTR} attribute")
    if L.attr_int(L.TYPE_VERSION_ATTR, version) > supported:
        raise newer(path, f"{expected} v{version} at {node.name}", supported)


def _child(parent: h5py.Group, name: str, path: str) -> h5py.HLObject:
    node = parent.get(name)
    if node is None:
        raise corrupt(path, f"{parent.name.rstrip('/')}/{name} is missing")
    return node


def table_problems(group: h5py.HLObject, columns: tuple[SchemaColumn, ...]) -> list[str]:
    """What is wrong with the structure of a table group: missing columns, dtypes, lengths."""
    if not isinstance(group, h5py.Group):
        return [f"{group.name} is not a group"]
    problems: list[str] = []
    lengths: dict[str, int] = {}
    for column in columns:
        ds = group.get(column.name)
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
            problems.append(f"{group.name} has no 1-D column '{column.name}'")
        elif ds.dtype != column.dtype:
            problems.append(f"{ds.name} has dtype {ds.dtype}, expected {column.dtype}")
        else:
            lengths[column.name] = ds.shape[0]
    if len(set(lengths.values())) > 1:
        sizes = ", ".join(f"{name}={n}" for name, n in lengths.items())
        problems.append(f"{group.name} has columns of unequal lengths ({sizes})")
    return problems


def _open_table(
    path: str,
    parent: h5py.Group,
    name: str,
    kind: str,
    version: int,
    strings: StringTable,
    sizes: Callable[[], dict[str, int]],
) -> Table:
    """Open table ``name`` (a key of RUN_TABLES or ROOT_TABLES) of a version-``version`` file.

    Columns added after ``version`` are computed, tables added after it are empty
    (NOTE [ Migrations build views ]).
    """
    schema = ROOT_TABLES[name] if kind == "modules" else RUN_TABLES[name]
    if added_table(name, version):
        empty = {c.name: _ComputedColumn(np.empty(0, c.dtype)) for c in schema}
        return Table(path, name, empty, sizes)
    with _reading(path):
        group = _child(parent, name, path)
        _check_type(group, kind, path)
        stored = stored_columns(name, version)
        problems = table_problems(group, stored)
        if problems:
            raise corrupt(path, "; ".join(problems))
        columns: dict[str, h5py.Dataset | _ComputedColumn] = {c.name: group[c.name] for c in stored}
        rows = group[stored[0].name].shape[0]
        for column in schema:
            if column.name not in columns:
                values = computed_column(
                    name, column.name, version, lambda c: np.asarray(group[c][...]), rows, strings
                )
                columns[column.name] = _ComputedColumn(values)
        return Table(path, name, {c.name: columns[c.name] for c in schema}, sizes)


class _ComputedColumn:
    """A column an older file lacks, computed on open: reads like the h5py dataset it stands
    for (``shape``, ``dtype``, ``ndim``, slicing, ``id.valid``)."""

    class _Id:
        valid = True

    id = _Id()

    def __init__(self, values: np.ndarray) -> None:
        self._values = values
        self.shape = values.shape
        self.dtype = values.dtype
        self.ndim = values.ndim

    def __getitem__(self, index: slice) -> np.ndarray:
        return self._values[index]


class Table:
    """One table: equal-length columns, read lazily (only the slice asked for leaves the disk).

    ``sizes()`` gives the row counts of the tables it refers to, for the checks of ``read``.
    """

    def __init__(
        self,
        path: str,
        name: str,
        datasets: Mapping[str, h5py.Dataset | _ComputedColumn],
        sizes: Callable[[], dict[str, int]],
    ) -> None:
        self.name = name
        self.columns: tuple[str, ...] = tuple(datasets)
        self._path = path
        self._datasets = datasets
        self._rows = next(iter(datasets.values())).shape[0]
        self._sizes = sizes

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"<Table {self.name!r}: {self._rows} rows, columns {', '.join(self.columns)}>"

    def column(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """Rows ``[start:stop]`` (Python slice rules) of one column, in its schema dtype."""
        ds = self._datasets.get(name)
        if ds is None:
            raise TraceKeyError(
                f"table {self.name!r} of {self._path} has no column {name!r}; "
                f"its columns are {', '.join(self.columns)}",
                path=self._path,
            )
        if not ds.id.valid:
            raise ValueError(f"{self._path} is closed")
        low, high, _ = slice(start, stop).indices(self._rows)
        if high <= low:
            return np.empty(0, ds.dtype)
        with _reading(self._path):
            return _read_rows(ds, low, high)

    def read(
        self,
        start: int | None = None,
        stop: int | None = None,
        columns: Iterable[str] | None = None,
        *,
        check: bool = True,
    ) -> dict[str, np.ndarray]:
        """Rows ``[start:stop]`` of several columns (all by default), by column name.

        Reading all rows checks their values (NOTE [ What the analysis may assume of a table ]
        in checks.py) and raises CorruptTraceError on the first problem, unless ``check`` is
        false (the validator, which lists them all).
        """
        names = self.columns if columns is None else tuple(columns)
        values = {name: self.column(name, start, stop) for name in names}
        if check and slice(start, stop).indices(self._rows)[:2] == (0, self._rows):
            problems = value_problems(self.name, values, self._sizes())
            if problems:
                more = f" (and {len(problems) - 1} more: see 'ckview validate')"
                raise corrupt(self._path, problems[0] + (more if len(problems) > 1 else ""))
        return values


READ_ROWS = 1 << 22
"""Rows read per HDF5 call: a large column is read in slices into one array, so that memory
grows with what was read and Ctrl-C is seen between slices."""


def _read_rows(ds: h5py.Dataset | _ComputedColumn, low: int, high: int) -> np.ndarray:
    if isinstance(ds, _ComputedColumn) or high - low <= READ_ROWS:
        return np.asarray(ds[low:high])
    out = np.empty(high - low, dtype=ds.dtype)
    for start in range(low, high, READ_ROWS):
        stop = min(start + READ_ROWS, high)
        out[start - low : stop - low] = ds[start:stop]
    return out


class StringTable:
    """The root string table: string id -> str. Loaded into memory on first use."""

    def __init__(self, path: str, dataset: h5py.Dataset) -> None:
        self._path = path
        self._dataset = dataset
        self._size: int = dataset.shape[0]
        self._values: np.ndarray | None = None

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[str]:
        return iter(self._load().tolist())

    def __getitem__(self, sid: int) -> str:
        index = operator.index(sid)
        if not 0 <= index < self._size:
            raise IndexError(self._out_of_range(index))
        return str(self._load()[index])

    def lookup(self, ids: np.ndarray | Iterable[int]) -> np.ndarray:
        """The strings of an array of string ids, as an object array of the same shape."""
        ids = np.asarray(ids)
        if ids.size == 0:
            return np.empty(ids.shape, dtype=object)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"string ids must be integers, got dtype {ids.dtype}")
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self._size:
            raise IndexError(self._out_of_range(low if low < 0 else high))
        return self._load()[ids]

    def _out_of_range(self, sid: int) -> str:
        return f"string id {sid} is out of range: {self._path} has {self._size} strings"

    def _load(self) -> np.ndarray:
        if self._values is None:
            if not self._dataset.id.valid:
                raise ValueError(f"{self._path} is closed")
            with _reading(self._path):
                values = self._dataset.asstr()[...]
            # NOTE [ Strings from a trace are escaped once, by the reader ]
            self._values = np.asarray([printable(v) for v in values.reshape(-1)], dtype=object)
        return self._values


class Run:
    """One run of the step (``main``, ``baseline``, ``plan:<name>``...) and its tables."""

    def __init__(self, trace: Trace, group: h5py.Group) -> None:
        self._trace = trace
        self._path = trace.path
        self._group = group
        attrs = {**added_values("run", trace.format_version), **group.attrs}
        with _reading(self._path):
            self.name: str = _printable_attr(self._path, group.name, "name", attrs["name"])
            self.complete: bool = L.attr_bool("complete", attrs["complete"])
            self.steps_recorded: int = L.attr_int("steps_recorded", attrs["steps_recorded"])
            self.oom_bytes: int = L.attr_int("oom_bytes", attrs["oom_bytes"])
            """RUN_FIELDS['oom_bytes']: what the failing allocation asked for, -1 unknown."""
            self.oom_time_ns: int = L.attr_int("oom_time_ns", attrs["oom_time_ns"])
            """RUN_FIELDS['oom_time_ns']: when the run's allocation failed, -1 if it did not."""
            texts = {
                key: _printable_attr(self._path, group.name, key, attrs.get(key))
                for key in RUN_STR_FIELDS
            }
        self.checkpointing: str = texts["checkpointing"]
        """RUN_FIELDS['checkpointing']: 'script', 'bypassed', 'plan', or '' if unknown."""
        self.oom_op: str = texts["oom_op"]
        """RUN_FIELDS['oom_op']: the aten op whose allocation failed, '' if none or unknown."""
        self.oom_module: str = texts["oom_module"]
        """RUN_FIELDS['oom_module']: the module path the failing op ran in, '' if none."""
        self.oom_message: str = texts["oom_message"]
        """RUN_FIELDS['oom_message']: the allocation error, '' if the run did not end in one."""
        self._tables: dict[str, Table] = {}

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        return f"<Run {self.name!r}: {self.steps_recorded} steps, {state}>"

    def table(self, name: str) -> Table:
        """One of the run's tables (schema.RUN_TABLES); CorruptTraceError if it is damaged."""
        if name not in RUN_TABLES:
            raise TraceKeyError(
                f"runs have no table {name!r} (asked of {self._path}); "
                f"run tables are {', '.join(RUN_TABLES)}",
                path=self._path,
            )
        if name not in self._tables:
            trace = self._trace
            self._tables[name] = _open_table(
                self._path,
                self._group,
                name,
                "table",
                trace.format_version,
                trace.strings,
                self._sizes,
            )
        return self._tables[name]

    def _sizes(self) -> dict[str, int]:
        """Rows of the string table, the modules and each of the run's tables."""
        tables = {name: len(self.table(name)) for name in RUN_TABLES}
        return {**self._trace.root_sizes(), **tables}


class Trace:
    """An open trace file. Get one from ``open_trace``."""

    def __init__(self, path: str, handle: h5py.File) -> None:
        self.path = path
        self._file = handle
        with _reading(path):
            self.format_version = self._read_format_version()
            self._root = handle
            self.meta = self._read_meta()
            self.strings = self._read_strings()
            self._run_groups = self._find_runs()
        self._runs: dict[str, Run] = {}
        self._root_tables: dict[str, Table] = {}

    def __repr__(self) -> str:
        return f"<Trace {self.path!r}: runs {self.run_names}>"

    @property
    def run_names(self) -> list[str]:
        """Names of the runs, in the order they were recorded."""
        return list(self._run_groups)

    @property
    def modules(self) -> Table:
        """The root ``modules`` table (shared by all runs)."""
        return self.root_table(L.MODULES)

    def root_table(self, name: str) -> Table:
        """A root table (schema.ROOT_TABLES: ``modules``, ``frames``, ``stacks``)."""
        if name not in ROOT_TABLES:
            raise TraceKeyError(
                f"traces have no root table {name!r} (asked of {self.path}); "
                f"root tables are {', '.join(ROOT_TABLES)}",
                path=self.path,
            )
        if name not in self._root_tables:
            self._root_tables[name] = _open_table(
                self.path,
                self._root,
                name,
                "modules",
                self.format_version,
                self.strings,
                self.root_sizes,
            )
        return self._root_tables[name]

    def root_sizes(self) -> dict[str, int]:
        """Rows of the string table and of each root table."""
        return {"strings": len(self.strings), **{n: len(self.root_table(n)) for n in ROOT_TABLES}}

    def run(self, name: str) -> Run:
        """The run called ``name``; TraceKeyError listing the run names if there is none."""
        if name not in self._runs:
            group = self._run_groups.get(name)
            if group is None:
                known = ", ".join(repr(n) for n in self._run_groups) or "none"
                raise TraceKeyError(
                    f"{self.path} has no run {name!r}; its runs are: {known}", path=self.path
                )
            self._runs[name] = Run(self, group)
        return self._runs[name]

    def read_run(
        self,
        name: str,
        on_table: Callable[[str], None] | None = None,
        all_devices: bool = False,
    ) -> dict[str, Any]:
        """Everything the analysis of run ``name`` reads, in memory: each of its tables (a dict
        of columns, by table name), the root tables (``modules``, ``frames``, ``stacks``), the
        ``strings`` (a list) and
        ``checkpoint_call_ns`` (median, low, high of checkpoint's cost per call; -1 unknown) and
        ``checkpoint_call_by_size`` (``call_costs``).
        ``on_table(table)`` is called before each run table is read (for progress). A run on
        several devices is read on its main one, unless ``all_devices`` (NOTE [ One device per
        timeline ] in devices.py: then ``timeline_device`` names it)."""
        run = self.run(name)
        tables: dict[str, Any] = {}
        for table in RUN_TABLES:
            if on_table is not None:
                on_table(table)
            tables[table] = run.table(table).read()
        for table in ROOT_TABLES:
            tables[table] = self.root_table(table).read()
        tables["strings"] = list(self.strings)
        meta = self.meta
        tables["checkpoint_call_ns"] = np.array(
            [meta.checkpoint_call_ns, meta.checkpoint_call_low_ns, meta.checkpoint_call_high_ns],
            dtype=np.int64,
        )
        tables["checkpoint_call_by_size"] = self.call_costs()
        tables[L.PLAN_ALL_TIMES] = self.plan_all_times(len(tables["modules"]["parent"]))
        device = None if all_devices else main_device(tables["storages"], tables["strings"])
        return tables if device is None else on_device(tables, tables["strings"], device)

    def call_costs(self) -> np.ndarray:
        """(k, 4) int64: checkpoint's cost per call by size, rows of (bytes saved per call,
        median, low, high ns) by increasing bytes (the optional ``/meta`` attribute
        ``checkpoint_call_by_size``); no rows if the trace has none."""
        with _reading(self.path):
            attrs = _child(self._root, L.META, self.path).attrs
            if L.CALL_COSTS not in attrs:
                return np.zeros((0, 4), dtype=np.int64)
            shape = attrs.get_id(L.CALL_COSTS).shape  # checked before reading: a few rows
            small = shape[1:] == (4,) and shape[0] <= 64
            table = np.asarray(attrs[L.CALL_COSTS]) if small else None
        if (
            table is None
            or table.dtype.kind not in "iu"
            or (table < 0).any()
            or (np.diff(table[:, 0]) <= 0).any()
        ):
            raise corrupt(
                self.path,
                f"/meta attribute '{L.CALL_COSTS}' is not rows of 4 non-negative integers by "
                "increasing bytes",
            )
        return table.astype(np.int64)

    def plan_all_times(self, modules: int | None = None) -> np.ndarray:
        """(k, 3) int64: the timing steps under plan all, rows of (round, -1, step ns) and
        (round, module row, recompute ns) (the optional ``/meta`` attribute ``plan_all_times``,
        NOTE [ Timing steps under plan all ] in recorder/calibration.py); no rows if the trace
        has none. ``modules`` (the model's module count) bounds the module rows."""
        with _reading(self.path):
            attrs = _child(self._root, L.META, self.path).attrs
            if L.PLAN_ALL_TIMES not in attrs:
                return np.zeros((0, 3), dtype=np.int64)
            shape = attrs.get_id(L.PLAN_ALL_TIMES).shape  # checked before reading
            small = len(shape) == 2 and shape[0] <= L.PLAN_ALL_ROWS
            table = np.asarray(attrs[L.PLAN_ALL_TIMES]) if small else None
        damage = "too many rows" if table is None else L.plan_all_damage(table, modules)
        if damage:
            raise corrupt(
                self.path,
                f"/meta attribute '{L.PLAN_ALL_TIMES}': {damage}",
            )
        assert table is not None
        return table.astype(np.int64)

    def close(self) -> None:
        """Close the file; tables and runs obtained from this trace become unreadable."""
        self._file.close()

    def __enter__(self) -> Trace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _read_format_version(self) -> int:
        attrs = self._file.attrs
        if L.FORMAT_ATTR not in attrs:
            raise not_a_trace(self.path, f"no '{L.FORMAT_ATTR}' attribute")
        name = L.decode_str(attrs[L.FORMAT_ATTR])
        if name != FORMAT_NAME:
            raise not_a_trace(self.path, f"its format is {name!r}, not {FORMAT_NAME!r}")
        if L.FORMAT_VERSION_ATTR not in attrs:
            raise corrupt(self.path, f"no '{L.FORMAT_VERSION_ATTR}' attribute")
        version = L.attr_int(L.FORMAT_VERSION_ATTR, attrs[L.FORMAT_VERSION_ATTR])
        if version > FORMAT_VERSION:
            raise newer(self.path, f"trace format v{version}", FORMAT_VERSION)
        if any(v not in MIGRATIONS for v in range(version, FORMAT_VERSION)):
            raise corrupt(self.path, f"unknown trace format v{version}")
        return version

    def _read_meta(self) -> TraceMeta:
        group = _child(self._root, L.META, self.path)
        _check_type(group, "meta", self.path)
        attrs = {**added_values("meta", self.format_version), **group.attrs}
        values = {}
        for name in META_FIELDS:
            if name not in attrs:
                raise corrupt(self.path, f"/meta has no '{name}' attribute")
            values[name] = _printable_value(L.decode_meta(name, attrs[name]))
        return TraceMeta(**values)

    def _read_strings(self) -> StringTable:
        dataset = _child(self._root, L.STRINGS, self.path)
        _check_type(dataset, "strings", self.path)
        if not isinstance(dataset, h5py.Dataset) or dataset.ndim != 1:
            raise corrupt(self.path, "/strings is not a 1-D dataset")
        if h5py.check_string_dtype(dataset.dtype) is None:
            raise corrupt(self.path, f"/strings holds {dataset.dtype}, not strings")
        return StringTable(self.path, dataset)

    def _find_runs(self) -> dict[str, h5py.Group]:
        """Run groups by run name, in creation order (their ``order`` attribute)."""
        found: list[tuple[int, str, h5py.Group]] = []
        for group in _child(self._root, L.RUNS, self.path).values():
            _check_type(group, "run", self.path)
            name = _printable_attr(self.path, group.name, "name", group.attrs.get("name"))
            found.append((L.attr_int(L.ORDER_ATTR, group.attrs.get(L.ORDER_ATTR)), name, group))
        found.sort(key=lambda item: item[:2])
        runs = {name: group for _, name, group in found}
        if len(runs) != len(found):
            raise corrupt(self.path, "two runs have the same name")
        return runs


def _printable_attr(path: str, where: str, name: str, value: object) -> str:
    """A string attribute, escaped (NOTE [ Strings from a trace are escaped once, by the
    reader ]); CorruptTraceError if it is not a string."""
    text = L.decode_str(value)
    if not isinstance(text, str):
        raise corrupt(path, f"{where} has no string {name!r} attribute")
    return printable(text)


def _printable_value(value: Any) -> Any:
    """A meta value with its strings escaped (lists of strings too: the command)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable_value(v) for v in value]
    return value
