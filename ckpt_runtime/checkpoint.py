"""Drop-in activation checkpointing: ``checkpoint`` and ``checkpoint_sequential``.

Same signatures and semantics as ``torch.utils.checkpoint`` (bitwise-equal gradients, RNG state
preserved, kwargs and non-tensor arguments/outputs, nesting, ``torch.autograd.grad``, both
``use_reentrant`` modes), with a leaner implementation and three additions:

- modules with running statistics (BatchNorm, InstanceNorm with ``track_running_stats``, ...)
  update them once per step, not again during the recompute (NOTE [ Running statistics ]);
- a recompute that differs from its forward raises :class:`RecomputeMismatchError` naming the
  region (NOTE [ Recompute mismatch ]);
- regions that are unsafe to recompute (they consume RNG with ``preserve_rng_state=False``, or
  modify one of their inputs in place) get one :class:`UnsafeRecomputeWarning` each.

Recompute begin/end is reported to ``ckpt_runtime.markers`` listeners, and ``ckpt_runtime.bypass``
turns every checkpoint into a plain call.

NOTE [ Non-reentrant checkpoint, lean version ]
The non-reentrant variant follows torch's design (see NOTE [ Nestable Checkpoint ] in
torch/utils/checkpoint.py) without its generality tax:

- Forward runs ``function`` under saved-tensor hooks whose pack returns a small ``_Holder``
  (remembering the tensor's shape/dtype/device) instead of the tensor, so nothing inside the
  region is kept. Inputs are saved through the *enclosing* hooks (``_make_saved_tensor``) so an
  outer checkpoint manages them (nesting) and autograd's version check catches later in-place
  changes.
- The first unpack in a backward (one graph task) reruns ``function`` under recompute hooks that
  hand the i-th saved tensor to the i-th holder still alive, and stops (raising
  ``_StopRecompute``) as soon as the last one saved in forward has been produced. Each unpack
  then takes its tensor out of the holder, so recomputed tensors die as backward consumes them,
  even with ``retain_graph=True``; a second backward recomputes again.
- Device RNG and autocast cost nothing on a CPU-only, autocast-free step: they are looked at only
  when a tensor argument is on a device or autocast is on. The running-statistics guard costs a
  global module pre-hook during recompute only (NOTE [ Running statistics ]).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules.module import register_module_forward_pre_hook

from ckpt_runtime import markers
from ckpt_runtime.bypass import is_bypassed, take_plan_mark
from ckpt_runtime.markers import region_target

# Recent torch: save a tensor through the current saved-tensor hooks, without a graph node.
# Older torch: ckpt_runtime holds the inputs itself (_KeptInput); tests cover both.
_make_saved_tensor: Callable[..., Any] | None = getattr(
    torch._C._autograd, "_make_saved_tensor", None
)

__all__ = [
    "RecomputeMismatchError",
    "UnsafeRecomputeWarning",
    "checkpoint",
    "checkpoint_sequential",
    "register_module_names",
]


class RecomputeMismatchError(RuntimeError):
    """The recompute of a checkpointed region produced different tensors than its forward."""


class UnsafeRecomputeWarning(UserWarning):
    """A checkpointed region cannot be recomputed faithfully (RNG, in-place input changes)."""


_listeners = markers._listeners  # the same list object; `if _listeners:` is the fast check
_ref = weakref.ref
_graph_task_id = torch._C._current_graph_task_id
_get_graph_exec_group: Callable[[], Any] | None = getattr(torch._C, "_get_graph_exec_group", None)
_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_autocast_available: Callable[[str], bool] = getattr(
    torch.amp, "is_autocast_available", lambda t: t in ("cpu", "cuda")
)
_STAT_NAMES = ("running_mean", "running_var", "num_batches_tracked")


class _StopRecompute(Exception):
    """Raised by the recompute pack hook once every tensor saved in forward is back."""


# ------------------------------------------------------------------------------ naming regions

_module_names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def register_module_names(root: torch.nn.Module, prefix: str = "") -> None:
    """Remember the qualified names of ``root``'s modules, for error and warning messages.

    ``apply_plan`` calls this; without it messages name a module by its class only.
    """
    for name, module in root.named_modules(prefix=prefix):
        _module_names[module] = name or "<root>"


def _describe(target: object) -> str:
    if isinstance(target, torch.nn.Module):
        name = _module_names.get(target)
        kind = type(target).__qualname__
        return f"module '{name}' ({kind})" if name else f"{kind} module"
    if isinstance(target, _Segment):
        parts = ", ".join(_describe(region_target(f)) for f in target.functions)
        return f"checkpoint_sequential segment [{parts}]"
    fn: Any = target
    while isinstance(fn, functools.partial):
        fn = fn.func
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"function {qualname}{where}"


def _region_key(function: Any) -> object:
    """What "once per region" means for warnings: the module, else the function's code."""
    target = region_target(function)
    if isinstance(target, torch.nn.Module):
        return ("module", id(target))
    if isinstance(target, _Segment):
        return ("segment", tuple(id(region_target(f)) for f in target.functions))
    fn: Any = target
    while isinstance(fn, functools.partial):
        fn = fn.func
    # Closures made per call (lambdas, checkpoint_sequential helpers) share their code object.
    return getattr(fn, "__code__", None) or ("object", id(fn))


