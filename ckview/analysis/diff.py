"""Two runs side by side: how far apart their peaks are, and where the difference comes from.

The runs may come from one trace (baseline and checkpointed, two plans) or two (two ranks, before
and after a change). They are aligned by name, not by row: categories by name, modules by path,
and tensors by *kind*: the module that made a storage, the op, its category, dtype and shape.
Two runs of one step make the same kinds of tensor, so what one run holds at its peak and the
other does not is named by module, op and shape, with bytes on each side.

NOTE [ What kept a checkpointed peak up ]
    In a run with recompute regions (a checkpointed run, a plan's run), every storage live at
    its peak is put in one class, the first that applies:
        - ``gradients``: parameters' gradients (at the end of backward they are the peak);
        - ``recompute``: made by a recompute in backward (the region being replayed);
        - ``region outputs``: the output of a checkpointed call, kept for the next block;
        - ``kept inside regions``: made in the forward of a checkpointed call and still live:
          checkpointing should have dropped it, so something else holds it (a Function's ctx,
          a cache, a Python reference);
        - ``region inputs``: an input of a checkpointed call, which checkpoint keeps for the
          recompute;
        - ``saved outside regions``: an activation made outside every checkpointed call;
        - ``other``: parameters, optimizer state, batches, temporaries.
    A region is a module whose calls were recomputed (``recompute_regions.module``); its
    forward calls, and every call inside them, are checkpointed calls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ckview.analysis.breakdown import bytes_by_category, module_paths
from ckview.analysis.summary import NO_MODULE
from ckview.analysis.timeline import (
    event_deltas,
    find_peak,
    live_at_start,
    live_storages,
    memory_timeline,
)
from ckview.analysis.types import Table
from ckview.trace.schema import NO_INDEX, Category, IOKind, Phase

Run = Mapping[str, Any]
"""What ``Trace.read_run`` returns: the run's tables, ``modules`` and ``strings``."""

HELD_CLASSES = (
    "gradients",
    "recompute",
    "region outputs",
    "kept inside regions",
    "region inputs",
    "saved outside regions",
    "other",
)
"""The classes of NOTE [ What kept a checkpointed peak up ], in order of precedence."""


@dataclass(frozen=True)
class PeakMoment:
    """When a run peaks and what was running then."""

    bytes: int
    time_ns: int
    step: int
    phase: str
    """'forward', 'backward', 'recompute', 'optimizer', 'other' ('' at the start)."""
    op: str
    module: str


@dataclass(frozen=True)
class TensorKind:
    """Live bytes of one kind of tensor at each run's peak (NOTE in the module docstring)."""

    module: str
    op: str
    category: str
    dtype: str
    shape: str
    a_bytes: int
    b_bytes: int
    a_count: int
    b_count: int

    @property
    def delta(self) -> int:
        return self.b_bytes - self.a_bytes


@dataclass(frozen=True)
class Held:
    """What a checkpointed run holds at its peak (NOTE [ What kept a checkpointed peak up ])."""

    bytes_by_class: dict[str, int]
    kept_inside: list[TensorKind]
    """The kinds of tensor kept inside regions, largest first (``b_bytes`` holds the bytes)."""


@dataclass(frozen=True)
class RunDiff:
    """Run B against run A: peaks, and the difference by category, module and tensor."""

    a: PeakMoment
    b: PeakMoment
    by_category: list[tuple[str, int, int]]
    """(category, A bytes, B bytes) at each run's peak, every category."""
    by_module: list[tuple[str, int, int]]
    """(module path, A bytes, B bytes) at each run's peak, largest change first."""
    tensors: list[TensorKind]
    """Kinds of tensor whose live bytes differ at the peaks, largest change first."""
    held_a: Held | None
    """What A holds at its peak, if it has recompute regions; else None."""
    held_b: Held | None

    @property
    def delta(self) -> int:
        return self.b.bytes - self.a.bytes

    def to_json(self) -> dict[str, Any]:
        """The diff as JSON-ready plain types."""
        out = asdict(self)
        out["delta"] = self.delta
        out["by_category"] = [list(row) for row in self.by_category]
        out["by_module"] = [list(row) for row in self.by_module]
        return out


