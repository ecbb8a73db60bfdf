"""Recompute markers: tell listeners (e.g. the recorder) when a checkpointed region recomputes.

Every checkpoint call gets a fresh ``region_id``. A listener is any object with

- ``on_recompute_begin(region_id: int, target: object) -> None``
- ``on_recompute_end(region_id: int, target: object) -> None``
- optionally ``on_region_forward(region_id: int, target: object) -> None``, called when the
  checkpoint call runs in forward, so that a forward call can be paired with its recompute.

``target`` is the checkpointed callable: the ``nn.Module`` when the function is one (or the module
behind a bound method or ``functools.partial``), else the function itself (see
:func:`region_target`). ``checkpoint`` only calls into this module when a listener is registered,
so markers cost nothing when nobody listens.

A region recomputes zero times (no backward reached it), once, or more (``retain_graph=True`` and
a second backward); every recompute is one begin/end pair with the region's id, ``end`` also
when the recompute raises. Nested regions recompute inside or after their parent's recompute.
Only ``ckpt_runtime.checkpoint`` reports here (torch's own checkpoint does not); a listener's
exception propagates to the checkpoint call or the backward.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Protocol

import torch

__all__ = ["ListenerHandle", "RecomputeListener", "add_listener", "region_target"]


class RecomputeListener(Protocol):
    """What a listener implements (``on_region_forward`` is optional)."""

    def on_recompute_begin(self, region_id: int, target: object) -> None: ...

    def on_recompute_end(self, region_id: int, target: object) -> None: ...


# Read directly by ckpt_runtime.checkpoint (``if _listeners:``) on every call: keep it a plain
# list, mutated in place, so that check stays a single truth test.
_listeners: list[Any] = []

next_region_id = itertools.count(1).__next__
"""A new region id, unique in this process (thread-safe under the GIL)."""


class ListenerHandle:
    """Returned by :func:`add_listener`; ``remove()`` (or leaving a ``with`` block) unregisters."""

    __slots__ = ("_listener",)

    def __init__(self, listener: Any) -> None:
        self._listener = listener

    def remove(self) -> None:
        """Unregister the listener (idempotent)."""
        for i, other in enumerate(_listeners):
            if other is self._listener:
                del _listeners[i]
                return

    def __enter__(self) -> ListenerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def add_listener(listener: RecomputeListener) -> ListenerHandle:
    """Register ``listener`` for recompute markers; returns a handle with ``remove()``."""
    if not callable(getattr(listener, "on_recompute_begin", None)) or not callable(
        getattr(listener, "on_recompute_end", None)
    ):
        raise TypeError(
            "a recompute listener needs on_recompute_begin(region_id, target) and "
            f"on_recompute_end(region_id, target) methods; got {type(listener).__name__}"
        )
    _listeners.append(listener)
    return ListenerHandle(listener)


def region_target(function: Any) -> object:
    """The object a region is reported as: the module behind ``function`` if any, else itself.

    Unwraps ``functools.partial`` and bound methods: ``module.forward``, ``module.__call__``,
    ``partial(module.__call__, ...)``, and HF's ``partial(Block.forward, module, **kwargs)``
    (an unbound method with the module as its first argument).
    """
    fn = function
    while isinstance(fn, functools.partial):
        inner = fn.func
        if (
            fn.args
            and isinstance(fn.args[0], torch.nn.Module)
            and not isinstance(inner, torch.nn.Module)
            and not hasattr(inner, "__self__")
        ):
            return fn.args[0]
        fn = inner
    if isinstance(fn, torch.nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return owner
    return function


def _region_forward(region_id: int, target: object) -> None:
    for listener in tuple(_listeners):
        method = getattr(listener, "on_region_forward", None)
        if method is not None:
            method(region_id, target)


def _recompute_begin(region_id: int, target: object) -> None:
    for listener in tuple(_listeners):
        listener.on_recompute_begin(region_id, target)


def _recompute_end(region_id: int, target: object) -> None:
    for listener in tuple(_listeners):
        listener.on_recompute_end(region_id, target)