_warned: set[tuple[str, object]] = set()


def _warn_once(kind: str, function: Any, message: str) -> None:
    key = (kind, _region_key(function))
    if key in _warned:
        return
    _warned.add(key)
    # _warn_once <- _check_forward <- _checkpoint_* <- checkpoint <- the caller
    warnings.warn(message, UnsafeRecomputeWarning, stacklevel=5)


def _already_warned(kind: str, function: Any) -> bool:
    return (kind, _region_key(function)) in _warned


# ----------------------------------------------------------------------- running statistics guard

# NOTE [ Running statistics ]
# A module with running statistics (BatchNorm*, SyncBatchNorm, InstanceNorm with
# track_running_stats, ...) updates running_mean / running_var / num_batches_tracked in place
# every time it runs in training mode. torch's checkpoint reruns the region in backward, so each
# such module counts the batch twice (momentum applied twice, num_batches_tracked += 2). We keep
# the forward's update and undo the recompute's: while a recompute runs, a global forward
# pre-hook snapshots the statistics buffers of every such module the first time it is about to
# run (whatever reaches it: a module, a lambda around modules, a bound method), and right after
# the recompute the snapshots are copied back in place. Restoring *after* (not swapping buffers
# before) keeps the buffer objects the module, optimizers and user code hold. The recompute's
# output is unaffected: in training mode these modules normalise with batch statistics, and the
# values of the running buffers saved for backward are not used when training (which is also
# why the restore may bypass their version counter, see _StatGuard.restore). Eval-mode
# modules do not update statistics and are left alone.


class _StatGuard:
    """Active during one recompute; see NOTE [ Running statistics ]."""

    __slots__ = ("handle", "last_module", "saved")

    def __init__(self) -> None:
        self.saved: dict[int, tuple[torch.nn.Module, list[tuple[str, Tensor]]]] | None = None
        self.last_module: torch.nn.Module | None = None  # names the place of a mismatch
        self.handle = register_module_forward_pre_hook(self._pre_forward)

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.last_module = module
        if not module.training:
            return
        buffers = module._buffers
        if not buffers.keys().isdisjoint(_STAT_NAMES):
            saved = self.saved
            if saved is None:
                saved = self.saved = {}
            if id(module) not in saved:
                snaps = [
                    (name, buf.clone())
                    for name in _STAT_NAMES
                    if (buf := buffers.get(name)) is not None
                ]
                saved[id(module)] = (module, snaps)

    def restore(self) -> None:
        self.handle.remove()
        if self.saved:
            with torch.no_grad():
                for module, snaps in self.saved.values():
                    for name, snap in snaps:
                        buf = module._buffers.get(name)
                        if buf is not None:
                            # Through .data: same storage, but autograd's version counter is
                            # left alone; the recompute's graph saved these buffers (batch
                            # norm saves running stats) and bumping it would fail backward.
                            buf.data.copy_(snap)
            self.saved = None