def diff_runs(a: Run, b: Run, top: int = 10) -> RunDiff:
    """Run ``b`` against run ``a``, each as ``Trace.read_run`` returns it."""
    peak_a, live_a = _peak(a)
    peak_b, live_b = _peak(b)
    cat_a = bytes_by_category(a["storages"], live_a)
    cat_b = bytes_by_category(b["storages"], live_b)
    return RunDiff(
        a=peak_a,
        b=peak_b,
        by_category=[(c.name.lower(), cat_a[c], cat_b[c]) for c in Category],
        by_module=_largest_changes(_by_module(a, live_a), _by_module(b, live_b), top),
        tensors=_tensor_changes(_kinds(a, live_a), _kinds(b, live_b), top),
        held_a=held_at_peak(a, live_a, top),
        held_b=held_at_peak(b, live_b, top),
    )


def _peak(run: Run) -> tuple[PeakMoment, np.ndarray]:
    storages, events, ops = run["storages"], run["memory_events"], run["ops"]
    peak = find_peak(memory_timeline(storages, events))
    live = live_storages(storages, events, peak.event)
    op = int(events["op"][peak.event]) if peak.event != NO_INDEX else NO_INDEX
    strings = run["strings"]
    if op == NO_INDEX:
        phase = name = module = ""
    else:
        phase = Phase(int(ops["phase"][op])).name.lower()
        name = strings[int(ops["name"][op])]
        module = _call_path(run, int(ops["module_call"][op]))
    first = np.asarray(run["steps"]["first_memory_event"])
    row = int(np.searchsorted(first, peak.event, side="right")) - 1
    step = int(run["steps"]["step"][row]) if peak.event != NO_INDEX and row >= 0 else -1
    return PeakMoment(peak.bytes, peak.time_ns, step, phase, name, module), live


def _paths(run: Run) -> list[str]:
    return module_paths(run["modules"], run["strings"])


def _call_path(run: Run, call: int) -> str:
    if call == NO_INDEX:
        return NO_MODULE
    return _paths(run)[int(run["module_calls"]["module"][call])]


def _by_module(run: Run, live: np.ndarray) -> dict[str, int]:
    paths = _paths(run)
    out: dict[str, int] = defaultdict(int)
    storages = run["storages"]
    for s in live.tolist():
        m = int(storages["module"][s])
        out[NO_MODULE if m == NO_INDEX else paths[m]] += int(storages["nbytes"][s])
    return out


def _largest_changes(
    a: Mapping[str, int], b: Mapping[str, int], top: int
) -> list[tuple[str, int, int]]:
    rows = [(k, a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b))]
    rows = [r for r in rows if r[1] != r[2]]
    rows.sort(key=lambda r: (-abs(r[2] - r[1]), r[0]))
    return rows[:top]


Kind = tuple[str, str, str, str, str]
"""(module path, op, category, dtype, shape)."""


def _kinds(run: Run, rows: np.ndarray) -> dict[Kind, tuple[int, int]]:
    """Live bytes and count per kind of tensor among storage ``rows``."""
    storages, ops, strings = run["storages"], run["ops"], run["strings"]
    paths = _paths(run)
    out: dict[Kind, tuple[int, int]] = {}
    for s in np.asarray(rows, dtype=np.int64).tolist():
        m, op = int(storages["module"][s]), int(storages["op"][s])
        kind = (
            NO_MODULE if m == NO_INDEX else paths[m],
            "" if op == NO_INDEX else strings[int(ops["name"][op])],
            Category(int(storages["category"][s])).name.lower(),
            strings[int(storages["dtype"][s])],
            strings[int(storages["shape"][s])],
        )
        nbytes, count = out.get(kind, (0, 0))
        out[kind] = (nbytes + int(storages["nbytes"][s]), count + 1)
    return out


def _tensor_changes(
    a: Mapping[Kind, tuple[int, int]], b: Mapping[Kind, tuple[int, int]], top: int
) -> list[TensorKind]:
    kinds = [
        TensorKind(*k, *_pair(a.get(k), b.get(k)))
        for k in sorted(set(a) | set(b))
        if a.get(k, (0, 0))[0] != b.get(k, (0, 0))[0]
    ]
    kinds.sort(key=lambda t: (-abs(t.delta), t.module, t.op, t.shape))
    return kinds[:top]


def _pair(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int, int, int]:
    (ab, ac), (bb, bc) = a or (0, 0), b or (0, 0)
    return ab, bb, ac, bc


