"""validate_trace: check a trace against docs/trace-format.md, vectorised (1e7 rows in seconds).

The checks of values are ``checks.value_problems``, the ones the reader runs on every read."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .checks import value_problems
from .errors import CorruptTraceError
from .reader import Run, Table, Trace, open_trace
from .schema import ROOT_TABLES, RUN_TABLES

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
        _check_strings(report, list(trace.strings))
        sizes = {"strings": len(trace.strings)}
        roots = {}
        for name in ROOT_TABLES:
            found = _table_or_problem(report, "", partial(trace.root_table, name))
            if found is not None:
                roots[name] = found
                sizes[name] = len(found)
        for name, found in roots.items():
            _check_table(report, name, name, found.read(check=False), sizes)
        for name in trace.run_names:
            _check_run(report, trace, name, sizes)
    return report


def _check_strings(report: ValidationReport, strings: list[str]) -> None:
    """The writer interns every string once: a repeated one means the table was altered (a
    resized string table repeats its fill value)."""
    seen: set[str] = set()
    for string in strings:
        if string in seen:
            repeated = len(strings) - len(set(strings))
            report.problems.append(
                f"/strings holds {repeated} repeated strings, first {string!r}: the string "
                "table was altered"
            )
            return
        seen.add(string)


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
        _check_table(report, where + table, table, found.read(check=False), sizes)
    _check_oom(report, where, run)


def _check_table(
    report: ValidationReport, where: str, table: str, columns: Columns, sizes: dict[str, int]
) -> None:
    prefix = where[: len(where) - len(table)]
    report.problems.extend(prefix + p for p in value_problems(table, columns, sizes))


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