# --------------------------------------------------------------------------- RNG and autocast

# NOTE [ RNG states as bytes ]
# A region stashes the RNG states its forward started from, to replay them in the recompute
# (and the recompute saves the states it interrupts). torch hands a state out as a new CPU
# tensor (5,056 bytes for the CPU generator): kept as such, every checkpoint call would hold a
# block of the tensor allocator from its forward to its backward, memory the plan's projection
# knows nothing of. Kept as bytes, the stash lives outside the tensor allocator; the state
# tensor torch returns is freed at once, and the replay reads the bytes back without copying.


def _cpu_rng_state() -> bytes:
    return _state_bytes(torch.get_rng_state())


def _set_cpu_rng_state(state: bytes) -> None:
    torch.set_rng_state(_state_tensor(state))


def _state_bytes(state: Tensor) -> bytes:
    return state.numpy().tobytes()


def _state_tensor(state: bytes) -> Tensor:
    return torch.frombuffer(bytearray(state), dtype=torch.uint8)


def _device_rng_state(args: Iterable[Any]) -> tuple[Any, list[tuple[int, bytes]]] | None:
    """RNG states of the devices of the tensor arguments (like torch: args only), or None."""
    device_type = None
    ids: list[int] = []
    for a in args:
        if isinstance(a, Tensor) and not a.is_cpu:
            t = a.device.type
            if t == "meta":
                continue
            if device_type is None:
                device_type = t
            if t == device_type and a.get_device() not in ids:
                ids.append(a.get_device())
    if device_type is None:
        return None
    module = getattr(torch, device_type, None)
    if module is None or not getattr(module, "_initialized", False):
        return None
    states = []
    for i in ids:
        with module.device(i):
            states.append((i, _state_bytes(module.get_rng_state())))
    return module, states


def _set_device_rng_state(saved: tuple[Any, list[tuple[int, bytes]]]) -> None:
    module, states = saved
    for i, state in states:
        with module.device(i):
            module.set_rng_state(_state_tensor(state))


_AutocastState = list[tuple[str, bool, torch.dtype, bool]]


def _autocast_device_types(args: Iterable[Any]) -> list[str]:
    types = ["cpu"]
    for a in args:
        if isinstance(a, Tensor) and not a.is_cpu and a.device.type not in types:
            types.append(a.device.type)
    if "cuda" not in types and torch.cuda.is_available():
        types.append("cuda")
    return [t for t in types if _autocast_available(t)]


def _autocast_state(args: Iterable[Any]) -> _AutocastState:
    cache = torch.is_autocast_cache_enabled()
    return [
        (t, torch.is_autocast_enabled(t), torch.get_autocast_dtype(t), cache)
        for t in _autocast_device_types(args)
    ]


def _rng_equal(before: bytes, before_dev: Any, args: Sequence[Any]) -> bool:
    if before != _cpu_rng_state():
        return False
    if before_dev is None:
        return True
    after_dev = _device_rng_state(args)
    return after_dev is not None and before_dev[1] == after_dev[1]


# ------------------------------------------------------------------------------ shared state


class _Holder:
    """What the forward pack hook returns instead of a tensor: see the module NOTE."""

    __slots__ = ("__weakref__", "gid", "meta", "value")

    def __init__(self, meta: tuple[Any, ...] | None) -> None:
        self.meta = meta
        self.value: Tensor | None = None
        self.gid: object = None


