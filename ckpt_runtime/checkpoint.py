"""Drop-in activation checkpointing (first version: delegates to torch.utils.checkpoint).

The public signatures are final; the implementation is being replaced by a leaner one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils.checkpoint as _tuc

__all__ = ["checkpoint", "checkpoint_sequential"]


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    **kwargs: Any,
) -> Any:
    """Checkpoint ``function(*args, **kwargs)``: same semantics as ``torch.utils.checkpoint``."""
    return _tuc.checkpoint(
        function,
        *args,
        use_reentrant=use_reentrant,
        preserve_rng_state=preserve_rng_state,
        **kwargs,
    )


def checkpoint_sequential(
    functions: torch.nn.Sequential | Sequence[Callable[[Any], Any]],
    segments: int,
    input: Any,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
    **kwargs: Any,
) -> Any:
    """Checkpoint a sequential model in ``segments`` chunks (as ``torch.utils.checkpoint``)."""
    return _tuc.checkpoint_sequential(
        functions,
        segments,
        input,
        use_reentrant=use_reentrant,
        preserve_rng_state=preserve_rng_state,
        **kwargs,
    )
