"""Break a set of storages down by category and by the module they belong to."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckview.analysis.types import Table
from ckview.trace.schema import NO_INDEX, Category


def bytes_by_category(storages: Table, rows: np.ndarray) -> dict[Category, int]:
    """Bytes of the storage ``rows`` per category, every ``Category`` present (0 if none)."""
    rows = np.asarray(rows, dtype=np.int64)
    sums = np.bincount(
        np.asarray(storages["category"])[rows],
        weights=np.asarray(storages["nbytes"])[rows],
        minlength=len(Category),
    )
    return {c: int(sums[c]) for c in Category}


def storage_modules(storages: Table, rows: np.ndarray) -> np.ndarray:
    """Row in ``modules`` each storage row belongs to (``storages.module``), -1 if none."""
    return np.asarray(storages["module"], dtype=np.int64)[np.asarray(rows, dtype=np.int64)]


def bytes_by_module(
    storages: Table, rows: np.ndarray, top: int | None = 10
) -> list[tuple[int, int]]:
    """``(module row, bytes)`` of the storage ``rows``, by the module each belongs to.

    A parameter, its gradient and its optimizer state belong to the module that owns the
    parameter; anything else to the innermost module whose call created it (not its
    ancestors), so the parts add up to the total. Storages of no module are grouped under
    module row -1. Sorted by bytes descending, then module row; at most ``top`` entries (all
    if ``top`` is None).
    """
    module = storage_modules(storages, rows)
    nbytes = np.asarray(storages["nbytes"], dtype=np.int64)[np.asarray(rows, dtype=np.int64)]
    keys, inverse = np.unique(module, return_inverse=True)
    sums = np.bincount(inverse, weights=nbytes, minlength=len(keys)).astype(np.int64)
    order = np.lexsort((keys, -sums))[:top]
    return [(int(keys[i]), int(sums[i])) for i in order]


def module_paths(modules: Table, strings: Sequence[str]) -> list[str]:
    """Display path of each module row: ``'Net'`` for a root, ``'Net.encoder.layers.0'`` below.

    A module's ``path`` is relative to its root module, so the root's type name is prefixed to
    tell apart several roots (a model and its loss module, say). Raises ``ValueError`` if the
    ``parent`` column has a cycle.
    """
    root = _roots(np.asarray(modules["parent"], dtype=np.int64))
    types = np.asarray(modules["type"])
    return [
        f"{strings[types[r]]}.{strings[p]}" if strings[p] else strings[types[r]]
        for p, r in zip(np.asarray(modules["path"]), root, strict=True)
    ]


def _roots(parent: np.ndarray) -> np.ndarray:
    """Root row of every module: climb one level per round, all modules at once."""
    root = np.arange(len(parent))
    for _ in range(len(parent) + 1):
        up = parent[root]
        if np.all(up == NO_INDEX):
            return root
        root = np.where(up == NO_INDEX, root, up)
    raise ValueError("modules.parent has a cycle: every module must lead up to a root (-1)")
