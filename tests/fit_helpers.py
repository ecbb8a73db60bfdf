"""Helpers of the fit and reserved-memory tests (torch-free)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ckview.trace import TraceWriter, open_trace
from tests.conftest import write_main_run

GIB = 1 << 30


def as_cuda(source: Path, out: Path, total: int, outside: int) -> Path:
    """``source``'s run with every storage on cuda:0, a device of ``total`` bytes, and one
    device sample where NVML counts ``outside`` bytes beyond what PyTorch reserved."""
    with open_trace(source) as trace:
        tables = trace.read_run("main", all_devices=True)
    meta = {"device": "cuda:0", "steps_recorded": 1, "device_total_bytes": total}
    writer = TraceWriter(out, meta=meta)
    for text in tables["strings"]:
        writer.intern(text)
    cuda = writer.intern("cuda:0")
    tables["storages"]["device"][:] = cuda
    sample = {
        "time_ns": [0],
        "device": [cuda],
        "reason": [0],
        "allocated": [1 << 20],
        "reserved": [2 << 20],
        "largest_free": [-1],
        "nvml_total": [total],
        "nvml_process": [(2 << 20) + outside],
        "nvml_others": [0],
    }
    tables["device_samples"] = {k: np.array(v) for k, v in sample.items()}
    write_main_run(writer, tables)
    return out
