"""What each capture of the native extension costs on the small-op step, beside torch.profiler.

The small-op step of ``record_overhead.py`` (40 x Linear 64->64 + GELU; AdamW, or SGD as in
issue 20) runs in short blocks of steps, the blocks of every row alternating, so that the
host's drift hits all rows alike. The rows add one capture at a time, each drained at every
step's end, none of the recorder's Python:

- ``torch.profiler (memory), per step``: ``torch.profiler.profile(profile_memory=True)`` around
  the block; its stop (where the profiler pays for its events) is left out, so this is the
  profiler's own cost per step, the figure the extension's capture competes with;
- ``op ranges``: the extension's ``RecordFunction`` callback alone;
- ``+ allocator blocks``: its memory reporter too (the capture the profiler row also makes);
- ``+ op outputs``: the dtype and shape of each new block;
- ``+ saved-tensor hooks``: which blocks autograd saves;
- ``+ module hooks``: which module call each op runs in; this is ``record_overhead.py``'s
  ``native extension alone``, the floor of the native recorder.

It prints the tenth percentile and the median of each row's step times, as ratios to the plain
step's, and what each row adds in milliseconds.

    OMP_NUM_THREADS=1 python benchmarks/capture_parts.py [--blocks 12] [--steps 25]
        [--optimizer adamw|sgd] [--batch 32]
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

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

from recorder.native import load

_WARM = 2
"""Steps of each block left out of its times: the first after a start warms caches."""


def profiler_steady(step: Step, n: int) -> list[float]:
    """Step times under torch.profiler with memory events; its stop is not timed."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True):
        return time_steps(step, n)


_PROFILER = "torch.profiler (memory), per step"
_NONE = dict(module_hooks=False, saved_hooks=False, memory=False, outputs=False)

ROWS: dict[str, StepTimes] = {
    "plain": time_steps,
    _PROFILER: profiler_steady,
    "op ranges": partial(extension_times, **_NONE),
    "+ allocator blocks": partial(extension_times, **{**_NONE, "memory": True}),
    "+ op outputs": partial(extension_times, **{**_NONE, "memory": True, "outputs": True}),
    "+ saved-tensor hooks": partial(extension_times, module_hooks=False),
    "+ module hooks (extension alone)": extension_times,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="blocks of steps for each row")
    parser.add_argument("--steps", type=int, default=25, help="steps a block")
    parser.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adamw")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if load().ext is None:
        sys.exit("capture_parts: the native recorder is not available here; it measures its parts")
    torch.set_num_threads(1)
    step = small_op_step(args.batch, args.optimizer)
    for _ in range(5):
        step()
    low, mid = interleaved(ROWS, step, args.blocks, args.steps, _WARM)
    print(
        f"small-op, batch {args.batch}, {args.optimizer}: {args.blocks} blocks of {args.steps} "
        "steps a row, interleaved"
    )
    print(f"  {'':34} {'10th pct':>9} {'median':>9} {'adds':>9}")
    print(f"  {'plain':34} {low['plain'] * 1e3:7.2f}ms {mid['plain'] * 1e3:7.2f}ms")
    previous = "plain"  # each capture adds to the row before; the profiler row to plain
    for name in list(ROWS)[1:]:
        adds = low[name] - low["plain" if name == _PROFILER else previous]
        print(
            f"  {name:34} {low[name] / low['plain']:8.2f}x {mid[name] / mid['plain']:8.2f}x "
            f"{adds * 1e3:+7.2f}ms"
        )
        if name != _PROFILER:
            previous = name


if __name__ == "__main__":
    main()
