"""Checkpoint plans in the explorer: the selection the user clicks together, and its projection.

Qt-free. ``PlanSession`` holds one baseline run, its module tree and chain of blocks, and the
selected regions; ``outcome()`` projects them with ``ckview.analysis`` (the incremental
``ProjectionModel`` when every region is one of its candidates, else the exact ``project``).

NOTE [ Chain strip ]
    A chain of blocks is cut into segments by boundaries; the user clicks a gap to add or
    remove a boundary and a block to checkpoint its segment or not. On an ``nn.Sequential``
    a segment of several blocks is one region (``SegmentRegion``: one instance keeps only the
    first block's input); a one-block segment is that block's ``ModuleRegion`` (the same
    instances). A ``ModuleList`` is called block by block by its owner, so there every block is
    its own segment and its gaps are fixed boundaries. Merging two segments keeps the merged
    one checkpointed if either was; splitting one keeps both halves as it was. The selection is
    the one source of truth: the strip's checkpointed segments are the selected chain regions;
    a preset, a loaded plan or the planner sets the selection, and then every block outside
    a selected segment is a segment of its own.

NOTE [ One region per module ]
    A module row is checkpointed by at most one ``ModuleRegion`` of the selection: recompute
    every op (``ModuleRegion(row)``), save some ops (``save``: the packets of the saved-tensor
    groups ticked in the panel, NOTE [ Op-level search space ] in planner_ops.py, plus any other
    entries a loaded plan gave), or offload (``save=("*",), offload=True``). ``region_of`` finds
    it whatever its kind; ticking groups or offload replaces it, unticking the module drops it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_runtime.plan import Plan, load_plan, save_plan
from ckpt_runtime.resolve import Container
from ckview.analysis import (
    ModuleRegion,
    Planner,
    PlannerResult,
    ProjectionModel,
    Region,
    SegmentRegion,
    chain_candidates,
    project,
    sequential_children,
)
from ckview.analysis.cost import PlanCost
from ckview.analysis.planner_ops import OpGroup, op_groups, save_warnings
from ckview.analysis.plans import TraceTree
from ckview.analysis.projection.oplevel import OpNames
from ckview.analysis.regions import subtree_sums
from ckview.analysis.timing import forward_ns_by_module
from ckview.app.run import Run
from ckview.trace.schema import Category, Phase


@dataclass(frozen=True)
class ModuleInfo:
    """One row of the module tree."""

    row: int
    name: str
    """Last component of the path (the type name for a root)."""
    path: str
    type: str
    parent: int
    calls: int
    """Forward calls in the run."""
    activation_bytes: int
    """Bytes of activations (saved for backward) created inside the module's calls."""
    forward_ns: int
    """Summed time of its forward calls (plain where the run has timing steps)."""


@dataclass(frozen=True)
class Chain:
    """The run's chain of blocks (NOTE [ Block chain detection ]), as the strip shows it."""

    row: int
    path: str
    blocks: tuple[int, ...]
    sequential: bool
    """True if blocks can be grouped into segments that take effect."""
    kind: str = "Sequential"
    """What the chain is, as the strip names it ("ModuleList", "Sequential, looped over")."""
    fixed: str = ""
    """Why each block is its own segment (when not ``sequential``)."""

    def region(self, start: int, stop: int) -> Region:
        """The region of blocks ``start .. stop-1`` (NOTE [ Chain strip ])."""
        if stop - start == 1:
            return ModuleRegion(self.blocks[start])
        return SegmentRegion(self.row, start, stop)

    def block_range(self, region: Region) -> tuple[int, int] | None:
        """``(start, stop)`` blocks of a chain region, None for any other region."""
        if isinstance(region, SegmentRegion):
            return (region.start, region.stop) if region.module == self.row else None
        if region.module in self.blocks:
            i = self.blocks.index(region.module)
            return i, i + 1
        return None


@dataclass(frozen=True)
class RecomputeMark:
    """Where the projected backward recomputes a checkpointed instance."""

    time_ns: int
    point: int
    """Baseline timeline point the recompute is inserted at."""
    label: str
    compute_ns: int


