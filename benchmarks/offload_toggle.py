"""How fast the explorer answers an offload toggle, beside a module toggle, on a CUDA run.

    QT_QPA_PLATFORM=offscreen python benchmarks/offload_toggle.py [--events N] [--blocks B]
        [--toggles T]

Writes the synthetic step of ``gui_performance.py`` (about N memory events, B blocks) with
every storage on a CUDA device ``cuda:0`` (one allocator sample, so that the run has a device
and its "offload saved tensors" checkbox is on), opens it in a 1600x1000 ``MainWindow`` and,
once the plan model is built, times T rounds, as ``gui_performance.py`` times a toggle (the
call, then a synchronous repaint of the timeline), each round

- a module toggle (``PlanPanel.toggle_module`` of a random block), then
- an offload toggle (``PlanPanel.set_offload`` of a random block, ticked first: on, or off
  if it offloads already), which draws the host curve while a block offloads.

Prints both medians, their ratio and the toggle target (50 ms); one offload toggle is checked
against the exact projection (host peak and projected peak), from the fast path.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np


def _gui_performance() -> Any:
    path = Path(__file__).with_name("gui_performance.py")
    spec = importlib.util.spec_from_file_location("gui_performance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gui_performance"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_cuda_trace(bench: Any, path: str, events: int, blocks: int) -> int:
    """The synthetic step with its storages on cuda:0 and one allocator sample; returns the
    number of memory events."""
    tables = bench.synthetic_tables(events, blocks)
    tables["strings"] = [*tables["strings"], "cuda:0"]
    cuda = len(tables["strings"]) - 1
    tables["storages"]["device"] = np.full(len(tables["storages"]["device"]), cuda)
    sample = {"time_ns": [0], "device": [cuda], "reason": [0], "allocated": [1 << 20]}
    sample |= {"reserved": [2 << 20], "largest_free": [-1], "nvml_total": [80 << 30]}
    sample |= {"nvml_process": [3 << 20], "nvml_others": [0]}
    tables["device_samples"] = {k: np.array(v) for k, v in sample.items()}
    bench.write_tables(path, tables)
    return len(tables["memory_events"]["kind"])


def offload_and_paint(bench: Any, window: Any, row: int) -> float:
    """Seconds from ``PlanPanel.set_offload`` of ticked block ``row`` (on if off, else off)
    to the timeline repainted."""
    session = window.plan.session
    region = session.region_of(row)
    counter = bench.PaintCounter(window.timeline.main.viewport())
    try:
        start = time.perf_counter()
        window.plan.set_offload(row, not region.offload)
        bench.repaint_timeline(window.timeline)
        elapsed = float(time.perf_counter() - start)
        if counter.count == 0:
            raise RuntimeError("the offload toggle did not repaint the timeline")
    finally:
        counter.remove()
    return elapsed


def measure_side_by_side(
    bench: Any, window: Any, toggles: int, seed: int = 2
) -> tuple[list[float], list[float]]:
    """``(module, offload)`` seconds of ``toggles`` rounds, each a module toggle of a random
    block, then an offload toggle of another (ticked first, untimed): interleaved, so that the
    machine's load drifts under both alike."""
    app = bench.qt_app()
    rows = bench.block_rows(window)
    rng = np.random.default_rng(seed)
    modules, offloads = [], []
    for _ in range(toggles):
        app.processEvents()
        modules.append(bench.toggle_and_paint(window, int(rows[rng.integers(len(rows))])))
        row = int(rows[rng.integers(len(rows))])
        if window.plan.session.region_of(row) is None:
            window.plan.toggle_module(row)
        app.processEvents()
        offloads.append(offload_and_paint(bench, window, row))
    return modules, offloads


def check_offload(window: Any) -> str:
    """One offload plan's readout against the exact projection of the same selection."""
    from ckview.analysis import project

    session = window.plan.session
    outcome = window.outcome
    exact = project(session.run.tables, session.regions())
    same = (outcome.host_peak_bytes, outcome.peak_bytes) == (
        exact.host_peak_bytes,
        exact.projected_peak.bytes,
    )
    return (
        f"host peak {outcome.host_peak_bytes:,} B (exact {exact.host_peak_bytes:,} B), projected "
        f"peak {outcome.peak_bytes:,} B (exact {exact.projected_peak.bytes:,} B), incremental "
        f"{outcome.incremental}, host curve drawn {window.timeline._host is not None}: "
        f"{'OK' if same and outcome.incremental else 'MISMATCH'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--toggles", type=int, default=30)
    args = parser.parse_args(argv)
    bench = _gui_performance()
    bench.qt_app()
    with tempfile.TemporaryDirectory(prefix="ckview-offload-bench-") as tmp:
        path = os.path.join(tmp, "synthetic_cuda.h5")
        n = write_cuda_trace(bench, path, args.events, args.blocks)
        window = bench.new_window(tmp)
        opened = bench.open_to_first_paint(window, path)
        bench.wait_until(window.plan.is_ready)
        print(
            f"trace: {n:,} memory events on cuda:0; first paint {opened.first_paint_s:.2f} s, "
            f"plan model ready {opened.ready_s:.1f} s after the open"
        )
        modules, offloads = measure_side_by_side(bench, window, args.toggles)
        row = bench.block_rows(window)[0]
        if window.plan.session.region_of(row) is None:
            window.plan.toggle_module(row)
        if not window.plan.session.region_of(row).offload:
            window.plan.set_offload(row, True)
        print(f"check: {check_offload(window)}")
        bench.close_window(window)
    m, o = statistics.median(modules), statistics.median(offloads)
    target = bench.TOGGLE_S
    print(f"module toggle -> redraw:  median {m * 1e3:.1f} ms ({m / target:.2f}x the 50 ms target)")
    print(f"offload toggle -> redraw: median {o * 1e3:.1f} ms ({o / target:.2f}x the 50 ms target)")
    print(f"offload / module: {o / m:.2f}x ({args.toggles} toggles each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
