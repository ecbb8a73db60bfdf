"""``ckview import`` on a big synthetic memory snapshot: time, peak memory, file sizes.

    python benchmarks/snapshot_import.py [--events N] [--frames K]

Writes a snapshot pickle of N history events (alloc, free_requested, free_completed of blocks
that live a few to a few thousand events, over a reused set of addresses, each event with one
of 2000 call stacks of K frames; each event has its own frames list, and the frame dicts are
shared, as torch shares them; ``--unshared`` gives every event its own frame dicts) and the
blocks still live at the end,
in a child process; then runs ``ckview import`` on it in another child and prints its wall
time, its peak resident memory (the child's ``ru_maxrss``) against the pickle's size, and checks
the imported peak against the snapshot's own replay. Not a test: tests never time anything.
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def make_snapshot(path: Path, events: int, frames: int, seed: int = 0, shared: bool = True) -> None:
    """Write a synthetic snapshot of about ``events`` history events to ``path``."""
    rng = np.random.default_rng(seed)
    pool = [
        {"filename": f"/src/model/layer{i}.py", "line": int(i * 7 % 500), "name": f"forward{i}"}
        for i in range(200)
    ]
    stacks = [[int(j) for j in rng.integers(0, len(pool), frames)] for _ in range(2000)]
    blocks = events // 3
    size = (rng.integers(1, 2048, blocks) * 512).tolist()
    life = rng.geometric(0.05, blocks)
    free_at = np.arange(blocks) + life
    order = np.argsort(np.concatenate((np.arange(blocks) * 2, free_at * 2 + 1)), kind="stable")
    addresses: list[int] = []
    free_slots: list[int] = []
    addr_of = [0] * blocks
    trace = []
    t = 1_700_000_000_000_000
    for key in order.tolist():
        b = key % blocks
        t += 3
        chosen = stacks[int(rng.integers(len(stacks)))]
        stack = [pool[j] if shared else dict(pool[j]) for j in chosen]
        common = {"size": size[b], "stream": 0, "time_us": t, "frames": stack}
        if key < blocks:
            if free_slots:
                addr_of[b] = free_slots.pop()
            else:
                addr_of[b] = 0x7F00_0000_0000 + len(addresses) * (1 << 20)
                addresses.append(addr_of[b])
            trace.append({"action": "alloc", "addr": addr_of[b], **common})
        elif free_at[b] < blocks:  # freed within the history
            trace.append({"action": "free_requested", "addr": addr_of[b], **common})
            trace.append({"action": "free_completed", "addr": addr_of[b], **common})
            free_slots.append(addr_of[b])
    live = {e["addr"]: e["size"] for e in trace if e["action"] == "alloc"}
    for e in trace:
        if e["action"] == "free_completed":
            live.pop(e["addr"], None)
    segments = [
        {
            "device": 0,
            "address": a,
            "total_size": 1 << 20,
            "stream": 0,
            "blocks": [{"address": a, "size": s, "state": "active_allocated", "frames": []}],
        }
        for a, s in live.items()
    ]
    with open(path, "wb") as f:
        pickle.dump({"segments": segments, "device_traces": [trace]}, f, protocol=4)


def run_child(code: str) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (bytes) and stdout of ``python -c code``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) * 1024, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--unshared", action="store_true", help="a frame dict per event")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pickle_path = Path(tmp) / "big.pickle"
        trace_path = Path(tmp) / "big.h5"
        start = time.perf_counter()
        gen = (
            "from benchmarks.snapshot_import import make_snapshot as m; from pathlib import Path; "
            f"m(Path({str(pickle_path)!r}), {args.events}, {args.frames}, "
            f"shared={not args.unshared})"
        )
        subprocess.run(
            [sys.executable, "-c", gen], env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True
        )
        print(
            f"synthetic snapshot: {pickle_path.stat().st_size / 2**20:.0f} MiB pickle "
            f"({time.perf_counter() - start:.1f} s to make)"
        )
        code = (
            "import time, sys; from ckview.cli.main import main; t = time.perf_counter(); "
            f"code = main(['import', {str(pickle_path)!r}, '-o', {str(trace_path)!r}, "
            "'--no-progress']); print(time.perf_counter() - t); sys.exit(code)"
        )
        wall, rss, out = run_child(code)
        print(
            f"ckview import: {float(out.split()[-1]):.1f} s inside, {wall:.1f} s with start-up; "
            f"peak RSS {rss / 2**20:.0f} MiB = {rss / pickle_path.stat().st_size:.1f}x the "
            f"pickle; trace {trace_path.stat().st_size / 2**20:.0f} MiB"
        )
        check = (
            "from ckview.snapshot import load_snapshot, replay_peak; "
            "from ckview.trace import open_trace; from ckview.analysis import memory_timeline; "
            f"s = load_snapshot({str(pickle_path)!r}); "
            f"t = open_trace({str(trace_path)!r}).read_run('snapshot:cuda:0'); "
            "print(replay_peak(s, 0), int(memory_timeline(t['storages'], t['memory_events'])"
            ".total.max()))"
        )
        replayed, imported = run_child(check)[2].split()
        print(f"peak: replay {int(replayed):,} B, imported {int(imported):,} B")


if __name__ == "__main__":
    main()
