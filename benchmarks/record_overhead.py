"""Recorder overhead, side by side in one run (ratios, not absolute times).

For a compute-bound step (6 TransformerEncoder layers, d=256, seq 128, batch 8) and a small-op
step (40 x Linear 64->64 + GELU) it times the same training step unrecorded, under a dispatch
mode that does nothing (the floor of any op-hook recorder), with the allocator's events taken in
a window per step and nothing else (the floor of any recorder that keeps each completed step's
allocator events on disk, as ckview's journal does), under ``ckview``'s recorder by default, on
its native path (``CKVIEW_RECORDER=native``: the extension's ops and allocator blocks, no
dispatch mode) and on its Python path (the fallback), the native extension alone (its callbacks
and hooks drained per step, none of the recorder's Python: the native path's floor), under
``torch.profiler.profile(profile_memory=True)`` (the allocator's events alone) and under
``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``,
interleaving them in rounds so machine noise hits all alike. "per step" is the median step time,
"all-in" the wall time per step including start, finalise and the trace written (the profilers'
stop). Then it measures the recorder's memory per event and the trace writer's throughput and
compression.

    OMP_NUM_THREADS=1 python benchmarks/record_overhead.py [--rounds 3] [--steps 200]
        [--case small-op|compute-bound] [--optimizer adamw|sgd]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_write import measure_write

from recorder import Recorder
from recorder.allocations import AllocatorEvents

Step = Callable[[], None]


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,  # the research's step: some 800 small ops a step on the CPU
    "sgd": torch.optim.SGD,  # issue 20's small-op step: one op per parameter
}


def make_step(model: nn.Module, batch_shape: tuple[int, ...], optimizer: str = "adamw") -> Step:
    """One training step of ``model`` on a random batch, with ``optimizer`` (lr 1e-4)."""
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=1e-4)

    def step() -> None:
        x = torch.randn(*batch_shape)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def small_op_step(batch: int = 32, optimizer: str = "adamw") -> Step:
    """40 x (Linear 64->64, GELU): ops of microseconds, where the per-op cost is everything."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(40):
        layers += [nn.Linear(64, 64), nn.GELU()]
    return make_step(nn.Sequential(*layers), (batch, 64), optimizer)


