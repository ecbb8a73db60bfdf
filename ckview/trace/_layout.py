"""Names and encodings shared by the writer and the reader (see docs/trace-format.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .schema import META_FIELDS, SOURCES

# Attribute names on the root and on every typed group (values in schema.GROUP_TYPES).
FORMAT_ATTR = "format"
FORMAT_VERSION_ATTR = "format_version"
TYPE_ATTR = "ckview_type"
TYPE_VERSION_ATTR = "ckview_type_version"
ORDER_ATTR = "order"  # on each run group: its position in creation order

META = "meta"
CALL_COSTS = "checkpoint_call_by_size"
"""Optional attribute of ``/meta``: (k, 4) int64 rows (bytes saved per call, median, low, high
ns) of checkpoint's cost per call by size (NOTE [ Checkpoint's cost grows with the data around
it ] in recorder/timing.py); absent if not measured."""
PLAN_ALL_TIMES = "plan_all_times"
"""Optional attribute of ``/meta``: (k, 3) int64 rows (round, module row or -1, ns) of the timing
steps under plan all (NOTE [ Timing steps under plan all ] in recorder/calibration.py): -1 rows
are kept steps, the others recomputes in them; absent if not measured."""
PLAN_ALL_ROWS = 100_000
"""The most rows ``plan_all_times`` may have (15 rounds of a step with thousands of regions)."""
STRINGS = "strings"
MODULES = "modules"  # the first of schema.ROOT_TABLES; each is a group named like the table
RUNS = "runs"

#: Rows per chunk of every column: the recorder's batch size, so that a batch becomes one whole
#: chunk per column, compressed once. Smaller chunks compress worse, larger ones no better.
CHUNK_ROWS = 65536
STRING_CHUNK_ROWS = 1024

#: Filters of column datasets: shuffle + deflate level 1, both built into every HDF5.
DEFAULT_FILTERS: dict[str, Any] = {"compression": "gzip", "compression_opts": 1, "shuffle": True}

_UNKNOWN_INT_FIELDS = frozenset(
    {
        "checkpoint_call_ns",
        "checkpoint_call_low_ns",
        "checkpoint_call_high_ns",
        "rank",
        "device_total_bytes",
    }
)
"""Int fields whose unset value is -1 (not measured), not 0."""
_INT_FIELDS = (
    frozenset({"steps_requested", "steps_recorded", "warmup", "world_size"}) | _UNKNOWN_INT_FIELDS
)
_BOOL_FIELDS = frozenset({"complete"})
_JSON_FIELDS = frozenset({"command"})


@dataclass(frozen=True)
class TraceMeta:
    """The attributes of ``/meta`` (see schema.META_FIELDS for their meaning)."""

    ckview_version: str
    torch_version: str
    python_version: str
    device: str
    command: list[str]
    start_time: str
    steps_requested: int
    steps_recorded: int
    warmup: int
    step_rule: str
    compiled: str
    checkpoint_call_ns: int
    checkpoint_call_low_ns: int
    checkpoint_call_high_ns: int
    rank: int
    world_size: int
    device_total_bytes: int
    allocator_events: str
    recorder: str
    source: str
    allocator_settings: str
    complete: bool
    error: str


def meta_default(name: str) -> Any:
    """The value a writer stores for a meta field nobody set."""
    if name in _UNKNOWN_INT_FIELDS:
        return -1
    if name == "world_size":
        return 1
    if name in _INT_FIELDS:
        return 0
    if name in _BOOL_FIELDS:
        return False
    if name == "source":
        return "record"
    return [] if name in _JSON_FIELDS else ""


def encode_meta(name: str, value: Any) -> Any:
    """Check one meta field and turn it into the value stored as an HDF5 attribute."""
    if name not in META_FIELDS:
        raise ValueError(f"unknown meta field {name!r}; known: {', '.join(META_FIELDS)}")
    if name in _JSON_FIELDS:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"meta field {name!r} must be a list of str, got {value!r}")
        return json.dumps(list(value))
    if name in _BOOL_FIELDS:
        if not isinstance(value, bool | np.bool_):
            raise TypeError(f"meta field {name!r} must be a bool, got {value!r}")
        return bool(value)
    if name in _INT_FIELDS:
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
            raise TypeError(f"meta field {name!r} must be an int, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"meta field {name!r} must be a str, got {value!r}")
    if name == "source" and value not in SOURCES:
        raise ValueError(f"meta field 'source' must be one of {SOURCES}, got {value!r}")
    return value


def decode_meta(name: str, value: Any) -> Any:
    """Turn a stored meta attribute back into its Python value; ValueError if it has a bad type."""
    value = decode_str(value)
    if name in _JSON_FIELDS:
        command = json.loads(value) if isinstance(value, str) else None
        if not isinstance(command, list) or not all(isinstance(v, str) for v in command):
            raise ValueError(f"meta attribute {name!r} is not a JSON list of strings")
        return command
    if name in _BOOL_FIELDS:
        return attr_bool(name, value)
    if name in _INT_FIELDS:
        return attr_int(name, value)
    if not isinstance(value, str):
        raise ValueError(f"meta attribute {name!r} is not a string")
    return value


def decode_str(value: Any) -> Any:
    """h5py returns fixed-length string attributes as bytes; treat them like str."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def attr_int(name: str, value: Any) -> int:
    """An integer attribute (numpy or Python, not bool); ValueError otherwise."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise ValueError(f"attribute {name!r} is not an integer")
    return int(value)


def attr_bool(name: str, value: Any) -> bool:
    """A boolean attribute (numpy or Python); ValueError otherwise."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"attribute {name!r} is not a boolean")
    return bool(value)


def encode_run_name(name: str) -> str:
    """The HDF5 link name of a run: '%', '/' and a leading '.' are percent-encoded.

    The run's ``name`` attribute holds the real name; readers never decode link names.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a run name must be a non-empty str, got {name!r}")
    link = name.replace("%", "%25").replace("/", "%2F")
    return "%2E" + link[1:] if link.startswith(".") else link


def plan_all_damage(table: np.ndarray, modules: int | None = None) -> str:
    """What is wrong with rows of ``plan_all_times`` (``PLAN_ALL_TIMES``), '' if nothing: the
    shape, a negative round or time, a module row below -1 (or not below ``modules``)."""
    if table.ndim != 2 or table.shape[1] != 3 or table.dtype.kind not in "iu":
        return "not rows of 3 integers"
    if len(table) > PLAN_ALL_ROWS:
        return f"more than {PLAN_ALL_ROWS} rows"
    top = modules if modules is not None else np.iinfo(np.int64).max
    if (table[:, 0] < 0).any() or (table[:, 2] < 0).any():
        return "a negative round or time"
    if (table[:, 1] < -1).any() or (table[:, 1] >= top).any():
        return "a module row outside the model"
    return ""
