"""Recorder overhead, side by side in one run (ratios, not absolute times).

For a compute-bound step (~50 ms or more) and a small-op step (5 ms or less) it times the same
training step unrecorded, under ``ckview``'s recorder, and under
``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``,
interleaving the three in rounds so machine noise hits all alike. Then it measures the
recorder's memory per event and the trace writer's throughput and compression.

    python benchmarks/record_overhead.py [--rounds 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_write import measure_write

from recorder import Recorder

Step = Callable[[], None]


def make_step(width: int, hidden: int, depth: int, batch: int) -> Step:
    """A residual-MLP training step with AdamW: wide layers are compute-bound, narrow small-op."""
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)
        )
        for _ in range(depth)
    ]
    model = nn.Sequential(*blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        x = torch.randn(batch, width)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_steps(step: Step, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


def plain(step: Step, n: int) -> float:
    return statistics.median(time_steps(step, n))


def recorded(step: Step, n: int) -> float:
    with (
        tempfile.TemporaryDirectory() as tmp,
        Recorder(Path(tmp) / "t.h5", steps=n, warmup=0, progress=False),
    ):
        times = time_steps(step, n)
    return statistics.median(times)


def profiled(step: Step, n: int) -> float:
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ):
        times = time_steps(step, n)
    return statistics.median(times)


def overhead(name: str, step: Step, rounds: int, n: int) -> None:
    for _ in range(3):
        step()  # warm caches, create optimizer state
    results: dict[str, list[float]] = {"plain": [], "ckview": [], "profiler": []}
    for _ in range(rounds):
        results["plain"].append(plain(step, n))
        results["ckview"].append(recorded(step, n))
        results["profiler"].append(profiled(step, n))
    base = statistics.median(results["plain"])
    rec = statistics.median(results["ckview"])
    prof = statistics.median(results["profiler"])
    print(
        f"{name:<14} plain {base * 1e3:7.2f} ms | ckview {rec / base:5.2f}x | "
        f"profiler {prof / base:5.2f}x | ckview/profiler {rec / prof:5.2f}"
    )


def recorder_bytes_per_event(step: Step, n: int) -> None:
    """Python-side memory the recorder holds while recording, per recorded event."""
    for _ in range(2):
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.h5"
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        rec = Recorder(path, steps=n, warmup=0, progress=False)
        with rec:
            time_steps(step, n)
            peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        events = len(rec._ops.data["name"]) * 0 + rec._ops.rows + rec._mem.rows + rec._saved.rows
    print(f"recorder memory: {peak / events:.1f} bytes/event over {events} events (peak {peak} B)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--write-rows", type=int, default=5_000_000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared 2-core machine
    compute = make_step(width=1024, hidden=4096, depth=4, batch=256)
    small = make_step(width=64, hidden=256, depth=4, batch=16)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {args.rounds}")
    overhead("compute-bound", compute, args.rounds, max(3, args.steps // 3))
    overhead("small-op", small, args.rounds, args.steps * 3)
    recorder_bytes_per_event(small, 200)
    w = measure_write(args.write_rows)
    print(f"trace writing: {w}")


if __name__ == "__main__":
    main()
