"""The planner: the checkpoint plan with the least extra compute whose projected peak fits a budget.

``plan_for_budget(tables, budget_bytes)`` searches the plans over a baseline run's chain of
blocks (or over given candidate regions), judging every plan it considers with
``ProjectionModel`` (the projection is the judge: no estimate ever decides an answer), and
returns the cheapest plan that fits, or, when none does, the plan with the lowest peak and
``fits=False``. ``pareto(tables)`` lists the plans no other plan beats on both peak and extra
compute. ``Planner`` does both on one ``ProjectionModel`` (the CLI asks for both).

NOTE [ Planner search space ]
    Candidates default to the chain of blocks (``chain_of_blocks``: the ModuleList or Sequential
    presets act on): each block as a ``ModuleRegion`` and, when the chain is an
    ``nn.Sequential`` that runs its own forward and whose forward ran in the step (NOTE [
    Regions that cannot take effect ] in ckpt_runtime/resolve.py), its contiguous segments of
    two or more blocks as ``SegmentRegion``s (a one-block segment is the block's module region:
    same instances, same projection). A plan is a set of candidates no two of which *conflict*:
    their instances overlap in call rows (a segment and a block or segment inside or across it).
    Selecting both of two nested regions is never worth it here: the projection keeps the outer
    one and ignores the inner one (NOTE [ Nesting: the outer region wins ] in regions.py), so it
    has the same peak and extra compute as the outer one alone. On a ModuleList chain of n
    blocks the space is the 2**n subsets of blocks; on a Sequential chain it is every way to
    mark disjoint runs of blocks as segments, F(2n+1) plans (Fibonacci: 34 for 4 blocks, 1597
    for 8). Extra compute is additive over the regions of such a plan (each instance's recompute
    runs once); the peak is not, so the peak of every plan considered comes from
    ``ProjectionModel.peak``.

NOTE [ Planner exactness ]
    When the space holds at most ``exact_limit`` plans (default ``EXACT_LIMIT`` = 4096: chains
    of up to 12 blocks in a ModuleList, up to 8 in a Sequential, or any candidate list with
    that few conflict-free subsets), the planner enumerates every plan and asks the projection
    for each peak: the answer is exactly the cheapest plan (ties: lower peak, then fewer
    regions) among all plans of the space whose projected peak fits, the reported best
    reachable peak is the lowest of all, and ``pareto`` is the exact front. This is a search
    over the projection itself, not over a model of it, so it is exact for whatever the
    projection says (recompute spikes, kept inputs, peaks in backward), at one query per plan,
    ~0.06 ms on small traces to ~0.2 ms on 1e6 events (4096 plans: 0.25 s to 0.8 s).
    ``PlannerResult.exact`` tells which case applied.

NOTE [ Planner heuristic ]
    Beyond ``exact_limit`` plans the planner searches with about ``max_evaluations`` projection
    queries per answer (default ``MAX_EVALUATIONS``; the seeds, about 2n + 20 queries on a chain
    of n blocks, are always judged), every plan it returns still judged by the projection:

    1. seeds: no plan; the presets ``all``, ``sqrt`` and ``every:K`` (K = 2..8) where the
       candidates can express them; k near-equal segments (Sequential chains, k = 1..n); and
       the cheapest member that fits of two families of growing cost, found by bisection: the
       first m blocks (the family ``sqrt`` on a ModuleList belongs to), and the greedy family
       (candidates ranked by peak saved alone per extra compute, one query each, taken in that
       order while they do not conflict);
    2. local search from the best seed (first improvement): remove a region; add one, dropping
       what it conflicts with (this also shrinks, extends and merges segments), alone or while
       removing a region within ``NEAR`` blocks (a swap); split a segment in two. While the
       plan fits, only moves that cost less (or as much, with a lower peak) are judged, the
       cheapest first; while it does not, any move that lowers the peak.

    Forced on chains small enough to check against the exact search (``exact_limit=0``), it
    gave the exact answer for all of 36 budgets on random 12-block ModuleList chains, and for
    121 of 125 on random 3-8 block Sequential chains (the misses: budgets no plan meets, where
    its lowest peak was 2.5% above the true lowest).

    Because the presets are seeds, the answer never costs more than ``sqrt`` when ``sqrt``
    fits (and likewise ``all``), exact or not. On a Sequential chain too long for every segment
    to be a candidate (more than ``MAX_SEGMENTS`` segments), segments are limited to the
    lengths up to that of ``sqrt``'s segments (and at least 4).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.analysis.planner_ops import op_variants
from ckview.analysis.plans import TraceTree
from ckview.analysis.projection import ProjectionModel
from ckview.analysis.regions import ModuleRegion, Region, SegmentRegion, sequential_children
from ckview.analysis.timing import step_time_ns
from ckview.analysis.types import RunTables
from ckview.analysis.units import format_bytes

__all__ = [
    "EXACT_LIMIT",
    "MAX_EVALUATIONS",
    "ParetoPoint",
    "Planner",
    "PlannerResult",
    "PresetPoint",
    "pareto",
    "plan_for_budget",
]

EXACT_LIMIT = 4096
"""Spaces with at most this many plans are searched exhaustively (NOTE [ Planner exactness ])."""
MAX_EVALUATIONS = 1500
"""Projection queries the heuristic may spend (NOTE [ Planner heuristic ])."""
MAX_SEGMENTS = 500
"""Segments of a Sequential chain beyond which long segments are not candidates."""
NEAR = 4
"""Local search swaps regions at most this many blocks (or candidates) apart."""
LEVELS = ("module", "op")
"""What a plan may choose per region: recompute whole modules, or also which ops to save
(NOTE [ Op-level search space ] in planner_ops.py)."""
PRESET_NAMES = ("none", "all", "sqrt")
"""The presets a result lists beside the plan."""


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ParetoPoint:
    """A plan on the peak / extra-compute front."""

    regions: tuple[Region, ...]
    peak_bytes: int
    extra_compute_ns: int


@dataclass(frozen=True)
class PresetPoint:
    """A preset resolved on the run's model, and what the projection says it does."""

    name: str
    regions: tuple[Region, ...]
    peak_bytes: int
    extra_compute_ns: int
    idle: str | None = None
    """Why some of its regions cannot take effect in the step (``PlanRegions.summary``)."""


