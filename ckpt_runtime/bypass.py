"""Bypass activation checkpointing: run checkpointed functions plainly (no hooks, no recompute).

Under ``with bypass():`` or with the environment variable ``CKPT_RUNTIME_BYPASS=1`` (read at call
time), ``ckpt_runtime.checkpoint`` / ``checkpoint_sequential`` **and** torch's
``torch.utils.checkpoint.checkpoint`` / ``checkpoint_sequential`` simply call the function. The
recorder uses this to record the un-checkpointed baseline of a script that checkpoints.

NOTE [ Bypassing torch's checkpoint ]
Replacing the module attribute ``torch.utils.checkpoint.checkpoint`` is not enough: HF
transformers' ``gradient_checkpointing_enable`` stores ``functools.partial(checkpoint, ...)`` at
enable time, and other libraries hold ``from torch.utils.checkpoint import checkpoint``. So we
hook what torch's ``checkpoint`` calls, looked up as module globals at call time:

- ``use_reentrant=False``: ``_checkpoint_without_reentrant_generator(fn, preserve, ...)``; it
  yields once before the function runs and once after. Bypassed, we hand back a generator that
  just yields once, so ``checkpoint`` runs the function with no saved-tensor hooks.
- ``use_reentrant=True``: ``CheckpointFunction.apply(function, preserve, *args)``. Bypassed, our
  ``apply`` calls ``function(*args)`` (set on the class, so the class keeps its identity).

NOTE [ A plan that replaces the script's checkpointing ]
``bypass(keep=modules)`` bypasses the script's checkpointing but not the regions that
``ckpt_runtime.apply_plan`` installed on ``modules`` (module regions, segments' Sequentials):
the recorder's plan runs (``ckview record --plan``, ``ckview verify``) compare a plan with the
un-checkpointed baseline, so the plan must replace the script's own checkpointing, not add to
it. A plan's region marks its checkpoint
call with ``plan_region(module)``; ``checkpoint`` takes that mark (``take_plan_mark``) before
anything else, so only that one call is exempt: checkpoints the script makes inside the
region, in its forward or its recompute, are still bypassed. The mark is per thread (a region
runs its checkpoint call on the thread that marked it). A plan the script applies itself is
script checkpointing and is bypassed like any other.

The hooks are installed once, at import, and decide at each call whether to bypass (bypass
depth or environment variable), so the state to restore after a ``bypass()`` block is just the
depth: nothing in torch is swapped in and out while other code may be running. When not
bypassed they forward to torch's originals (cost: one Python call and one environment lookup,
small against torch's checkpoint itself). If a future torch renames these internals, the hooks
are not installed, ``bypass()`` raises a ``RuntimeError`` that says so (pass
``torch_checkpoint=False`` to bypass only ``ckpt_runtime``), and ``ckpt_runtime``'s own
checkpoint is still bypassed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils.checkpoint as _tuc

__all__ = [
    "BYPASS_ENV",
    "bypass",
    "is_bypassed",
    "plan_region",
    "take_plan_mark",
    "torch_checkpoint_hooked",
]

BYPASS_ENV = "CKPT_RUNTIME_BYPASS"
_FALSE_VALUES = frozenset({"", "0", "false", "no", "off"})

_lock = threading.Lock()
# Process-wide, not thread-local: the autograd engine and DataParallel run module code on other
# threads than the one that entered bypass(). Read without the lock (an int read is atomic).
_depth = 0
_kept: dict[int, int] = {}  # id(module) -> how many bypass(keep=...) blocks keep its regions
_mark = threading.local()  # NOTE [ A plan that replaces the script's checkpointing ]


def is_bypassed() -> bool:
    """True inside ``bypass()`` or when ``CKPT_RUNTIME_BYPASS`` is set to a true value."""
    if _depth:
        return True
    value = os.environ.get(BYPASS_ENV)
    return value is not None and value.strip().lower() not in _FALSE_VALUES


@contextmanager
def bypass(torch_checkpoint: bool = True, keep: Iterable[torch.nn.Module] = ()) -> Iterator[None]:
    """Run every checkpointed function plainly inside the block (re-entrant).

    Covers ``ckpt_runtime.checkpoint`` / ``checkpoint_sequential`` and torch's
    ``torch.utils.checkpoint.checkpoint`` / ``checkpoint_sequential``, including references
    captured before the block (see NOTE [ Bypassing torch's checkpoint ]). If this torch's
    internals could not be hooked, ``torch_checkpoint=True`` (default) raises a ``RuntimeError``
    saying so, and ``torch_checkpoint=False`` accepts bypassing ``ckpt_runtime``'s only.
    Regions entered inside the block are not checkpointed; regions checkpointed before it still
    recompute in their backward. The regions that ``apply_plan`` installed on the ``keep``
    modules (a module region's module, a segment's ``nn.Sequential``) still checkpoint
    (NOTE [ A plan that replaces the script's checkpointing ]). The state is restored on exit,
    also on exceptions.
    """
    global _depth
    kept = [id(m) for m in keep]
    if torch_checkpoint and not torch_checkpoint_hooked():
        raise RuntimeError(
            "ckpt_runtime.bypass: cannot bypass torch.utils.checkpoint on torch "
            f"{torch.__version__}: {_missing_reason}. Use bypass(torch_checkpoint=False) to bypass "
            "only ckpt_runtime.checkpoint, and please report this so ckpt_runtime can follow the "
            "new torch internals."
        )
    with _lock:
        _depth += 1
        for key in kept:
            _kept[key] = _kept.get(key, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            for key in kept:
                _kept[key] -= 1
                if not _kept[key]:
                    del _kept[key]


@contextmanager
def plan_region(module: torch.nn.Module) -> Iterator[None]:
    """Around the checkpoint call of a plan's region on ``module``: that call checkpoints even
    under ``bypass`` if ``module`` is kept (NOTE [ A plan that replaces the script's
    checkpointing ])."""
    previous = getattr(_mark, "kept", False)
    _mark.kept = id(module) in _kept
    try:
        yield
    finally:
        _mark.kept = previous


def region_bypassed(module: torch.nn.Module) -> bool:
    """Whether a plan's region on ``module`` runs plainly: under ``bypass`` unless ``module`` is
    kept. What ``plan_region`` and ``take_plan_mark`` decide, without the mark, for a region
    inside a compiled graph (NOTE [ Checkpoint inside a compiled graph ] in checkpoint.py)."""
    return is_bypassed() and id(module) not in _kept


def take_plan_mark() -> bool:
    """Whether the checkpoint call being made is a kept plan region's; clears the mark, so that
    checkpoint calls nested in it are not exempt."""
    kept: bool = getattr(_mark, "kept", False)
    _mark.kept = False
    return kept


# ------------------------------------------------------------------ hooks into torch's checkpoint

_orig_generator: Any = None
_orig_apply_func: Any = None  # the function behind CheckpointFunction.apply (a classmethod)
_orig_apply_in_dict: Any = None  # CheckpointFunction.__dict__["apply"] before us (normally none)
_installed = False
_missing_reason = "the hooks were not installed"


def torch_checkpoint_hooked() -> bool:
    """Whether torch's checkpoint honours the bypass on this torch version."""
    return _installed


def _plain_generator() -> Generator[None, None, None]:
    yield


def _generator_hook(*args: Any, **kwargs: Any) -> Any:
    # An op-level plan region calls torch's checkpoint itself (selective checkpoint policy):
    # its mark exempts it as it exempts ckpt_runtime's checkpoint.
    if not take_plan_mark() and is_bypassed():
        return _plain_generator()
    return _orig_generator(*args, **kwargs)


def _apply_hook(cls: Any, *args: Any, **kwargs: Any) -> Any:
    if is_bypassed():
        function, _preserve_rng_state, *fn_args = args
        return function(*fn_args)
    return _orig_apply_func(cls, *args, **kwargs)


def _install() -> None:
    """Hook torch's checkpoint internals (idempotent); record why if they are not there."""
    global _orig_generator, _orig_apply_func, _orig_apply_in_dict, _installed, _missing_reason
    if _installed:
        return
    generator = getattr(_tuc, "_checkpoint_without_reentrant_generator", None)
    function_cls = getattr(_tuc, "CheckpointFunction", None)
    if generator is None or not (
        isinstance(function_cls, type) and issubclass(function_cls, torch.autograd.Function)
    ):
        _missing_reason = (
            "torch.utils.checkpoint has no _checkpoint_without_reentrant_generator function "
            "or CheckpointFunction autograd.Function"
        )
        return
    _orig_generator = generator
    _orig_apply_func = function_cls.apply.__func__  # type: ignore[attr-defined]
    _orig_apply_in_dict = function_cls.__dict__.get("apply")
    _tuc._checkpoint_without_reentrant_generator = _generator_hook
    function_cls.apply = classmethod(_apply_hook)  # type: ignore[assignment, method-assign]
    _installed = True


def _uninstall() -> None:
    """Give torch's checkpoint back its own internals (used by tests and benchmarks)."""
    global _installed
    if not _installed:
        return
    _tuc._checkpoint_without_reentrant_generator = _orig_generator
    if _orig_apply_in_dict is None:
        del _tuc.CheckpointFunction.apply
    else:
        _tuc.CheckpointFunction.apply = _orig_apply_in_dict  # type: ignore[method-assign]
    _installed = False


_install()
