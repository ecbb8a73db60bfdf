"""The live-model adapter of the plan rules: a ``torch.nn.Module`` described as a
:class:`~ckpt_runtime.resolve.ModuleTree`, and the presets on it (``find_block_chain``,
``resolve_preset``). The rules themselves (chain detection, presets, resolution) live once, in
the torch-free :mod:`ckpt_runtime.resolve` (NOTE [ Block chain detection ], NOTE [ sqrt on a
ModuleList ]), which ``ckview.analysis.plans`` runs over a trace's module tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ckpt_runtime.plan import Plan, PlanOptions
from ckpt_runtime.resolve import Container, ModuleTree, Node, expand_preset, find_chain, join

__all__ = [
    "BlockChain",
    "container_kind",
    "find_block_chain",
    "is_compiled_wrapper",
    "module_tree",
    "resolve_preset",
    "runs_sequential_forward",
    "user_model",
]


def check_model(model: Any) -> nn.Module:
    """The model a plan names: ``model``, or the model that ``torch.compile(model)`` wraps
    (NOTE [ A compiled model is named as the user's model ]); ``TypeError`` if ``model`` is
    not an ``nn.Module``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return user_model(model)


# NOTE [ A compiled model is named as the user's model ]
#     ``torch.compile(model)`` returns an ``OptimizedModule`` that holds the model as its child
#     ``_orig_mod`` and calls it: named from the wrapper, every path gains ``_orig_mod.``. Users
#     write plans against their model's paths (``layers.*``), so the wrapper is never named:
#     plans resolve and apply over the model it wraps, and the recorder does not register the
#     wrapper (recorder/modules.py): the trace's paths are the model's, compiled or not. (A
#     compiled submodule keeps its ``_orig_mod`` level, as the model's own
#     ``named_modules()`` shows it.)


def is_compiled_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` is ``torch.compile``'s ``OptimizedModule`` wrapper (without
    importing dynamo)."""
    kind = type(module)
    return kind.__name__ == "OptimizedModule" and kind.__module__.startswith("torch._dynamo")


def user_model(module: nn.Module) -> nn.Module:
    """The model under any ``torch.compile`` wrappers of ``module`` (NOTE [ A compiled model is
    named as the user's model ])."""
    while is_compiled_wrapper(module) and isinstance(
        inner := module._modules.get("_orig_mod"), nn.Module
    ):
        module = inner
    return module


def has_sequential_forward(seq: nn.Module) -> bool:
    """True if calling ``seq`` runs its children in order: nn.Sequential's own forward, or the
    segment forward ckpt_runtime.apply installs (marked ``ckpt_runtime_segments``).

    """
    own = vars(seq).get("forward")
    return type(seq).forward is nn.Sequential.forward and (
        own is None or getattr(own, "ckpt_runtime_segments", False)
    )


def runs_sequential_forward(module: nn.Module) -> bool:
    """True if calling ``module`` runs ``nn.Sequential.forward`` (or the segment forward a plan
    installs): the trace's ``modules.sequential_forward``."""
    return isinstance(module, nn.Sequential) and has_sequential_forward(module)


def container_kind(module: nn.Module) -> Container:
    """The container kind of ``module`` (``isinstance``: subclasses count)."""
    if isinstance(module, nn.Sequential):
        return Container.SEQUENTIAL
    if isinstance(module, nn.ModuleList):
        return Container.MODULE_LIST
    if isinstance(module, nn.ModuleDict):
        return Container.MODULE_DICT
    return Container.MODULE


def module_tree(model: nn.Module) -> ModuleTree:
    """``model`` described for the plan rules: its ``named_modules()`` in order (a module
    shared at several paths once, at its first path), children in ``named_children()`` order."""
    named = list(check_model(model).named_modules())
    index = {path: i for i, (path, _) in enumerate(named)}
    nodes = []
    children: list[tuple[int, ...]] = []
    for path, module in named:
        parent = -1 if path == "" else index[path.rpartition(".")[0]]
        nodes.append(
            Node(
                path=path,
                type=type(module).__name__,
                parent=parent,
                container=container_kind(module),
                sequential_forward=runs_sequential_forward(module),
                param_bytes=sum(p.nbytes for p in module.parameters(recurse=False)),
            )
        )
        kids = (index.get(join(path, name)) for name, _ in module.named_children())
        # A child listed under another path (shared) is not this module's node child.
        children.append(
            tuple(k for k in kids if k is not None and named[k][0].rpartition(".")[0] == path)
        )
    return ModuleTree(tuple(nodes), tuple(children))


@dataclass(frozen=True)
class BlockChain:
    """The model's chain of blocks that presets act on (NOTE [ Block chain detection ])."""

    path: str
    """Dotted path of the ``nn.ModuleList`` / ``nn.Sequential`` (``""``: the model itself)."""
    module: nn.Module = field(repr=False, compare=False)
    names: tuple[str, ...]
    """The blocks' child names (``"0"``, ``"1"``, ... unless built from an OrderedDict)."""
    segmentable: bool = False
    """True if blocks can be grouped into segments (an ``nn.Sequential`` with its own
    forward; a ModuleList's loop lives in the model's forward)."""

    def __len__(self) -> int:
        return len(self.names)

    def block_path(self, index: int) -> str:
        """Dotted path of block ``index``."""
        return join(self.path, self.names[index])


def find_block_chain(model: nn.Module, path: str | None = None) -> BlockChain:
    """The model's chain of blocks: the one at ``path`` if given, else detected
    (NOTE [ Block chain detection ]). Raises :class:`PlanError` if there is none."""
    tree = module_tree(model)
    chain = find_chain(tree, path)
    cut = len(chain.path) + 1 if chain.path else 0
    names = tuple(tree.nodes[b].path[cut:] for b in chain.blocks)
    return BlockChain(chain.path, model.get_submodule(chain.path), names, chain.segmentable)


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
    return expand_preset(module_tree(model), preset, chain=chain, options=options, name=name)