@dataclass(frozen=True)
class PlannerResult:
    """The planner's answer for one budget."""

    regions: tuple[Region, ...]
    """The plan's regions, in plan order (by module row)."""
    plan: dict[str, Any]
    """The plan document (``plan_from_regions``), ready for ``ckpt_runtime.apply_plan``."""
    peak_bytes: int
    """Projected peak of the plan."""
    extra_compute_ns: int
    """Summed forward time of the recomputes the plan adds."""
    extra_compute_range_ns: tuple[int, int]
    """The lowest and highest extra compute the measurements allow (NOTE [ How sure the extra
    time is ] in timing.py)."""
    fits: bool
    """True if ``peak_bytes <= budget_bytes``; otherwise the plan is the lowest peak found."""
    best_reachable_peak: int
    """Lowest projected peak of any plan considered (of all plans when ``exact``)."""
    budget_bytes: int
    baseline_peak_bytes: int
    """Projected peak with nothing checkpointed (the recorded baseline's peak)."""
    step_ns: int
    """Summed duration of the run's recorded steps (to put extra compute in proportion)."""
    presets: tuple[PresetPoint, ...]
    """``none``, ``all`` and ``sqrt`` on the same run (those the model can resolve)."""
    exact: bool
    """True if every plan of the space was judged (NOTE [ Planner exactness ])."""
    evaluations: int
    """Projection queries the planner has spent so far (each plan is judged once)."""
    notes: tuple[str, ...] = ()
    """What limited the search (``Planner.notes``)."""

    def preset(self, name: str) -> PresetPoint | None:
        """The preset point named ``name``, or None if the model could not resolve it."""
        return next((p for p in self.presets if p.name == name), None)


@dataclass(frozen=True)
class _Point:
    """A judged plan: a bitmask over pool indices, its projected peak and extra compute."""

    mask: int
    peak: int
    cost: int
    size: int
    host: int = 0
    """Bytes its offload regions move to host memory (NOTE [ Offload in the planner ])."""


# ----------------------------------------------------------------------------- public API


def plan_for_budget(
    tables: RunTables,
    budget_bytes: int,
    candidates: Sequence[Region] | None = None,
    *,
    exact_limit: int = EXACT_LIMIT,
    max_evaluations: int = MAX_EVALUATIONS,
) -> PlannerResult:
    """The plan with the least extra compute whose projected peak is at most ``budget_bytes``.

    ``tables`` is a baseline run's tables with ``modules`` and ``strings``. ``candidates``
    default to the chain of blocks (NOTE [ Planner search space ]). If no plan fits, the result
    has ``fits=False`` and the plan with the lowest peak found. Raises ``ValueError`` if the
    run has no chain of blocks and no candidates are given.
    """
    planner = Planner(tables, candidates, exact_limit=exact_limit, max_evaluations=max_evaluations)
    return planner.for_budget(budget_bytes)


