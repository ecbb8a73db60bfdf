"""How many iterations a model's wrappers take to reach the steady state that a plan is judged on.

NOTE [ Warm-up until steady ]
DistributedDataParallel rebuilds its gradient buckets at the start of its second iteration's
forward, in the order gradients arrived in the first backward: it allocates the new buckets
and frees the old ones (torch's ``Reducer::rebuild_buckets``; not with
``find_unused_parameters=True`` unless ``static_graph``). With the default warmup of one
iteration, the first recorded step is that second iteration: a baseline that holds freshly
allocated buckets beside everything else, while a plan's run, recorded later, finds the buckets
already there (and, before a native recorder, not seen at all). Projected against measured,
every plan was 4-5% off on a 6-block MLP under DDP. So a recording whose warmup is not zero
warms up at least until every such wrapper has settled; ``--warmup 0`` still records the
first iteration as asked. (NOTE [ Steps that are not alike ] in ckview/analysis/steadiness.py
reports what this rule cannot foresee.)
"""

from __future__ import annotations

import torch


def iterations_to_settle(model: torch.nn.Module) -> int:
    """Iterations after which ``model`` (the script's main model) allocates as in every later
    one: 2 for a DDP that rebuilds its buckets, else 0."""
    ddp = torch.nn.parallel.DistributedDataParallel
    if not isinstance(model, ddp):
        return 0
    rebuilds = getattr(model, "static_graph", False) or not model.find_unused_parameters
    return 2 if rebuilds else 0


def warmup_needed(asked: int, model: torch.nn.Module | None) -> int:
    """The warmup iterations to run: as ``asked``, at least until ``model`` has settled (NOTE
    [ Warm-up until steady ]), unless no warmup was asked for."""
    if asked == 0 or model is None:
        return asked
    return max(asked, iterations_to_settle(model))
