"""Checkpoint regions in a recorded run: which module rows a plan names, and their instances.

A *region* is what a plan checkpoints (docs/plan-format.md, section 3), here by module row:

- ``ModuleRegion(m)``: every forward call of module row ``m`` is one region *instance*;
- ``SegmentRegion(s, start, stop)``: children ``start .. stop-1`` of the ``nn.Sequential`` at row
  ``s``; each forward call of ``s`` gives one instance spanning those children's calls.

Which regions a plan names is the plan core's to say (``ckpt_runtime.resolve``, over the trace
by ``ckview.analysis.plans``); here ``sequential_children`` gives a module's children in order and
``region_instances`` finds the instances of regions in a run's ``module_calls``.

NOTE [ Call rows of an instance ]
    ``module_calls`` rows are appended when a call begins, so a call's descendants are the rows
    right after it, up to the first call that starts after it ended. An instance (one call, or
    the consecutive sibling calls of a segment) is therefore the contiguous range of call rows
    ``[first_call, call_stop)``, and "created inside the instance" is a range test on the
    creating call. Instances of different regions either nest or are disjoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ckview.analysis.types import Table
from ckview.trace.schema import NO_INDEX, Phase


@dataclass(frozen=True)
class ModuleRegion:
    """Checkpoint every forward call of module row ``module``, each call as its own instance.

    ``save`` and ``offload`` make it an op-level region (NOTE [ Op-level regions ] in
    ckpt_runtime/plan.py; projected as NOTE [ Op-level instances ] in ckview.analysis.projection
    says): the ops whose outputs it keeps, recomputing the others (None: recompute every op),
    and whether the tensors it keeps go to host memory."""

    module: int
    save: tuple[str, ...] | None = None
    offload: bool = False

    @property
    def op_level(self) -> bool:
        """True if the region says which ops it saves, or offloads."""
        return self.save is not None or self.offload

    def __repr__(self) -> str:
        if not self.op_level:
            return f"ModuleRegion(module={self.module})"
        return f"ModuleRegion(module={self.module}, save={self.save!r}, offload={self.offload})"


@dataclass(frozen=True)
class SegmentRegion:
    """Checkpoint children ``start .. stop-1`` of the ``nn.Sequential`` at row ``module`` as one
    instance per call of the Sequential (``sequential_children`` gives the child order)."""

    module: int
    start: int
    stop: int


Region = ModuleRegion | SegmentRegion


@dataclass(frozen=True)
class RegionInstances:
    """The instances of a list of regions in one run, one row per instance.

    Instances are ordered by region, then by call. See NOTE [ Call rows of an instance ].
    """

    region: np.ndarray
    """(k,) int64: index of the instance's region in the list it was resolved from."""
    first_call: np.ndarray
    """(k,) int64: row of the instance's first top-level call (its first call row)."""
    call_stop: np.ndarray
    """(k,) int64: one past the last call row inside the instance."""
    last_call: np.ndarray
    """(k,) int64: row of the instance's last top-level call (whose outputs leave it)."""
    start_ns: np.ndarray
    """(k,) int64: time the instance began (its first call's pre-hook)."""
    end_ns: np.ndarray
    """(k,) int64: time the instance ended (its last call's forward hook)."""
    top_instance: np.ndarray
    """(t,) int64: instance of each top-level call, paired with ``top_call``."""
    top_call: np.ndarray
    """(t,) int64: the top-level calls of each instance (whose inputs it keeps)."""

    def __len__(self) -> int:
        return len(self.region)


# ----------------------------------------------------------------------------- module rows


def sequential_children(modules: Table, strings: Sequence[str], row: int) -> list[int]:
    """Rows of the direct children of module ``row``, in the container's order.

    Children named ``'0', '1', ...`` (an ``nn.Sequential`` or ``nn.ModuleList``) are ordered by
    that number; others keep the recording order of ``named_modules()``, which is their
    definition order.
    """
    children = np.flatnonzero(np.asarray(modules["parent"]) == row).tolist()
    return _in_container_order(modules, strings, children)


def all_children(modules: Table, strings: Sequence[str]) -> list[list[int]]:
    """``sequential_children`` of every row, in one pass over the table."""
    parent = np.asarray(modules["parent"], dtype=np.int64)
    kids: list[list[int]] = [[] for _ in range(len(parent))]
    for child, up in enumerate(parent.tolist()):
        if up >= 0:
            kids[up].append(child)
    return [_in_container_order(modules, strings, c) if len(c) > 1 else c for c in kids]


def _in_container_order(modules: Table, strings: Sequence[str], children: list[int]) -> list[int]:
    names = [strings[modules["path"][c]].rpartition(".")[2] for c in children]
    if all(name.isdigit() for name in names):
        return [c for _, c in sorted(zip((int(n) for n in names), children, strict=True))]
    return children