def held_at_peak(run: Run, live: np.ndarray, top: int = 10) -> Held | None:
    """What a run with recompute regions holds at its peak, by class (NOTE [ What kept a
    checkpointed peak up ]); None for a run without recompute regions."""
    region_modules = {int(m) for m in run["recompute_regions"]["module"]} - {NO_INDEX}
    if not region_modules:
        return None
    region_of = _region_of_calls(run["module_calls"], region_modules)
    classes = _classify(run, live, region_of)
    storages = run["storages"]
    nbytes = np.asarray(storages["nbytes"], dtype=np.int64)[live]
    by_class = {name: int(nbytes[classes == i].sum()) for i, name in enumerate(HELD_CLASSES)}
    inside = live[classes == HELD_CLASSES.index("kept inside regions")]
    kinds = _kinds(run, inside)
    kept = [TensorKind(*k, 0, b, 0, c) for k, (b, c) in kinds.items()]
    kept.sort(key=lambda t: (-t.b_bytes, t.module, t.op, t.shape))
    return Held(by_class, kept[:top])


def held_mask(run: Run, name: str) -> np.ndarray:
    """Boolean mask over the run's storages: those live at its peak in class ``name`` of NOTE
    [ What kept a checkpointed peak up ] (none for a run without recompute regions)."""
    mask = np.zeros(len(run["storages"]["nbytes"]), dtype=bool)
    region_modules = {int(m) for m in run["recompute_regions"]["module"]} - {NO_INDEX}
    if not region_modules:
        return mask
    _, live = _peak(run)
    classes = _classify(run, live, _region_of_calls(run["module_calls"], region_modules))
    mask[live[classes == HELD_CLASSES.index(name)]] = True
    return mask


def _region_of_calls(calls: Table, region_modules: set[int]) -> np.ndarray:
    """For each module call: the outermost checkpointed forward call it is in (itself
    included), or -1. A call's parent comes before it, so one pass in row order does."""
    parent = np.asarray(calls["parent"], dtype=np.int64)
    module = np.asarray(calls["module"], dtype=np.int64)
    phase = np.asarray(calls["phase"])
    region_of = np.full(len(parent), NO_INDEX, dtype=np.int64)
    for c in range(len(parent)):
        up = region_of[parent[c]] if parent[c] != NO_INDEX else NO_INDEX
        if up != NO_INDEX:
            region_of[c] = up
        elif phase[c] == Phase.FORWARD and int(module[c]) in region_modules:
            region_of[c] = c
    return region_of


def _classify(run: Run, live: np.ndarray, region_of: np.ndarray) -> np.ndarray:
    """The index in ``HELD_CLASSES`` of each live storage."""
    storages, ops, io = run["storages"], run["ops"], run["module_io"]
    category = np.asarray(storages["category"])[live]
    op = np.asarray(storages["op"], dtype=np.int64)[live]
    phase = np.where(op >= 0, np.asarray(ops["phase"])[np.maximum(op, 0)], -1)
    call = np.where(op >= 0, np.asarray(ops["module_call"], dtype=np.int64)[np.maximum(op, 0)], -1)
    region = np.where(call >= 0, region_of[np.maximum(call, 0)], NO_INDEX)
    io_call = np.asarray(io["call"], dtype=np.int64)
    io_storage = np.asarray(io["storage"], dtype=np.int64)
    io_kind = np.asarray(io["kind"])
    in_region = region_of[io_call] == io_call  # io rows of a region's own (outermost) call
    outputs = set(io_storage[in_region & (io_kind == IOKind.OUTPUT)].tolist())
    inputs = set(io_storage[in_region & (io_kind == IOKind.INPUT)].tolist())
    classes = np.full(len(live), HELD_CLASSES.index("other"))
    rules = (
        ("saved outside regions", (category == Category.ACTIVATION) & (region == NO_INDEX)),
        ("region inputs", np.isin(live, list(inputs))),
        ("kept inside regions", (phase == Phase.FORWARD) & (region != NO_INDEX)),
        ("region outputs", np.isin(live, list(outputs)) & (region != NO_INDEX)),
        ("recompute", phase == Phase.RECOMPUTE),
        ("gradients", category == Category.GRADIENT),
    )
    for name, mask in rules:  # lowest precedence first: later rules win
        classes[mask] = HELD_CLASSES.index(name)
    return classes


