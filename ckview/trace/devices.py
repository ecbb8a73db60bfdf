"""A run's memory on one device: the timeline of a CUDA run is the GPU's.

NOTE [ One device per timeline ]
The recorder sees every storage of the step, whatever its device: on a CUDA run also the CPU
ones (the batch before ``.to("cuda")``, pinned buffers, the CPU RNG state checkpoint keeps,
optimizer step counters, what the data pipeline makes between steps). Added to the GPU's bytes
they would make a peak no device ever had, and the recorded peak would not agree with
``torch.cuda.max_memory_allocated``. So a run whose storages are on more than one device is read
as the run on its *main device*: the accelerator holding the most bytes (the CPU only when no
accelerator is there). Its other storages are left out, with every row that refers to them
(memory events, saved events, module inputs and outputs), and the rows that point into
``memory_events`` (``steps.first_memory_event``) are renumbered. Ops, module calls, steps and
regions stay whole: they are the step's, not a device's. A run on one device reads unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_STORAGE_REFERENCES = ("memory_events", "saved_events", "module_io")
"""The tables whose ``storage`` column holds rows of ``storages``."""


def main_device(storages: Mapping[str, np.ndarray], strings: Sequence[str]) -> str | None:
    """The device a run's timeline is about (NOTE [ One device per timeline ]); None when all
    its storages are on one device (or it has none)."""
    ids, inverse = np.unique(np.asarray(storages["device"]), return_inverse=True)
    if len(ids) < 2:
        return None
    totals = np.bincount(inverse, weights=np.asarray(storages["nbytes"], dtype=np.float64))
    names = [strings[int(i)] if 0 <= i < len(strings) else "" for i in ids]
    accelerator = [name not in ("cpu", "") for name in names]
    if any(accelerator):
        totals = np.where(accelerator, totals, -1.0)
    return names[int(np.argmax(totals))]


def on_device(tables: Mapping[str, Any], strings: Sequence[str], device: str) -> dict[str, Any]:
    """A run's ``tables`` (all or some of those ``Trace.read_run`` gives; ``storages``,
    ``memory_events`` and ``steps`` at least) with only the storages on ``device`` and the rows
    that refer to them (NOTE [ One device per timeline ]). Adds ``timeline_device`` (the
    device) and ``left_out`` (storages left out, by device)."""
    storages = tables["storages"]
    ids, inverse = np.unique(np.asarray(storages["device"]), return_inverse=True)
    names = [strings[int(i)] if 0 <= i < len(strings) else "" for i in ids]
    keep = np.asarray([name == device for name in names], dtype=bool)[inverse]
    new_row = np.cumsum(keep) - 1
    out = dict(tables)
    out["storages"] = {name: np.asarray(col)[keep] for name, col in storages.items()}
    for table in _STORAGE_REFERENCES:
        if table not in tables:
            continue
        rows = tables[table]
        refs = np.asarray(rows["storage"], dtype=np.int64)
        kept = keep[refs]
        out[table] = {name: np.asarray(col)[kept] for name, col in rows.items()}
        out[table]["storage"] = new_row[refs[kept]].astype(np.asarray(rows["storage"]).dtype)
    events_kept = keep[np.asarray(tables["memory_events"]["storage"], dtype=np.int64)]
    before = np.concatenate(([0], np.cumsum(events_kept)))  # kept events before each row
    steps = dict(tables["steps"])
    first = np.asarray(steps["first_memory_event"])
    steps["first_memory_event"] = before[first.astype(np.int64)].astype(first.dtype)
    out["steps"] = steps
    out["timeline_device"] = device
    counts = np.bincount(inverse, minlength=len(names))
    out["left_out"] = {
        name: int(n) for name, n in zip(names, counts, strict=True) if name != device and n
    }
    return out
