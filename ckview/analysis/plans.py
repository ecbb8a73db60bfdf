"""The trace adapter of the plan rules: a recorded ``modules`` table described as a
:class:`ckpt_runtime.resolve.ModuleTree`, and plans resolved over it into the module-row regions
the projection reads (``ckview.analysis.regions``).

The rules (plan documents, presets, chain of blocks, patterns, segments, nesting, suggestions)
live once, in the torch-free ``ckpt_runtime.plan`` and ``ckpt_runtime.resolve``, which
``ckpt_runtime.apply_plan`` runs over the live model: a plan resolves to the same regions over a
model and over its trace (tests/test_plan_core.py). What is trace-specific is here:

- the model is the main root of the module table (the root owning the most parameter bytes);
  other roots (e.g. a loss module) are not part of the model a plan is applied to;
- the children of a module are in ``sequential_children`` order;
- with a run's ``module_calls``, each module's forward calls in the step tell which regions
  cannot take effect, and why (NOTE [ Regions that cannot take effect ] in
  ckpt_runtime/resolve.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt_runtime.plan import ModuleRegion as PatternRegion
from ckpt_runtime.plan import Plan, PlanError, is_preset_like, parse_preset
from ckpt_runtime.resolve import (
    Chain,
    Container,
    ModuleTree,
    Node,
    Resolved,
    find_chain,
    idle_notes,
    resolve,
    resolve_regions,
)
from ckview.analysis.regions import ModuleRegion, Region, SegmentRegion, all_children
from ckview.analysis.types import Table
from ckview.trace.schema import NO_INDEX, Phase

__all__ = [
    "PlanRegions",
    "TraceTree",
    "as_plan",
    "chain_of_blocks",
    "module_rows_matching",
    "plan_from_regions",
    "plan_name",
    "plan_on_trace",
    "regions_from_plan",
    "resolve_on_trace",
]

PlanLike = Plan | Mapping[str, Any] | str
"""A plan, a plan document (dict or JSON text), or a preset string (``every:2@blocks``)."""


class TraceTree:
    """The main model of a trace's ``modules`` table as a ``ModuleTree``, with the module row of
    each node. With ``calls`` (a run's ``module_calls``), the tree knows each module's forward
    calls in the step."""

    def __init__(self, modules: Table, strings: Sequence[str], calls: Table | None = None) -> None:
        self.modules, self.strings = modules, strings
        parent = np.asarray(modules["parent"], dtype=np.int64)
        self.rows: list[int] = _main_subtree(parent, np.asarray(modules["param_bytes"]))
        self.node_of = {row: node for node, row in enumerate(self.rows)}
        children = all_children(modules, strings)
        forward = None
        if calls is not None:
            phase = np.asarray(calls["phase"])
            called = np.asarray(calls["module"], dtype=np.int64)[phase == Phase.FORWARD]
            counts = np.bincount(called[called >= 0], minlength=len(parent))
            forward = [int(counts[row]) for row in self.rows]
        self.tree = ModuleTree.build(
            self._nodes(parent.tolist()),
            forward_calls=forward,
            listing="list all paths with `ckview summary`",
            order=[[self.node_of[c] for c in children[row]] for row in self.rows],
        )

    def _nodes(self, parent: list[int]) -> list[Node]:
        m, strings = self.modules, self.strings
        columns = ("path", "type", "container", "sequential_forward", "param_bytes")
        path, type_, container, sequential, params = (np.asarray(m[c]).tolist() for c in columns)
        return [
            Node(
                path=strings[path[row]],
                type=strings[type_[row]],
                parent=-1 if parent[row] == NO_INDEX else self.node_of[parent[row]],
                container=Container(container[row]),  # ckview.trace.schema.ContainerKind
                sequential_forward=bool(sequential[row]),
                param_bytes=params[row],
            )
            for row in self.rows
        ]

    def region(self, resolved: Resolved) -> Region:
        """The projection's region (by module row) of a resolved region."""
        row = self.rows[resolved.node]
        if resolved.is_segment:
            return SegmentRegion(row, resolved.start, resolved.stop)
        return ModuleRegion(row, resolved.save, resolved.offload)

    def resolved(self, region: Region) -> Resolved:
        """The core's region (by node) of a projection region; PlanError outside the model."""
        node = self.node_of.get(region.module)
        if node is None:
            raise PlanError(
                f"region {region} names module row {region.module}, which is not part of the "
                f"model ({self.tree.model_type}); a plan can only name the model's modules"
            )
        if isinstance(region, SegmentRegion):
            return Resolved(node, region.start, region.stop)
        return Resolved(node, save=region.save, offload=region.offload)

    def resolve(self, plan: PlanLike) -> PlanRegions:
        """``plan`` resolved over this tree (``resolve_on_trace``)."""
        resolution = resolve(self.tree, as_plan(plan))
        return PlanRegions(
            plan=resolution.plan,
            regions=tuple(self.region(r) for r in resolution.regions),
            why=tuple(r.why for r in resolution.regions),
            labels=tuple(str(region) for region in resolution.plan.regions),
        )

    def plan_of(
        self, regions: Sequence[Region], name: str, meta: Mapping[str, Any] | None = None
    ) -> PlanRegions:
        """Module-row ``regions`` as a plan over this tree (``plan_on_trace``)."""
        wanted = [self.resolved(r).region(self.tree) for r in dict.fromkeys(regions)]
        concrete = resolve_regions(self.tree, wanted)
        plan = Plan(name, tuple(r.region(self.tree) for r in concrete), meta=dict(meta or {}))
        return PlanRegions(
            plan=plan,
            regions=tuple(self.region(r) for r in concrete),
            why=tuple(r.why for r in concrete),
            labels=tuple(str(region) for region in plan.regions),
        )

    def chain(self) -> Chain | None:
        """The model's chain of blocks (NOTE [ Block chain detection ]), None if it has none."""
        try:
            return find_chain(self.tree)
        except PlanError:
            return None


def _main_subtree(parent: np.ndarray, param_bytes: np.ndarray) -> list[int]:
    """Rows under the root owning the most parameter bytes (the first on ties), in row order
    (a module's parent row comes before it)."""
    n = len(parent)
    root = np.arange(n)
    for _ in range(n):
        up = parent[root]
        if not (up != NO_INDEX).any():
            break
        root = np.where(up != NO_INDEX, up, root)
    roots = np.flatnonzero(parent == NO_INDEX)
    if roots.size == 0:
        return []
    owned = np.bincount(
        np.searchsorted(roots, root), weights=param_bytes.astype(np.float64), minlength=len(roots)
    )
    main = roots[int(np.argmax(owned))]
    return np.flatnonzero(root == main).tolist()


# ----------------------------------------------------------------------------- plans


def as_plan(plan: PlanLike) -> Plan:
    """``plan`` as a :class:`Plan`: a preset string, a plan document or its JSON text (a plan
    file's path is the caller's to read). Raises PlanError (a ValueError)."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, str) and is_preset_like(plan):
        spec = parse_preset(plan)
        return Plan(name=str(spec), preset=spec.name, chain=spec.chain)
    if isinstance(plan, str):
        text = plan
        try:
            plan = json.loads(text)
        except json.JSONDecodeError:
            raise PlanError(
                f"{text[:60]!r} is neither a preset (none, all, sqrt, every:K) nor a plan "
                "document; pass a preset or the plan file's JSON (read the file first)"
            ) from None
    if not isinstance(plan, Mapping):
        raise PlanError(f"a plan is a JSON object or a preset string, got {type(plan).__name__}")
    return Plan.from_json(plan)


@dataclass(frozen=True)
class PlanRegions:
    """A plan resolved over a recorded run: its regions by module row, in plan order, and
    for each the reason it cannot take effect in the step (None if it runs)."""

    plan: Plan
    """The concrete plan (what ``ckpt_runtime.resolve_plan`` gives on the live model)."""
    regions: tuple[Region, ...]
    why: tuple[str | None, ...]
    labels: tuple[str, ...]
    """Each region as a plan names it (``path`` or ``path[start:stop]``)."""

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def effective(self) -> tuple[Region, ...]:
        """The regions that take effect."""
        return tuple(r for r, w in zip(self.regions, self.why, strict=True) if w is None)

    @property
    def idle(self) -> tuple[Region, ...]:
        """The regions that cannot take effect (NOTE [ Regions that cannot take effect ])."""
        return tuple(r for r, w in zip(self.regions, self.why, strict=True) if w is not None)

    def notes(self) -> list[str]:
        """One line per reason some regions cannot take effect, naming them (``idle_notes``)."""
        return idle_notes(self.labels, self.why)

    def summary(self) -> str | None:
        """One line on the regions that cannot take effect, None if all can."""
        idle = len(self.idle)
        if not idle:
            return None
        n = len(self.regions)
        return (
            f"{idle} of {n} region{'s' if n != 1 else ''} cannot take effect in the recorded "
            f"step: {'; '.join(self.notes())}"
        )

    def to_json(self) -> list[dict[str, Any]]:
        """Each region with ``takes_effect`` and ``why``."""
        return [
            {"region": label, "takes_effect": why is None, "why": why}
            for label, why in zip(self.labels, self.why, strict=True)
        ]


def resolve_on_trace(
    plan: PlanLike, modules: Table, strings: Sequence[str], calls: Table | None = None
) -> PlanRegions:
    """Resolve ``plan`` over the model recorded in ``modules`` as ``ckpt_runtime.resolve_plan``
    resolves it over the live model; with a run's ``module_calls`` as ``calls``, each region
    says whether it takes effect in that run's step. Raises PlanError (a ValueError, one line)
    for a malformed plan, a pattern that matches nothing, or regions the model cannot have.
    A trace without modules (a loop without ``nn.Module``) resolves only a plan that
    checkpoints nothing."""
    if len(modules["parent"]) == 0:
        concrete = as_plan(plan)
        if not concrete.checks_nothing:
            raise PlanError(
                f"plan {concrete.name!r} names modules, but no nn.Module ran in the recorded "
                "step: only plan 'none' applies to a loop without modules"
            )
        return PlanRegions(Plan(concrete.name, ()), (), (), ())
    return TraceTree(modules, strings, calls).resolve(plan)


def regions_from_plan(plan: PlanLike, modules: Table, strings: Sequence[str]) -> list[Region]:
    """The regions (by module row, in plan order) a plan checkpoints in the recorded model
    (``resolve_on_trace`` without the run's calls)."""
    return list(resolve_on_trace(plan, modules, strings).regions)


def plan_on_trace(
    regions: Sequence[Region],
    modules: Table,
    strings: Sequence[str],
    name: str,
    *,
    calls: Table | None = None,
    meta: Mapping[str, Any] | None = None,
) -> PlanRegions:
    """Module-row ``regions`` as a plan over the recorded model (deduplicated, in resolved
    order), each saying whether it takes effect when ``calls`` are given; PlanError for regions
    no plan can express (as ``plan_from_regions``)."""
    return TraceTree(modules, strings, calls).plan_of(regions, name, meta)


def plan_from_regions(
    regions: Sequence[Region],
    modules: Table,
    strings: Sequence[str],
    name: str,
    *,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A plan document (as ``ckpt_runtime.save_plan`` writes it) checkpointing ``regions``.

    Module regions become exact (escaped) paths, segments ``{"sequential", "start", "stop"}``;
    duplicates are merged and the order is the resolved order, so ``regions_from_plan`` on the
    result gives back the same regions. ``meta`` (JSON data) is stored as the plan's ``meta``.
    Raises PlanError for regions no plan can express (a row outside the model, a segment of a
    non-Sequential or past its children, overlapping segments).
    """
    return plan_on_trace(regions, modules, strings, name, meta=meta).plan.to_json()


def plan_name(plan: PlanLike) -> str:
    """The name a re-recording with ``plan`` is stored under, after ``plan:``.

    A preset string names itself in canonical form (``every:02@blocks`` -> ``every:2@blocks``);
    a plan document its ``name``, else ``"plan"`` (a file's stem is the caller's to supply).
    """
    return as_plan(plan).name


def chain_of_blocks(modules: Table, strings: Sequence[str]) -> int | None:
    """Row of the recorded model's chain of blocks (the ModuleList or Sequential presets act
    on; NOTE [ Block chain detection ] in ckpt_runtime/resolve.py), None if it has none."""
    tt = TraceTree(modules, strings)
    chain = tt.chain()
    return None if chain is None else tt.rows[chain.node]


def module_rows_matching(modules: Table, strings: Sequence[str], pattern: str) -> list[int]:
    """Rows of the modules whose dotted path (relative to its root) matches ``pattern``, with
    the plan format's matching (NOTE [ Module path patterns ] in ckpt_runtime/plan.py); with
    several roots, each root's modules. Raises PlanError for a pattern the format rejects."""
    region = PatternRegion(pattern)
    return [r for r, p in enumerate(np.asarray(modules["path"])) if region.matches(strings[p])]
