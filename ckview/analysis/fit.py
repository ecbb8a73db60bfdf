"""What fits: a training step at another size (batch, sequence length, image side), fitted from
recordings of the same step at two sizes.

``fit_sizes(a, b, (size_a, size_b))`` checks that the two runs are the same step (NOTE [ One
step at two sizes ]) and reads each storage's scaling from its shapes (NOTE [ Scaling from
shapes ]); ``SizeFit.tables_at(n)`` is run ``a`` with every storage at size ``n``: a run that
``project``, ``ProjectionModel`` and the planner take as they take a recorded one, so plans and
presets apply to it. ``largest_size`` searches the largest size for which a test holds (a
projected peak under a budget). Pure functions over arrays: no files, no torch.

NOTE [ One step at two sizes ]
    Two recordings of one script at two sizes run the same ops in the same order, in the same
    module calls, and create, save and free the same storages in the same order; only the
    storages' shapes (and bytes) and the times differ. Storages are matched by the op and module
    call that created them and their order (a storage row is one lifetime, NOTE [ One lifetime
    per storage row ] in timeline.py): the check compares, table by table, the module tree, the
    module calls, the ops (name, phase, call), the storages (creating op and call, category,
    dtype, device), the memory events (kind, storage, op), the saved-tensor events and the
    module I/O, and names the first row where the two runs part. A script whose control flow
    depends on the size (a branch, a loop over the length) parts there and cannot be fitted:
    the stream at a third size is unknown.

NOTE [ Scaling from shapes ]
    A storage whose bytes are the same at both sizes is constant (parameters, optimizer state,
    buffers of a fixed size). Otherwise each dimension of its shape (the shape of the first
    tensor seen on it) is a linear function of the size through its two values, ``d(n) = d_a +
    (d_b - d_a) (n - a) / (b - a)`` rounded to a whole number, and its bytes scale with the
    product of its dimensions: linear where one dimension grows (activations of a batch),
    quadratic where two do (attention scores ``B x H x S x S`` over the sequence, logits
    ``B x S x V`` over the batch and the sequence together), and so on. A flattened dimension
    (``B*S``) is linear in either. Where the first shape does not account for the storage's
    bytes at both sizes (a storage larger than the view first seen on it, the bytes not
    proportional to its elements), its bytes are fitted linearly in the size instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.analysis.breakdown import module_paths
from ckview.analysis.types import RunTables
from ckview.trace.schema import Phase

MAX_SIZE = 1 << 20
"""``largest_size`` searches no further (a step whose memory does not grow fits at every size)."""

FROM_BYTES = -1
"""``SizeFit.degree`` of a storage whose bytes are fitted linearly, not from its shape."""


class StreamsPart(ValueError):
    """The two recordings are not the same step (NOTE [ One step at two sizes ]); the message
    says where they part."""


# ----------------------------------------------------------------------------- matching

# Columns compared row by row, per table; string ids are compared as the strings they name.
# Ops first: a call made at one size only parts the ops too, and an op names where.
_COMPARED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ops", ("name", "phase", "module_call")),
    ("module_calls", ("module", "parent", "phase")),
    ("storages", ("op", "module_call", "category", "dtype", "device")),
    ("memory_events", ("kind", "storage", "op")),
    ("saved_events", ("kind", "storage", "op")),
    ("module_io", ("call", "storage", "kind")),
)
_STRING_COLUMNS = {("ops", "name"), ("storages", "dtype"), ("storages", "device")}


def check_same_step(a: RunTables, b: RunTables, sizes: tuple[int, int]) -> None:
    """Raise ``StreamsPart`` naming where runs ``a`` and ``b`` (recorded at ``sizes``) part
    (NOTE [ One step at two sizes ]); nothing if they are the same step."""
    paths_a = module_paths(a["modules"], a["strings"])
    if paths_a != module_paths(b["modules"], b["strings"]):
        raise StreamsPart(
            f"the recordings at {sizes[0]} and {sizes[1]} hold different models (their module "
            "trees differ); record the same script at both sizes"
        )
    for table, columns in _COMPARED:
        row = _first_difference(a, b, table, columns)
        if row is not None:
            raise StreamsPart(_where(a, b, table, row, sizes, paths_a))


def _first_difference(a: RunTables, b: RunTables, table: str, columns: Sequence[str]) -> int | None:
    """First row of ``table`` where ``a`` and ``b`` differ in ``columns`` (the shorter table's
    length where one is a prefix of the other); None if they are the same."""
    n_a, n_b = len(a[table][columns[0]]), len(b[table][columns[0]])
    n = min(n_a, n_b)
    differs = np.zeros(n, dtype=bool)
    for column in columns:
        col_a, col_b = _column(a, table, column)[:n], _column(b, table, column)[:n]
        differs |= col_a != col_b
    rows = np.flatnonzero(differs)
    if len(rows):
        return int(rows[0])
    return None if n_a == n_b else n


def _column(tables: RunTables, table: str, column: str) -> np.ndarray:
    values = np.asarray(tables[table][column])
    if (table, column) in _STRING_COLUMNS:
        strings = np.asarray(tables["strings"], dtype=object)
        return strings[values] if len(values) else values.astype(object)
    return values


def _where(
    a: RunTables,
    b: RunTables,
    table: str,
    row: int,
    sizes: tuple[int, int],
    paths: Sequence[str],
) -> str:
    """One line: where the runs part, and what to do."""
    if table == "ops":
        what = f"op {row}: {_op(a, row, paths)} at {sizes[0]}, {_op(b, row, paths)} at {sizes[1]}"
    else:
        op = _op_before(a, table, row)
        during = f" (during op {op}: {_op(a, op, paths)})" if op >= 0 else ""
        what = f"{table} row {row}{during}"
    return (
        f"the recordings at {sizes[0]} and {sizes[1]} are not the same step: they part at "
        f"{what}; control flow that depends on the size cannot be fitted (record at two sizes "
        "that take the same path)"
    )


def _op(tables: RunTables, row: int, paths: Sequence[str]) -> str:
    """``aten.mm.default in Net.encoder (forward)``, or 'the end' past the last op."""
    ops = tables["ops"]
    if row >= len(ops["name"]):
        return "the end"
    call = int(ops["module_call"][row])
    where = ""
    if call >= 0:
        where = f" in {paths[int(tables['module_calls']['module'][call])]}"
    phase = Phase(int(ops["phase"][row])).name.lower()
    return f"{tables['strings'][int(ops['name'][row])]}{where} ({phase})"


def _op_before(tables: RunTables, table: str, row: int) -> int:
    """The op a row of ``table`` belongs to (memory and saved events, storages), else -1."""
    column = tables[table].get("op")
    if column is None or row >= len(column):
        return -1
    return int(column[row])


# ----------------------------------------------------------------------------- scaling


@dataclass(frozen=True)
class SizeFit:
    """Each storage of run ``base`` (recorded at ``sizes[0]``) as a function of the size
    (NOTE [ Scaling from shapes ])."""

    base: RunTables
    sizes: tuple[int, int]
    nbytes: np.ndarray
    """(2, s) int64: each storage's bytes at the two sizes."""
    degree: np.ndarray
    """(s,) int64: how many dimensions grow with the size (0 constant, 1 linear, 2 quadratic),
    ``FROM_BYTES`` for bytes fitted linearly."""
    group: np.ndarray
    """(s,) int64: the storage's pair of shapes, a row of ``dims``; -1 for none."""
    dims: tuple[tuple[np.ndarray, np.ndarray], ...]
    """Per pair of shapes, its dimensions at the two sizes."""

    def nbytes_at(self, n: int) -> np.ndarray:
        """(s,) int64: each storage's bytes at size ``n``."""
        a, b = self.sizes
        t = (n - a) / (b - a)
        low, high = self.nbytes
        out = np.rint(low + (high - low) * t).clip(min=0).astype(np.int64)
        shaped = self.degree > 0
        if shaped.any():
            numel = np.array([_numel(d_a, d_b, t) for d_a, d_b in self.dims], dtype=np.float64)
            numel_a = np.array([np.prod(d_a, dtype=np.float64) for d_a, _ in self.dims])
            g = self.group[shaped]
            out[shaped] = np.rint(low[shaped] * numel[g] / numel_a[g]).astype(np.int64)
        out[self.degree == 0] = low[self.degree == 0]
        return out

    def shapes_at(self, n: int) -> list[str]:
        """Each pair of shapes' shape at size ``n`` ('8x32x64')."""
        t = (n - self.sizes[0]) / (self.sizes[1] - self.sizes[0])
        return ["x".join(str(int(d)) for d in _dims(d_a, d_b, t)) for d_a, d_b in self.dims]

    def tables_at(self, n: int) -> dict[str, Any]:
        """Run ``base`` at size ``n``: its tables with every storage's bytes and shape at ``n``
        (saved tensors scaled with their storage), the same events in the same order."""
        nbytes = self.nbytes_at(n)
        tables = dict(self.base)
        storages = dict(self.base["storages"])
        storages["nbytes"] = nbytes
        strings = list(self.base["strings"])
        if self.dims:
            shape = np.asarray(storages["shape"]).copy()
            ids = np.arange(len(strings), len(strings) + len(self.dims))
            strings += self.shapes_at(n)
            shaped = self.group >= 0
            shape[shaped] = ids[self.group[shaped]]
            storages["shape"] = shape
        tables["storages"], tables["strings"] = storages, strings
        saved = dict(self.base["saved_events"])
        rows = np.asarray(saved["storage"], dtype=np.int64)
        ratio = nbytes[rows] / np.maximum(self.nbytes[0][rows], 1)
        saved["nbytes"] = np.rint(np.asarray(saved["nbytes"]) * ratio).astype(np.int64)
        tables["saved_events"] = saved
        return tables

    def counts(self) -> dict[str, int]:
        """How many storages scale how: constant, linear, quadratic, higher, from bytes."""
        d = self.degree
        return {
            "constant": int((d == 0).sum()),
            "linear": int((d == 1).sum()),
            "quadratic": int((d == 2).sum()),
            "higher": int((d > 2).sum()),
            "from_bytes": int((d == FROM_BYTES).sum()),
        }


