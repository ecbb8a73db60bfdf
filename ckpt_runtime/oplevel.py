"""Op-level regions at run time: torch's selective checkpoint policy, and offload to host memory.

An op-level module region (NOTE [ Op-level regions ] in plan.py) runs its module call under
``torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=...)`` with a policy from
:class:`SavePolicy`: an op whose name matches the region's ``save`` list is ``MUST_SAVE``, every
other op ``PREFER_RECOMPUTE``. An offload region (``save: ["*"]``, ``offload: true``) is not
checkpointed: its module call runs under ``saved_tensors_hooks`` of an :class:`Offloader`.

Torch versions: the policy API (``CheckpointPolicy``, ``create_selective_checkpoint_contexts``
taking a policy function of ``(ctx, op, *args, **kwargs)``) appeared in torch 2.4; older torch is
refused with one line (:func:`check_selective_support`). Offload needs only
``saved_tensors_hooks`` (torch 1.10) and, on CUDA, streams and events.

NOTE [ Exact gradients under an op-level plan ]
The step's loss and gradients stay bitwise those of the un-checkpointed step:
- RNG ops (dropout) are recomputed with the RNG state restored (``preserve_rng_state``, the
  default; ``apply._forward_rng`` keeps the states as bytes, not torch's checkpoint; a plan
  with ``preserve_rng_state: false`` recomputes different masks, and the gradient gate,
  ``compare_gradients``, catches it).
- Modules with running statistics (BatchNorm) update them in forward and again in the
  recompute; the recompute's update is undone right after it, as ckpt_runtime's own checkpoint
  does (NOTE [ Running statistics ] in checkpoint.py), so those buffers count as the region's own.
- Another op that writes one of its inputs (``op._schema.is_mutable``: ``add_``,
  ``bernoulli_``) is never saved by name. If it writes a tensor the region created in this call,
  recomputing it repeats exactly what forward did (PREFER_RECOMPUTE). If it writes a tensor the
  region did not create (a region input, a parameter, another buffer, or a view of one), the
  recompute would write it again, and saving the op instead does not help (autograd bumps the
  tensor's version in the recompute before the cache is read, and torch refuses the changed
  cache entry; nor could the ops before the write read the unwritten value), so the plan is
  refused with one line. "Did not create" is decided by storage address
  (``outside_addresses``): those tensors are alive during the whole call, so no tensor made in
  the call shares their storage unless it is a view of them. (Tensors without storage count as
  created.)
- An op saved by name whose output a later op writes in place would leave the written value in
  the cache: refused with one line in forward where torch hands the policy the op's output
  (``ctx.op_output``), else by torch at backward ("Tensor cached during selective activation
  checkpoint has been mutated").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from ckpt_runtime.checkpoint import _STAT_NAMES
from ckpt_runtime.plan import PlanError, match_op, one_line, op_auto_name

__all__ = [
    "Offloader",
    "SavePolicy",
    "check_op_names",
    "check_selective_support",
    "kept_statistics",
    "module_paths",
    "outside_addresses",
    "track_modules",
]

HOST_PATHS = ("cpu", "cuda")
"""Device types whose tensors an offload region can keep in host memory."""


def _fail(message: str) -> PlanError:
    return PlanError(one_line(message))


def check_selective_support(region: str) -> None:
    """PlanError (one line) if this torch lacks the selective checkpoint policy API (2.4+)."""
    from torch.utils import checkpoint as ckpt

    if not hasattr(ckpt, "CheckpointPolicy") or not hasattr(
        ckpt, "create_selective_checkpoint_contexts"
    ):
        raise _fail(
            f"region {region!r} saves chosen ops, which needs torch 2.4 or newer (selective "
            f"checkpoint policies); this is torch {torch.__version__}: upgrade torch, or drop "
            "'save' to recompute the whole region"
        )


# ----------------------------------------------------------------------------- module tracking


@dataclass
class _Frame:
    path: str
    counts: dict[str, int] = field(default_factory=dict)  # op -> calls so far in this call


class _Tracker:
    """The stack of module calls running now, as paths of the model (global module hooks,
    installed only while an op-level region runs)."""

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.paths: dict[int, str] = {}
        self.depth = 0
        self.handles: list[Any] = []

    def pre(self, module: nn.Module, args: Any) -> None:
        parent = self.stack[-1].path if self.stack else ""
        path = self.paths.get(id(module), f"{parent}.?{type(module).__name__}".lstrip("."))
        self.stack.append(_Frame(path))

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.stack:
            self.stack.pop()

    def auto_name(self, op: str) -> str:
        """The auto-name of the next call of ``op`` in the innermost module call."""
        frame = self.stack[-1] if self.stack else _Frame("")
        index = frame.counts.get(op, 0)
        frame.counts[op] = index + 1
        return op_auto_name(frame.path, op, index)


_TRACKER = _Tracker()


def module_paths(region: nn.Module, path: str) -> dict[int, str]:
    """``id(module) -> path in the model`` for the modules inside the region module at ``path``
    (auto-names use these; computed per call, so a deep copy of a planned model names its own
    modules)."""
    return {
        id(module): f"{path}.{sub}".strip(".") if sub else path
        for sub, module in region.named_modules()
    }


@contextlib.contextmanager
def track_modules(paths: dict[int, str]) -> Iterator[None]:
    """Track module calls (for auto-names) while the block runs; the stack starts empty, so
    forward and its recompute count op calls from the same point."""
    from torch.nn.modules import module as module_mod

    tracker = _TRACKER
    saved = tracker.stack
    tracker.stack = []
    tracker.paths = paths
    if tracker.depth == 0:
        tracker.handles = [
            module_mod.register_module_forward_pre_hook(tracker.pre),
            module_mod.register_module_forward_hook(tracker.post, always_call=True),
        ]
    tracker.depth += 1
    try:
        yield
    finally:
        tracker.depth -= 1
        tracker.stack = saved
        if tracker.depth == 0:
            for handle in tracker.handles:
                handle.remove()
            tracker.handles = []


@contextlib.contextmanager
def kept_statistics(region: nn.Module, recompute: bool) -> Iterator[None]:
    """In a recompute, put the running statistics of the region's training modules back as
    forward left them, once the recompute ends (NOTE [ Running statistics ] in checkpoint.py;
    here all at once, as the region's modules are known). The copies run outside the selective
    checkpoint's dispatch mode, which would take them for ops of the region."""
    if not recompute:
        yield
        return
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.no_grad():
        snaps = [
            (buf, buf.clone())
            for sub in region.modules()
            if sub.training
            for name in _STAT_NAMES
            if (buf := sub._buffers.get(name)) is not None
        ]
    try:
        yield
    finally:
        with _disable_current_modes(), torch.no_grad():
            for buf, snap in snaps:
                buf.data.copy_(snap)  # .data: leave the version counter alone (checkpoint.py)


# ----------------------------------------------------------------------------- policy


def _op_names(op: Any) -> tuple[str, str]:
    """``("aten.mm", "aten.mm.default")`` for an OpOverload."""
    full = str(op)
    packet = getattr(op, "overloadpacket", None)
    return (str(packet) if packet is not None else full.rsplit(".", 1)[0], full)


def _written(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The tensors ``op`` writes (arguments whose schema alias info says ``!``)."""
    schema = getattr(op, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out: list[Tensor] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        items = value if isinstance(value, list | tuple) else [value]
        out += [t for t in items if isinstance(t, Tensor)]
    return out


def _address(t: Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (subclasses, functional tensors)
        return 0


class SavePolicy:
    """The selective checkpoint policy of one call of an op-level region (NOTE [ Exact
    gradients under an op-level plan ]); ``contexts()`` is checkpoint's ``context_fn``.

    ``outside`` holds the storage addresses of the tensors the region did not create: its
    inputs, and its parameters and buffers (:func:`outside_addresses`). ``matched`` collects
    the ``save`` entries that matched some op (to name the ones that match nothing)."""

    def __init__(
        self,
        region: str,
        save: tuple[str, ...],
        outside: tuple[set[int], set[int]],
        matched: set[str],
    ) -> None:
        self.region, self.save, self.matched = region, save, matched
        self.inputs, self.state = outside
        self.saved: dict[int, str] = {}  # address of a saved output -> its op's auto-name

    def contexts(self) -> tuple[Any, Any]:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        return create_selective_checkpoint_contexts(self)

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        packet, full = _op_names(op)
        auto = _TRACKER.auto_name(packet)
        written = _written(op, args, kwargs)
        outside = {_address(t) for t in written} & (self.inputs | self.state)
        if outside:
            what = "an input" if outside & self.inputs else "a parameter or buffer"
            raise _fail(
                f"op-level region {self.region!r}: {full} ({auto}) writes in place {what} of "
                "the region, which the recompute would write again; make the op out of place, "
                "or drop 'save' from the region"
            )
        if written:
            self._check_not_saved(written, full, auto)
            return CheckpointPolicy.PREFER_RECOMPUTE  # writes a tensor of this call: repeatable
        hits = [e for e in self.save if match_op(e, (packet, full, auto))]
        self.matched.update(hits)
        if not hits:
            return CheckpointPolicy.PREFER_RECOMPUTE
        output = getattr(ctx, "op_output", None)  # newer torch hands the policy the output
        for t in _tensor_args((output,), {}):
            self.saved[_address(t)] = auto
        return CheckpointPolicy.MUST_SAVE

    def _check_not_saved(self, written: list[Tensor], full: str, auto: str) -> None:
        """A saved output must not be written later: the cache would hold the written value
        (torch raises at backward; where torch tells us op outputs, we refuse in forward)."""
        for t in written:
            saved = self.saved.get(_address(t))
            if saved is not None:
                raise _fail(
                    f"op-level region {self.region!r}: {full} ({auto}) writes in place the "
                    f"output of {saved}, which 'save' keeps; drop that op from 'save', or make "
                    "the write out of place"
                )


def _tensor_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    out: list[Tensor] = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, list | tuple) else [value]
        out += [t for t in items if isinstance(t, Tensor)]
    return out


def outside_addresses(module: nn.Module, args: tuple[Any, ...]) -> tuple[set[int], set[int]]:
    """Storage addresses of ``args``' tensors, and of ``module``'s parameters and buffers but
    running statistics (restored after the recompute, NOTE [ Running statistics ])."""
    inputs = {_address(t) for t in _tensor_args(args, {})}
    state = {_address(p) for p in module.parameters()}
    state |= {
        _address(buf)
        for sub in module.modules()
        for name, buf in sub._buffers.items()
        if buf is not None and name not in _STAT_NAMES
    }
    return inputs - {0}, state - {0}


def check_op_names(region: str, save: tuple[str, ...]) -> None:
    """PlanError naming an exact ``aten``/``prims`` op of ``save`` that this torch lacks."""
    for entry in save:
        parts = entry.split(".")
        if parts[0] not in ("aten", "prims") or len(parts) > 3 or set("*?[") & set(entry):
            continue  # a pattern or an auto-name: checked by what it matches
        packet = getattr(getattr(torch.ops, parts[0]), parts[1], None) if len(parts) > 1 else None
        if packet is None or (len(parts) == 3 and not hasattr(packet, parts[2])):
            raise _fail(
                f"region {region!r}: unknown op {entry!r} in 'save' (no such op in torch "
                f"{torch.__version__}); write it as printed by torch, e.g. aten.mm or "
                "aten.addmm.default"
            )


# ----------------------------------------------------------------------------- offload


@dataclass
class _OnHost:
    device: torch.device
    host: Any
    copied: Any  # the side stream's event after the device-to-host copy


class Offloader:
    """Saved-tensor hooks that keep a region's saved tensors in host memory.

    CPU tensors are already in host memory and are kept as they are. A CUDA tensor is copied
    to pinned host memory on a side stream (``tensor.to("cpu", non_blocking=True)`` allocates
    pinned memory for a device-to-host copy) after the side stream waits for the current one;
    ``record_stream`` stops the allocator reusing the tensor's memory before the copy is done.
    Unpacking makes the current stream wait for the copy, then copies back asynchronously.
    Parameters stay where they are (they stay resident anyway). Any other device type has no host
    path and is refused with one line. ``cuda`` is ``torch.cuda`` (tests pass a fake).
    """

    def __init__(self, region: str, cuda: ModuleType | Any = None) -> None:
        self.region = region
        self._cuda = cuda
        self.stream: Any = None

    @property
    def cuda(self) -> Any:
        """``torch.cuda``, or the fake a test passed."""
        return torch.cuda if self._cuda is None else self._cuda

    def __deepcopy__(self, memo: dict[int, Any]) -> Offloader:
        # A deep copy of a planned model gets its own offloader (streams are not copyable).
        return Offloader(self.region, self._cuda)

    def hooks(self) -> Any:
        """``torch.autograd.graph.saved_tensors_hooks`` with this offloader's pack/unpack."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: Tensor) -> Any:
        kind = tensor.device.type
        if isinstance(tensor, nn.Parameter) or kind == "cpu":
            return tensor
        if kind != "cuda":
            raise _fail(
                f"offload region {self.region!r} saves a tensor on device {kind!r}, which has "
                f"no host path (offload supports {', '.join(HOST_PATHS)}); drop 'offload' "
                "from the region"
            )
        cuda = self.cuda
        if self.stream is None:
            self.stream = cuda.Stream(device=tensor.device)
        side = self.stream
        side.wait_stream(cuda.current_stream(tensor.device))
        with cuda.stream(side):
            host = tensor.to("cpu", non_blocking=True)
            copied = side.record_event()
        tensor.record_stream(side)
        return _OnHost(tensor.device, host, copied)

    def unpack(self, packed: Any) -> Tensor:
        if not isinstance(packed, _OnHost):
            return packed
        self.cuda.current_stream(packed.device).wait_event(packed.copied)
        tensor: Tensor = packed.host.to(packed.device, non_blocking=True)
        return tensor
