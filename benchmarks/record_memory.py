"""The recorder's memory over a long recording: does it grow with the steps recorded?

Records one plain MLP (Linear+ReLU blocks, Adam) for ``--steps`` steps on each recorder path
(``CKVIEW_RECORDER=native`` and ``python``) and reads, after recorded steps 20, 200 and the
last, the Python-side memory (tracemalloc: array.array and numpy buffers are traced too) and
the process's RSS. It prints KiB per extra recorded step between those points (near 0 means
bounded: what is journaled is not kept), and the lines whose allocations grew most between
step 200 and the last (a tracemalloc snapshot diff). RSS also counts memory that glibc keeps
free after the script and the writer freed it: ``--trim`` reads it after ``malloc_trim``.

On a 2-core CPU machine (torch 2.13), KiB per step between steps 200 and 1000, traced / RSS:
before issue 21's fixes: native 15.9 / 52, python 31.3 / 61; storage rows leaving memory:
native 3.5 / 33 (5.8 with --trim; 2.0 / 13.7 over 3000 steps), python 1.6 / 2.8; module-call
rows leaving too: native 1.8 / 32, python 0.14 (RSS within noise: -13 to +6 on reruns). What is
left: the writer's partial chunk (bounded by a chunk) and the ``steps`` table (64 B a step).

    OMP_NUM_THREADS=1 python benchmarks/record_memory.py [--steps 1000] [--path native|python]
        [--trim]
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import resource
import tempfile
import tracemalloc
from pathlib import Path

import torch
from torch import nn

from recorder import Recorder

KIB = 1024


def rss_kib(trim: bool = False) -> int:
    """The process's resident set now (Linux /proc), in KiB; with ``trim``, after glibc gave
    back the free memory it can (``malloc_trim``), which tells growth from fragmentation."""
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // KIB


def measure(path: str, steps: int, marks: tuple[int, ...], top: int, trim: bool) -> None:
    """Record ``steps`` steps on recorder ``path``; print memory at each of ``marks``."""
    os.environ["CKVIEW_RECORDER"] = path
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(128, 128), nn.ReLU())])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    seen: dict[int, tuple[int, int]] = {}
    snapshots: dict[int, tracemalloc.Snapshot] = {}
    tracemalloc.start()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Recorder(Path(tmp) / "t.h5", steps=steps, warmup=1, progress=False),
    ):
        for i in range(steps + 1):  # the warm-up step, then the recorded ones
            loss = model(torch.randn(64, 128)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i in marks:  # after step i (its boundary came at opt.step)
                seen[i] = (tracemalloc.get_traced_memory()[0] // KIB, rss_kib(trim))
                if i in marks[-2:]:
                    snapshots[i] = tracemalloc.take_snapshot()
    tracemalloc.stop()
    print(f"\n[{path}] {steps} recorded steps")
    print(f"{'step':>6} {'traced KiB':>11} {'RSS KiB':>9}")
    for i in marks:
        print(f"{i:>6} {seen[i][0]:>11} {seen[i][1]:>9}")
    for a, b in itertools.pairwise(marks):
        traced = (seen[b][0] - seen[a][0]) / (b - a)
        rss = (seen[b][1] - seen[a][1]) / (b - a)
        print(f"steps {a}..{b}: {traced:.2f} KiB/step traced, {rss:.2f} KiB/step RSS")
    a, b = marks[-2:]
    print(f"grew most between step {a} and {b} (tracemalloc, by line):")
    for stat in snapshots[b].compare_to(snapshots[a], "lineno")[:top]:
        print(f"  {stat.size_diff / KIB:+9.1f} KiB  {stat.traceback[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--path", choices=("native", "python"), action="append")
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--trim", action="store_true", help="malloc_trim before reading RSS")
    args = parser.parse_args()
    marks = tuple(sorted({m for m in (20, 200, args.steps) if m <= args.steps}))
    for path in args.path or ("native", "python"):
        measure(path, args.steps, marks, args.top, args.trim)


if __name__ == "__main__":
    main()