@dataclass(frozen=True)
class PlanOutcome(PlanCost):
    """The projection of the current selection: what the readout and the curve show (its
    shares: ``PlanCost``)."""

    time_ns: np.ndarray
    """Projected curve (NOTE [ Projected curve ] in ``ckview.analysis.projection``)."""
    point: np.ndarray
    total: np.ndarray
    peak_time_ns: int
    peak_point: int
    recomputes: tuple[RecomputeMark, ...]
    incremental: bool
    """True if the fast ``ProjectionModel`` answered, False for the exact fallback."""
    regions: int = 0
    """Selected regions (after merging a one-block segment into its block)."""
    idle_regions: int = 0
    """Selected regions that cannot take effect in the recorded step."""
    notes: tuple[str, ...] = ()
    """Why they cannot (NOTE [ Regions that cannot take effect ] in ckpt_runtime/resolve.py)."""
    warnings: tuple[str, ...] = ()
    """Save entries the projection cannot hold, one line each (NOTE [ Saves the projection
    cannot hold ] in ckview/analysis/planner_ops.py): a loaded plan's, never the panel's."""
    plain_times: bool = False
    """Extra compute and step time come from plain timing steps, not recorded op times."""
    offloaded_bytes: int = 0
    """Bytes the offload regions move to host memory and back (NOTE [ Offloaded instances ])."""
    host_peak_bytes: int = 0
    """The most bytes the offload regions hold in host memory at once."""
    host: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(c,) int64: bytes the offload regions hold in host memory at each state of the curve;
    zero-length when no region offloads (NOTE [ Host curve ] in ckview.analysis.projection)."""
    extra_compute_range_ns: tuple[int, int] = (0, 0)
    """The lowest and highest extra compute the measurements allow (NOTE [ How sure the extra
    time is ] in ckview/analysis/timing.py)."""

    def idle_summary(self) -> str | None:
        """One line on the regions that cannot take effect, None if all can (or none)."""
        if not self.idle_regions:
            return None
        if self.idle_regions == self.regions:
            head = f"none of its {self.regions} region(s) will run in the recorded step"
        else:
            head = f"{self.idle_regions} of its {self.regions} regions will not run in the step"
        return f"{head}: {'; '.join(self.notes)}"


class PlanSession:
    """The plan being built over one baseline run."""

    def __init__(self, run: Run) -> None:
        self.run = run
        t = run.tables
        self.modules = _module_infos(run)
        self.tree = TraceTree(t["modules"], t["strings"], t["module_calls"])
        """The run's model for the plan rules, built once (``outcome`` asks it on each click)."""
        self.chain = _chain(run, self.tree)
        self.boundaries: set[int] = set(range(1, len(self.chain.blocks))) if self.chain else set()
        self.selection: set[Region] = set()
        self.candidates: list[Region] = list(
            dict.fromkeys(
                [ModuleRegion(m.row) for m in self.modules if m.calls]
                + chain_candidates(t["modules"], t["strings"], t["module_calls"])
                + self._offload_candidates()
            )
        )
        self.index = {r: i for i, r in enumerate(self.candidates)}
        self.model: ProjectionModel | None = None
        self.step_ns, self.plain_times = run.step_ns, run.plain_times
        self._op_names: OpNames | None = None
        self._groups: dict[int, list[OpGroup]] = {}

    def _offload_candidates(self) -> list[Region]:
        """Each block of the chain offloading what it saves, where offload can change the run
        (a CUDA run): its checkbox then answers from the model, not an exact projection. Other
        modules offload through the exact projection: as candidates, every module would
        about double the model's build (each nested call counts its storages again)."""
        if self.offload_blocked() is not None or self.chain is None:
            return []
        return [ModuleRegion(r, ("*",), True) for r in self.chain.blocks if self.modules[r].calls]

    # -- preparing (slow on big runs: the GUI does it off the UI thread)

    def prepare(self) -> None:
        """Build the incremental model over every candidate (about 1 s per 1e6 events)."""
        if self.model is None:
            model = ProjectionModel(self.run.tables, self.candidates)
            model.curve([])  # builds the curve index here, not on the first click
            self.model = model

    def recompute_cost_ns(self, row: int) -> int | None:
        """Extra compute of checkpointing module ``row`` alone; None until ``prepare``."""
        i = self.index.get(ModuleRegion(row))
        if self.model is None or i is None:
            return None
        return self.model.extra_compute_ns([i])

    # -- the selection

    def set_selection(self, regions: Iterable[Region]) -> None:
        """Select exactly ``regions``; the strip then shows the selected chain segments and
        every other block as a segment of its own."""
        self.selection = {self._normal(r) for r in regions}
        if self.chain is not None and self.chain.sequential:
            # Every gap is a boundary but those inside a selected segment.
            inside: set[int] = set()
            for region in self.selection:
                span = self.chain.block_range(region)
                if span is not None:
                    inside.update(range(span[0] + 1, span[1]))
            self.boundaries = set(range(1, len(self.chain.blocks))) - inside

    def _normal(self, region: Region) -> Region:
        """A one-block segment is its block's module region (the same instances)."""
        if isinstance(region, SegmentRegion) and region.stop - region.start == 1:
            t = self.run.tables
            children = sequential_children(t["modules"], t["strings"], region.module)
            return ModuleRegion(children[region.start])
        return region

    def toggle_module(self, row: int) -> bool:
        """Checkpoint module ``row`` or stop; returns whether it is now selected."""
        region = ModuleRegion(row)
        selected = self.region_of(row)
        if selected is not None:
            self.selection.discard(selected)
            return False
        if self.chain is not None and self.chain.sequential and row in self.chain.blocks:
            i = self.chain.blocks.index(row)
            self._drop_chain_regions_over(i, i + 1)
            self.boundaries.update(b for b in (i, i + 1) if 0 < b < len(self.chain.blocks))
        self.selection.add(region)
        return True

    def segments(self) -> list[tuple[int, int]]:
        """The strip's segments ``(start, stop)``, in order (NOTE [ Chain strip ])."""
        if self.chain is None:
            return []
        cuts = [0, *sorted(self.boundaries), len(self.chain.blocks)]
        return list(itertools.pairwise(cuts))

    def segment_selected(self, start: int, stop: int) -> bool:
        assert self.chain is not None
        return self._selected(self.chain.region(start, stop)) is not None

    def _selected(self, region: Region) -> Region | None:
        """The selected region standing for ``region``: a block's module region of any kind
        (NOTE [ One region per module ]), a segment itself; None if not selected."""
        if isinstance(region, ModuleRegion):
            return self.region_of(region.module)
        return region if region in self.selection else None

    def toggle_block(self, block: int) -> bool:
        """Checkpoint the segment holding ``block`` or stop; returns whether it now is."""
        assert self.chain is not None
        start, stop = next(s for s in self.segments() if s[0] <= block < s[1])
        region = self.chain.region(start, stop)
        selected = self._selected(region)
        if selected is not None:
            self.selection.discard(selected)
            return False
        self._drop_chain_regions_over(start, stop)
        self.selection.add(region)
        return True

    def toggle_boundary(self, gap: int) -> bool:
        """Add or remove the boundary before block ``gap`` (Sequential chains only); returns
        whether it is now a boundary. Selected segments merge or split (NOTE [ Chain strip ])."""
        assert self.chain is not None
        if not self.chain.sequential:
            raise ValueError(self.chain.fixed)
        if not 0 < gap < len(self.chain.blocks):
            raise ValueError(f"no gap {gap} in a chain of {len(self.chain.blocks)} blocks")
        before = {s: self.segment_selected(*s) for s in self.segments()}
        if gap in self.boundaries:
            self.boundaries.discard(gap)
        else:
            self.boundaries.add(gap)
        for s in before:
            selected = self._selected(self.chain.region(*s))
            if selected is not None:
                self.selection.discard(selected)
        for start, stop in self.segments():
            if any(on and a < stop and start < b for (a, b), on in before.items()):
                self.selection.add(self.chain.region(start, stop))
        return gap in self.boundaries

    def _drop_chain_regions_over(self, start: int, stop: int) -> None:
        assert self.chain is not None
        for region in list(self.selection):
            span = self.chain.block_range(region)
            if span is not None and span[0] < stop and start < span[1]:
                self.selection.discard(region)

    # -- op-level regions (NOTE [ One region per module ])

    def region_of(self, row: int) -> ModuleRegion | None:
        """The selected module region of module ``row``, of any kind; None if unticked."""
        for region in self.selection:
            if isinstance(region, ModuleRegion) and region.module == row:
                return region
        return None

    def op_groups(self, row: int) -> list[OpGroup]:
        """The saved-tensor groups of module ``row``, best first (NOTE [ Op-level search
        space ] in ckview/analysis/planner_ops.py); computed once per module."""
        if row not in self._groups:
            self._groups[row] = op_groups(self.run.tables, ModuleRegion(row), self.names())
        return self._groups[row]

    def names(self) -> OpNames:
        """The run's op names (``OpNames``), computed once."""
        if self._op_names is None:
            self._op_names = OpNames(self.run.tables)
        return self._op_names

    def set_saved(self, row: int, packets: Iterable[str]) -> ModuleRegion:
        """Make checkpointed module ``row`` save the ops of the groups ``packets`` and
        recompute the rest (none: recompute every op); entries of its ``save`` that are no
        group's packet (a loaded plan's auto-names or patterns) stay. Raises ``ValueError``
        if the module is not checkpointed."""
        old = self._ticked(row)
        groups = {g.packet for g in self.op_groups(row)}
        others = [e for e in old.save or () if e not in groups and not old.offload]
        save = tuple(sorted({*others, *packets})) or None
        return self._replace(old, ModuleRegion(row, save))

    def set_offload(self, row: int, on: bool) -> ModuleRegion:
        """Make checkpointed module ``row`` offload what it saves (``save=["*"]``) or go back
        to recomputing every op. Raises ``ValueError`` if it is not checkpointed."""
        old = self._ticked(row)
        return self._replace(old, ModuleRegion(row, ("*",), True) if on else ModuleRegion(row))

    def offload_blocked(self) -> str | None:
        """Why offload cannot change this run (a CPU trace), None if it can."""
        if self.run.device is not None:
            return None
        return (
            "a CPU trace: its tensors are in host memory already, so offloading changes "
            "nothing; record on a CUDA device to plan offload"
        )

    def _ticked(self, row: int) -> ModuleRegion:
        region = self.region_of(row)
        if region is None:
            raise ValueError(f"{self.run.paths[row]} is not checkpointed: tick it first")
        return region

    def _replace(self, old: ModuleRegion, new: ModuleRegion) -> ModuleRegion:
        self.selection.discard(old)
        self.selection.add(new)
        return new

    def shadowed(self) -> set[int]:
        """Module rows selected but inside another selected module (the outer one wins)."""
        rows = {r.module for r in self.selection if isinstance(r, ModuleRegion)}
        parent = self.run.tables["modules"]["parent"]
        out = set()
        for row in rows:
            up = int(parent[row])
            while up >= 0:
                if up in rows:
                    out.add(row)
                    break
                up = int(parent[up])
        return out

    # -- plans

    def regions(self) -> list[Region]:
        """The selection in a stable order (by module row, then block range)."""
        return sorted(self.selection, key=_region_key)

    def apply_preset(self, preset: str) -> None:
        """Select what a preset (``none``, ``all``, ``sqrt``, ``every:K``) checkpoints; raises
        ``ValueError`` if the model has no chain for it."""
        self.set_selection(self.tree.resolve(preset).regions)

    def plan_document(self, name: str) -> dict[str, Any]:
        """The selection as a plan document (docs/plan-format.md)."""
        meta = {"trace": os.path.basename(self.run.source), "run": self.run.name}
        return self.tree.plan_of(self.regions(), name, meta).plan.to_json()

    def save_plan(self, path: str, name: str | None = None) -> None:
        """Write the selection as a plan JSON file (named after the file if no ``name``)."""
        stem = os.path.splitext(os.path.basename(path))[0] or "plan"
        meta = {"trace": os.path.basename(self.run.source), "run": self.run.name}
        save_plan(self.tree.plan_of(self.regions(), name or stem, meta).plan, path)

    def load_plan(self, path: str) -> None:
        """Select what a plan file checkpoints; ``ValueError`` (one line) if it cannot apply."""
        self.apply_plan(load_plan(Path(path)))  # a path, even one named like a preset

    def apply_plan(self, plan: Plan) -> None:
        """Select what ``plan`` checkpoints; ``ValueError`` (one line) if it cannot apply."""
        self.set_selection(self.tree.resolve(plan).regions)

    def planner(self) -> Planner:
        """A planner over the chain of blocks (``ValueError`` without one); slow on big runs."""
        return Planner(self.run.tables)

    def apply_planner(self, result: PlannerResult) -> None:
        self.set_selection(result.regions)

    # -- projection

    def outcome(self) -> PlanOutcome:
        """The projection of the current selection, with the regions that cannot take effect."""
        regions = self.regions()
        if not regions:
            return self._recorded()
        if self.model is not None and all(r in self.index for r in regions):
            outcome = self._incremental([self.index[r] for r in regions])
        else:
            outcome = self._exact(regions)
        warnings = tuple(w.line() for w in save_warnings(self.run.tables, regions, self.names()))
        try:
            plan = self.tree.plan_of(regions, "selection")
        except ValueError:  # a selection no plan can say (saving it says why)
            return replace(outcome, regions=len(regions), warnings=warnings)
        return replace(
            outcome,
            regions=len(regions),
            idle_regions=len(plan.idle),
            notes=tuple(plan.notes()),
            warnings=warnings,
        )

    def _recorded(self) -> PlanOutcome:
        """Nothing checkpointed: the recorded run, what ``project`` of no region gives, without
        projecting (an exact projection of a 1e6-event run takes ~0.4 s of the UI thread)."""
        timeline, peak = self.run.timeline, self.run.peak
        return PlanOutcome(
            peak_bytes=peak.bytes,
            baseline_peak_bytes=peak.bytes,
            extra_compute_ns=0,
            step_ns=self.step_ns,
            plain_times=self.plain_times,
            time_ns=timeline.time_ns,
            point=np.arange(len(timeline.total)),
            total=timeline.total,
            peak_time_ns=peak.time_ns,
            peak_point=peak.point,
            recomputes=(),
            incremental=True,
        )

    def _incremental(self, chosen: list[int]) -> PlanOutcome:
        model = self.model
        assert model is not None
        curve = model.curve(chosen)
        peak = model.peak(chosen)
        offload = model.effects.offload  # its tensors come back, nothing reruns
        active = model.checkpointed(chosen) & (model.effects.replay_key >= 0) & ~offload
        marks = tuple(
            RecomputeMark(
                time_ns=int(model.effects.trigger_ns[i]),
                point=int(np.searchsorted(self.run.timeline.time_ns, model.effects.trigger_ns[i])),
                label=self._call_label(int(model.instances.first_call[i])),
                compute_ns=int(model.effects.compute_ns[i]),
            )
            for i in np.flatnonzero(active)
        )
        return PlanOutcome(
            peak_bytes=peak.bytes,
            baseline_peak_bytes=self.run.peak.bytes,
            extra_compute_ns=model.extra_compute_ns(chosen),
            step_ns=self.step_ns,
            plain_times=self.plain_times,
            time_ns=curve.time_ns,
            point=curve.point,
            total=curve.total,
            peak_time_ns=peak.time_ns,
            peak_point=peak.baseline_point,
            recomputes=marks,
            incremental=True,
            offloaded_bytes=model.offloaded_bytes(chosen),
            host_peak_bytes=int(curve.host.max(initial=0)),
            host=curve.host,
            extra_compute_range_ns=model.extra_compute_range_ns(chosen),
        )

    def _exact(self, regions: Sequence[Region]) -> PlanOutcome:
        p = project(self.run.tables, regions)
        times = self.run.timeline.time_ns
        points = np.clip(np.searchsorted(times, p.timeline.time_ns, side="right") - 1, 0, None)
        marks = tuple(
            RecomputeMark(
                time_ns=r.time_ns,
                point=r.baseline_point,
                label=self._call_label(r.call),
                compute_ns=r.compute_ns,
            )
            for r in p.recomputes
            if not _offloads(regions[r.region])  # its tensors come back, nothing reruns
        )
        return PlanOutcome(
            peak_bytes=p.projected_peak.bytes,
            baseline_peak_bytes=self.run.peak.bytes,
            extra_compute_ns=p.extra_compute_ns,
            step_ns=self.step_ns,
            plain_times=self.plain_times,
            time_ns=p.timeline.time_ns,
            point=points,
            total=p.timeline.total,
            peak_time_ns=p.projected_peak.time_ns,
            peak_point=p.projected_peak.baseline_point,
            recomputes=marks,
            incremental=False,
            offloaded_bytes=p.offloaded_bytes,
            host_peak_bytes=p.host_peak_bytes,
            host=p.host,
            extra_compute_range_ns=p.extra_compute_range_ns,
        )

    def _call_label(self, call: int) -> str:
        return self.run.paths[int(self.run.tables["module_calls"]["module"][call])]

    def region_label(self, region: Region) -> str:
        if isinstance(region, SegmentRegion):
            return f"{self.run.paths[region.module]}[{region.start}:{region.stop}]"
        return self.run.paths[region.module]