def fit_sizes(a: RunTables, b: RunTables, sizes: tuple[int, int]) -> SizeFit:
    """The scaling of every storage of run ``a`` (recorded at ``sizes[0]``) from run ``b`` (at
    ``sizes[1]``): ``StreamsPart`` if they are not the same step (NOTE [ One step at two
    sizes ]), ValueError if the sizes are not two different positive whole numbers."""
    if sizes[0] == sizes[1] or min(sizes) < 1:
        raise ValueError(f"sizes must be two different positive whole numbers, not {sizes}")
    check_same_step(a, b, sizes)
    nbytes = np.stack([np.asarray(t["storages"]["nbytes"], dtype=np.int64) for t in (a, b)])
    shapes = [np.asarray(t["storages"]["shape"], dtype=np.int64) for t in (a, b)]
    degree = np.zeros(len(nbytes[0]), dtype=np.int64)
    group = np.full(len(degree), -1, dtype=np.int64)
    grows = np.flatnonzero(nbytes[0] != nbytes[1])
    degree[grows] = FROM_BYTES
    dims: list[tuple[np.ndarray, np.ndarray]] = []
    if len(grows):
        pairs = np.stack([shapes[0][grows], shapes[1][grows]], axis=1)
        keys, inverse = np.unique(pairs, axis=0, return_inverse=True)
        order = np.argsort(inverse.reshape(-1), kind="stable")
        groups = np.split(grows[order], np.cumsum(np.bincount(inverse.reshape(-1)))[:-1])
        for (shape_a, shape_b), members in zip(keys, groups, strict=True):
            d_a, d_b = _parse(a["strings"][shape_a]), _parse(b["strings"][shape_b])
            if d_a is None or d_b is None or len(d_a) != len(d_b):
                continue
            numel_a, numel_b = np.prod(d_a, dtype=np.float64), np.prod(d_b, dtype=np.float64)
            if numel_a == 0:
                continue
            # NOTE [ Scaling from shapes ]: the shape must account for the bytes at both sizes.
            members = members[nbytes[1][members] * numel_a == nbytes[0][members] * numel_b]
            if not len(members):
                continue
            degree[members] = int((d_a != d_b).sum())
            group[members] = len(dims)
            dims.append((d_a, d_b))
    return SizeFit(a, sizes, nbytes, degree, group, tuple(dims))