def pareto(
    tables: RunTables,
    candidates: Sequence[Region] | None = None,
    *,
    exact_limit: int = EXACT_LIMIT,
    max_evaluations: int = MAX_EVALUATIONS,
) -> list[ParetoPoint]:
    """The plans no other plan beats on both projected peak and extra compute, by increasing
    extra compute (decreasing peak). Exact within ``exact_limit`` (NOTE [ Planner exactness ]),
    else the front of the plans the heuristic judged."""
    planner = Planner(tables, candidates, exact_limit=exact_limit, max_evaluations=max_evaluations)
    return planner.pareto()


def chain_candidates(
    modules: Mapping[str, np.ndarray],
    strings: Sequence[str],
    calls: Mapping[str, np.ndarray] | None = None,
) -> list[Region]:
    """The planner's default candidates: each block of the run's chain of blocks, and on a
    Sequential chain its segments (NOTE [ Planner search space ]; with the run's
    ``module_calls``, segments only if the Sequential's forward ran); empty without a chain."""
    try:
        return _Chain.find(TraceTree(modules, strings, calls)).candidates()
    except ValueError:
        return []


def already_checkpointed(tables: RunTables) -> str | None:
    """Why plans over this run say nothing (it recorded recomputes: it is checkpointed
    already, and a plan is projected from a run without checkpointing), or None."""
    regions = len(tables["recompute_regions"]["module"])
    if not regions:
        return None
    return (
        f"this run is checkpointed already ({regions} recompute(s) recorded): plans are "
        "projected from a run without checkpointing; plan over its baseline run "
        "(ckview record --compare records both)"
    )


def budget_answer(result: PlannerResult, budget: str | None = None) -> str:
    """One line answering a budget, the same in ``ckview plan`` and the explorer:
    ``'budget 8.90 MiB is not met: the best plan peaks at 36.6 MiB (+27.7 MiB)'``, or what
    the plan that meets it peaks at. ``budget`` is the budget as shown (``Budget.describe``);
    by default its size."""
    shown = budget or format_bytes(result.budget_bytes)
    if result.fits:
        return f"budget {shown} is met: the plan peaks at {format_bytes(result.peak_bytes)}"
    best = result.best_reachable_peak
    return (
        f"budget {shown} is not met: the best plan peaks at {format_bytes(best)} "
        f"(+{format_bytes(best - result.budget_bytes)})"
    )


