"""The plan rules, once: resolving a plan over a small description of a model's module tree.

Torch-free, so that both sides of the loop resolve a plan with the same code:

- ``ckpt_runtime.apply`` describes a live ``nn.Module`` (:func:`ckpt_runtime.apply.module_tree`)
  and applies what this module resolves;
- ``ckview.analysis.plans`` describes the module tree a trace recorded (its ``modules`` table)
  and projects what this module resolves.

A :class:`ModuleTree` holds what the rules need and nothing else: each module's path, class
name, parent and children, container kind, whether calling it runs ``nn.Sequential``'s own
``forward``, and its parameter bytes; a trace adds how often each module ran forward, which
tells a region that will run from one that cannot (NOTE [ Regions that cannot take effect ]).
:func:`resolve` turns a :class:`~ckpt_runtime.plan.Plan` (regions, patterns or a preset) into
concrete regions over the tree, each with a note saying why it cannot take effect, if it
cannot; every user mistake raises :class:`~ckpt_runtime.plan.PlanError` with a one-line message.

NOTE [ Regions that cannot take effect ]
    A resolved region is a promise about the model's code, not only its structure: a module
    region patches the module's *call* (NOTE [ A module region is the whole module call ] in
    apply.py) and a segment patches its ``nn.Sequential``'s ``forward``. Neither runs if the
    model never makes that call: a Sequential that the model loops over in Python or hands to
    ``checkpoint_sequential`` (which calls its children one by one), or a module whose
    ``forward`` is called directly, or through a function the script checkpoints, instead of
    the module itself. A live model cannot tell (the code has not run yet); a recorded step can:
    when the tree carries ``forward_calls`` (the trace adapter fills it from ``module_calls``),
    a region whose module (or Sequential) never ran a forward call in the step gets a ``why``:
    what happened and what to checkpoint instead. Such a region still resolves (the plan is
    valid and ``ckpt_runtime`` would apply it); every surface that shows a plan states the
    ``why`` of its idle regions, and the planner never offers them.

NOTE [ Block chain detection ]
    Presets act on "the model's chain of blocks" (``find_block_chain``): the ``nn.ModuleList``
    or ``nn.Sequential`` of repeated blocks that makes up the model's depth. Candidates are the
    ModuleLists and Sequentials (``isinstance``: subclasses count; the model itself included)
    with at least two children, all of one class (``transformer.h`` of GPT2Block,
    ``encoder.layers`` of TransformerEncoderLayer). A candidate inside another candidate is
    dropped (MoE ``experts`` inside each layer, convs inside each block): the outermost chain is
    the model's depth. Of the rest, the one with the most children wins, ties broken by the most
    parameter bytes, then by the first in ``named_modules()`` order. If no candidate has
    children of one class, the same rule picks among the ``nn.Sequential``s with mixed children
    (a VGG-style ``features``). A plan or preset can name the chain instead (``"chain":
    "encoder.layers"``, ``"sqrt@encoder.layers"``).

NOTE [ sqrt on a ModuleList ]
    Chen et al.'s sqrt(n) segments need the blocks grouped into segments, which only an
    ``nn.Sequential`` that the model calls and that runs its own ``forward`` allows. A
    ModuleList's loop lives in the model's forward (and so does the loop over a Sequential whose
    forward is overridden), so each checkpointed block is its own region. Keeping the LAST
    round(sqrt(n)) blocks un-checkpointed and checkpointing the rest leaves about sqrt(n)
    blocks' activations live (the memory of sqrt(n) segments) while recomputing fewer blocks;
    the kept blocks are the last ones because backward frees them before the first recompute
    starts. docs/plan-format.md, 5.2, works through the trade-off.
"""

from __future__ import annotations

import difflib
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from ckpt_runtime.plan import (
    ModuleRegion,
    Plan,
    PlanError,
    PlanOptions,
    PresetSpec,
    Region,
    SegmentRegion,
    check_module_path,
    escape_path,
    match_paths,
    one_line,
    parse_preset,
)

