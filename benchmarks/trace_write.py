"""Trace write throughput and file size, for the default filters and a few alternatives.

    python benchmarks/trace_write.py [--rows N] [--repeat K]

Writes N realistic ``memory_events`` rows and N/2 ``ops`` rows in 64 Ki-row batches through
``TraceWriter`` (as the recorder does) and prints, side by side, rows/s and stored size / raw
size (raw = sum of column itemsize * rows). Targets: >= 5 M events/s and <= 0.25 x raw. Each
configuration runs K times, interleaved, and the best run counts (these machines are noisy).

``measure_write(rows)`` is importable by other benchmarks.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from ckview.trace import TraceWriter
from ckview.trace.schema import MemoryEventKind, Phase

BATCH = 65536
Columns = dict[str, np.ndarray]


def realistic_memory_events(rows: int, rng: np.random.Generator) -> Columns:
    """Alloc/free pairs in op order: most storages die within a few ops, 10% live long."""
    storages = max(rows // 2, 1)
    alloc_op = np.sort(rng.integers(0, int(storages * 0.8) + 1, storages))
    life = rng.geometric(0.4, storages)
    long_lived = rng.random(storages) < 0.1
    life[long_lived] = rng.integers(10, 20_000, int(long_lived.sum()))
    kind = np.repeat(np.array([MemoryEventKind.ALLOC, MemoryEventKind.FREE], np.uint8), storages)
    kind[: min(50, storages)] = MemoryEventKind.SEEN  # parameters that existed before recording
    storage = np.tile(np.arange(storages, dtype=np.int32), 2)
    op = np.concatenate([alloc_op, alloc_op + life])
    order = np.lexsort((kind, op))[:rows]
    op = op[order]
    # Events of one op are tens of ns apart; ops are microseconds apart.
    new_op = np.diff(op, prepend=-1) != 0
    gaps = np.where(new_op, rng.integers(500, 20_000, rows), rng.integers(20, 300, rows))
    return {
        "kind": kind[order],
        "storage": storage[order],
        "op": op.astype(np.int32),
        "time_ns": (1_000_000_000 + np.cumsum(gaps)).astype(np.int64),
    }


def realistic_ops(rows: int, rng: np.random.Generator) -> Columns:
    """Forward, backward, optimizer ops of two steps; op names repeat layer by layer."""
    index = np.arange(rows)
    forward, backward = int(rows * 0.4), int(rows * 0.55)
    phase = np.full(rows, Phase.OPTIMIZER, np.uint8)
    phase[:forward] = Phase.FORWARD
    phase[forward : forward + backward] = Phase.BACKWARD
    module_call = np.where(phase == Phase.OPTIMIZER, -1, index // 4).astype(np.int32)
    seq_nr = np.full(rows, -1, np.int64)
    seq_nr[forward : forward + backward] = forward - 1 - (index[:backward] * forward // backward)
    gaps = rng.integers(500, 20_000, rows)
    start = 1_000_000_000 + np.cumsum(gaps)
    return {
        "name": rng.integers(0, 120, 37).astype(np.int32)[index % 37],
        "phase": phase,
        "module_call": module_call,
        "step": (index * 2 // max(rows, 1)).astype(np.int32),
        "start_ns": start.astype(np.int64),
        "end_ns": (start + rng.integers(300, gaps)).astype(np.int64),
        "seq_nr": seq_nr,
    }


def _raw_bytes(columns: Columns) -> int:
    return sum(c.nbytes for c in columns.values())


def _stored_bytes(path: str, table: str) -> int:
    with h5py.File(path, "r") as f:
        group = f["runs"]["main"][table]
        return sum(group[name].id.get_storage_size() for name in group)


def _write_one(path: str, table: str, columns: Columns, options: Mapping[str, Any]) -> float:
    """Seconds to write one table in batches, from creating the file to closing it.

    Closing counts: HDF5 keeps chunks in its cache and compresses them as late as that.
    """
    rows = len(next(iter(columns.values())))
    began = time.perf_counter()
    with TraceWriter(path, **options) as writer:
        run = writer.run("main")
        for start in range(0, rows, BATCH):
            run.append(table, {name: col[start : start + BATCH] for name, col in columns.items()})
    return time.perf_counter() - began


def _measure(tables: Mapping[str, Columns], options: Mapping[str, Any]) -> dict[str, float]:
    seconds, stored, file_bytes = {}, {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        for table, columns in tables.items():
            path = os.path.join(tmp, f"{table}.h5")
            seconds[table] = _write_one(path, table, columns, options)
            stored[table] = _stored_bytes(path, table)
            file_bytes += os.path.getsize(path)
    raw = {table: _raw_bytes(columns) for table, columns in tables.items()}
    rows = {table: len(next(iter(columns.values()))) for table, columns in tables.items()}
    return {
        "rows": rows["memory_events"],
        "ops_rows": rows["ops"],
        "seconds": sum(seconds.values()),
        "events_per_s": rows["memory_events"] / seconds["memory_events"],
        "ops_rows_per_s": rows["ops"] / seconds["ops"],
        "rows_per_s": sum(rows.values()) / sum(seconds.values()),
        "events_size_ratio": stored["memory_events"] / raw["memory_events"],
        "ops_size_ratio": stored["ops"] / raw["ops"],
        "raw_bytes": sum(raw.values()),
        "file_bytes": file_bytes,
        "size_ratio": file_bytes / sum(raw.values()),
    }


def make_tables(rows: int, seed: int = 0) -> dict[str, Columns]:
    """``rows`` memory events and ``rows // 2`` ops of realistic content."""
    rng = np.random.default_rng(seed)
    return {
        "memory_events": realistic_memory_events(rows, rng),
        "ops": realistic_ops(max(rows // 2, 1), rng),
    }


def measure_write(rows: int) -> dict[str, float]:
    """Write ``rows`` memory events and ``rows // 2`` ops with ckview's default settings.

    Each table is written to its own file, in 64 Ki-row batches, timed from creating the file to
    closing it. Returns ``events_per_s`` (memory_events rows/s), ``ops_rows_per_s``,
    ``rows_per_s`` (both tables), size ratios stored / raw (``events_size_ratio``,
    ``ops_size_ratio``, ``size_ratio`` for the whole files), ``raw_bytes``, ``file_bytes``.
    """
    return _measure(make_tables(rows), {})


DEFAULT = "gzip-1 + shuffle, threads (default)"


def _alternatives() -> dict[str, dict[str, Any]]:
    """TraceWriter options of each configuration compared."""
    configs: dict[str, dict[str, Any]] = {
        DEFAULT: {},
        "gzip-1 + shuffle, HDF5 serial": {"threads": 0},
        "lzf + shuffle": {"filters": {"compression": "lzf", "shuffle": True}},
        "gzip-1, no shuffle": {"filters": {"compression": "gzip", "compression_opts": 1}},
        "uncompressed": {"filters": {}},
    }
    try:
        import hdf5plugin  # optional: only to show what a plugin filter would buy
    except ImportError:
        return configs
    configs["zstd-1 + shuffle (hdf5plugin)"] = {
        "filters": {**hdf5plugin.Zstd(clevel=1), "shuffle": True}
    }
    configs["blosc-lz4 + shuffle (hdf5plugin)"] = {"filters": dict(hdf5plugin.Blosc(cname="lz4"))}
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="memory_events rows")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    args = parser.parse_args()
    tables = make_tables(args.rows)
    configs = _alternatives()
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):
        for name, options in configs.items():
            result = _measure(tables, options)
            if name not in best or result["events_per_s"] > best[name]["events_per_s"]:
                best[name] = result
    print(
        f"{args.rows:,} memory_events + {args.rows // 2:,} ops rows, batches of {BATCH:,}, "
        f"best of {args.repeat}"
    )
    print(
        f"{'configuration':34} {'events/s':>10} {'ops rows/s':>11} {'all rows/s':>11} "
        f"{'events size':>12} {'ops size':>9} {'file/raw':>9}"
    )
    for name, r in best.items():
        print(
            f"{name:34} {r['events_per_s'] / 1e6:9.2f}M {r['ops_rows_per_s'] / 1e6:10.2f}M "
            f"{r['rows_per_s'] / 1e6:10.2f}M {r['events_size_ratio']:12.3f} "
            f"{r['ops_size_ratio']:9.3f} {r['size_ratio']:9.3f}"
        )
    default = best[DEFAULT]
    verdict = default["events_per_s"] >= 5e6 and default["size_ratio"] <= 0.25
    print(f"default meets >= 5M events/s and <= 0.25x raw: {'yes' if verdict else 'NO'}")


if __name__ == "__main__":
    main()
