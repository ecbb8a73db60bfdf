"""Id maps of the native ledger (recorder/native_ledger.py), grown once per step in amortised
constant time per id: block ids -> storage rows, the extension's call ids -> the run's rows (op
rows come from the extension itself: NOTE [ Op rows of a step ] in ckattr.cpp)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ckview.trace.schema import NO_INDEX
from recorder.storage_rows import KeptRows


class Blocks:
    """The run's blocks: block id -> storage row; native call id -> Python call row."""

    def __init__(self) -> None:
        self.rows = IdMap()
        self.calls = IdMap()

    def add(self, blocks: dict[str, np.ndarray], sids: np.ndarray) -> None:
        self.rows.add(blocks["block"].astype(np.int64), sids)

    def sid(self, block: np.ndarray) -> np.ndarray:
        """Storage row of each block id, -1 for a block of no step of this run (or freed in an
        earlier step, NOTE [ Freed blocks leave the map ])."""
        return self.rows.get(np.asarray(block, np.int64))

    # NOTE [ Freed blocks leave the map ]
    # A freed block's id is never named again (NOTE [ Blocks by address ] in ckrec.cpp: every
    # allocation gets a new id), so once its step's rows are written nothing asks for its
    # storage row: the map keeps only the blocks alive, and stays as small as they are however
    # long the recording (issue 21, defect 6: it grew by 16 bytes per block, about 20 KiB per
    # small-op step).
    def forget(self, freed: np.ndarray) -> None:
        """Drop freed block ids (NOTE [ Freed blocks leave the map ]); call it once the step's
        rows are written."""
        self.rows.drop(np.asarray(freed, np.int64))


class Growing:
    """An int64 array appended to in batches, in amortised constant time per value."""

    def __init__(self) -> None:
        self._data = np.zeros(1024, np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def values(self) -> np.ndarray:
        return self._data[: self._n]

    def extend(self, values: np.ndarray) -> None:
        n, m = self._n, len(values)
        if n + m > len(self._data):
            self._data = np.resize(self._data, max(2 * len(self._data), n + m))
        self._data[n : n + m] = values
        self._n = n + m

    def keep(self, kept: np.ndarray) -> None:
        """Keep only the values where ``kept`` (a mask over ``values``), in order."""
        values = self.values[kept]
        self._n = len(values)
        self._data[: self._n] = values


class IdMap:
    """Sorted int keys -> values. Keys mostly come in increasing batches (block and call ids
    count up), which are appended in amortised constant time per key; any other batch is
    merged."""

    def __init__(self) -> None:
        self._keys = Growing()
        self._values = Growing()

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        if not len(keys):
            return
        n = len(self._keys)
        self._keys.extend(keys)
        self._values.extend(values)
        new = self._keys.values[n:]
        if (new[1:] < new[:-1]).any() or (n and new[0] < self._keys.values[n - 1]):
            order = np.argsort(self._keys.values, kind="stable")
            self._keys.values[:] = self._keys.values[order]
            self._values.values[:] = self._values.values[order]

    def keep_values(self, kept: Callable[[np.ndarray], np.ndarray]) -> None:
        """Keep only the keys whose values ``kept`` (values -> a mask) keeps."""
        mask = kept(self._values.values)
        self._keys.keep(mask)
        self._values.keep(mask)

    def drop(self, keys: np.ndarray) -> None:
        """Remove ``keys`` (those not added are ignored)."""
        known = self._keys.values
        if not len(keys) or not len(known):
            return
        at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
        kept = np.ones(len(known), bool)
        kept[at[known[at] == keys]] = False
        self._keys.keep(kept)
        self._values.keep(kept)

    def get(self, query: np.ndarray) -> np.ndarray:
        """The value of each key, NO_INDEX for a key not added (and for negative keys)."""
        keys = self._keys.values
        if not len(keys):
            return np.full(len(query), NO_INDEX, np.int64)
        at = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
        return np.where((keys[at] == query) & (query >= 0), self._values.values[at], NO_INDEX)


class CallMap:
    """Native call ids -> Python call rows, and the rows' modules (from the run's call table,
    where the rows a step names are in memory: NOTE [ Kept rows ] in storage_rows.py)."""

    def __init__(self, calls: IdMap, table: KeptRows) -> None:
        self._calls = calls
        self._table = table

    def row(self, native: np.ndarray) -> np.ndarray:
        return self._calls.get(np.asarray(native, np.int64))

    def module(self, row: np.ndarray) -> np.ndarray:
        modules = np.full(len(row), NO_INDEX, np.int64)
        known = row >= 0
        modules[known] = self._table.column(row[known], "module")
        return modules


def intervals(spans: list[list[int]], now: int) -> np.ndarray:
    """(start, end) rows; an end still -1 (open) is ``now``."""
    if not spans:
        return np.zeros((0, 2), np.int64)
    out = np.asarray(spans, np.int64).reshape(-1, 2)
    out[out[:, 1] < 0, 1] = now
    return out
