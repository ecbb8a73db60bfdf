"""Checks of a table's values: the one place that says which rows a reader may trust.

``value_problems`` is run by the reader on every whole table it reads (``Table.read``), so that
each verb either gets tables the analysis can rely on or a one-line ``CorruptTraceError``, and
by ``validate_trace``, which lists every problem instead of stopping at the first. Vectorised:
a 1e7-row table is checked in well under a second.

NOTE [ What the analysis may assume of a table ]
Once a table is read whole without error: every index column points at a row of its target
(or is NO_INDEX where allowed), string ids at strings, enum and flag columns hold their values;
``modules.parent`` and ``module_calls.parent`` lead up to a root without cycles; steps are in
order with non-decreasing first rows inside their tables; event and op times are non-negative
and memory events in time order, each storage born and freed at most once and never freed
before it was born; sizes are non-negative and times and sizes small enough that sums of them
cannot overflow int64.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .schema import (
    ENUM_COLUMNS,
    FLAG_COLUMNS,
    NO_INDEX,
    REFERENCES,
    STRING_COLUMNS,
    MemoryEventKind,
)

Columns = Mapping[str, np.ndarray]

MAX_NS = 1 << 60
"""Largest time (or duration) accepted: 36 years of nanoseconds; sums of a few stay in int64."""
MAX_BYTES = 1 << 50
"""Largest size accepted (1 PiB): sums over millions of storages stay in int64."""

_UNSET_ALLOWED = frozenset(
    {
        ("module_calls", "end_ns"),
        ("storages", "alloc_ns"),
        ("storages", "free_ns"),
        ("recompute_regions", "end_ns"),
        ("segments", "alloc_ns"),
        ("segments", "free_ns"),
    }
)
"""Time columns where -1 means 'never' or 'before recording'."""

_PARENTS = (("modules", "parent"), ("module_calls", "parent"))


def value_problems(table: str, columns: Columns, sizes: Mapping[str, int]) -> list[str]:
    """What is wrong with the values of ``table`` (only the checks whose columns are present).

    ``sizes`` holds the row counts of the tables it refers to (and ``strings``); a reference to
    a table missing from ``sizes`` is not checked.
    """
    problems: list[str] = []
    _references(problems, table, columns, sizes)
    _enums(problems, table, columns)
    for source, name in _PARENTS:
        if source == table and name in columns and not problems:
            _cycles(problems, f"{table}.{name}", columns[name])
    _times(problems, table, columns)
    _sizes(problems, table, columns)
    if table == "steps":
        _steps(problems, columns, sizes)
    elif table == "memory_events":
        _memory_events(problems, columns, sizes.get("storages"))
    elif table == "stacks" and "parent" in columns:
        parent = columns["parent"].astype(np.int64)
        bad = parent >= np.arange(len(parent))
        report(
            problems, bad, "stacks.parent has {n} values not before their own row", values=parent
        )
    elif table == "device_samples":
        _device_samples(problems, columns)
    elif table == "recompute_regions":
        _rows_in(problems, "recompute_regions", columns, ("first_op", "end_op"), sizes.get("ops"))
    return problems


def _references(problems: list[str], table: str, columns: Columns, sizes: Mapping[str, int]):
    for name in STRING_COLUMNS.get(table, ()):
        if name in columns and "strings" in sizes:
            _range(problems, f"{table}.{name}", columns[name], "strings", sizes["strings"], False)
    for (source, name), (target, nullable) in REFERENCES.items():
        if source == table and target in sizes and name in columns:
            _range(problems, f"{table}.{name}", columns[name], target, sizes[target], nullable)


def _enums(problems: list[str], table: str, columns: Columns) -> None:
    for (source, name), enum in ENUM_COLUMNS.items():
        if source == table and name in columns:
            values = columns[name]
            bad = ~np.isin(values, [member.value for member in enum])
            report(
                problems,
                bad,
                f"{table}.{name} has {{n}} values that are not a {enum.__name__}",
                values=values,
            )
    for source, name in FLAG_COLUMNS:
        if source == table and name in columns:
            values = columns[name]
            report(problems, values > 1, f"{table}.{name} has {{n}} values other than 0 and 1")


def _range(
    problems: list[str], where: str, values: np.ndarray, target: str, size: int, nullable: bool
) -> None:
    """Indices must point at a row of ``target`` (or be NO_INDEX where that is allowed)."""
    low = NO_INDEX if nullable else 0
    if values.size == 0 or (values.min() >= low and values.max() < size):
        return
    bad = (values < low) | (values >= size)
    report(problems, bad, f"{where} has {{n}} values outside {target} ({size} rows)", values=values)


def _cycles(problems: list[str], where: str, parent: np.ndarray) -> None:
    """Every row must reach a root (-1) by following ``parent``: pointer doubling, log2(n)
    vectorised steps. Needs every value in [-1, n)."""
    n = len(parent)
    up = np.where(parent < 0, n, parent).astype(np.int64)
    up = np.append(up, n)
    for _ in range(max(n, 1).bit_length() + 1):
        up = up[up]
    report(problems, up[:n] != n, f"{where} has {{n}} rows in or under a cycle")


def _times(problems: list[str], table: str, columns: Columns) -> None:
    for name, values in columns.items():
        if not name.endswith("_ns") or values.size == 0:
            continue
        low = -1 if (table, name) in _UNSET_ALLOWED else 0
        if table == "timing_steps" or table == "timed_calls":
            low = 0
        bad = (values < low) | (values >= MAX_NS)
        report(problems, bad, f"{table}.{name} has {{n}} times out of range", values=values)


def _sizes(problems: list[str], table: str, columns: Columns) -> None:
    for name in ("nbytes", "param_bytes"):
        values = columns.get(name)
        if values is not None and values.size:
            bad = (values < 0) | (values >= MAX_BYTES)
            report(problems, bad, f"{table}.{name} has {{n}} sizes out of range", values=values)


def _steps(problems: list[str], columns: Columns, sizes: Mapping[str, int]) -> None:
    if "step" in columns:
        bad = np.diff(columns["step"]) <= 0
        report(problems, bad, "steps.step does not increase {n} times", offset=1)
    if "start_ns" in columns:
        bad = np.diff(columns["start_ns"]) < 0
        report(problems, bad, "steps.start_ns decreases {n} times", offset=1)
    if "start_ns" in columns and "end_ns" in columns:
        bad = columns["end_ns"] < columns["start_ns"]
        report(problems, bad, "steps has {n} steps that end before they start")
    for name, target in (("first_op", "ops"), ("first_memory_event", "memory_events")):
        _rows_in(problems, "steps", columns, (name,), sizes.get(target))
        if name in columns:
            bad = np.diff(columns[name]) < 0
            report(problems, bad, f"steps.{name} decreases {{n}} times", offset=1)


def _rows_in(
    problems: list[str], table: str, columns: Columns, names: tuple[str, ...], size: int | None
) -> None:
    """Row bounds ``[0, size]`` (a first row, or the row after a last one)."""
    if size is None:
        return
    for name in names:
        if name in columns:
            values = columns[name]
            bad = (values < 0) | (values > size)
            report(
                problems, bad, f"{table}.{name} has {{n}} rows outside [0, {size}]", values=values
            )
    if "first_op" in names and "end_op" in names and {"first_op", "end_op"} <= set(columns):
        bad = columns["end_op"] < columns["first_op"]
        report(problems, bad, f"{table} has {{n}} rows whose end_op is before their first_op")


def _memory_events(problems: list[str], columns: Columns, storages: int | None) -> None:
    if "time_ns" in columns:
        time = columns["time_ns"]
        report(problems, np.diff(time) < 0, "memory_events.time_ns decreases {n} times", offset=1)
    if storages is None or "kind" not in columns or "storage" not in columns:
        return
    kind, storage = columns["kind"], columns["storage"].astype(np.int64)
    valid = (storage >= 0) & (storage < storages)
    rows = np.arange(len(kind))
    births = valid & ((kind == MemoryEventKind.ALLOC) | (kind == MemoryEventKind.SEEN))
    frees = valid & (kind == MemoryEventKind.FREE)
    _at_most_once(problems, storage[births], storages, "ALLOC/SEEN")
    _at_most_once(problems, storage[frees], storages, "FREE")
    first_birth = np.full(storages, len(kind), dtype=np.int64)
    np.minimum.at(first_birth, storage[births], rows[births])
    early = first_birth[storage[frees]] > rows[frees]
    report(
        problems,
        early,
        "memory_events has {n} FREE events before any ALLOC/SEEN of their storage",
        rows=rows[frees],
    )


def _at_most_once(problems: list[str], ids: np.ndarray, size: int, label: str) -> None:
    repeated = np.flatnonzero(np.bincount(ids, minlength=size) > 1)
    if repeated.size:
        problems.append(
            f"memory_events has {repeated.size} storages with more than one "
            f"{label} event, first: storage {repeated[0]}"
        )


def report(
    problems: list[str],
    bad: np.ndarray,
    message: str,
    *,
    values: np.ndarray | None = None,
    rows: np.ndarray | None = None,
    offset: int = 0,
) -> None:
    """If any of ``bad`` is set, add ``message`` ({n}: how many) and the first bad row.

    Row ``i`` of ``bad`` is row ``rows[i]`` (or ``i + offset``) of the table.
    """
    count = int(np.count_nonzero(bad))
    if not count:
        return
    i = int(np.argmax(bad))
    row = int(rows[i]) if rows is not None else i + offset
    value = "" if values is None else f": {values[i]}"
    problems.append(f"{message.format(n=count)}, first at row {row}{value}")


_SAMPLE_BYTES = (
    "allocated",
    "reserved",
    "largest_free",
    "nvml_total",
    "nvml_process",
    "nvml_others",
)


def _device_samples(problems: list[str], columns: Columns) -> None:
    """Samples come in time order; byte counts are -1 (unknown) or more (since v4)."""
    if "time_ns" in columns:
        time = columns["time_ns"].astype(np.int64)
        report(problems, np.diff(time) < 0, "device_samples.time_ns decreases {n} times", offset=1)
    for name in _SAMPLE_BYTES:
        if name in columns:
            values = columns[name].astype(np.int64)
            report(
                problems,
                values < -1,
                f"device_samples.{name} has {{n}} values below -1",
                values=values,
            )
