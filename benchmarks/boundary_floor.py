"""What the native path's small-op step costs, piece by piece: the floor each part sets.

The small-op step of ``record_overhead.py`` (40 x Linear 64->64 + GELU; AdamW, or SGD as in
issue 20), interleaved in rounds, under:

- ``ckview default``: the recorder as it ships;
- ``boundary cut to a drain``: the same, but each step's end only drains the extension's rows
  and drops them: no attribution, no rows of the run's tables, no journal record. It is the
  most that any deferral of the boundary's work (a light boundary now, the attribution in
  batches later) can save;
- ``... and no Python module hooks``: also without the recorder's own module hooks (the
  extension's stay): the most that recording module calls in the extension alone can save;
- ``native extension alone``: its op callback, memory reporter, module and saved-tensor hooks,
  drained each step, none of the recorder's Python (``record_overhead.py``'s row);
- ``extension without module hooks``: the same without its module hooks.

The two cut rows replace two methods of the recorder (``NativeLedger.step_ends``,
``TraceSink.journal_step``) and one of its hook lists (``TorchHooks._module_hooks``) for their
runs: they measure a floor, not a recorder (their traces are empty). Besides the medians it
prints the tenth percentile of the step times, which this shared host's noise moves least.

    OMP_NUM_THREADS=1 python benchmarks/boundary_floor.py [--rounds 6] [--steps 200] [--batch 32]
        [--optimizer adamw|sgd]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_overhead import (
    OPTIMIZERS,
    Step,
    StepTimes,
    extension_times,
    interleaved,
    small_op_step,
    time_steps,
)

from recorder import Recorder
from recorder.hooks import TorchHooks
from recorder.native import load
from recorder.native.rows import drain
from recorder.native_ledger import NativeLedger
from recorder.sink import TraceSink


@contextmanager
def _replaced(owner: type, name: str, value: Any) -> Iterator[None]:
    original = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


_STEP_ENDS = NativeLedger.step_ends


def _drain_only(self: NativeLedger, now: int) -> None:
    if not self._deferring:  # as shipped: nothing to drain before the run's first step
        _STEP_ENDS(self, now)
        return
    drain(self._ext)
    self._optimizer_spans, self._backward_starts = [], []
    self._calls_at_step = len(self._calls)


def _no_record(self: TraceSink, modules: Any, attrs: Any, meta: Any) -> None:
    for buffer in self.tables.appended:
        buffer.take_rows()


def recorded(step: Step, n: int, cut: bool = False, module_hooks: bool = True) -> list[float]:
    """Step times under the recorder; ``cut``: its boundary cut to a drain; without
    ``module_hooks``: without the recorder's own (Python) module hooks."""
    with ExitStack() as patches, tempfile.TemporaryDirectory() as tmp:
        if cut:
            patches.enter_context(_replaced(NativeLedger, "step_ends", _drain_only))
            patches.enter_context(_replaced(TraceSink, "journal_step", _no_record))
        if not module_hooks:
            patches.enter_context(_replaced(TorchHooks, "_module_hooks", lambda self: []))
        with Recorder(Path(tmp) / "t.h5", steps=n, warmup=0, progress=False, timing_steps=0):
            return time_steps(step, n)


RUNS: dict[str, StepTimes] = {
    "plain": time_steps,
    "ckview default (native)": recorded,
    "boundary cut to a drain": lambda s, n: recorded(s, n, cut=True),
    "... and no Python module hooks": lambda s, n: recorded(s, n, True, False),
    "native extension alone": extension_times,
    "extension without module hooks": lambda s, n: extension_times(s, n, module_hooks=False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="the research's step had 64")
    parser.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adamw")
    args = parser.parse_args()
    if load().ext is None:
        sys.exit("boundary_floor: the native recorder is not available here; it measures its path")
    torch.set_num_threads(1)
    step = small_op_step(args.batch, args.optimizer)
    for _ in range(3):
        step()
    low, mid = interleaved(RUNS, step, args.rounds, args.steps)
    print(
        f"small-op, batch {args.batch}, {args.optimizer}: {args.steps} steps a run, "
        f"{args.rounds} rounds interleaved"
    )
    print(f"  {'':34} {'10th pct':>9} {'median':>9}")
    print(f"  {'plain':34} {low['plain'] * 1e3:7.2f}ms {mid['plain'] * 1e3:7.2f}ms")
    for name in list(RUNS)[1:]:
        print(f"  {name:34} {low[name] / low['plain']:8.2f}x {mid[name] / mid['plain']:8.2f}x")


if __name__ == "__main__":
    main()