def compute_bound_step(optimizer: str = "adamw") -> Step:
    """6 TransformerEncoder layers, d=256, seq 128, batch 8: ops of milliseconds."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
    return make_step(model, (8, 128, 256), optimizer)


def time_steps(step: Step, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


Timing = tuple[float, float]
"""(median step time, wall time per step including setup and finalisation)."""

StepTimes = Callable[[Step, int], list[float]]
"""Runs ``step`` ``n`` times under something and returns the step times."""


def interleaved(
    runs: dict[str, StepTimes], step: Step, rounds: int, n: int, warm: int = 0
) -> tuple[dict[str, float], dict[str, float]]:
    """Each run's step times, the runs taking turns ``rounds`` times, less the first ``warm``
    steps of each turn: their tenth percentiles (which this shared host's noise moves least) and
    medians, by run."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            gc.collect()  # what the run before left is collected here, untimed
            times[name] += run(step, n + warm)[warm:]
    low = {k: float(np.percentile(v, 10)) for k, v in times.items()}
    return low, {k: float(np.median(v)) for k, v in times.items()}


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


def recorded(step: Step, n: int, path: str | None = None) -> Timing:
    """ckview's recorder: the default path, or the one ``CKVIEW_RECORDER`` forces (``path``)."""
    before = os.environ.get("CKVIEW_RECORDER")
    if path is not None:
        os.environ["CKVIEW_RECORDER"] = path
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return _timed(
                step,
                n,
                lambda: Recorder(
                    Path(tmp) / "t.h5", steps=n, warmup=0, progress=False, timing_steps=0
                ),
            )
    finally:
        if before is None:
            os.environ.pop("CKVIEW_RECORDER", None)
        else:
            os.environ["CKVIEW_RECORDER"] = before


def recorded_native(step: Step, n: int) -> Timing:
    return recorded(step, n, "native")


def recorded_python(step: Step, n: int) -> Timing:
    """The fallback: the Python recorder (a dispatch mode and allocator windows)."""
    return recorded(step, n, "python")


def recorded_with_stacks(step: Step, n: int) -> Timing:
    with tempfile.TemporaryDirectory() as tmp:
        return _timed(
            step,
            n,
            lambda: Recorder(
                Path(tmp) / "t.h5", steps=n, warmup=0, progress=False, timing_steps=0, stacks=True
            ),
        )


def windows_alone(step: Step, n: int) -> Timing:
    """The allocator's events in a window per step, and nothing else: the recorder's profiler
    window started before each step and stopped, its events read, after it. What any recorder
    pays that keeps each completed step's allocator events safe from a kill (ckview's journal
    does), before it records a single op."""
    events = AllocatorEvents()
    times = []
    t = time.perf_counter()
    for _ in range(n):
        began = time.perf_counter()
        events.start()
        step()
        events.stop()
        times.append(time.perf_counter() - began)
    return statistics.median(times), (time.perf_counter() - t) / n


@contextmanager
def extension_running(
    step: Step,
    module_hooks: bool = True,
    *,
    saved_hooks: bool = True,
    memory: bool = True,
    outputs: bool = True,
) -> Iterator[Step]:
    """The extension alone recording: its op callback, and unless told otherwise its memory
    reporter, op outputs, module hooks and saved-tensor hooks. Yields ``step`` followed by a
    drain of its rows."""
    from recorder.native import load
    from recorder.native.source import NativeSource

    ext: Any = load().ext
    source = NativeSource(ext, lambda kind, facts: None, outputs=outputs)
    undo = source.install()
    if not module_hooks:
        for hook in source._hooks:
            hook.remove()
    if not saved_hooks and source._saved is not None:
        source._saved.__exit__(None, None, None)
        source._saved = None

    def drained_step() -> None:
        step()
        ext.drain()

    ext.start(ops=True, memory=memory, outputs=outputs)
    try:
        yield drained_step
    finally:
        ext.stop()
        undo()


def extension_times(step: Step, n: int, **captures: bool) -> list[float]:
    """Step times under the extension with ``captures`` (``extension_running``'s flags)."""
    with extension_running(step, **captures) as drained_step:
        return time_steps(drained_step, n)


def extension_alone(step: Step, n: int) -> Timing:
    """The native path's floor: the extension's op callback, memory reporter, module and
    saved-tensor hooks, its rows drained at every step's end, and none of the recorder's Python
    (no hooks of its own, no attribution, no tables, no journal). The gap between this row and
    ``ckview default`` is what the recorder's Python costs."""
    t = time.perf_counter()
    times = extension_times(step, n)
    return statistics.median(times), (time.perf_counter() - t) / n


def profiled_memory(step: Step, n: int) -> Timing:
    return _timed(
        step,
        n,
        lambda: torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ),
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
    path = default_path()
    runs = {
        "plain": plain,
        f"ckview default ({path})": recorded,
        **({} if path == "native" else {"ckview native": recorded_native}),
        "ckview python (fallback)": recorded_python,
        "ckview --stacks": recorded_with_stacks,
        "profiler (memory)": profiled_memory,
        "profiler (memory, shapes, stacks)": profiled,
        "empty dispatch mode": empty_mode,
        "allocator window per step": windows_alone,
        **({"native extension alone": extension_alone} if path == "native" else {}),
    }
    results: dict[str, list[Timing]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            # What the run before left is collected here, untimed. torch.profiler's events
            # are reference cycles: left to the collector, the next run's first collection took
            # 0.3-1.1 s to free them (+1.5-5.5 ms all-in per small-op step for whatever ran
            # next). A full collection in the timed region would charge every run, plain too,
            # about 0.15 s; so the profilers' all-in leaves out freeing their events.
            gc.collect()
            results[key].append(run(step, n))
    median = {
        k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
        for k, v in results.items()
    }
    base_step, base_all = median["plain"]
    print(f"\n{name}: {n} steps a run, {rounds} rounds interleaved, medians")
    print(f"  {'':36} {'per step':>9} {'all-in':>9}")
    print(f"  {'plain':36} {base_step * 1e3:7.2f}ms {base_all * 1e3:7.2f}ms")
    for key in list(runs)[1:]:
        step_t, all_t = median[key]
        print(f"  {key:36} {step_t / base_step:8.2f}x {all_t / base_all:8.2f}x")


def default_path() -> str:
    """Which recorder ``CKVIEW_RECORDER`` unset (``auto``) runs here."""
    from recorder.native import load, mode

    return "native" if mode() != "python" and load().ext is not None else "python"


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
            assert rec._sink is not None
            run = rec._sink.tables  # the last run's tables stay readable after close
            points.append((run.ops.rows + run.mem.rows + run.saved.rows, peak))
    (e1, p1), (e2, p2) = points
    print(
        f"recorder memory: {(p2 - p1) / (e2 - e1):.1f} bytes/event marginal, "
        f"{p2 / e2:.1f} bytes/event average over {e2} events"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="recorded steps a small-op run")
    parser.add_argument("--compute-steps", type=int, default=4, help="a compute-bound run")
    parser.add_argument("--write-rows", type=int, default=5_000_000)
    parser.add_argument(
        "--case",
        choices=("small-op", "compute-bound"),
        help="time only this step (and skip the memory and trace-writing figures)",
    )
    parser.add_argument(
        "--optimizer",
        choices=tuple(OPTIMIZERS),
        default="adamw",
        help="the timed steps' optimizer (issue 20's small-op step uses sgd)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared 2-core machine
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {args.rounds}, "
        f"optimizer {args.optimizer}"
    )
    if args.case in (None, "compute-bound"):
        step = compute_bound_step(args.optimizer)
        overhead("compute-bound", step, args.rounds, args.compute_steps)
    if args.case in (None, "small-op"):
        overhead("small-op", small_op_step(optimizer=args.optimizer), args.rounds, args.steps)
    if args.case is not None:
        return
    recorder_bytes_per_event(small_op_step(optimizer=args.optimizer), 100)
    w = measure_write(args.write_rows)
    print(
        f"trace writing: {w['events_per_s'] / 1e6:.2f} M events/s, "
        f"file {w['size_ratio']:.3f}x the raw record size"
    )


if __name__ == "__main__":
    main()
