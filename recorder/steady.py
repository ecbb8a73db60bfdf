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

NOTE [ A data pipeline that settles ]
A DataLoader with worker processes starts by sending ``num_workers * prefetch_factor`` batches
to its workers at once, and the workers deliver them as they finish: while the workers start
up, one can deliver batch 2 before another delivers batch 1. The main process then rebuilds
the early batch from shared memory and keeps it (the iterator's ``_task_info``) until its turn,
so a step that waits for batch 1 holds a batch more than the steps after it. With the default
warmup of one iteration the baseline was recorded in exactly that step in about half of the
runs of ``verify`` on examples/loops/dataloader_workers.py: every plan, measured in later and
steady runs, was projected a batch high (+1.19%). So the warmup also lasts until every live
multi-process DataLoader iterator has handed out that first burst (its order is a race) and
holds no batch delivered ahead of its turn.
- An epoch of no more batches than the burst is all start: waiting would record the start of
  the next epoch (a new iterator, as much a race) or nothing (a 4-batch epoch with 2 recorded
  steps), so such an iterator counts as settled.
- At most ``DATA_SETTLE_LIMIT`` iterations more than asked, for a loop whose workers are too
  slow to ever be ahead: its steps can then differ by a batch, and the recorder says so when it
  stops waiting (as the steadiness report does for recorded steps that differ).
- The gradient gate does not wait (``Recorder(wait_for_data=False)``): its runs of the script
  compare the gradients of one iteration, the same in each run whenever batches arrive.
- The iterator's state is torch's private attributes (``_task_info``, ``_rcvd_idx``): an
  iterator without them counts as settled.
- Once settled, workers still race under CPU load: one may hand over a batch ahead of its turn
  inside a recorded step, which then holds a batch more (seen once in CI: a plan measured
  100,608 B, one batch, above its projection). No warmup can rule that out; the held batch is
  real memory of that step, and shows as an input at its peak.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

DATA_SETTLE_LIMIT = 16
"""Warmup iterations beyond those asked that wait for a DataLoader to settle, at most."""


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


def _iterator_settled(iterator: Any) -> bool:
    """Whether a multi-process DataLoader iterator is past its start (NOTE [ A data pipeline
    that settles ]): done, or its first burst of batches handed out and none kept early."""
    try:
        if iterator._shutdown:
            return True
        first_burst = iterator._num_workers * iterator._prefetch_factor
        with contextlib.suppress(TypeError):  # an IterableDataset without __len__: no bound
            if len(iterator) <= first_burst:
                return True  # an epoch that is all start: waiting cannot help
        early = any(len(info) == 2 for info in iterator._task_info.values())
        return bool(iterator._rcvd_idx >= first_burst and not early)
    except AttributeError:  # another torch's iterator: nothing to wait for that we can see
        return True


class DataLoaders:
    """The script's multi-process DataLoader iterators, held weakly (NOTE [ A data pipeline
    that settles ])."""

    def __init__(self) -> None:
        self._iterators: weakref.WeakSet[Any] = weakref.WeakSet()

    def created(self, iterator: Any) -> None:
        """A multi-process DataLoader iterator was made (recorder/_torch.py watches them)."""
        self._iterators.add(iterator)

    def settled(self) -> bool:
        """Whether every live one delivers its batches in turn now."""
        return all(_iterator_settled(it) for it in list(self._iterators))
