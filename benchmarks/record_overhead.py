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
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

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


Timing = tuple[float, float]
"""(median step time, wall time per step including setup and finalisation)."""


def _timed(step: Step, n: int, context: Callable[[], AbstractContextManager[object]]) -> Timing:
    t = time.perf_counter()
    with context():
        times = time_steps(step, n)
    return statistics.median(times), (time.perf_counter() - t) / n


def plain(step: Step, n: int) -> Timing:
    return _timed(step, n, nullcontext)


class _EmptyMode(TorchDispatchMode):
    """The floor: a dispatch mode that only forwards each op (what any such recorder pays)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func._op(*args, **(kwargs or {}))


def empty_mode(step: Step, n: int) -> Timing:
    return _timed(step, n, _EmptyMode)


def recorded(step: Step, n: int) -> Timing:
    with tempfile.TemporaryDirectory() as tmp:
        return _timed(
            step, n, lambda: Recorder(Path(tmp) / "t.h5", steps=n, warmup=0, progress=False)
        )


def profiled(step: Step, n: int) -> Timing:
    return _timed(
        step,
        n,
        lambda: torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            profile_memory=True,
            record_shapes=True,
            with_stack=True,
        ),
    )


def overhead(name: str, step: Step, rounds: int, n: int) -> None:
    for _ in range(3):
        step()  # warm caches, create optimizer state
    runs = {"plain": plain, "empty mode": empty_mode, "ckview": recorded, "profiler": profiled}
    results: dict[str, list[Timing]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            results[key].append(run(step, n))
    for label, which in (("step", 0), ("incl. finalise", 1)):
        median = {k: statistics.median(t[which] for t in v) for k, v in results.items()}
        base = median["plain"]
        print(
            f"{name:<14} {label:<15} plain {base * 1e3:7.2f} ms | empty dispatch mode "
            f"{median['empty mode'] / base:5.2f}x | ckview {median['ckview'] / base:5.2f}x | "
            f"profiler {median['profiler'] / base:5.2f}x | "
            f"ckview/profiler {median['ckview'] / median['profiler']:5.2f}"
        )


def recorder_bytes_per_event(step: Step, n: int) -> None:
    """Python-side memory the recorder holds while recording, per recorded event.

    Buffers are flushed in batches, so memory grows only with what must stay editable until
    the end (one row per storage); the slope between a short and a long recording is the
    per-event cost, the average includes the fixed batch buffers.
    """
    for _ in range(2):
        step()
    points = []
    for steps in (n, 3 * n):
        with tempfile.TemporaryDirectory() as tmp:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            rec = Recorder(Path(tmp) / "t.h5", steps=steps, warmup=0, progress=False)
            with rec:
                time_steps(step, steps)
                peak = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
            points.append((rec._ops.rows + rec._mem.rows + rec._saved.rows, peak))
    (e1, p1), (e2, p2) = points
    print(
        f"recorder memory: {(p2 - p1) / (e2 - e1):.1f} bytes/event marginal, "
        f"{p2 / e2:.1f} bytes/event average over {e2} events"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--write-rows", type=int, default=5_000_000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared 2-core machine
    compute = make_step(width=1024, hidden=4096, depth=4, batch=256)
    small = make_step(width=128, hidden=512, depth=4, batch=16)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {args.rounds}")
    overhead("compute-bound", compute, args.rounds, max(3, args.steps // 3))
    overhead("small-op", small, args.rounds, args.steps * 3)
    recorder_bytes_per_event(small, 100)
    w = measure_write(args.write_rows)
    print(
        f"trace writing: {w['events_per_s'] / 1e6:.2f} M events/s, "
        f"file {w['size_ratio']:.3f}x the raw record size"
    )


if __name__ == "__main__":
    main()