class Planner:
    """Plans for one baseline run and candidate list, on one ``ProjectionModel``."""

    def __init__(
        self,
        tables: RunTables,
        candidates: Sequence[Region] | None = None,
        *,
        exact_limit: int = EXACT_LIMIT,
        max_evaluations: int = MAX_EVALUATIONS,
        level: str = "module",
        offload: bool = False,
        host_budget: int | None = None,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown planning level {level!r}; the levels are {LEVELS}")
        if offload and level != "op":
            raise ValueError("offload is an op-level choice: plan with level 'op' to offload")
        self.tables, self.level, self.offload = tables, level, offload
        self.host_budget = host_budget
        """Most bytes the plan may hold in host memory (NOTE [ Offload in the planner ])."""
        self.modules, self.strings = tables["modules"], tables["strings"]
        self.exact_limit, self.max_evaluations = exact_limit, max_evaluations
        self.chain: _Chain | None = None
        self.calls = tables.get("module_calls")
        self.tree = TraceTree(self.modules, self.strings, self.calls)
        if candidates is None:
            self.chain = _Chain.find(self.tree)
            candidates = self.chain.candidates()
        self.candidates: list[Region] = list(dict.fromkeys(candidates))
        self._module_candidates = list(self.candidates)
        if level == "op":  # NOTE [ Op-level search space ]
            variants = op_variants(tables, self.candidates, offload)
            self.candidates += [v for _, v in variants]
            if self.chain is not None:
                self.chain.add(self.chain.ranges[i] for i, _ in variants)
        self._module_planner: Planner | None = None
        self.pool = list(self.candidates)
        self._presets = self._resolve_presets()
        self.model = ProjectionModel(tables, self.pool)
        self.step_ns, self.plain_times = step_time_ns(tables)
        """Summed time of the recorded steps, and whether it (and every extra compute) comes
        from plain timing steps (NOTE [ Extra compute from plain times ] in timing.py)."""
        self.search = self._searchable()
        self.cost = {i: self.model.extra_compute_ns([i]) for i in self.search}
        self.host = {i: self.model.offloaded_bytes([i]) if offload else 0 for i in self.search}
        self.conflicts = self._conflicts()
        self.near = self._nearby()
        self._cache: dict[int, _Point] = {}
        self.evaluations = 0
        self._space: list[int] | None = self._enumerate()
        self.baseline_peak = self.evaluate(0).peak

    @property
    def exact(self) -> bool:
        """True if the whole space is enumerated (NOTE [ Planner exactness ])."""
        return self._space is not None

    # -- answers

    def for_budget(self, budget_bytes: int) -> PlannerResult:
        """The cheapest plan that fits ``budget_bytes`` (NOTE [ Planner exactness ],
        NOTE [ Planner heuristic ])."""
        budget = int(budget_bytes)
        if self._space is not None:
            judged = [self.evaluate(mask) for mask in self._space]
            best = min(judged, key=lambda p: self._objective(p, budget))
        else:
            limit = self.evaluations + self.max_evaluations
            best = self._local_search(self._best_seed(budget), budget, limit)
        if self.level == "op":  # NOTE [ Op-level never costs more ]
            module = self.evaluate(self._module_mask(budget))
            best = min(best, module, key=lambda p: self._objective(p, budget))
        return self._result(best, budget)

    def _objective(self, point: _Point, budget: int) -> tuple[int, int, int, int, int]:
        """NOTE [ Offload in the planner ]
        With ``offload=True`` each block may also offload what it saves (``save: ["*"],
        offload: true``; NOTE [ Offloaded instances ] in ckview.analysis.projection): no
        extra compute, a lower device peak on CUDA (on a CPU trace it changes nothing and is
        never worth choosing), and host memory. A plan's host bytes are the sum of what its
        offload regions move (``ProjectionModel.offloaded_bytes``), an upper bound of the
        host's peak (``Projection.host_peak_bytes``): a plan fits only if its device peak fits
        the budget and its host bytes fit ``host_budget`` (when given)."""
        return _objective(point, budget, self.host_budget)

    def _module_mask(self, budget: int) -> int:
        """The module-level planner's answer for ``budget``, as a plan of this pool.

        NOTE [ Op-level never costs more ]
            The op-level search space holds every module plan, and its answer is compared with
            the module-level planner's answer for the same budget (a seed of the heuristic,
            and a contender of the exact search): so, by the projection that judges both, an
            op-level plan that fits never costs more extra compute than the best module plan
            that fits (tests/test_planner_ops.py checks it on several budgets)."""
        if self._module_planner is None:
            self._module_planner = Planner(
                self.tables,
                self._module_candidates if self.chain is None else None,
                exact_limit=self.exact_limit,
                max_evaluations=self.max_evaluations,
            )
        regions = self._module_planner.for_budget(budget).regions
        index = {region: i for i, region in enumerate(self.pool)}
        return _mask(index[region] for region in regions)

    def pareto(self) -> list[ParetoPoint]:
        """The non-dominated plans by (extra compute, peak), cheapest first."""
        if self._space is not None:
            for mask in self._space:
                self.evaluate(mask)
        else:
            self._sweep()
        front = _front(list(self._cache.values()))
        return [ParetoPoint(self.regions_of(p.mask), p.peak, p.cost) for p in front]

    def evaluate(self, mask: int) -> _Point:
        """The plan ``mask`` judged by the projection (memoised)."""
        point = self._cache.get(mask)
        if point is None:
            chosen = _bits(mask)
            peak = self.model.peak(chosen).bytes
            cost, host = sum(self.cost[i] for i in chosen), sum(self.host[i] for i in chosen)
            point = _Point(mask, peak, cost, len(chosen), host)
            self._cache[mask] = point
            self.evaluations += 1
        return point

    def regions_of(self, mask: int) -> tuple[Region, ...]:
        """The regions of plan ``mask``, in plan order."""
        return tuple(sorted((self.pool[i] for i in _bits(mask)), key=_region_order))

    # -- construction

    def notes(self) -> tuple[str, ...]:
        """What limits the search, in a sentence each: a chain whose segments cannot take
        effect, no candidate that runs in the step."""
        out = []
        checkpointed = already_checkpointed(self.tables)
        if checkpointed is not None:
            out.append(checkpointed)
        if self.chain is not None and self.chain.idle_segments is not None:
            out.append(self.chain.idle_segments)
        if not self.search:
            out.append(
                "no candidate region ran forward in the recorded step, so no plan can lower "
                "the peak"
            )
        return tuple(out)

    def _resolve_presets(self) -> dict[str, tuple[tuple[Region, ...], list[int]]]:
        """Each preset the model resolves: its regions and their pool indices (regions the
        candidates lack are appended to the pool, outside the search)."""
        index = {region: i for i, region in enumerate(self.pool)}
        names = [*PRESET_NAMES, *(f"every:{k}" for k in range(2, 9))]
        out = {}
        self._preset_idle: dict[str, str | None] = {}
        for name in names:
            try:
                resolved = self.tree.resolve(name)
            except ValueError:
                continue  # no chain of blocks: the preset does not exist for this model
            regions = resolved.regions
            self._preset_idle[name] = resolved.summary()
            picks = []
            for region in regions:
                region = self._as_candidate(region, index)
                if region not in index:
                    index[region] = len(self.pool)
                    self.pool.append(region)
                picks.append(index[region])
            out[name] = (regions, picks)
        return out

    def _as_candidate(self, region: Region, index: Mapping[Region, int]) -> Region:
        """A one-child segment as its child's module region if that is a candidate."""
        if isinstance(region, SegmentRegion) and region.stop - region.start == 1:
            child = sequential_children(self.modules, self.strings, region.module)[region.start]
            if ModuleRegion(child) in index:
                return ModuleRegion(child)
        return region

    def _searchable(self) -> list[int]:
        """Candidates with at least one instance in the run (others change nothing)."""
        present = set(np.unique(self.model.instances.region).tolist())
        return [i for i in range(len(self.candidates)) if i in present]

    def _conflicts(self) -> dict[int, int]:
        """Bitmask of the candidates each candidate conflicts with (NOTE [ Planner search
        space ]): by block ranges on a chain, by instance call rows otherwise."""
        if self.chain is not None:
            return self.chain.conflicts(self.search)
        return _instance_conflicts(self.model, self.search)

    def _enumerate(self) -> list[int] | None:
        """Every plan of the space if there are at most ``exact_limit``, else None."""
        if 2 ** _independent_lower_bound(self.search, self.conflicts) > self.exact_limit:
            return None
        plans: list[int] = []
        _independent_sets(self.search, self.conflicts, 0, 0, 0, plans, self.exact_limit)
        return plans if len(plans) <= self.exact_limit else None

    # -- heuristic (NOTE [ Planner heuristic ])

    def _seeds(self, budget: int) -> list[int]:
        """The seed plans of the heuristic for ``budget``, judged: fixed plans, and the
        cheapest member that fits of each family ordered by growing extra compute."""
        searchable = set(self.search)
        seeds = [0]
        for _, picks in self._presets.values():
            if set(picks) <= searchable:
                seeds.append(_mask(picks))
        if self.level == "op":
            seeds.append(self._module_mask(budget))
        families = [self._greedy_family()]
        if self.chain is not None:
            seeds += self.chain.segmentations(searchable)
            families.append(self.chain.prefixes(searchable))
        for mask in seeds:
            self.evaluate(mask)
        for family in families:
            seeds += self._bisect(family, budget)
        return seeds

    def _greedy_family(self) -> list[int]:
        """Prefixes of the candidates ranked by peak saved alone per extra compute."""
        base = self.evaluate(0).peak
        gain = {i: base - self.evaluate(1 << i).peak for i in self.search}
        ranked = sorted(self.search, key=lambda i: (-gain[i] / max(self.cost[i], 1), i))
        family, mask = [], 0
        for i in ranked:
            if gain[i] > 0 and not mask & self.conflicts[i]:
                mask |= 1 << i
                family.append(mask)
        return family

    def _bisect(self, family: Sequence[int], budget: int) -> list[int]:
        """The first member of ``family`` (plans of growing extra compute) that fits, found by
        bisection as if the peak fell along the family (it is a seed: the judge has the last
        word), and the members judged on the way; the last member if none fits."""
        if not family:
            return []
        judged = [family[-1]]
        if self.evaluate(family[-1]).peak > budget:
            return judged
        lo, hi = 0, len(family) - 1  # family[hi] fits
        while lo < hi:
            middle = (lo + hi) // 2
            judged.append(family[middle])
            if self.evaluate(family[middle]).peak <= budget:
                hi = middle
            else:
                lo = middle + 1
        return judged

    def _best_seed(self, budget: int) -> _Point:
        points = (self.evaluate(m) for m in self._seeds(budget))
        return min(points, key=lambda p: self._objective(p, budget))

    def _local_search(self, point: _Point, budget: int, limit: int) -> _Point:
        """First-improvement descent from ``point`` until no move improves or the planner has
        spent ``limit`` evaluations."""
        while self.evaluations < limit:
            for mask in self._moves(point, budget):
                if self.evaluations >= limit and mask not in self._cache:
                    return point
                moved = self.evaluate(mask)
                if self._objective(moved, budget)[:3] < self._objective(point, budget)[:3]:
                    point = moved
                    break
            else:
                return point
        return point

    def _moves(self, point: _Point, budget: int) -> Iterator[int]:
        """Neighbouring plans worth judging, most promising first."""
        fits = point.peak <= budget
        moves = {m for m in self._neighbours(point.mask) if m != point.mask}
        if fits:
            costs = {m: self._cost_of(m) for m in moves}
            yield from sorted(
                (m for m in moves if costs[m] <= point.cost), key=lambda m: (costs[m], m)
            )
        else:
            yield from sorted(moves, key=lambda m: (self._known_peak(m), m))

    def _neighbours(self, mask: int) -> Iterator[int]:
        """Remove a region; add one (dropping what it conflicts with), alone or while removing
        a nearby one; split a segment."""
        chosen = _bits(mask)
        for i in sorted(chosen, key=lambda i: -self.cost[i]):
            yield mask & ~(1 << i)
        for j in self.search:
            if mask >> j & 1:
                continue
            added = (mask & ~self.conflicts[j]) | 1 << j
            yield added
            for i in _bits(added & self.near[j]):
                if i != j:
                    yield added & ~(1 << i)
        if self.chain is not None:
            for i in chosen:
                halves = self.chain.halves(i)
                if halves is not None:
                    yield (mask & ~(1 << i)) | _mask(halves)

    def _nearby(self) -> dict[int, int]:
        """Bitmask of the candidates near each candidate: within ``NEAR`` blocks on a chain,
        within ``NEAR`` places in forward order otherwise."""
        if self.chain is not None:
            return self.chain.nearby(self.search, NEAR)
        return {
            c: _mask(self.search[max(k - NEAR, 0) : k + NEAR + 1])
            for k, c in enumerate(self.search)
        }

    def _cost_of(self, mask: int) -> int:
        return sum(self.cost[i] for i in _bits(mask))

    def _known_peak(self, mask: int) -> int:
        point = self._cache.get(mask)
        return point.peak if point is not None else -1  # unjudged first: they may be better

    def _sweep(self) -> None:
        """Judge plans across budgets from the lowest peak seen up to the baseline (pareto)."""
        seeds = self._seeds(0)
        low = min(self.evaluate(m).peak for m in seeds)
        for share in np.linspace(0.0, 1.0, 9):
            budget = int(low + share * (self.baseline_peak - low))
            limit = self.evaluations + self.max_evaluations // 9
            self._local_search(self._best_seed(budget), budget, limit)

    # -- result

    def _result(self, best: _Point, budget: int) -> PlannerResult:
        chosen = _bits(best.mask)
        peak = self.model.peak(chosen).bytes  # the judge's word, not the memo's
        extra = self.model.extra_compute_ns(chosen)
        regions = self.regions_of(best.mask)
        fits = peak <= budget and (self.host_budget is None or best.host <= self.host_budget)
        meta = {
            "planner": {
                "budget_bytes": budget,
                "projected_peak_bytes": peak,
                "extra_compute_ns": extra,
                "fits": fits,
                "exact": self.exact,
                "level": self.level,
                "offloaded_bytes": best.host,
            }
        }
        name = "budget-" + format_bytes(budget).replace(" ", "")
        return PlannerResult(
            regions=regions,
            plan=self.tree.plan_of(regions, name, meta).plan.to_json(),
            peak_bytes=peak,
            extra_compute_ns=extra,
            extra_compute_range_ns=self.model.extra_compute_range_ns(chosen),
            fits=fits,
            best_reachable_peak=min(p.peak for p in self._cache.values()),
            budget_bytes=budget,
            baseline_peak_bytes=self.baseline_peak,
            step_ns=self.step_ns,
            presets=self._preset_points(),
            exact=self.exact,
            evaluations=self.evaluations,
            notes=self.notes(),
        )

    def _preset_points(self) -> tuple[PresetPoint, ...]:
        points = []
        for name in PRESET_NAMES:
            if name in self._presets:
                regions, picks = self._presets[name]
                peak = self.model.peak(picks).bytes
                extra = self.model.extra_compute_ns(picks)
                points.append(PresetPoint(name, regions, peak, extra, self._preset_idle[name]))
        return tuple(points)


# ----------------------------------------------------------------------------- the chain


class _Chain:
    """The chain of blocks the default candidates come from, and their block ranges."""

    def __init__(
        self, row: int, blocks: Sequence[int], sequential: bool, idle_segments: str | None = None
    ) -> None:
        self.row, self.blocks, self.sequential = row, tuple(blocks), sequential
        self.idle_segments = idle_segments
        """Why a Sequential chain offers no segments (its forward never ran), or None."""
        n = len(self.blocks)
        ranges = [(i, i + 1) for i in range(n)]
        if sequential:
            longest = _segment_length_limit(n)
            ranges += [(a, a + k) for k in range(2, longest + 1) for a in range(n - k + 1)]
        self.ranges = tuple(ranges)
        """Block range [start, stop) of each candidate, in candidate order."""
        self.index = {r: k for k, r in enumerate(self.ranges)}

    @classmethod
    def find(cls, tt: TraceTree) -> _Chain:
        """The run's chain of blocks (NOTE [ Block chain detection ]); segments only on a
        segmentable Sequential whose forward ran (when the tree knows the calls);
        ``ValueError`` if there is no chain."""
        chain = tt.chain()
        if chain is None:
            raise ValueError(
                "the run's model has no chain of blocks (no ModuleList or Sequential with 2+ "
                "children) to plan over; write a plan naming its modules (docs/plan-format.md) "
                "and project it with ckview project"
            )
        blocks = [tt.rows[b] for b in chain.blocks]
        row = tt.rows[chain.node]
        if chain.segmentable and tt.tree.ran(chain.node) is False:
            idle = (
                f"{chain.path or '<model>'} is an nn.Sequential whose forward never ran in the "
                "recorded step (it is looped over in Python, or handed to "
                "checkpoint_sequential), so its segments cannot take effect: the planner "
                "checkpoints its blocks one by one"
            )
            return cls(row, blocks, False, idle)
        return cls(row, blocks, chain.segmentable)

    def candidates(self) -> list[Region]:
        return [
            ModuleRegion(self.blocks[a]) if b - a == 1 else SegmentRegion(self.row, a, b)
            for a, b in self.ranges
        ]

    def add(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Append candidates over the given block ranges (op-level variants of blocks); the
        first candidate of a range stays the one ``index`` names."""
        self.ranges = (*self.ranges, *ranges)

    def conflicts(self, search: Sequence[int]) -> dict[int, int]:
        """Candidates whose block ranges overlap (their instances then overlap)."""
        return {i: mask & ~(1 << i) for i, mask in self.nearby(search, 0).items()}

    def nearby(self, search: Sequence[int], distance: int) -> dict[int, int]:
        """Candidates whose block range overlaps each one's widened by ``distance`` blocks."""
        n = len(self.blocks)
        cover = [0] * n  # candidates holding each block
        for i in search:
            a, b = self.ranges[i]
            for block in range(a, b):
                cover[block] |= 1 << i
        out = {}
        for i in search:
            a, b = self.ranges[i]
            mask = 0
            for block in range(max(a - distance, 0), min(b + distance, n)):
                mask |= cover[block]
            out[i] = mask
        return out

    def halves(self, i: int) -> list[int] | None:
        """Candidates splitting segment ``i`` in two near-equal halves, if it is one."""
        a, b = self.ranges[i]
        if b - a < 2:
            return None
        middle = (a + b) // 2
        parts = [self.index.get((a, middle)), self.index.get((middle, b))]
        return [p for p in parts if p is not None] if None not in parts else None

    def prefixes(self, searchable: set[int]) -> list[int]:
        """The first m blocks as module regions, m = 1..n (growing extra compute)."""
        family = [_mask(range(m)) for m in range(1, len(self.blocks) + 1)]
        return [m for m in family if set(_bits(m)) <= searchable]

    def segmentations(self, searchable: set[int]) -> list[int]:
        """k near-equal segments covering the chain, k = 1..n, as ``sqrt`` cuts them
        (Sequential chains; those whose segments are all candidates)."""
        n = len(self.blocks)
        out = []
        for k in range(1, n + 1) if self.sequential else ():
            bounds = [(i * n) // k for i in range(k + 1)]
            picks = [self.index.get(r) for r in itertools.pairwise(bounds)]
            if None not in picks and set(picks) <= searchable:
                out.append(_mask(p for p in picks if p is not None))
        return out


def _segment_length_limit(n: int) -> int:
    """Longest segment candidate on a Sequential chain of ``n`` blocks (NOTE [ Planner
    heuristic ]): every length while the segments number at most ``MAX_SEGMENTS``."""
    if n * (n - 1) // 2 <= MAX_SEGMENTS:
        return n
    k = math.ceil(math.sqrt(n))
    return max(4, math.ceil(n / k))


# ----------------------------------------------------------------------------- helpers


def _bits(mask: int) -> list[int]:
    """Indices of the set bits of ``mask``, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _mask(indices: Any) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << int(i)
    return mask


def _region_order(region: Region) -> tuple[int, int, int]:
    if isinstance(region, ModuleRegion):
        return (region.module, 0, 0)
    return (region.module, 1, region.start)


def _objective(
    point: _Point, budget: int, host_budget: int | None = None
) -> tuple[int, int, int, int, int]:
    """Smaller is better: fitting plans by extra compute, then peak; others by peak."""
    if point.peak <= budget and (host_budget is None or point.host <= host_budget):
        return (0, point.cost, point.peak, point.size, point.mask)
    return (1, point.peak, point.cost, point.size, point.mask)


def _front(points: list[_Point]) -> list[_Point]:
    """Non-dominated points by (cost, peak), cheapest first; one plan per (cost, peak)."""
    front: list[_Point] = []
    for p in sorted(points, key=lambda p: (p.cost, p.peak, p.size, p.mask)):
        if not front or p.peak < front[-1].peak:
            front.append(p)
    return front


def _instance_conflicts(model: ProjectionModel, search: Sequence[int]) -> dict[int, int]:
    """Candidates with overlapping instances (call-row ranges), as bitmasks."""
    inst = model.instances
    keep = np.isin(inst.region, np.asarray(search, dtype=np.int64))
    lo, hi, region = inst.first_call[keep], inst.call_stop[keep], inst.region[keep]
    order = np.argsort(lo, kind="stable")
    first = np.searchsorted(lo[order], lo, side="left")
    counts = np.searchsorted(lo[order], hi, side="left") - first
    a = np.repeat(np.arange(len(lo)), counts)
    b = order[np.arange(a.size) + np.repeat(first - (np.cumsum(counts) - counts), counts)]
    pairs = np.unique(np.stack([region[a], region[b]], axis=1), axis=0)
    out = dict.fromkeys(search, 0)
    for x, y in pairs.tolist():
        if x != y:
            out[x] |= 1 << y
            out[y] |= 1 << x
    return out


def _independent_lower_bound(search: Sequence[int], conflicts: Mapping[int, int]) -> int:
    """Size of a greedy conflict-free subset: the space holds at least 2**size plans."""
    mask = banned = 0
    for i in search:
        if not banned >> i & 1:
            mask |= 1 << i
            banned |= conflicts[i]
    return mask.bit_count()


def _independent_sets(
    search: Sequence[int],
    conflicts: Mapping[int, int],
    position: int,
    mask: int,
    banned: int,
    out: list[int],
    limit: int,
) -> None:
    """Append every conflict-free subset of ``search[position:]`` added to ``mask`` to ``out``,
    stopping once ``out`` holds more than ``limit``."""
    if len(out) > limit:
        return
    if position == len(search):
        out.append(mask)
        return
    i = search[position]
    _independent_sets(search, conflicts, position + 1, mask, banned, out, limit)
    if not banned >> i & 1:
        _independent_sets(
            search, conflicts, position + 1, mask | 1 << i, banned | conflicts[i], out, limit
        )
