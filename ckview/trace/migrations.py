"""Reading older trace format versions: one registered migration per version step.

NOTE [ Migrations build views ]
    Files are opened read-only and writers write only the current version. A migration says
    what version ``source + 1`` added and how a version-``source`` file reads as if it had it:
    each added column is computed from the columns the old file has (a constant, or a function
    of them and the string table), added tables read as empty, added meta fields and run
    attributes get the value that stands for "unknown". The reader applies every step from the
    file's version up to ``FORMAT_VERSION``, so a reader only ever sees current-version tables.
    Old files are kept as test data (``tests/data/traces_v1`` to ``traces_v4``),
    and a migration is tested by reading them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .schema import FORMAT_VERSION, ROOT_TABLES, RUN_TABLES, Column, ContainerKind

ReadColumn = Callable[[str], np.ndarray]
"""Reads a whole column of the table being opened, as the old file has it."""

ColumnRule = Callable[[ReadColumn, int, Iterable[str]], np.ndarray]
"""(read a column, number of rows, the string table) -> the added column's values."""


@dataclass(frozen=True)
class Migration:
    """What version ``source + 1`` added, and the values a version-``source`` file reads as."""

    source: int
    columns: Mapping[str, Mapping[str, ColumnRule]]
    """Table name -> added column -> how to compute it."""
    meta: Mapping[str, Any]
    """Added meta fields -> their value in older files."""
    run_attrs: Mapping[str, Any]
    """Added run attributes -> their value in older files."""
    tables: tuple[str, ...] = ()
    """Added tables (of runs or of the root): they read as empty in older files."""


def _constant(value: int) -> ColumnRule:
    return lambda read, rows, strings: np.full(rows, value)


def _type_is(*names: str) -> Callable[[ReadColumn, Iterable[str]], np.ndarray]:
    """Rows of the modules table whose class name is one of ``names``."""

    def mask(read: ReadColumn, strings: Iterable[str]) -> np.ndarray:
        wanted = [i for i, s in enumerate(strings) if s in names]
        return np.isin(read("type"), wanted)

    return mask


def _v1_container(read: ReadColumn, rows: int, strings: Iterable[str]) -> np.ndarray:
    # v1 kept class names only: a subclass with another name reads as a plain module.
    kinds = np.full(rows, ContainerKind.MODULE)
    for name, kind in (
        ("Sequential", ContainerKind.SEQUENTIAL),
        ("ModuleList", ContainerKind.MODULE_LIST),
        ("ModuleDict", ContainerKind.MODULE_DICT),
    ):
        kinds[_type_is(name)(read, strings)] = kind
    return kinds


def _v1_sequential_forward(read: ReadColumn, rows: int, strings: Iterable[str]) -> np.ndarray:
    return _type_is("Sequential")(read, strings)


MIGRATIONS: dict[int, Migration] = {
    1: Migration(
        source=1,
        columns={
            "modules": {
                "container": _v1_container,
                "sequential_forward": _v1_sequential_forward,
            },
            "steps": {
                "forwards": _constant(-1),
                "backwards": _constant(-1),
                "optimizer_steps": _constant(-1),
                "complete": _constant(1),
            },
        },
        meta={"step_rule": "", "compiled": ""},
        run_attrs={"checkpointing": ""},
    ),
    2: Migration(
        source=2,
        columns={},
        meta={
            "checkpoint_call_ns": -1,
            "checkpoint_call_low_ns": -1,
            "checkpoint_call_high_ns": -1,
            "rank": -1,
            "world_size": 1,
        },
        run_attrs={},
        tables=("timing_steps", "timed_calls"),
    ),
    3: Migration(
        source=3,
        columns={"storages": {"stack": _constant(-1)}},
        meta={
            "allocator_events": "",
            "source": "record",
            "device_total_bytes": -1,
        },
        run_attrs={
            "oom_op": "",
            "oom_module": "",
            "oom_bytes": -1,
            "oom_time_ns": -1,
            "oom_message": "",
        },
        tables=("frames", "stacks", "segments", "device_samples"),
    ),
    4: Migration(
        source=4,
        columns={},
        meta={"allocator_settings": "", "recorder": ""},
        run_attrs={},
        tables=(),
    ),
}
"""Migrations by the version they read."""


def _schema(table: str) -> tuple[Column, ...]:
    return ROOT_TABLES[table] if table in ROOT_TABLES else RUN_TABLES[table]


def added_columns(table: str, version: int) -> dict[str, ColumnRule]:
    """The columns of ``table`` a version-``version`` file lacks, with how to compute each."""
    rules: dict[str, ColumnRule] = {}
    for source in range(version, FORMAT_VERSION):
        rules.update(MIGRATIONS[source].columns.get(table, {}))
    return rules


def stored_columns(table: str, version: int) -> tuple[Column, ...]:
    """The columns of ``table`` that a version-``version`` file stores."""
    added = added_columns(table, version)
    return tuple(c for c in _schema(table) if c.name not in added)


def added_table(table: str, version: int) -> bool:
    """Whether ``table`` was added after ``version`` (a version-``version`` file has none)."""
    return any(table in MIGRATIONS[source].tables for source in range(version, FORMAT_VERSION))


def added_values(kind: str, version: int) -> dict[str, Any]:
    """Meta fields (``kind='meta'``) or run attributes (``'run'``) added after ``version``."""
    values: dict[str, Any] = {}
    for source in range(version, FORMAT_VERSION):
        migration = MIGRATIONS[source]
        values.update(migration.meta if kind == "meta" else migration.run_attrs)
    return values


def computed_column(
    table: str, name: str, version: int, read: ReadColumn, rows: int, strings: Iterable[str]
) -> np.ndarray:
    """The values of added column ``name`` of ``table`` in a version-``version`` file."""
    column = next(c for c in _schema(table) if c.name == name)
    values = added_columns(table, version)[name](read, rows, strings)
    return np.asarray(values, dtype=column.dtype)
