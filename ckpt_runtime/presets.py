"""Presets: finding the model's chain of blocks, and resolving ``none``, ``all``, ``every:K``
and ``sqrt`` against a model into concrete plans (docs/plan-format.md, section 5).

NOTE [ Block chain detection ]
Presets act on "the model's chain of blocks" (``find_block_chain``): the ``nn.ModuleList`` or
``nn.Sequential`` of repeated blocks that makes up the model's depth. Candidates are the
ModuleLists and Sequentials (the model itself included) with at least two children, all of one
class (``transformer.h`` of GPT2Block, ``encoder.layers`` of TransformerEncoderLayer). A
candidate inside another candidate is dropped (MoE ``experts`` inside each layer, convs inside
each block): the outermost chain is the model's depth. Of the rest, the one with the most
children wins, ties broken by the most parameters, then by the first in ``named_modules()``
order. If no candidate has children of one class, the same rule picks among the
``nn.Sequential``s with mixed children (a VGG-style ``features``). A plan or preset can name the
chain instead (``"chain": "encoder.layers"``, ``"sqrt@encoder.layers"``).

NOTE [ sqrt on a ModuleList ]
Chen et al.'s sqrt(n) segments need the blocks grouped into segments, which only an
``nn.Sequential`` that the model calls allows. A ModuleList's loop lives in the model's
forward, so each checkpointed block is its own region. Keeping the LAST round(sqrt(n)) blocks
un-checkpointed and checkpointing the rest leaves about sqrt(n) blocks' activations live (the
memory of sqrt(n) segments) while recomputing fewer blocks; the kept blocks are the last ones
because backward frees them before the first recompute starts. docs/plan-format.md, 5.2, works
through the trade-off.
"""

from __future__ import annotations

import difflib
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ckpt_runtime.plan import (
    ModuleRegion,
    Plan,
    PlanError,
    PlanOptions,
    Region,
    SegmentRegion,
    check_module_path,
    escape_path,
    parse_preset,
)

__all__ = ["BlockChain", "find_block_chain", "resolve_preset"]


def _fail(message: str) -> PlanError:
    return PlanError(" ".join(message.split()))


def check_model(model: Any) -> nn.Module:
    """``model`` if it is an ``nn.Module``, else ``TypeError``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def join(parent: str, name: str) -> str:
    """``parent.name`` (``name`` alone under the root path ``""``)."""
    return f"{parent}.{name}" if parent else name


def suggest(wanted: str, paths: list[str]) -> str:
    """A hint for a module path that does not exist: close paths, else the top-level ones."""
    close = difflib.get_close_matches(wanted, [p for p in paths if p], n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(repr(p) for p in close) + "?"
    top = [p for p in paths if p and "." not in p][:8]
    return f"its top-level modules are {top}; list all paths with model.named_modules()"


def lookup(model: nn.Module, path: str, what: str) -> nn.Module:
    """The module at exact ``path``; a PlanError naming ``what`` and suggesting paths if none."""
    check_module_path(path, what, glob=False)
    try:
        return model.get_submodule(path)
    except AttributeError:
        paths = [p for p, _ in model.named_modules()]
        raise _fail(
            f"{what} {path!r} is not a module of {type(model).__name__}; {suggest(path, paths)}"
        ) from None


def has_sequential_forward(seq: nn.Module) -> bool:
    """True if calling ``seq`` runs its children in order: nn.Sequential's own forward, or the
    segment forward ckpt_runtime.apply installs (marked ``ckpt_runtime_segments``)."""
    own = vars(seq).get("forward")
    return type(seq).forward is nn.Sequential.forward and (
        own is None or getattr(own, "ckpt_runtime_segments", False)
    )


# ----------------------------------------------------------------------------- block chain


@dataclass(frozen=True)
class BlockChain:
    """The model's chain of blocks that presets act on (NOTE [ Block chain detection ])."""

    path: str
    """Dotted path of the ``nn.ModuleList`` / ``nn.Sequential`` (``""``: the model itself)."""
    module: nn.Module = field(repr=False, compare=False)
    names: tuple[str, ...]
    """The blocks' child names (``"0"``, ``"1"``, ... unless built from an OrderedDict)."""

    def __len__(self) -> int:
        return len(self.names)

    @property
    def segmentable(self) -> bool:
        """True if blocks can be grouped into segments (an ``nn.Sequential`` with its own
        forward; a ModuleList's loop lives in the model's forward)."""
        return isinstance(self.module, nn.Sequential) and has_sequential_forward(self.module)

    def block_path(self, index: int) -> str:
        """Dotted path of block ``index``."""
        return join(self.path, self.names[index])


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_block_chain(model: nn.Module, path: str | None = None) -> BlockChain:
    """The model's chain of blocks: the one at ``path`` if given, else detected
    (NOTE [ Block chain detection ]). Raises :class:`PlanError` if there is none."""
    check_model(model)
    if path is not None:
        module = lookup(model, path, "chain")
        if not isinstance(module, nn.ModuleList | nn.Sequential) or len(module) == 0:
            raise _fail(
                f"chain {path!r} is a {type(module).__name__}"
                + (" with no children" if isinstance(module, nn.ModuleList | nn.Sequential) else "")
                + "; a chain of blocks is a non-empty nn.ModuleList or nn.Sequential"
            )
        return BlockChain(path, module, tuple(name for name, _ in module.named_children()))

    containers = [
        (p, m)
        for p, m in model.named_modules()
        if isinstance(m, nn.ModuleList | nn.Sequential) and len(m) >= 2
    ]
    uniform = [(p, m) for p, m in containers if len({type(c) for c in m}) == 1]
    uniform_paths = {p for p, _ in uniform}
    mixed = [
        (p, m) for p, m in containers if isinstance(m, nn.Sequential) and p not in uniform_paths
    ]
    for tier in (uniform, mixed):

        def inside(p: str, q: str) -> bool:  # is path p strictly inside path q?
            return p != q and (q == "" or p.startswith(q + "."))

        outermost = [(p, m) for p, m in tier if not any(inside(p, q) for q, _ in tier)]
        if outermost:
            # max() keeps the first of equal keys: named_modules() order breaks the last tie.
            p, m = max(outermost, key=lambda pm: (len(pm[1]), _n_params(pm[1])))
            return BlockChain(p, m, tuple(name for name, _ in m.named_children()))
    raise _fail(
        f"found no chain of blocks in {type(model).__name__} (no nn.ModuleList or nn.Sequential "
        "with 2+ children); name one: 'sqrt@path.to.blocks', resolve_preset(model, 'sqrt', "
        "chain='path.to.blocks'), or \"chain\" in the plan"
    )


