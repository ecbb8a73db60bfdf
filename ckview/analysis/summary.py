"""One run at a glance: its peak, what is live there, and per-step numbers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.analysis.breakdown import (
    bytes_by_category,
    bytes_by_module,
    module_paths,
    storage_modules,
)
from ckview.analysis.recompute import step_durations
from ckview.analysis.stacks import allocation_site
from ckview.analysis.timeline import (
    MemoryTimeline,
    find_peak,
    live_storages,
    memory_timeline,
    step_allocated_peaks,
    step_segments,
)
from ckview.analysis.timing import Spread
from ckview.analysis.types import Table
from ckview.trace.schema import NO_INDEX, Category, Phase

NO_MODULE = "(no module)"
"""Label of storages created outside any module call."""


@dataclass(frozen=True)
class ActivationPeak:
    """The most activation bytes (tensors saved for backward) live at once, and where.

    The overall peak often falls where activations are already gone (the gradients at the end
    of backward), so this is reported on its own.
    """

    bytes: int
    time_ns: int
    event: int
    """memory_events row after which it is reached, -1 if at the start (or no activation)."""
    step: int
    top_modules: list[tuple[str, int]]
    """Live activation bytes there by the module that saved them, largest first."""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["top_modules"] = [list(pair) for pair in self.top_modules]
        return out


@dataclass(frozen=True)
class RunSummary:
    """The headline numbers of one run; ``to_json`` gives them as plain Python types."""

    peak_bytes: int
    peak_time_ns: int
    peak_event: int
    """memory_events row after which the peak is reached, -1 if the peak is the baseline."""
    peak_step: int
    """step number of the peak event, -1 if the peak is the baseline or before any step."""
    baseline_bytes: int
    by_category: dict[str, int]
    """lowercase category name -> live bytes at the peak, for every category."""
    top_modules: list[tuple[str, int]]
    top_storages: list[dict[str, Any]]
    steps: list[dict[str, int]]
    activation_bytes_saved: int
    n_ops: int
    n_memory_events: int
    recompute_ns: int
    """Time spent recomputing checkpointed regions in backward (sum of RECOMPUTE op times)."""
    step_ns: int
    """Total time of the complete recorded steps (analysis.recompute.step_durations)."""
    activation_peak: ActivationPeak
    plain_step: Spread | None = None
    """The run's plain step time (its unrecorded timing steps), None without them."""

    def to_json(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict (lists instead of tuples)."""
        out = dataclasses.asdict(self)
        out["top_modules"] = [list(pair) for pair in self.top_modules]
        out["activation_peak"] = self.activation_peak.to_json()
        out["plain_step"] = None if self.plain_step is None else self.plain_step.to_json()
        return out


def summarize_run(
    tables: Mapping[str, Table], modules: Table, strings: Sequence[str], top: int = 10
) -> RunSummary:
    """Summarise one run: peak, live bytes there by category / module / storage, and steps.

    ``tables`` maps the run's table names (``steps``, ``ops``, ``memory_events``, ``storages``,
    ``module_calls``) to their columns. The peak is the first maximum of the memory timeline.
    """
    storages, events = tables["storages"], tables["memory_events"]
    tl = memory_timeline(storages, events)
    peak = find_peak(tl)
    live = live_storages(storages, events, peak.event)
    paths = module_paths(modules, strings)
    categories = bytes_by_category(storages, live)
    return RunSummary(
        peak_bytes=peak.bytes,
        peak_time_ns=peak.time_ns,
        peak_event=peak.event,
        peak_step=_step_of_event(tables["steps"], peak.event),
        baseline_bytes=int(tl.total[0]),
        by_category={c.name.lower(): b for c, b in categories.items()},
        top_modules=[(_label(paths, m), b) for m, b in bytes_by_module(storages, live, top)],
        top_storages=top_storages(tables, live, paths, strings, top),
        steps=_step_rows(tables, tl),
        activation_bytes_saved=categories[Category.ACTIVATION],
        n_ops=len(tables["ops"]["name"]),
        n_memory_events=len(events["kind"]),
        recompute_ns=phase_time_ns(tables["ops"], Phase.RECOMPUTE),
        step_ns=int(np.sum(step_durations(tables["steps"]))),
        activation_peak=activation_peak(tables, tl, paths, top),
        plain_step=_plain_step(tables),
    )


def _plain_step(tables: Mapping[str, Table]) -> Spread | None:
    steps = tables.get("timing_steps")
    return None if steps is None else Spread.of(steps["duration_ns"])


def activation_peak(
    tables: Mapping[str, Table], tl: MemoryTimeline, paths: Sequence[str], top: int = 10
) -> ActivationPeak:
    """The first moment the most ACTIVATION bytes are live, and those bytes by module."""
    storages, events = tables["storages"], tables["memory_events"]
    point = int(np.argmax(tl.by_category[Category.ACTIVATION]))
    event = int(tl.event[point])
    live = live_storages(storages, events, event)
    live = live[np.asarray(storages["category"])[live] == Category.ACTIVATION]
    return ActivationPeak(
        bytes=int(tl.by_category[Category.ACTIVATION, point]),
        time_ns=int(tl.time_ns[point]),
        event=event,
        step=_step_of_event(tables["steps"], event),
        top_modules=[(_label(paths, m), b) for m, b in bytes_by_module(storages, live, top)],
    )


def phase_time_ns(ops: Table, phase: Phase) -> int:
    """Summed duration of the ops of one phase (ops do not nest: the recorder sees top-level
    aten ops only)."""
    mask = np.asarray(ops["phase"]) == phase
    return int(np.sum(np.asarray(ops["end_ns"])[mask] - np.asarray(ops["start_ns"])[mask]))


def _label(paths: Sequence[str], module: int) -> str:
    return NO_MODULE if module == NO_INDEX else paths[module]


def _string(strings: Sequence[str], index: int) -> str:
    return "" if index == NO_INDEX else strings[index]


def _op_name(op_names: np.ndarray, strings: Sequence[str], op: int) -> str:
    """Name of op row ``op``; '' for a storage that no recorded op created (pre-existing)."""
    return "" if op == NO_INDEX else strings[op_names[op]]


def _step_of_event(steps: Table, event: int) -> int:
    """Step number whose events include ``event``; -1 for -1 or events before the first step."""
    first = np.asarray(steps["first_memory_event"])
    row = int(np.searchsorted(first, event, side="right")) - 1
    return -1 if event == NO_INDEX or row < 0 else int(steps["step"][row])


def top_storages(
    tables: Mapping[str, Table],
    rows: np.ndarray,
    paths: Sequence[str],
    strings: Sequence[str],
    top: int,
) -> list[dict[str, Any]]:
    """The ``top`` largest of the storage ``rows`` (ties: lower row first), described."""
    storages = tables["storages"]
    nbytes = np.asarray(storages["nbytes"])[rows]
    biggest = rows[np.lexsort((rows, -nbytes))[:top]]
    modules = storage_modules(storages, biggest)
    op_names = np.asarray(tables["ops"]["name"])
    frames, stacks = tables.get("frames"), tables.get("stacks")
    stack = np.asarray(storages.get("stack", np.full(len(storages["nbytes"]), NO_INDEX)))
    return [
        {
            "storage": int(s),
            "nbytes": int(storages["nbytes"][s]),
            "category": Category(int(storages["category"][s])).name.lower(),
            "shape": _string(strings, int(storages["shape"][s])),
            "dtype": _string(strings, int(storages["dtype"][s])),
            "module": _label(paths, int(m)),
            "op": _op_name(op_names, strings, int(storages["op"][s])),
            "allocated_at": ""
            if frames is None or stacks is None
            else allocation_site(frames, stacks, strings, int(stack[s])),
        }
        for s, m in zip(biggest, modules, strict=True)
    ]


def _step_rows(tables: Mapping[str, Table], tl: MemoryTimeline) -> list[dict[str, int]]:
    """Per step: duration, what it held (forwards, backwards, optimizer steps; -1 if unknown,
    as in v1 traces), whether it ended at a step boundary (``complete`` 1, else 0), its peak
    live bytes and its peak bytes allocated since the step began.

    A step's points run from the state at its start (point ``first``) to the state after its
    last event (point ``stop``), so an eventless step still has a peak: what was live then.
    """
    steps = tables["steps"]
    start, stop = step_segments(steps, len(tl.event) - 1)
    allocated = step_allocated_peaks(tables["storages"], tables["memory_events"], steps)
    return [
        {
            "step": int(steps["step"][i]),
            "duration_ns": int(steps["end_ns"][i] - steps["start_ns"][i]),
            "forwards": int(steps["forwards"][i]),
            "backwards": int(steps["backwards"][i]),
            "optimizer_steps": int(steps["optimizer_steps"][i]),
            "complete": int(steps["complete"][i]),
            "peak_bytes": int(tl.total[start[i] : stop[i] + 1].max()),
            "allocated_peak_bytes": int(allocated[i]),
        }
        for i in range(len(start))
    ]