def _offloads(region: Region) -> bool:
    """The region offloads what it saves (NOTE [ Offloaded instances ]): no recompute."""
    return isinstance(region, ModuleRegion) and region.offload


def _region_key(region: Region) -> tuple[int, int, int]:
    if isinstance(region, SegmentRegion):
        return region.module, region.start, region.stop
    return region.module, -1, -1


def _chain(run: Run, tt: TraceTree) -> Chain | None:
    """The chain of blocks; segments only where they take effect (a Sequential running its own
    forward, which ran in the step)."""
    chain = tt.chain()
    if chain is None:
        return None
    row = tt.rows[chain.node]
    node = tt.tree.nodes[chain.node]
    kind, fixed = node.type, ""
    if node.container != Container.SEQUENTIAL:
        fixed = f"a {node.type}'s blocks are called one by one: each is its own segment"
    elif not chain.segmentable:
        kind = f"{node.type} with its own forward"
        fixed = f"{node.type} {chain.path} has its own forward: each block is its own segment"
    elif tt.tree.ran(chain.node) is False:
        kind = f"{node.type}, looped over"
        fixed = (
            f"{chain.path}'s forward never ran in the recorded step (it is looped over in "
            "Python, or handed to checkpoint_sequential): each block is its own segment"
        )
    return Chain(
        row=row,
        path=run.paths[row],
        blocks=tuple(tt.rows[b] for b in chain.blocks),
        sequential=not fixed,
        kind=kind,
        fixed=fixed,
    )


def _module_infos(run: Run) -> list[ModuleInfo]:
    t = run.tables
    modules, strings = t["modules"], t["strings"]
    parent = np.asarray(modules["parent"], dtype=np.int64)
    n = len(parent)
    calls = t["module_calls"]
    forward = np.asarray(calls["phase"]) == Phase.FORWARD
    called = np.asarray(calls["module"], dtype=np.int64)[forward]
    st = t["storages"]
    act = (np.asarray(st["category"]) == Category.ACTIVATION) & (np.asarray(st["module"]) >= 0)
    own_act = np.bincount(st["module"][act], weights=st["nbytes"][act], minlength=n)
    activation = subtree_sums(parent, own_act.astype(np.int64))
    counts = np.bincount(called, minlength=n)
    time, _ = forward_ns_by_module(t, n)  # plain where the run has timing steps
    return [
        ModuleInfo(
            row=row,
            name=run.paths[row].rsplit(".", 1)[-1],
            path=run.paths[row],
            type=strings[int(modules["type"][row])],
            parent=int(parent[row]),
            calls=int(counts[row]),
            activation_bytes=int(activation[row]),
            forward_ns=int(time[row]),
        )
        for row in range(n)
    ]