__all__ = [
    "Chain",
    "Container",
    "ModuleTree",
    "Node",
    "Resolution",
    "Resolved",
    "expand_preset",
    "find_chain",
    "idle_notes",
    "resolve",
    "resolve_regions",
]


def _fail(message: str) -> PlanError:
    return PlanError(one_line(message))


def join(parent: str, name: str) -> str:
    """``parent.name`` (``name`` alone under the root path ``""``)."""
    return f"{parent}.{name}" if parent else name


class Container(IntEnum):
    """What kind of container a module is (``isinstance``, so subclasses count); the values are
    those of the trace's ``modules.container`` column."""

    MODULE = 0
    SEQUENTIAL = 1
    MODULE_LIST = 2
    MODULE_DICT = 3


@dataclass(frozen=True)
class Node:
    """One module of the tree."""

    path: str
    """Dotted path as ``model.named_modules()`` lists it (``""``: the model)."""
    type: str
    """Class name."""
    parent: int
    """Index of the parent node, -1 for the model."""
    container: Container = Container.MODULE
    sequential_forward: bool = False
    """True if calling the module runs ``nn.Sequential.forward`` (its children in order):
    neither its class nor the instance replaces ``forward``."""
    param_bytes: int = 0
    """Bytes of the parameters the module holds itself (not its children's)."""