def _parse(shape: str) -> np.ndarray | None:
    """'4x32x64' as its dimensions ('' for a scalar: none); None if it is not a shape."""
    if shape == "":
        return np.zeros(0, dtype=np.int64)
    parts = shape.split("x")
    if not all(p.isdigit() for p in parts):
        return None
    return np.array([int(p) for p in parts], dtype=np.int64)


def _dims(d_a: np.ndarray, d_b: np.ndarray, t: float) -> np.ndarray:
    """The dimensions at the size a fraction ``t`` of the way from size a to size b (linear
    in the size, whole, never negative)."""
    return np.rint(d_a + (d_b - d_a) * t).clip(min=0)


def _numel(d_a: np.ndarray, d_b: np.ndarray, t: float) -> float:
    return float(np.prod(_dims(d_a, d_b, t), dtype=np.float64))


# ----------------------------------------------------------------------------- answers


def largest_size(fits: Callable[[int], bool], start: int, limit: int = MAX_SIZE) -> int | None:
    """The largest size ``n`` in 1..``limit`` with ``fits(n)``, searched from ``start``
    (doubling, then bisecting: memory never shrinks as the size grows, so ``fits`` holds up to
    a size and not beyond); 0 if not even size 1 fits, None if ``limit`` fits."""
    start = min(max(start, 1), limit)
    if fits(start):
        low, high = start, None
        while high is None:
            if low == limit:
                return None
            n = min(low * 2, limit)
            low, high = (n, None) if fits(n) else (low, n)
    else:
        low, high = 0, start
        while low == 0 and high > 1:
            n = high // 2
            low, high = (n, high) if fits(n) else (0, n)
        if low == 0:
            return 0
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


__all__ = [
    "FROM_BYTES",
    "MAX_SIZE",
    "SizeFit",
    "StreamsPart",
    "check_same_step",
    "fit_sizes",
    "largest_size",
]