def storage_mask(
    run: Run,
    *,
    module: str | None = None,
    category: str | None = None,
    kind: TensorKind | None = None,
) -> np.ndarray:
    """Boolean mask over the run's storages: those of ``module`` (a path as ``RunDiff`` names
    it, ``NO_MODULE`` for none), of ``category`` (a lowercase ``Category`` name), of the kind
    of tensor ``kind`` (its module, op, category, dtype and shape); every given one applies.
    How a row of a diff is found again in each run, to be drawn on its curve."""
    storages = run["storages"]
    mask = np.ones(len(storages["nbytes"]), dtype=bool)
    if kind is not None:
        mask &= storage_mask(run, module=kind.module, category=kind.category)
        mask &= _op_mask(run, kind.op)
        mask &= _string_mask(run, storages["dtype"], kind.dtype)
        mask &= _string_mask(run, storages["shape"], kind.shape)
    if module is not None:
        rows = [i for i, path in enumerate(_paths(run)) if path == module]
        owner = np.asarray(storages["module"], dtype=np.int64)
        mask &= np.isin(owner, rows) | ((owner == NO_INDEX) & (module == NO_MODULE))
    if category is not None:
        mask &= np.asarray(storages["category"]) == Category[category.upper()]
    return mask


def _string_mask(run: Run, ids: np.ndarray, text: str) -> np.ndarray:
    """Which string ids in ``ids`` spell ``text``."""
    wanted = [i for i, s in enumerate(run["strings"]) if s == text]
    return np.isin(np.asarray(ids, dtype=np.int64), wanted)


def _op_mask(run: Run, name: str) -> np.ndarray:
    """Which storages an op named ``name`` made ('': no op, a pre-existing storage)."""
    op = np.asarray(run["storages"]["op"], dtype=np.int64)
    if not name:
        return op == NO_INDEX
    by_op = _string_mask(run, run["ops"]["name"], name)
    if not len(by_op):
        return np.zeros(len(op), dtype=bool)
    return (op != NO_INDEX) & by_op[np.maximum(op, 0)]


def live_bytes_of(run: Run, mask: np.ndarray) -> np.ndarray:
    """Live bytes of the storages in ``mask`` at every timeline point of the run (the points
    of ``memory_timeline``: point 0 before the first event, point i + 1 after event i)."""
    storages, events = run["storages"], run["memory_events"]
    mask = np.asarray(mask, dtype=bool)
    deltas = event_deltas(storages, events) * mask[np.asarray(events["storage"], dtype=np.int64)]
    nbytes = np.asarray(storages["nbytes"], dtype=np.int64)
    curve = np.empty(len(deltas) + 1, dtype=np.int64)
    curve[0] = int(nbytes[live_at_start(storages) & mask].sum())
    np.cumsum(deltas, out=curve[1:])
    curve[1:] += curve[0]
    return curve


def describe_moment(p: PeakMoment) -> str:
    """When a peak happens: 'at 230.0 ms (step 0, backward, aten.mm.default in Net.fc)'."""
    if not p.phase:
        return "at the start"
    where = f"{p.op} in {p.module}" if p.op else p.module
    return f"at {p.time_ns / 1e6:.1f} ms (step {p.step}, {p.phase}, {where})"


def describe_kind(t: TensorKind) -> str:
    """'Net.fc (aten.addmm.default) activation float32 64x128' for a kind of tensor."""
    op = f" ({t.op})" if t.op else ""
    layout = " ".join(x for x in (t.dtype, t.shape) if x)
    return f"{t.module}{op} {t.category} {layout}".rstrip()


def held_lines(held: Held, format_bytes: Any, top: int) -> list[str]:
    """Text lines for ``held`` (shared by the CLI and the explorer)."""
    lines = [f"  {name:<22} {format_bytes(b):>10}" for name, b in held.bytes_by_class.items() if b]
    for t in held.kept_inside[:top]:
        lines.append(f"    kept inside: {format_bytes(t.b_bytes):>10}  {describe_kind(t)}")
    return lines


__all__ = [
    "HELD_CLASSES",
    "Held",
    "PeakMoment",
    "RunDiff",
    "TensorKind",
    "describe_kind",
    "describe_moment",
    "diff_runs",
    "held_at_peak",
    "held_lines",
    "held_mask",
    "live_bytes_of",
    "storage_mask",
]
