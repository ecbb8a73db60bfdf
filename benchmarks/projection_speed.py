"""How fast ProjectionModel answers a toggle, on a synthetic 1e6-event step with 200 blocks.

    python benchmarks/projection_speed.py [--events N] [--blocks B] [--toggles T]

Builds a synthetic training step (``synthetic_run``: B blocks called in a row, each allocating
activations it saves for backward and temporaries it frees, then backward in reverse), makes
each block a candidate region, and times ``ProjectionModel.peak`` after toggling one random
candidate at a time (the GUI's click). Prints the median toggle time and its ratio to the 1 ms
target, next to one exact ``project`` on the same selection, and checks that both agree.

``synthetic_run(events, blocks, seed)`` is importable (the tests use a small one).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from ckview.analysis.projection import ProjectionModel
from ckview.analysis.regions import ModuleRegion
from ckview.trace.schema import (
    MODULES,
    RUN_TABLES,
    Category,
    IOKind,
    MemoryEventKind,
    Phase,
    SavedEventKind,
)

TARGET_NS = 1_000_000
OP_NS = 100  # ops are 100 ns apart; the events of one op a few ns apart within it


def _table(name: str, columns: dict[str, Any]) -> dict[str, np.ndarray]:
    """A run table with the schema's dtypes; columns not given are -1 (indices) or 0."""
    n = len(next(iter(columns.values())))
    out = {}
    for c in RUN_TABLES[name]:
        value = columns.get(c.name, -1 if c.name in {"op", "module_call", "module", "stack"} else 0)
        out[c.name] = np.broadcast_to(np.asarray(value), (n,)).astype(c.dtype)
    return out