class _KeptInput:
    """Fallback for torch without ``_make_saved_tensor``: hold the input, check its version."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor
        self.version = tensor._version

    def unpack(self) -> Tensor:
        if self.tensor._version != self.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: an input of a checkpointed region is at version "
                f"{self.tensor._version}; expected version {self.version} instead."
            )
        return self.tensor


class _Frame:
    """Everything one checkpoint call needs to recompute its region."""

    __slots__ = (
        "amp",
        "args",
        "check",
        "cpu_rng",
        "dev_rng",
        "done",
        "early_stop",
        "fn",
        "gid",
        "holders",
        "inputs_modified",
        "kwargs",
        "out_meta",
        "preserve",
        "region_id",
        "saved",
        "tensor_idx",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        preserve: bool,
        early_stop: bool,
        check: bool,
    ) -> None:
        self.fn = fn
        self.kwargs = kwargs
        self.preserve = preserve
        self.early_stop = early_stop
        self.check = check
        self.region_id = markers.next_region_id()
        self.holders: list[weakref.ref[_Holder]] = []
        self.done = False
        self.inputs_modified = False
        self.gid: object = None
        self.out_meta: list[tuple[Any, ...] | None] | None = None
        self.cpu_rng: bytes | None = None  # NOTE [ RNG states as bytes ]
        self.dev_rng: Any = None
        self.amp: _AutocastState | None = _autocast_state(args) if _any_autocast() else None
        self.args: list[Any] = list(args)
        self.tensor_idx: list[int] = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        self.saved: list[Any] = []

    # -- forward hooks (non-reentrant)

    def pack(self, x: Tensor) -> _Holder:
        holder = _Holder((x.shape, x.dtype, x.device) if self.check else None)
        self.holders.append(_ref(holder))
        return holder

    def unpack(self, holder: _Holder) -> Tensor:
        gid = _current_gid()
        if holder.gid != gid:
            if self.gid != gid:
                _recompute_nonreentrant(self, gid)
            if holder.gid != gid:  # pragma: no cover - internal invariant
                raise RuntimeError(
                    "ckpt_runtime.checkpoint: internal error: a saved tensor was not recomputed. "
                    "Please report this with the model that triggers it."
                )
        value = holder.value
        if value is None:
            raise RuntimeError(
                "ckpt_runtime.checkpoint: a saved tensor of a checkpointed region is being "
                "unpacked a second time in the same backward. If you call ctx.saved_tensors in "
                "a custom Function's backward, do so only once."
            )
        holder.value = None  # the recomputed tensor now belongs to backward alone
        return value

    # -- inputs

    def save_inputs(self) -> None:
        args = self.args
        if _make_saved_tensor is not None:
            self.saved = [_make_saved_tensor(args[i], is_output=False) for i in self.tensor_idx]
        else:
            self.saved = [_KeptInput(args[i]) for i in self.tensor_idx]
        for i in self.tensor_idx:
            args[i] = None  # held only through `saved` (and thus by an enclosing checkpoint)

    def load_inputs(self) -> list[Any]:
        args = list(self.args)
        try:
            for i, saved in zip(self.tensor_idx, self.saved, strict=True):
                args[i] = saved.unpack()
        except RuntimeError as e:
            if "modified by an inplace operation" not in str(e):
                raise
            raise _inputs_modified_error(self) from e
        return args


def _current_gid() -> object:
    if _get_graph_exec_group is not None:
        group = _get_graph_exec_group()
        if group is not None:
            return group
    gid = _graph_task_id()
    # Unpacking outside of a backward (e.g. reading grad_fn._saved_self): recompute every time.
    return object() if gid == -1 else gid


# ------------------------------------------------------------------------------ recompute


def _rerun(frame: _Frame, run: Callable[[], Any]) -> Any:
    """Run ``run()`` as the recompute of ``frame``: forward's RNG and autocast, grad enabled,
    running statistics guarded, markers around it."""
    target = None
    if _listeners:
        target = region_target(frame.fn)
        markers._recompute_begin(frame.region_id, target)
    try:
        outer_cpu = outer_dev = None
        if frame.preserve:
            outer_cpu = _cpu_rng_state()
            _set_cpu_rng_state(frame.cpu_rng)  # type: ignore[arg-type]
            if frame.dev_rng is not None:
                outer_dev = _device_rng_state_like(frame.dev_rng)
                _set_device_rng_state(frame.dev_rng)
        try:
            guard = _StatGuard()
            try:
                amp = frame.amp
                if amp is None and not _any_autocast():
                    with torch.enable_grad():
                        return run()
                return _run_with_autocast(amp, frame, run)
            except RecomputeMismatchError as e:
                _add_location(e, guard)
                raise
            finally:
                guard.restore()
        finally:
            if outer_cpu is not None:
                _set_cpu_rng_state(outer_cpu)
                if outer_dev is not None:
                    _set_device_rng_state(outer_dev)
    finally:
        if target is not None:
            markers._recompute_end(frame.region_id, target)


def _device_rng_state_like(saved: tuple[Any, list[tuple[int, Tensor]]]) -> Any:
    module, states = saved
    current = []
    for i, _ in states:
        with module.device(i):
            current.append((i, _state_bytes(module.get_rng_state())))
    return module, current


def _run_with_autocast(amp: _AutocastState | None, frame: _Frame, run: Callable[[], Any]) -> Any:
    if amp is None:  # forward ran without autocast, backward runs inside one: switch it off
        amp = [(t, False, dtype, cache) for t, _, dtype, cache in _autocast_state(frame.args)]
    contexts = [
        torch.autocast(t, enabled=enabled, dtype=dtype, cache_enabled=cache)
        for t, enabled, dtype, cache in amp
    ]
    for c in contexts:
        c.__enter__()
    try:
        with torch.enable_grad():
            return run()
    finally:
        for c in reversed(contexts):
            c.__exit__(None, None, None)


_WHERE = "{where}"  # placeholder in mismatch messages, filled in by _rerun


def _add_location(error: RecomputeMismatchError, guard: _StatGuard) -> None:
    """Say which module the recompute was running when the mismatch showed."""
    if not error.args or _WHERE not in error.args[0]:
        return
    module = guard.last_module
    where = f" (detected in or after {_describe(module)})" if module is not None else ""
    error.args = (error.args[0].replace(_WHERE, where), *error.args[1:])


def _mismatch(frame: _Frame, detail: str) -> RecomputeMismatchError:
    # NOTE [ Recompute mismatch ]
    # The recompute must save the same tensors (shape, dtype, device; in order) as the forward,
    # else backward would silently mix tensors or fail deep inside autograd. The usual causes
    # are outside the region's inputs: a global counter or Python state, data-dependent
    # control flow on values that changed, train/eval switched between forward and backward.
    return RecomputeMismatchError(
        f"ckpt_runtime.checkpoint: the recompute of the checkpointed "
        f"{_describe(region_target(frame.fn))} differs from its forward{_WHERE}: {detail}. "
        "Checkpointing requires the region to compute the same thing when rerun in backward. "
        "Make the region deterministic (no dependence on global counters or state that changes "
        "between forward and backward), or exclude it from the checkpoint plan."
    )


def _fmt_meta(meta: tuple[Any, ...]) -> str:
    shape, dtype, device = meta
    return f"{tuple(shape)} {str(dtype).removeprefix('torch.')} on {device}"


def _recompute_nonreentrant(frame: _Frame, gid: object) -> None:
    args = frame.load_inputs()
    holders = frame.holders
    n = len(holders)
    count = 0
    early_stop = frame.early_stop
    done = frame.done
    check = frame.check

    def pack(x: Tensor) -> Tensor:
        nonlocal count
        if x.requires_grad:
            x = x.detach()
        i = count
        count = i + 1
        if i >= n:
            if not done:  # backward inside the region's own, unfinished forward
                return x
            raise _mismatch(frame, f"it saves more tensors for backward than the forward ({n})")
        holder = holders[i]()
        if holder is not None:  # else backward already freed it (e.g. grad inside forward)
            if check:
                meta = (x.shape, x.dtype, x.device)
                if meta != holder.meta:
                    raise _mismatch(
                        frame,
                        f"saved tensor #{i} is {_fmt_meta(meta)} in the recompute but was "
                        f"{_fmt_meta(holder.meta)} in the forward",  # type: ignore[arg-type]
                    )
            holder.value = x
            holder.gid = gid
        if early_stop and count == n:
            raise _StopRecompute
        return x

    def run() -> None:
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, _identity):
                frame.fn(*args, **frame.kwargs)
        except _StopRecompute:
            return
        if count < n and done:
            raise _mismatch(
                frame, f"it saves fewer tensors for backward ({count}) than the forward ({n})"
            )

    _rerun(frame, run)
    frame.gid = gid


def _identity(x: Any) -> Any:
    return x


# ------------------------------------------------------------------------------ forward


def _begin_forward(
    frame: _Frame, function: Callable[..., Any], args: tuple[Any, ...]
) -> tuple[Any, Any, list[int]]:
    """Before a region's forward: stash the RNG state to replay (or, without preservation, to
    warn if the region uses it), note input versions, tell the listeners."""
    rng_before = dev_before = None
    if frame.preserve:
        frame.cpu_rng = _cpu_rng_state()
        frame.dev_rng = _device_rng_state(args)
    elif not _already_warned("rng", function):
        rng_before = _cpu_rng_state()
        dev_before = _device_rng_state(args)
    versions = [args[i]._version for i in frame.tensor_idx]
    if _listeners:
        markers._region_forward(frame.region_id, region_target(function))
    return rng_before, dev_before, versions


def _checkpoint_nonreentrant(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    preserve: bool,
    early_stop: bool,
    check: bool,
) -> Any:
    frame = _Frame(function, args, kwargs, preserve, early_stop, check)
    rng_before, dev_before, versions = _begin_forward(frame, function, args)
    frame.save_inputs()
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        out = function(*args, **kwargs)
    frame.done = True
    _check_forward(function, args, frame.tensor_idx, versions, rng_before, dev_before)
    return out


def _check_forward(
    function: Callable[..., Any],
    args: Sequence[Any],
    tensor_idx: list[int],
    versions: list[int],
    rng_before: bytes | None,
    dev_before: Any,
) -> bool:
    """Warn about an unsafe region; return whether it modified one of its inputs in place."""
    mutated = False
    for i, v in zip(tensor_idx, versions, strict=True):
        if args[i]._version != v:
            mutated = True
            _warn_once(
                "inplace",
                function,
                f"ckpt_runtime.checkpoint: the checkpointed {_describe(region_target(function))} "
                f"modified its input #{i} in place, so its recompute in backward would see the "
                "modified value (backward will fail). Clone the input inside the region before "
                "modifying it, move the in-place operation out of the region, or exclude the "
                "region from the checkpoint plan.",
            )
            break
    if rng_before is not None and not _rng_equal(rng_before, dev_before, args):
        _warn_once(
            "rng",
            function,
            f"ckpt_runtime.checkpoint: the checkpointed {_describe(region_target(function))} "
            "consumes random numbers (e.g. dropout) but preserve_rng_state=False, so its "
            "recompute draws different numbers and the gradients will not match the forward. "
            "Use preserve_rng_state=True (the default), make the region deterministic, or "
            "exclude it from the checkpoint plan.",
        )
    return mutated


def _inputs_modified_error(frame: _Frame) -> RecomputeMismatchError:
    return RecomputeMismatchError(
        "ckpt_runtime.checkpoint: an input of the checkpointed "
        f"{_describe(region_target(frame.fn))} was modified in place after the checkpoint saved "
        "it (inside the region or later), so the region cannot be recomputed as it ran in "
        "forward. Clone the input before modifying it (or move the in-place operation out of "
        "the region), or exclude this region from the checkpoint plan."
    )


class _ReentrantCheckpoint(torch.autograd.Function):
    """``use_reentrant=True``: forward under ``no_grad``; backward recomputes, then backprops."""

    @staticmethod
    def forward(ctx: Any, frame: _Frame, *args: Any) -> Any:
        ctx.frame = frame
        ctx.save_for_backward(*(args[i] for i in frame.tensor_idx))
        for i in frame.tensor_idx:
            frame.args[i] = None
        with torch.no_grad():
            outputs = frame.fn(*args)
        if frame.check:
            frame.out_meta = _outputs_meta(outputs)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "When use_reentrant=True, ckpt_runtime.checkpoint (like torch.utils.checkpoint) "
                "is incompatible with .grad() or passing an `inputs` parameter to .backward(). "
                "To resolve this error, you can either set use_reentrant=False, or call "
                ".backward() without passing the `inputs` argument."
            )
        frame: _Frame = ctx.frame
        if frame.inputs_modified:  # the recompute would start from different inputs
            raise _inputs_modified_error(frame)
        args = list(frame.args)
        for i, t in zip(frame.tensor_idx, ctx.saved_tensors, strict=True):
            detached = t.detach()
            detached.requires_grad = t.requires_grad
            args[i] = detached

        def run() -> Any:
            outputs = frame.fn(*args)
            if frame.out_meta is not None:
                meta = _outputs_meta(outputs)
                if meta != frame.out_meta:
                    raise _mismatch(
                        frame,
                        f"its outputs are {_fmt_outputs(meta)} in the recompute but were "
                        f"{_fmt_outputs(frame.out_meta)} in the forward",
                    )
            return outputs

        outputs = _rerun(frame, run)
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        with_grad, out_grads = [], []
        for out, grad in zip(outputs, grads, strict=False):
            if isinstance(out, Tensor) and out.requires_grad:
                with_grad.append(out)
                out_grads.append(grad)
        if not with_grad:
            raise RuntimeError(
                "none of output has requires_grad=True, this checkpoint() is not necessary"
            )
        torch.autograd.backward(with_grad, out_grads)
        return (None, *(a.grad if isinstance(a, Tensor) else None for a in args))


def _outputs_meta(outputs: Any) -> list[tuple[Any, ...] | None]:
    if isinstance(outputs, Tensor):
        outputs = (outputs,)
    if not isinstance(outputs, tuple):
        return []
    return [(o.shape, o.dtype, o.device) if isinstance(o, Tensor) else None for o in outputs]


def _fmt_outputs(meta: list[tuple[Any, ...] | None]) -> str:
    return "[" + ", ".join("-" if m is None else _fmt_meta(m) for m in meta) + "]"


def _checkpoint_reentrant(
    function: Callable[..., Any], args: tuple[Any, ...], preserve: bool, check: bool
) -> Any:
    if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
        warnings.warn(
            "None of the inputs have requires_grad=True. Gradients will be None",
            stacklevel=3,
        )
    frame = _Frame(function, args, {}, preserve, True, check)
    rng_before, dev_before, versions = _begin_forward(frame, function, args)
    out = _ReentrantCheckpoint.apply(frame, *args)
    frame.inputs_modified = _check_forward(
        function, args, frame.tensor_idx, versions, rng_before, dev_before
    )
    return out


# ------------------------------------------------------------------------------ public API


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool | None = False,
    preserve_rng_state: bool = True,
    context_fn: Callable[[], tuple[Any, Any]] | None = None,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """Checkpoint ``function(*args, **kwargs)``: keep its inputs, recompute the rest in backward.

    A drop-in for ``torch.utils.checkpoint.checkpoint`` (same arguments and semantics: gradients
    are bitwise identical to running without checkpointing; see its documentation for the
    ``use_reentrant`` variants), defaulting to ``use_reentrant=False``. In addition:

    - modules with running statistics in the region (BatchNorm, ...) update them once per step;
    - a recompute that differs from the forward raises :class:`RecomputeMismatchError`;
    - a region that consumes RNG with ``preserve_rng_state=False`` or modifies an input in place
      gets an :class:`UnsafeRecomputeWarning` (once per region);
    - recomputes are reported to ``ckpt_runtime.markers`` listeners;
    - under ``ckpt_runtime.bypass()`` (or ``CKPT_RUNTIME_BYPASS=1``) it just calls the function.

    ``determinism_check="none"`` switches the mismatch check off. ``context_fn`` and ``debug``
    are handed to ``torch.utils.checkpoint.checkpoint`` as they are (without the additions above).
    Under ``torch.no_grad()`` the function simply runs.
    """
    if torch.compiler.is_compiling():  # no plan mark: ckpt_runtime.apply decides it there
        if is_bypassed():
            return function(*args, **kwargs)
        return compiled_checkpoint(
            function, args, kwargs, preserve_rng_state, context_fn, determinism_check
        )
    if not take_plan_mark() and is_bypassed():
        return function(*args, **kwargs)
    if determinism_check not in ("default", "none"):
        raise ValueError(
            f"determinism_check should be one of ['default', 'none'], but got {determinism_check}"
        )
    check = determinism_check == "default"
    if use_reentrant:
        if context_fn is not None or debug:
            raise ValueError(
                "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
            )
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if not torch.is_grad_enabled():
            return function(*args)
        return _checkpoint_reentrant(function, args, preserve_rng_state, check)
    if context_fn is not None or debug:
        import torch.utils.checkpoint as tuc

        extra: dict[str, Any] = {"debug": debug, "early_stop": early_stop}
        if context_fn is not None:
            extra["context_fn"] = context_fn
        return tuc.checkpoint(
            function,
            *args,
            use_reentrant=False,
            preserve_rng_state=preserve_rng_state,
            determinism_check=determinism_check,
            **extra,
            **kwargs,
        )
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    global_early_stop = getattr(torch.utils.checkpoint, "_enable_checkpoint_early_stop", None)
    if global_early_stop is not None:  # torch.utils.checkpoint.set_checkpoint_early_stop
        early_stop = global_early_stop
    return _checkpoint_nonreentrant(function, args, kwargs, preserve_rng_state, early_stop, check)


# NOTE [ Checkpoint inside a compiled graph ]
# While dynamo traces a region, the region becomes torch.utils.checkpoint's higher-order op,
# which AOTAutograd's partitioner turns into a recompute inside the compiled backward: the
# compiled forward saves what the partitioner decides, not what the eager region would, so this
# module's own machinery (saved-tensor hooks comparing the recompute with the forward, the
# running-statistics guard, markers) cannot run there and would report a false mismatch. A
# compiled region is therefore torch's non-reentrant checkpoint, as the compiled graph runs
# it; ``context_fn`` (op-level regions) is passed on, as torch.compile supports it.
def compiled_checkpoint(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    preserve_rng_state: bool,
    context_fn: Callable[[], tuple[Any, Any]] | None = None,
    determinism_check: str = "default",
) -> Any:
    """A region while dynamo traces it (NOTE [ Checkpoint inside a compiled graph ])."""
    import torch.utils.checkpoint as tuc

    extra: dict[str, Any] = {} if context_fn is None else {"context_fn": context_fn}
    return tuc.checkpoint(
        function,
        *args,
        use_reentrant=False,
        preserve_rng_state=preserve_rng_state,
        determinism_check=determinism_check,
        **extra,
        **kwargs,
    )


class _Segment:
    """A run of ``checkpoint_sequential``'s functions; the region ``target`` for markers."""

    __slots__ = ("functions",)

    def __init__(self, functions: Sequence[Callable[[Any], Any]]) -> None:
        self.functions = tuple(functions)

    def __call__(self, x: Any) -> Any:
        for f in self.functions:
            x = f(x)
        return x

    def __repr__(self) -> str:  # short: the recorder shows it as the region's name
        names = (
            type(f).__name__
            if isinstance(f, torch.nn.Module)
            else getattr(f, "__qualname__", type(f).__name__)
            for f in self.functions
        )
        return f"checkpoint_sequential segment [{', '.join(names)}]"


def checkpoint_sequential(
    functions: torch.nn.Sequential | Sequence[Callable[[Any], Any]],
    segments: int,
    input: Any,
    use_reentrant: bool | None = False,
    preserve_rng_state: bool = True,
    **kwargs: Any,
) -> Any:
    """Run ``functions`` in order on ``input``, checkpointing all but the last of ``segments``.

    A drop-in for ``torch.utils.checkpoint.checkpoint_sequential`` (same splitting: segments of
    ``len(functions) // segments`` functions, the last segment, with the remainder, runs
    without checkpointing), built on :func:`checkpoint`. A single-function segment is
    checkpointed as that function (so markers report the module itself); a longer one as a
    ``_Segment`` whose ``functions`` attribute lists them.
    """
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    else:
        functions = list(functions)
    if not 1 <= segments <= max(len(functions), 1):
        raise ValueError(
            f"checkpoint_sequential: segments must be between 1 and the number of functions "
            f"({len(functions)}), got {segments}"
        )
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        fn = functions[start] if segment_size == 1 else _Segment(functions[start : end + 1])
        input = checkpoint(
            fn, input, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state
        )
    for f in functions[end + 1 :]:
        input = f(input)
    return input
