"""The rows the native sources write (``ckrec_ops.cpp``, ``ckrec_hooks.cpp``), as numpy
structured dtypes.

Each dtype mirrors a packed C++ struct field by field; ``check_layout`` compares their sizes with
the ones the extension reports before any row is read. Times are ``CLOCK_MONOTONIC``
nanoseconds (``time.perf_counter_ns`` on Linux). Op ids and module call ids count up over the
whole process, across drains, so rows of different drains refer to each other by id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DIMS = 8
"""Sizes kept per tensor row; ``ndim`` may be larger, then only the first ``DIMS`` are known."""

_TENSOR = [("dtype", "i1"), ("ndim", "i1"), ("tpad", "u1", 6), ("dims", "<i8", DIMS)]

OPS = np.dtype(
    [
        ("id", "<i8"),  # process-wide op id
        ("t0", "<i8"),
        ("t1", "<i8"),  # -1 while open at the drain: see ``op_ends``
        ("seq", "<i8"),  # RecordFunction sequence number (autograd's, -1 if none)
        ("parent", "<i8"),  # enclosing op on the thread, -1 at top level
        ("top", "<i8"),  # outermost enclosing op (itself at top level)
        ("node_seq", "<i8"),  # its backward node's seq (NOTE [ Engine work between nodes ]), or -1
        ("outer", "<i8"),  # its outermost op, -1 if none (NOTE [ Outermost ops ] in attribute.py)
        ("name", "<i4"),  # index into the extension's names()
        ("call", "<i4"),  # innermost open module call on the thread, -1 if none
        ("graph_task", "<i4"),  # autograd graph task running on the thread, -1 if none
        ("scope", "u1"),  # at::RecordScope: 0 FUNCTION, 1 BACKWARD_FUNCTION
        ("raised", "u1"),  # 1: an exception left the op
        ("pad", "u1", 2),
    ]
)
MEMORY = np.dtype(
    [
        ("t", "<i8"),
        ("ptr", "<i8"),
        ("bytes", "<i8"),  # > 0 allocation, < 0 free
        ("block", "<i8"),  # block id (NOTE [ Blocks by address ] in ckrec_ops.cpp); -1: a free
        # of a block it does not know
        ("op", "<i8"),  # its op of the trace, else the innermost open range, -1 if none
        ("top", "<i8"),
        ("node_seq", "<i8"),
        ("allocated", "<i8"),  # the allocator's total after the event (0 on the CPU)
        ("reserved", "<i8"),
        ("call", "<i4"),
        ("device_type", "<i2"),  # c10::DeviceType: 0 CPU, 1 CUDA
        ("device_index", "<i2"),
    ]
)
OOMS = np.dtype(
    [
        ("t", "<i8"),
        ("bytes", "<i8"),  # what the failed allocation asked for
        ("allocated", "<i8"),
        ("reserved", "<i8"),
        ("op", "<i8"),  # the innermost open range
        ("top", "<i8"),
        ("call", "<i4"),
        ("device_type", "<i2"),
        ("device_index", "<i2"),
    ]
)
SAVED = np.dtype(
    [
        ("t", "<i8"),
        ("ptr", "<i8"),  # data pointer of the tensor's storage
        ("block", "<i8"),  # the block it lives in, -1 if allocated before recording
        ("storage_nbytes", "<i8"),
        ("nbytes", "<i8"),  # numel * element size of the saved view
        ("op", "<i8"),  # as a memory row's
        ("top", "<i8"),
        ("call", "<i4"),
        ("kind", "u1"),  # SavedEventKind: 0 pack, 1 unpack
        ("pad", "u1", 3),
        *_TENSOR,
    ]
)
OUTPUTS = np.dtype(
    [
        ("t", "<i8"),
        ("op", "<i8"),  # as a memory row's
        ("ptr", "<i8"),
        ("block", "<i8"),
        ("storage_nbytes", "<i8"),
        *_TENSOR,
    ]
)
MODULES = np.dtype(
    [
        ("t", "<i8"),
        ("address", "<i8"),  # id() of the module object
        ("seq", "<i8"),  # autograd's next sequence number at the hook
        ("call", "<i4"),  # process-wide call id
        ("parent", "<i4"),  # enclosing call, -1 at top level
        ("module", "<i4"),  # small id per module address
        ("enter", "u1"),  # 1 forward pre-hook, 0 forward hook
        ("pad", "u1", 3),
    ]
)
OP_ENDS = np.dtype([("id", "<i8"), ("t1", "<i8")])
NOTES = np.dtype(  # NOTE [ Notes ] in ckrec_hooks.cpp
    [
        ("t", "<i8"),
        ("block", "<i8"),  # a block of the run, or -1: then
        ("sid", "<i8"),  # the storage row Python registered
        ("value", "<i8"),  # a category (a mark) or a module call row (module I/O)
        ("module", "<i4"),
        ("what", "u1"),  # the ledger's codes: 0 mark, 1 saved, 2 input, 3 output
        ("pad", "u1", 3),
    ]
)
INPUTS = np.dtype(  # NOTE [ Op inputs outside modules ] in ckrec_hooks.cpp
    [
        ("t", "<i8"),
        ("op", "<i8"),  # a top-level op outside module calls, backward and optimizer
        ("block", "<i8"),  # the block it read, or -1: then
        ("sid", "<i8"),  # the storage row Python registered, or -1: then
        ("tensor", "<i8"),  # its index in Rows.input_tensors (None there once it died)
    ]
)

DTYPES: dict[str, np.dtype] = {
    "ops": OPS,
    "memory": MEMORY,
    "ooms": OOMS,
    "saved": SAVED,
    "outputs": OUTPUTS,
    "modules": MODULES,
    "op_ends": OP_ENDS,
    "notes": NOTES,
    "inputs": INPUTS,
}


@dataclass(frozen=True)
class Rows:
    """What one ``drain()`` returned: every table's rows since the previous drain."""

    ops: np.ndarray
    memory: np.ndarray
    ooms: np.ndarray
    saved: np.ndarray
    outputs: np.ndarray
    modules: np.ndarray
    op_ends: np.ndarray
    notes: np.ndarray
    inputs: np.ndarray
    input_tensors: tuple[Any, ...] = ()
    """The tensors inputs' ``tensor`` indexes (None for one that died since)."""

    @classmethod
    def empty(cls) -> Rows:
        columns: dict[str, Any] = {name: np.zeros(0, dtype) for name, dtype in DTYPES.items()}
        return cls(**columns)

    def is_empty(self) -> bool:
        return not any(len(getattr(self, name)) for name in DTYPES)


def check_layout(ext: Any) -> str | None:
    """Why the extension's rows cannot be read with these dtypes, or None if they can."""
    sizes = ext.row_sizes()
    wrong = [
        f"{k} {sizes.get(k)} != {d.itemsize}"
        for k, d in DTYPES.items()
        if sizes.get(k) != d.itemsize
    ]
    if ext.DIMS != DIMS:
        wrong.append(f"DIMS {ext.DIMS} != {DIMS}")
    return f"row layout differs ({', '.join(wrong)})" if wrong else None


def drain(ext: Any) -> Rows:
    """The rows written since the last drain, as (read-only) structured arrays."""
    raw = ext.drain()
    columns: dict[str, Any] = {name: np.frombuffer(raw[name], d) for name, d in DTYPES.items()}
    return Rows(**columns, input_tensors=tuple(raw["input_tensors"]))