def synthetic_run(events: int = 1_000_000, blocks: int = 200, seed: int = 0) -> dict[str, Any]:
    """Run tables (plus ``modules`` and ``strings``) of one synthetic step of about ``events``
    memory events: a root call running ``blocks`` block calls (module rows 2.., children of a
    ModuleList at row 1), then backward block by block in reverse, then an optimizer step.

    Per block, two thirds of its storages are made in forward: 30% saved for backward (freed
    by the block's backward), the rest temporaries living a few ops (5% outlive the block); the
    last is the block's output, saved by the next block and freed by its backward. The other
    third are backward temporaries. Each block's backward also makes a gradient that stays.
    """
    rng = np.random.default_rng(seed)
    per_block = max(events // (2 * blocks), 4)
    kf = max(2 * per_block // 3, 2)  # forward storages (= forward ops) per block
    kb = max(per_block - kf, 1)  # backward temporaries (= backward ops) per block
    n_fwd, n_bwd = blocks * kf, blocks * kb
    block_f = np.repeat(np.arange(blocks), kf)
    op_f = np.arange(n_fwd)
    t_fwd = OP_NS * (op_f + 1)
    bwd_start = OP_NS * (n_fwd + 10)
    # Backward runs the blocks in reverse; the backward op h belongs to block b_order[h // kb].
    block_b = np.repeat(np.arange(blocks)[::-1], kb)
    t_bwd = bwd_start + OP_NS * np.arange(n_bwd)
    bwd_begin = bwd_start + OP_NS * kb * (blocks - 1 - np.arange(blocks))  # per block
    bwd_end = bwd_begin + OP_NS * (kb - 1)

    last = (op_f % kf) == kf - 1
    saved = (rng.random(n_fwd) < 0.3) & ~last
    life = rng.geometric(0.3, n_fwd)
    outlive = rng.random(n_fwd) < 0.05
    life[outlive] += kf
    free_f = np.minimum(t_fwd + OP_NS * life, OP_NS * n_fwd) + 7
    free_f = np.where(saved, bwd_begin[block_f] + 50, free_f)
    # A block's output is saved by the next block (or the loss) and freed by its backward.
    next_end = np.append(bwd_end[1:], bwd_start - 50)
    free_f = np.where(last, next_end[block_f] + 60, free_f)

    nbytes = np.concatenate(
        [
            rng.integers(1, 64, n_fwd) * 4096,
            rng.integers(1, 32, n_bwd) * 4096,
            np.full(blocks, 65536),  # gradients
            [16 << 20],  # parameters
        ]
    )
    n_st = len(nbytes)
    grad_alloc = bwd_end + 40
    alloc = np.concatenate([t_fwd + 3, t_bwd + 3, grad_alloc, [-1]])
    free = np.concatenate([free_f, t_bwd + 5, np.full(blocks, -1), [-1]])
    category = np.concatenate(
        [
            np.where(saved | last, Category.ACTIVATION, Category.TEMPORARY),
            np.full(n_bwd, Category.TEMPORARY),
            np.full(blocks, Category.GRADIENT),
            [Category.PARAMETER],
        ]
    )
    block_of = np.concatenate([block_f, block_b, np.arange(blocks), [-1]])
    op = np.concatenate([op_f, n_fwd + np.arange(n_bwd), n_fwd + np.searchsorted(t_bwd, bwd_end)])
    op = np.append(op, -1)

    ev_storage = np.concatenate([np.arange(n_st), np.flatnonzero(free >= 0)])
    ev_kind = np.concatenate(
        [
            np.where(alloc >= 0, MemoryEventKind.ALLOC, MemoryEventKind.SEEN),
            np.full(int((free >= 0).sum()), MemoryEventKind.FREE),
        ]
    )
    ev_time = np.concatenate([np.maximum(alloc, 0), free[free >= 0]])
    order = np.lexsort((ev_kind, ev_time))
    ops_time = np.concatenate([t_fwd, t_bwd])
    ev_op = np.searchsorted(ops_time, ev_time[order], side="right") - 1

    call_start = np.concatenate([[1], t_fwd[::kf] - 20])
    call_end = np.concatenate([[OP_NS * n_fwd + 50], t_fwd[kf - 1 :: kf] + 30])
    # Every forward storage is made inside its block; the output is the last one.
    outputs = np.flatnonzero(last)
    io_call = np.concatenate([np.arange(2, blocks + 1), np.arange(1, blocks + 1)])
    io_storage = np.concatenate([outputs[:-1], outputs])
    io_kind = np.concatenate([np.full(blocks - 1, IOKind.INPUT), np.full(blocks, IOKind.OUTPUT)])

    packed = np.flatnonzero(saved | last)
    pack_call = np.where(last[packed], np.minimum(block_f[packed] + 2, blocks), block_f[packed] + 1)
    pack_call[last[packed] & (block_f[packed] == blocks - 1)] = 0  # the loss, in the root call
    unpack_time = np.where(pack_call == 0, bwd_start - 60, bwd_begin[np.maximum(pack_call - 1, 0)])

    tables: dict[str, Any] = {
        "steps": _table("steps", {"step": [0], "start_ns": [0], "end_ns": [int(ev_time.max())]}),
        "module_calls": _table(
            "module_calls",
            {
                "module": np.concatenate([[0], np.arange(2, blocks + 2)]),
                "parent": np.concatenate([[-1], np.zeros(blocks, dtype=np.int64)]),
                "phase": Phase.FORWARD,
                "start_ns": call_start,
                "end_ns": call_end,
            },
        ),
        "module_io": _table("module_io", {"call": io_call, "storage": io_storage, "kind": io_kind}),
        "ops": _table(
            "ops",
            {
                "phase": np.concatenate(
                    [np.full(n_fwd, Phase.FORWARD), np.full(n_bwd, Phase.BACKWARD)]
                ),
                "module_call": np.concatenate([block_f, block_b]) + 1,
                "start_ns": ops_time,
                "end_ns": ops_time + OP_NS // 2,
            },
        ),
        "memory_events": _table(
            "memory_events",
            {
                "kind": ev_kind[order],
                "storage": ev_storage[order],
                "op": ev_op,
                "time_ns": ev_time[order],
            },
        ),
        "storages": _table(
            "storages",
            {
                "nbytes": nbytes,
                "category": category,
                "op": op,
                "module_call": np.where(block_of >= 0, block_of + 1, -1),
                "module": np.where(block_of >= 0, block_of + 2, -1),
                "alloc_ns": alloc,
                "free_ns": free,
            },
        ),
        "recompute_regions": _table("recompute_regions", {"region": np.zeros(0)}),
        "saved_events": _table(
            "saved_events",
            {
                "kind": np.repeat([SavedEventKind.PACK, SavedEventKind.UNPACK], len(packed)),
                "storage": np.tile(packed, 2),
                "module_call": np.tile(pack_call, 2),
                "nbytes": np.tile(nbytes[packed], 2),
                "time_ns": np.concatenate([alloc[packed] + 1, unpack_time]),
            },
        ),
    }
    tables["modules"], tables["strings"] = _modules(blocks)
    return tables


def _modules(blocks: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """A model ('') holding a ModuleList 'blocks' of ``blocks`` Blocks."""
    strings = ["", "Net", "blocks", "ModuleList", "Block"]
    paths = [0, 2]
    for i in range(blocks):
        strings.append(f"blocks.{i}")
        paths.append(len(strings) - 1)
    columns = {
        "path": paths,
        "type": [1, 3] + [4] * blocks,
        "parent": [-1, 0] + [1] * blocks,
        "param_bytes": [0, 0] + [65536] * blocks,
        "container": [0, 2] + [0] * blocks,
        "sequential_forward": [0] * (blocks + 2),
    }
    return {c.name: np.asarray(columns[c.name], dtype=c.dtype) for c in MODULES}, strings


def time_toggles(model: ProjectionModel, toggles: int, seed: int) -> list[int]:
    """Nanoseconds of ``model.peak`` after each of ``toggles`` random one-candidate toggles."""
    rng = np.random.default_rng(seed)
    selected = rng.random(len(model.candidates)) < 0.5
    times = []
    for _ in range(toggles):
        selected[rng.integers(len(selected))] ^= True
        t0 = time.perf_counter_ns()
        model.peak(selected)
        times.append(time.perf_counter_ns() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--toggles", type=int, default=500)
    args = parser.parse_args()

    t0 = time.perf_counter()
    tables = synthetic_run(args.events, args.blocks)
    t1 = time.perf_counter()
    model = ProjectionModel(tables, [ModuleRegion(row) for row in range(2, args.blocks + 2)])
    t2 = time.perf_counter()
    n_events = len(tables["memory_events"]["kind"])
    print(
        f"synthetic step: {n_events:,} memory events, {len(model.candidates)} candidates "
        f"(built in {t1 - t0:.2f} s); model built in {t2 - t1:.2f} s"
    )

    toggles = time_toggles(model, args.toggles, seed=1)
    median = statistics.median(toggles)
    selection = np.arange(0, len(model.candidates), 2)
    t3 = time.perf_counter_ns()
    exact = model.project(selection)
    exact_ns = time.perf_counter_ns() - t3
    agree = exact.projected_peak == model.peak(selection)
    print(
        f"toggle -> peak: median {median / 1e3:.1f} us over {len(toggles)} toggles "
        f"(p90 {np.percentile(toggles, 90) / 1e3:.1f} us); "
        f"{median / TARGET_NS:.3f}x the 1 ms target"
    )
    print(
        f"exact projection of the same step: {exact_ns / 1e6:.1f} ms "
        f"({exact_ns / median:.0f}x a toggle); incremental == exact: {agree}"
    )


if __name__ == "__main__":
    main()
