"""validate_trace: check a trace against docs/trace-format.md, vectorised (1e7 rows in seconds)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .errors import CorruptTraceError
from .reader import Run, Table, Trace, open_trace
from .schema import (
    ENUM_COLUMNS,
    FLAG_COLUMNS,
    NO_INDEX,
    REFERENCES,
    RUN_TABLES,
    STRING_COLUMNS,
    MemoryEventKind,
)

Columns = dict[str, np.ndarray]


@dataclass
class ValidationReport:
    """What ``validate_trace`` found: ``problems`` break the format, ``notes`` are worth knowing."""

    path: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when there is no problem (notes do not count)."""
        return not self.problems


def validate_trace(path: str | os.PathLike[str]) -> ValidationReport:
    """Check structure, references, enums and event order of every table of a trace.

    A file that cannot be opened at all raises the ``TraceError`` of ``open_trace``.
    """
    with open_trace(path) as trace:
        report = ValidationReport(trace.path)
        if not trace.meta.complete:
            report.notes.append(f"trace is incomplete: {trace.meta.error or 'no error recorded'}")
        modules = _table_or_problem(report, "", lambda: trace.modules)
        sizes = {"strings": len(trace.strings)}
        if modules is not None:
            sizes["modules"] = len(modules)
            _check_table(report, "modules", "modules", modules.read(), sizes)
        for name in trace.run_names:
            _check_run(report, trace, name, sizes)
    return report


def _table_or_problem(
    report: ValidationReport, prefix: str, get: Callable[[], Table]
) -> Table | None:
    """The table ``get()`` returns, or None after recording why it is unreadable."""
    try:
        table = get()
    except CorruptTraceError as e:
        report.problems.append(prefix + e.detail)
        return None
    return table


def _check_run(report: ValidationReport, trace: Trace, name: str, root: dict[str, int]) -> None:
    where = f"run {name!r}: "
    try:
        run: Run = trace.run(name)
    except CorruptTraceError as e:
        report.problems.append(where + e.detail)
        return
    if not run.complete:
        report.notes.append(f"run {name!r} is incomplete")
    tables: dict[str, Table] = {}
    for table in RUN_TABLES:
        found = _table_or_problem(report, where, partial(run.table, table))
        if found is not None:
            tables[table] = found
    sizes = {**root, **{table: len(found) for table, found in tables.items()}}
    # One table in memory at a time: a 1e7-row run stays well within RAM.
    for table, found in tables.items():
        columns = found.read()
        _check_table(report, where + table, table, columns, sizes)
        if table == "memory_events":
            _check_memory_events(report, where + table, columns, sizes.get("storages"))
        elif table == "steps":
            _check_steps(report, where + table, columns)
        elif table == "device_samples":
            _check_device_samples(report, where + table, columns)
    _check_oom(report, where, run)


def _check_table(
    report: ValidationReport, where: str, table: str, columns: Columns, sizes: dict[str, int]
) -> None:
    for name in STRING_COLUMNS.get(table, ()):
        _check_range(report, f"{where}.{name}", columns[name], "strings", sizes["strings"], False)
    for (source, name), (target, nullable) in REFERENCES.items():
        if source == table and target in sizes:
            _check_range(report, f"{where}.{name}", columns[name], target, sizes[target], nullable)
    for (source, name), enum in ENUM_COLUMNS.items():
        if source == table:
            values = columns[name]
            bad = ~np.isin(values, [member.value for member in enum])
            _report(
                report,
                bad,
                f"{where}.{name} has {{n}} values that are not a {enum.__name__}",
                values=values,
            )
    for source, name in FLAG_COLUMNS:
        if source == table:
            values = columns[name]
            _report(report, values > 1, f"{where}.{name} has {{n}} values other than 0 and 1")


def _check_range(
    report: ValidationReport,
    where: str,
    values: np.ndarray,
    target: str,
    size: int,
    nullable: bool,
) -> None:
    """Indices must point at a row of ``target`` (or be NO_INDEX where that is allowed)."""
    low = NO_INDEX if nullable else 0
    if values.size == 0 or (values.min() >= low and values.max() < size):
        return
    bad = (values < low) | (values >= size)
    _report(report, bad, f"{where} has {{n}} values outside {target} ({size} rows)", values=values)


def _report(
    report: ValidationReport,
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
    report.problems.append(f"{message.format(n=count)}, first at row {row}{value}")


def _check_memory_events(
    report: ValidationReport, where: str, columns: Columns, storages: int | None
) -> None:
    time = columns["time_ns"]
    _report(report, np.diff(time) < 0, f"{where}.time_ns decreases {{n}} times", offset=1)
    if storages is None:  # the storages table is unreadable, already reported
        return
    kind, storage = columns["kind"], columns["storage"].astype(np.int64)
    valid = (storage >= 0) & (storage < storages)
    rows = np.arange(len(kind))
    births = valid & ((kind == MemoryEventKind.ALLOC) | (kind == MemoryEventKind.SEEN))
    frees = valid & (kind == MemoryEventKind.FREE)
    _at_most_once(report, where, storage[births], storages, "ALLOC/SEEN")
    _at_most_once(report, where, storage[frees], storages, "FREE")
    first_birth = np.full(storages, len(kind), dtype=np.int64)
    np.minimum.at(first_birth, storage[births], rows[births])
    early = first_birth[storage[frees]] > rows[frees]
    _report(
        report,
        early,
        f"{where} has {{n}} FREE events before any ALLOC/SEEN of their storage",
        rows=rows[frees],
    )


def _at_most_once(
    report: ValidationReport, where: str, ids: np.ndarray, size: int, label: str
) -> None:
    repeated = np.flatnonzero(np.bincount(ids, minlength=size) > 1)
    if repeated.size:
        report.problems.append(
            f"{where} has {repeated.size} storages with more than one "
            f"{label} event, first: storage {repeated[0]}"
        )


def _check_steps(report: ValidationReport, where: str, columns: Columns) -> None:
    step, start = columns["step"], columns["start_ns"]
    _report(report, np.diff(step) <= 0, f"{where}.step does not increase {{n}} times", offset=1)
    _report(report, np.diff(start) < 0, f"{where}.start_ns decreases {{n}} times", offset=1)


_SAMPLE_BYTES = (
    "allocated",
    "reserved",
    "largest_free",
    "nvml_total",
    "nvml_process",
    "nvml_others",
)


def _check_device_samples(report: ValidationReport, where: str, columns: Columns) -> None:
    """Samples come in time order; byte counts are -1 (unknown) or more (since v4)."""
    time = columns["time_ns"]
    _report(report, np.diff(time) < 0, f"{where}.time_ns decreases {{n}} times", offset=1)
    for name in _SAMPLE_BYTES:
        values = columns[name]
        _report(report, values < -1, f"{where}.{name} has {{n}} values below -1", values=values)


def _check_oom(report: ValidationReport, where: str, run: Run) -> None:
    """A run that ended in an OOM says so in its attributes, and is incomplete (since v4)."""
    if run.oom_time_ns < 0:
        if run.oom_message or run.oom_op:
            report.problems.append(f"{where}oom_message or oom_op is set, but oom_time_ns is -1")
        return
    if not run.oom_message:
        report.problems.append(f"{where}oom_time_ns is set, but oom_message is empty")
    if run.complete:
        report.problems.append(f"{where}the run ended in an OOM, yet it is marked complete")
    if run.oom_bytes < -1:
        report.problems.append(f"{where}oom_bytes is {run.oom_bytes}, below -1")