@dataclass(frozen=True)
class ModuleTree:
    """A model's modules: ``nodes[0]`` is the model, ``children[i]`` the child nodes of node
    ``i`` in the container's order. ``forward_calls[i]`` is how often node ``i`` ran forward in a
    recorded step, or ``forward_calls`` is None (a live model: not known)."""

    nodes: tuple[Node, ...]
    children: tuple[tuple[int, ...], ...]
    forward_calls: tuple[int, ...] | None = None
    listing: str = "list all paths with model.named_modules()"
    """How the user lists the paths (ends the hint for a path that does not exist)."""
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _subtree_bytes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _ran_below: tuple[bool, ...] = field(init=False, repr=False, compare=False)
    _paths: list[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a module tree has at least the model's node")
        if (
            any(not -1 <= n.parent < i for i, n in enumerate(self.nodes))
            or self.nodes[0].parent != -1
        ):
            raise ValueError(
                "module tree nodes must list the model first and parents before children"
            )
        object.__setattr__(self, "_index", {n.path: i for i, n in enumerate(self.nodes)})
        object.__setattr__(self, "_paths", [n.path for n in self.nodes])
        sums = [n.param_bytes for n in self.nodes]
        for i in reversed(range(1, len(self.nodes))):  # a parent comes before its children
            sums[self.nodes[i].parent] += sums[i]
        object.__setattr__(self, "_subtree_bytes", tuple(sums))
        below = [False] * len(self.nodes)
        if self.forward_calls is not None:
            for i in reversed(range(1, len(self.nodes))):
                if below[i] or self.forward_calls[i] > 0:
                    below[self.nodes[i].parent] = True
        object.__setattr__(self, "_ran_below", tuple(below))

    @classmethod
    def build(
        cls,
        nodes: Sequence[Node],
        *,
        forward_calls: Sequence[int] | None = None,
        listing: str | None = None,
        order: Sequence[Sequence[int]] | None = None,
    ) -> ModuleTree:
        """A tree from ``nodes`` (parents before children); children in node order unless
        ``order`` gives each node's children."""
        if order is None:
            kids: list[list[int]] = [[] for _ in nodes]
            for i, node in enumerate(nodes):
                if node.parent >= 0:
                    kids[node.parent].append(i)
            order = kids
        extra = {} if listing is None else {"listing": listing}
        return cls(
            tuple(nodes),
            tuple(tuple(c) for c in order),
            None if forward_calls is None else tuple(int(c) for c in forward_calls),
            **extra,
        )

    @property
    def model_type(self) -> str:
        return self.nodes[0].type

    def lookup(self, path: str, what: str) -> int:
        """Node at exact ``path``; a PlanError naming ``what`` and suggesting paths if none."""
        check_module_path(path, what, glob=False)
        node = self._index.get(path)
        if node is None:
            raise _fail(
                f"{what} {path!r} is not a module of {self.model_type}; {self.suggest(path)}"
            )
        return node

    def suggest(self, wanted: str) -> str:
        """A hint for a module path that does not exist: close paths, else the top-level ones."""
        paths = [n.path for n in self.nodes if n.path]
        close = difflib.get_close_matches(wanted, paths, n=3, cutoff=0.6)
        if close:
            return "did you mean " + " or ".join(repr(p) for p in close) + "?"
        top = [p for p in paths if "." not in p][:8]
        return f"its top-level modules are {top}; {self.listing}"

    def matching(self, pattern: str) -> list[int]:
        """Nodes whose path matches ``pattern`` (NOTE [ Module path patterns ] in plan.py)."""
        check_module_path(pattern, "module pattern", glob=True)
        return match_paths(pattern, self._paths)

    def subtree_bytes(self, node: int) -> int:
        """Parameter bytes of ``node`` and everything under it."""
        return self._subtree_bytes[node]

    def segmentable(self, node: int) -> bool:
        """True if ``node``'s children can be grouped into segments: an ``nn.Sequential`` that
        runs them in order with its own ``forward``."""
        n = self.nodes[node]
        return n.container == Container.SEQUENTIAL and n.sequential_forward

    def inside(self, node: int, other: int) -> bool:
        """True if ``node`` is a strict descendant of ``other``."""
        up = self.nodes[node].parent
        while up >= 0:
            if up == other:
                return True
            up = self.nodes[up].parent
        return False

    def ran(self, node: int) -> bool | None:
        """Whether ``node`` ran forward in the recorded step (None: not known)."""
        return None if self.forward_calls is None else self.forward_calls[node] > 0

    def ran_below(self, node: int) -> bool:
        """True if some descendant of ``node`` ran forward (False if not known)."""
        return self._ran_below[node]


# ----------------------------------------------------------------------------- block chain


@dataclass(frozen=True)
class Chain:
    """The model's chain of blocks that presets act on (NOTE [ Block chain detection ])."""

    node: int
    path: str
    blocks: tuple[int, ...]
    """Nodes of the blocks, in order."""
    segmentable: bool
    """True if blocks can be grouped into segments (``ModuleTree.segmentable``)."""

    def __len__(self) -> int:
        return len(self.blocks)


def _is_list_like(node: Node) -> bool:
    return node.container in (Container.SEQUENTIAL, Container.MODULE_LIST)


def find_chain(tree: ModuleTree, path: str | None = None) -> Chain:
    """The model's chain of blocks: the one at ``path`` if given, else detected
    (NOTE [ Block chain detection ]). Raises PlanError if there is none."""
    if path is not None:
        node = tree.lookup(path, "chain")
        n = tree.nodes[node]
        if not _is_list_like(n) or not tree.children[node]:
            raise _fail(
                f"chain {path!r} is a {n.type}"
                + (" with no children" if _is_list_like(n) else "")
                + "; a chain of blocks is a non-empty nn.ModuleList or nn.Sequential"
            )
        return _chain(tree, node)
    containers = [
        i for i, n in enumerate(tree.nodes) if _is_list_like(n) and len(tree.children[i]) >= 2
    ]
    uniform = [i for i in containers if len({tree.nodes[c].type for c in tree.children[i]}) == 1]
    mixed = [
        i
        for i in containers
        if tree.nodes[i].container == Container.SEQUENTIAL and i not in set(uniform)
    ]
    for tier in (uniform, mixed):
        outermost = [i for i in tier if not any(tree.inside(i, q) for q in tier)]
        if outermost:
            # max() keeps the first of equal keys: named_modules() order breaks the last tie.
            best = max(outermost, key=lambda i: (len(tree.children[i]), tree.subtree_bytes(i)))
            return _chain(tree, best)
    raise _fail(
        f"found no chain of blocks in {tree.model_type} (no nn.ModuleList or nn.Sequential "
        "with 2+ children); name one: 'sqrt@path.to.blocks', or \"chain\" in the plan"
    )


def _chain(tree: ModuleTree, node: int) -> Chain:
    return Chain(node, tree.nodes[node].path, tree.children[node], tree.segmentable(node))


def _preset_regions(tree: ModuleTree, spec: PresetSpec, found: Chain) -> tuple[Region, ...]:
    """The concrete regions of a preset other than ``none`` on the chain ``found``.

    - ``all``: every block of the chain, each as its own module region.
    - ``every:K``: blocks 0, K, 2K, ... as module regions.
    - ``sqrt`` (Chen et al. 2016): on a segmentable chain of n blocks, ceil(sqrt(n)) contiguous
      segments of near-equal length; otherwise the first n - round(sqrt(n)) blocks as module
      regions (NOTE [ sqrt on a ModuleList ]).
    """
    n = len(found)
    if spec.kind == "sqrt" and found.segmentable:
        k = math.ceil(math.sqrt(n))
        bounds = [(i * n) // k for i in range(k + 1)]
        return tuple(SegmentRegion(found.path, a, b) for a, b in itertools.pairwise(bounds))
    if spec.kind == "all":
        blocks = range(n)
    elif spec.kind == "every":
        assert spec.k is not None
        blocks = range(0, n, spec.k)
    else:  # NOTE [ sqrt on a ModuleList ]
        blocks = range(n - math.floor(math.sqrt(n) + 0.5))
    return tuple(ModuleRegion(escape_path(tree.nodes[found.blocks[i]].path)) for i in blocks)


def expand_preset(
    tree: ModuleTree,
    preset: str,
    *,
    chain: str | None = None,
    options: PlanOptions | None = None,
    name: str | None = None,
) -> Plan:
    """A preset resolved into a plan with concrete regions; ``meta["preset"]`` records the
    preset, the chain path and its length."""
    spec = parse_preset(preset)
    options = options if options is not None else PlanOptions()
    name = name if name is not None else str(spec)
    if spec.kind == "none":
        return Plan(name, (), options)
    found = find_chain(tree, chain if chain is not None else spec.chain)
    regions = _preset_regions(tree, spec, found)
    meta = {"preset": {"name": spec.name, "chain": found.path, "blocks": len(found)}}
    return Plan(name, regions, options, meta=meta)


# ----------------------------------------------------------------------------- resolving


@dataclass(frozen=True)
class Resolved:
    """One concrete region on the tree: a module region on ``node`` (``start == stop == -1``)
    or children ``start .. stop-1`` of the Sequential ``node``."""

    node: int
    start: int = -1
    stop: int = -1
    why: str | None = None
    """Why the region cannot take effect in the recorded step (NOTE [ Regions that cannot take
    effect ]); None if it runs, or if the tree does not know."""
    save: tuple[str, ...] | None = None
    """A module region's op-level ``save`` list (NOTE [ Op-level regions ] in plan.py)."""
    offload: bool = False

    @property
    def is_segment(self) -> bool:
        return self.start >= 0

    def region(self, tree: ModuleTree) -> Region:
        """The region as a plan document names it (an exact, escaped path)."""
        path = tree.nodes[self.node].path
        if self.is_segment:
            return SegmentRegion(path, self.start, self.stop)
        return ModuleRegion(escape_path(path), self.save, self.offload)


@dataclass(frozen=True)
class Resolution:
    """A plan resolved over a tree: the concrete plan and its regions, in the same order."""

    plan: Plan
    """The concrete plan (presets expanded, patterns replaced by exact paths, model order)."""
    regions: tuple[Resolved, ...]

    @property
    def idle(self) -> tuple[Resolved, ...]:
        """The regions that cannot take effect (those with a ``why``)."""
        return tuple(r for r in self.regions if r.why is not None)

    def notes(self) -> list[str]:
        """One line per reason some regions cannot take effect (:func:`idle_notes`)."""
        return idle_notes([str(r) for r in self.plan.regions], [r.why for r in self.regions])


def idle_notes(labels: Sequence[str], whys: Sequence[str | None]) -> list[str]:
    """One line per distinct reason (``why``) that regions cannot take effect, naming the
    regions it applies to: ``"blocks[0:2], blocks[2:4]: blocks is an nn.Sequential ..."``."""
    groups: dict[str, list[str]] = {}
    for label, why in zip(labels, whys, strict=True):
        if why is not None:
            groups.setdefault(why, []).append(label or "<model>")
    out = []
    for why, names in groups.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(f"{shown}: {why}")
    return out


def resolve(tree: ModuleTree, plan: Plan) -> Resolution:
    """Resolve ``plan`` over ``tree``: presets expanded, patterns matched (several patterns
    matching one module select it once), segments checked (an ``nn.Sequential`` running its own
    forward, ``stop`` within its children, no overlap), no two regions checkpointing the same
    computation (NOTE [ Nesting of regions ] in apply.py). Regions come back in model order (by
    node; a module region before the segments of the same node; segments by start), each with
    its ``why`` (NOTE [ Regions that cannot take effect ]). Raises PlanError."""
    if plan.is_preset:
        assert plan.preset is not None
        expanded = expand_preset(
            tree, plan.preset, chain=plan.chain, options=plan.options, name=plan.name
        )
        plan = Plan(
            expanded.name, expanded.regions, expanded.options, meta={**plan.meta, **expanded.meta}
        )
    regions = resolve_regions(tree, plan.regions)
    concrete = Plan(plan.name, tuple(r.region(tree) for r in regions), plan.options, meta=plan.meta)
    return Resolution(concrete, regions)


def resolve_regions(tree: ModuleTree, wanted: Iterable[Region]) -> tuple[Resolved, ...]:
    """The concrete, checked regions of ``wanted`` in model order (as :func:`resolve`)."""
    kinds: dict[int, ModuleRegion] = {}  # node -> the region selecting it
    segments: list[Resolved] = []
    for region in wanted:
        if isinstance(region, ModuleRegion):
            hits = tree.matching(region.pattern)
            if not hits:
                raise _fail(
                    f"module pattern {region.pattern!r} matches no module of "
                    f"{tree.model_type}; {tree.suggest(region.pattern)}"
                )
            for node in hits:
                _check_same_kind(tree, node, kinds.setdefault(node, region), region)
        else:
            segments.append(_segment(tree, region))
    nodes = set(kinds)
    _check_overlaps(tree, segments)
    _check_same_computation(tree, nodes, segments)
    _check_op_level_alone(tree, kinds, segments)
    found = [Resolved(i, save=kinds[i].save, offload=kinds[i].offload) for i in nodes] + segments
    found.sort(key=lambda r: (r.node, int(r.is_segment), r.start))
    return tuple(Resolved(r.node, r.start, r.stop, _why(tree, r), r.save, r.offload) for r in found)


def _check_same_kind(tree: ModuleTree, node: int, first: ModuleRegion, other: ModuleRegion) -> None:
    """Two patterns selecting one module must agree on ``save`` and ``offload``."""
    if (first.save, first.offload) != (other.save, other.offload):
        raise _fail(
            f"module {tree.nodes[node].path or '<model>'!r} is selected by regions "
            f"{first.pattern!r} and {other.pattern!r} with different 'save' or 'offload'; "
            "make them agree, or narrow one pattern"
        )


def _check_op_level_alone(
    tree: ModuleTree, kinds: Mapping[int, ModuleRegion], segments: Sequence[Resolved]
) -> None:
    """An op-level region neither nests in nor holds another region (torch's selective
    checkpoint does not nest, and offload hooks would not see a nested checkpoint's tensors)."""
    others = [(n, tree.nodes[n].path or "<model>", False) for n in kinds]
    others += [(r.node, _label(tree, r), True) for r in segments]
    for node, region in kinds.items():
        if not region.op_level:
            continue
        for other, label, segment in others:
            same = other == node and segment  # a segment of the op-level module itself
            if same or tree.inside(other, node) or tree.inside(node, other):
                raise _fail(
                    f"op-level region {tree.nodes[node].path or '<model>'!r} and region "
                    f"{label!r} nest; a region with 'save' or 'offload' cannot nest with "
                    "another region, so drop one of them"
                )


def _segment(tree: ModuleTree, region: SegmentRegion) -> Resolved:
    node = tree.lookup(region.sequential, "sequential")
    n = tree.nodes[node]
    if n.container != Container.SEQUENTIAL:
        raise _fail(
            f"segment {region}: {region.sequential!r} is a {n.type}, not an nn.Sequential; its "
            "children are called by its parent's code and cannot be grouped, so checkpoint them "
            f'one by one with {{"module": "{join(escape_path(region.sequential), "*")}"}}'
        )
    if not n.sequential_forward:
        raise _fail(
            f"segment {region}: {n.type} {region.sequential!r} has its own forward (overridden "
            "or replaced), so its children may not run in order; checkpoint its children as "
            f'module regions instead: {{"module": "{join(escape_path(region.sequential), "*")}"}}'
        )
    count = len(tree.children[node])
    if region.stop > count:
        raise _fail(
            f"segment {region}: stop {region.stop} is past the end of {region.sequential!r}, "
            f"which has {count} children"
        )
    return Resolved(node, region.start, region.stop)


def _label(tree: ModuleTree, r: Resolved) -> str:
    path = tree.nodes[r.node].path
    return f"{path or '<model>'}[{r.start}:{r.stop}]" if r.is_segment else path or "<model>"


def _check_overlaps(tree: ModuleTree, segments: Sequence[Resolved]) -> None:
    for i, a in enumerate(segments):
        for b in segments[i + 1 :]:
            if a.node == b.node and a.start < b.stop and b.start < a.stop:
                raise _fail(
                    f"segments {_label(tree, a)} and {_label(tree, b)} overlap; segments of one "
                    "nn.Sequential must be disjoint (merge them, or to nest, checkpoint a child "
                    "as a module region inside the segment)"
                )


def _check_same_computation(
    tree: ModuleTree, nodes: set[int], segments: Sequence[Resolved]
) -> None:
    """A module region on a one-child segment's child, or on a Sequential one segment covers
    entirely, checkpoints the same computation as the segment (docs/plan-format.md, 3.3)."""
    for seg in segments:
        children = tree.children[seg.node]
        same = None
        if seg.stop - seg.start == 1 and children[seg.start] in nodes:
            same = children[seg.start]
        if seg.start == 0 and seg.stop == len(children) and seg.node in nodes:
            same = seg.node
        if same is not None:
            raise _fail(
                f"module region {tree.nodes[same].path or '<model>'!r} and segment "
                f"{_label(tree, seg)} checkpoint the same computation; keep one of them "
                "(docs/plan-format.md, 3.3)"
            )


def _why(tree: ModuleTree, r: Resolved) -> str | None:
    """Why region ``r`` cannot take effect in the recorded step, or None (NOTE [ Regions that
    cannot take effect ]). Regions with one cause share one text (``idle_notes`` groups them),
    so the text names the Sequential of a segment, never the region itself."""
    if tree.ran(r.node) is not False:
        return None
    node = tree.nodes[r.node]
    path = node.path or "<model>"
    if r.is_segment:
        if tree.ran_below(r.node):
            return (
                f"{path} is an nn.Sequential whose forward never ran in the recorded step (it "
                "is looped over in Python, or handed to checkpoint_sequential), so a segment "
                "plan on it has no effect; checkpoint its blocks as modules: "
                f"`{join(escape_path(node.path), '*')}`"
            )
        return f"{path} never ran in the recorded step, so a segment of it has no effect"
    if tree.ran_below(r.node):
        parent = tree.nodes[node.parent] if node.parent >= 0 else None
        if parent is not None and _is_list_like(parent):  # a block of a chain: all its siblings
            inside = join(join(escape_path(parent.path), "*"), "*")
        else:
            inside = join(escape_path(node.path), "*")
        return (
            "the module is never called in the recorded step although modules inside it ran "
            "(its forward is called directly, e.g. checkpoint(module.forward, x), or a function "
            "calls its children), so a module region on it has no effect; checkpoint the "
            f"modules inside it that are called: `{inside}`"
        )
    return "the module never ran forward in the recorded step, so checkpointing it has no effect"