def subtree_sums(parent: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over each module's subtree (itself and all descendants)."""
    sums = values.copy()
    up = parent.copy()
    for _ in range(len(parent)):
        alive = up != NO_INDEX
        if not alive.any():
            break
        np.add.at(sums, up[alive], values[alive])
        up = np.where(alive, parent[np.maximum(up, 0)], NO_INDEX)
    return sums


# ----------------------------------------------------------------------------- instances


def region_instances(
    calls: Table, modules: Table, strings: Sequence[str], regions: Sequence[Region]
) -> RegionInstances:
    """The instances of ``regions`` among the FORWARD calls of a run's ``module_calls``.

    Recompute calls (a baseline that already checkpoints) are never instances. A segment whose
    Sequential is never called (a model that loops over it) has no instance. Raises
    ``ValueError`` for a segment outside its Sequential's children.
    """
    phase = np.asarray(calls["phase"])
    module = np.asarray(calls["module"], dtype=np.int64)
    parent = np.asarray(calls["parent"], dtype=np.int64)
    forward = np.flatnonzero(phase == Phase.FORWARD)
    groups: list[tuple[int, list[int]]] = []
    for index, region in enumerate(regions):
        if isinstance(region, ModuleRegion):
            groups += [(index, [int(c)]) for c in forward[module[forward] == region.module]]
        else:
            groups += _segment_groups(index, region, forward, module, parent, modules, strings)
    return _instances(calls, groups)


def _segment_groups(
    index: int,
    region: SegmentRegion,
    forward: np.ndarray,
    module: np.ndarray,
    parent: np.ndarray,
    modules: Table,
    strings: Sequence[str],
) -> list[tuple[int, list[int]]]:
    """(region index, top calls) of each call of the segment's Sequential."""
    children = sequential_children(modules, strings, region.module)
    if not 0 <= region.start < region.stop <= len(children):
        raise ValueError(
            f"segment [{region.start}:{region.stop}] of module row {region.module} is outside "
            f"its {len(children)} children; use 0 <= start < stop <= {len(children)}"
        )
    wanted = np.asarray(children[region.start : region.stop], dtype=np.int64)
    groups = []
    for call in forward[module[forward] == region.module]:
        inner = forward[(parent[forward] == call) & np.isin(module[forward], wanted)]
        if inner.size:
            groups.append((index, inner.tolist()))
    return groups


def _instances(calls: Table, groups: list[tuple[int, list[int]]]) -> RegionInstances:
    start = np.asarray(calls["start_ns"], dtype=np.int64)
    end = np.asarray(calls["end_ns"], dtype=np.int64)
    first = np.asarray([g[1][0] for g in groups], dtype=np.int64)
    last = np.asarray([g[1][-1] for g in groups], dtype=np.int64)
    last_end = end[last]
    # NOTE [ Call rows of an instance ]; a call that never returned holds every later row.
    stop = np.where(
        last_end < 0, len(start), np.searchsorted(start, last_end, side="right")
    ).astype(np.int64)
    sizes = [len(g[1]) for g in groups]
    return RegionInstances(
        region=np.asarray([g[0] for g in groups], dtype=np.int64),
        first_call=first,
        call_stop=np.maximum(stop, last + 1),
        last_call=last,
        start_ns=start[first],
        end_ns=np.where(last_end < 0, np.iinfo(np.int64).max, last_end),
        top_instance=np.repeat(np.arange(len(groups), dtype=np.int64), sizes),
        top_call=np.asarray([c for g in groups for c in g[1]], dtype=np.int64),
    )


def outermost(instances: RegionInstances, active: np.ndarray) -> np.ndarray:
    """The ``active`` instances (boolean mask) that lie inside no other active instance.

    NOTE [ Nesting: the outer region wins ]
        When selected instances nest (a block and its MLP, a segment and one of its children),
        only the outermost is checkpointed; the inner ones are ignored, as if not selected. Of
        two instances with the same call rows (a module region on a segment's only child), the
        one listed first wins, and of two overlapping segments of one Sequential (which a plan
        may not hold) the one starting first. ckpt_runtime would checkpoint the inner region
        again inside the outer one's recompute (docs/plan-format.md, 3.3); that third run
        lowers memory only while the outer region is differentiated, which this projection
        leaves out (an upper bound).
    """
    lo, hi = instances.first_call, instances.call_stop
    rows = np.flatnonzero(active)
    rows = rows[np.lexsort((rows, -hi[rows], lo[rows]))]  # outer first; first listed wins ties
    # Instances nest or are disjoint (overlapping segments aside), so one lies inside another
    # active instance exactly when an instance before it in this order reaches past its start.
    reach = np.maximum.accumulate(np.concatenate(([-1], hi[rows])))[:-1]
    keep = np.zeros(len(lo), dtype=bool)
    keep[rows[lo[rows] >= reach]] = True
    return keep
