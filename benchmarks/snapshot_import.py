"""``ckview import`` on big synthetic memory snapshots: time and peak memory, both readers.

    python benchmarks/snapshot_import.py [--events N [N ...]] [--frames K] [--only c|stream]

For each N, writes a snapshot pickle of N history events (alloc, free_requested,
free_completed of blocks that live a few to a few thousand events, over a reused set of
addresses, each event with one of 2000 call stacks of K frames; each event has its own frames
list, and the frame dicts are shared, as torch shares them; ``--unshared`` gives every event
its own frame dicts) and the blocks still live at the end, in a child process; then runs
``ckview import`` on it in a child per reader, the restricted C unpickler (``c``) and the
streaming reader (``stream``, NOTE [ Streaming a snapshot ]), and prints each one's wall time
and peak resident memory (the child's own ``ru_maxrss``, from ``os.wait4``) side by side, and
checks that both traces have the same peak. Not a test: tests never time anything.
"""

from __future__ import annotations

import argparse
import os
import pickle
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
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the child failed: {errors}")
    return wall, usage.ru_maxrss * 1024, text


#: ``STREAM_ABOVE`` for each reader.
READERS = {"c": 1 << 62, "stream": 0}


def import_once(pickle_path: Path, trace_path: Path, reader: str) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, imported peak bytes) of one ``ckview import``."""
    code = (
        "import sys; import ckview.snapshot.stream as s; "
        f"s.STREAM_ABOVE = {READERS[reader]}; from ckview.cli.main import main; "
        f"code = main(['import', {str(pickle_path)!r}, '-o', {str(trace_path)!r}, "
        "'--no-progress']); "
        "from ckview.trace import open_trace; from ckview.analysis import memory_timeline; "
        f"t = open_trace({str(trace_path)!r}).read_run('snapshot:cuda:0'); "
        "print(int(memory_timeline(t['storages'], t['memory_events']).total.max())); "
        "sys.exit(code)"
    )
    wall, rss, out = run_child(code)
    return wall, rss, int(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[2_000_000, 8_000_000])
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--unshared", action="store_true", help="a frame dict per event")
    parser.add_argument("--only", choices=sorted(READERS), help="run one reader only")
    args = parser.parse_args()
    readers = [args.only] if args.only else sorted(READERS)
    for events in args.events:
        with tempfile.TemporaryDirectory() as tmp:
            pickle_path = Path(tmp) / "big.pickle"
            gen = (
                "from benchmarks.snapshot_import import make_snapshot as m; "
                f"from pathlib import Path; m(Path({str(pickle_path)!r}), {events}, "
                f"{args.frames}, shared={not args.unshared})"
            )
            subprocess.run(
                [sys.executable, "-c", gen], env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True
            )
            size = pickle_path.stat().st_size
            print(f"{events:,} events: {size / 2**20:.0f} MiB pickle")
            peaks = set()
            for reader in readers:
                wall, rss, peak = import_once(pickle_path, Path(tmp) / f"{reader}.h5", reader)
                peaks.add(peak)
                print(
                    f"  {reader:<6} {wall:6.1f} s with start-up, peak RSS {rss / 2**20:6.0f} MiB"
                    f" = {rss / size:4.1f}x the pickle ({size / 2**20 / wall:.1f} MiB/s)"
                )
            print(
                f"  imported peak {peaks.pop():,} B"
                if len(peaks) == 1
                else f"  PEAKS DIFFER {peaks}"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
