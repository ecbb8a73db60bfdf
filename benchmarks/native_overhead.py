"""Native event sources' overhead per step, side by side in one run (ratios, not times).

On ``record_overhead.py``'s small-op step (40 x Linear 64->64 + GELU, AdamW) and compute-bound
step (6 TransformerEncoder layers, d=256), it times the same training step:

- ``plain``: unrecorded;
- ``capture``: ops, allocator blocks, module calls and saved tensors recorded by the extension,
  drained at every step boundary (the rows reach Python; nothing reads them);
- ``capture+attribute``: the same through ``NativeSource``, whose boundaries also run the numpy
  attribution (``recorder/native/attribute.py``), as a recorder would;
- ``+outputs``: that, with every op's output storages, dtype and sizes recorded too.

Each round runs every mechanism in a shuffled order, each block of steps right after a block of
plain steps; a mechanism's ratio in a round is its median step over the plain block's. Reported:
median over rounds of the ratio of thread CPU time (what the other jobs on a shared machine
disturb least), and of wall time.

    OMP_NUM_THREADS=1 python benchmarks/native_overhead.py [--rounds 7] [--only small]
        [--device cuda]

With ``--device cuda`` the same two models train on the GPU (each step ends with a
synchronize), and the ratios are of wall time: there the CPU's time is the launch time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.nn.modules import module as nn_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_overhead import compute_bound_step, small_op_step

from recorder.native import load
from recorder.native.rows import drain
from recorder.native.source import NativeSource

Step = Callable[[], None]
Boundary = Callable[[], None]
Mechanism = Callable[[Any], AbstractContextManager[Boundary]]


@contextmanager
def plain(ext: Any) -> Iterator[Boundary]:
    yield lambda: None


@contextmanager
def capture(ext: Any) -> Iterator[Boundary]:
    hooks = [
        nn_module.register_module_forward_pre_hook(ext.pre_hook),
        nn_module.register_module_forward_hook(ext.post_hook, always_call=True),
    ]
    ext.start(ops=True, memory=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(ext.pack, ext.unpack):
            yield lambda: drain(ext)
    finally:
        ext.stop()
        for hook in hooks:
            hook.remove()


def attributed(outputs: bool) -> Mechanism:
    @contextmanager
    def mechanism(ext: Any) -> Iterator[Boundary]:
        source = NativeSource(ext, lambda kind, facts: None, outputs=outputs)
        undo = source.install()
        source.begin_run()
        try:

            def boundary() -> None:
                source.step_ends(0)
                source.step_begins(0)

            yield boundary
        finally:
            source.end_run()
            undo()

    return mechanism


MECHANISMS: dict[str, Mechanism] = {
    "capture": capture,
    "capture+attribute": attributed(outputs=False),
    "+outputs": attributed(outputs=True),
}


def on_cuda(make: Callable[[], Step]) -> Step:
    """``make``'s step with its model, optimizer state and batches on the GPU."""
    real_randn = torch.randn
    torch.set_default_device("cuda")
    try:
        step = make()
    finally:
        torch.set_default_device(None)

    def step_on_cuda() -> None:
        torch.randn = lambda *a, **k: real_randn(*a, device="cuda", **k)  # type: ignore[assignment]
        try:
            step()
        finally:
            torch.randn = real_randn  # type: ignore[assignment]
        torch.cuda.synchronize()

    return step_on_cuda


def run_block(ext: Any, mechanism: Mechanism, step: Step, n: int) -> tuple[float, float]:
    """Median thread-CPU and wall seconds per step (the boundary's work included)."""
    cpu, wall = [], []
    with mechanism(ext) as boundary:
        for _ in range(n):
            c, w = time.thread_time(), time.perf_counter()
            step()
            boundary()
            cpu.append(time.thread_time() - c)
            wall.append(time.perf_counter() - w)
    return statistics.median(cpu), statistics.median(wall)


def measure(ext: Any, step: Step, n: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median over rounds of each mechanism's (cpu, wall) ratio to the plain block before it."""
    for _ in range(3):
        step()
    ratios: dict[str, list[tuple[float, float]]] = {name: [] for name in MECHANISMS}
    plain_ms: list[float] = []
    for _ in range(rounds):
        names = list(MECHANISMS)
        random.shuffle(names)
        for name in names:
            base = run_block(ext, plain, step, n)
            mine = run_block(ext, MECHANISMS[name], step, n)
            ratios[name].append((mine[0] / base[0], mine[1] / base[1]))
            plain_ms.append(base[0] * 1e3)
    out = {
        name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        for name, rs in ratios.items()
    }
    out["plain"] = (statistics.median(plain_ms), 0.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=("small", "compute"))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ext, reason = load()
    if ext is None:
        sys.exit(f"native_overhead: {reason}")
    steps = {"small-op": (small_op_step, 10), "compute-bound": (compute_bound_step, 3)}
    if args.only:
        steps = {k: v for k, v in steps.items() if k.startswith(args.only)}
    head = f"torch {torch.__version__} on {args.device}, {args.rounds} rounds"
    print(f"{head}; ratios to plain: CPU (wall)")
    for label, (make, n) in steps.items():
        result = measure(ext, on_cuda(make) if args.device == "cuda" else make(), n, args.rounds)
        cells = ", ".join(
            f"{name} {cpu:.2f}x ({wall:.2f}x)"
            for name, (cpu, wall) in result.items()
            if name != "plain"
        )
        print(f"{label}: plain {result['plain'][0]:.1f} ms CPU per step; {cells}")


if __name__ == "__main__":
    main()