def resolve_preset(
    model: nn.Module,
    preset: str,
    *,
    chain: str | None = None,
    options: PlanOptions | None = None,
    name: str | None = None,
) -> Plan:
    """Resolve a preset against ``model`` into a plan with concrete regions.

    - ``none``: no regions.
    - ``all``: every block of the chain, each as its own module region.
    - ``every:K``: blocks 0, K, 2K, ... as module regions.
    - ``sqrt`` (Chen et al. 2016): on an ``nn.Sequential`` chain of n blocks, ceil(sqrt(n))
      contiguous segments of near-equal length, all checkpointed. On an ``nn.ModuleList`` (whose
      loop is in the model's forward and cannot be segmented), the last round(sqrt(n)) blocks
      keep their activations and every earlier block is a module region: about sqrt(n) blocks'
      activations are live at once, as with sqrt(n) segments (see docs/plan-format.md).

    ``chain`` (or ``preset@chain``) names the chain; by default it is detected. The plan's
    ``meta["preset"]`` records the preset, the chain path and its length.
    """
    spec = parse_preset(preset)
    chain = chain if chain is not None else spec.chain
    options = options if options is not None else PlanOptions()
    name = name if name is not None else str(spec)
    if spec.kind == "none":
        return Plan(name, (), options)
    found = find_block_chain(model, chain)
    n = len(found)
    regions: list[Region]
    if spec.kind == "sqrt" and found.segmentable:
        k = math.ceil(math.sqrt(n))
        bounds = [(i * n) // k for i in range(k + 1)]
        regions = [SegmentRegion(found.path, a, b) for a, b in itertools.pairwise(bounds)]
    else:
        if spec.kind == "all":
            blocks = range(n)
        elif spec.kind == "every":
            assert spec.k is not None
            blocks = range(0, n, spec.k)
        else:  # NOTE [ sqrt on a ModuleList ]
            blocks = range(n - math.floor(math.sqrt(n) + 0.5))
        regions = [ModuleRegion(escape_path(found.block_path(i))) for i in blocks]
    meta = {"preset": {"name": spec.name, "chain": found.path, "blocks": n}}
    return Plan(name, tuple(regions), options, meta=meta)
