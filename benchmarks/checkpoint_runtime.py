"""ckpt_runtime.checkpoint vs torch.utils.checkpoint vs no checkpointing, side by side.

For an MLP chain and a small transformer (nn.TransformerEncoderLayer blocks), every block
checkpointed (``use_reentrant=False``), it prints:

- step time (forward + backward) of each variant, timed in interleaved rounds so machine noise
  hits all alike, and the ratios: ours / torch (target <= 1.02), ours / plain (target
  <= 1 + forward share + 0.03, with the forward share of the plain step measured here);
- peak memory of one step (increase over the memory held before the step), measured in a
  separate run under ``torch.profiler.profile(profile_memory=True)`` from the allocator totals
  the profiler records (target: ours <= torch's);
- the fixed per-call overhead: a checkpointed tiny function, forward + backward, minus the same
  step without checkpoint; ours / torch's (target <= 0.5).

torch's checkpoint is measured with ckpt_runtime's bypass hooks removed (see NOTE [ Bypassing
torch's checkpoint ]), so it runs exactly as shipped.

    python benchmarks/checkpoint_runtime.py [--rounds 15] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.utils.checkpoint as tuc
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ckpt_runtime.bypass import _uninstall
from ckpt_runtime.checkpoint import checkpoint

Step = Callable[[], None]


def ours(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return checkpoint(block, x, use_reentrant=False)


def theirs(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return tuc.checkpoint(block, x, use_reentrant=False)


def plain(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)


VARIANTS: dict[str, Callable[[nn.Module, torch.Tensor], torch.Tensor]] = {
    "plain": plain,
    "torch": theirs,
    "ours": ours,
}


def make_mlp(width: int, depth: int) -> tuple[list[nn.Module], torch.Tensor]:
    blocks: list[nn.Module] = [
        nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        for _ in range(depth)
    ]
    return blocks, torch.randn(512, width)


def make_transformer(d_model: int, depth: int) -> tuple[list[nn.Module], torch.Tensor]:
    blocks: list[nn.Module] = [
        nn.TransformerEncoderLayer(
            d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.1, batch_first=True
        )
        for _ in range(depth)
    ]
    return blocks, torch.randn(8, 64, d_model)


class TimedStep:
    """One training step through ``wrap(block, h)`` per block; remembers its forward share."""

    def __init__(
        self, blocks: list[nn.Module], x: torch.Tensor, wrap: Callable[..., torch.Tensor]
    ) -> None:
        self.blocks, self.x, self.wrap = blocks, x, wrap
        self.params = [p for b in blocks for p in b.parameters()]
        self.shares: list[float] = []  # forward time / step time, one per call

    def __call__(self) -> None:
        t0 = time.perf_counter()
        for p in self.params:
            p.grad = None
        h = self.x
        for b in self.blocks:
            h = self.wrap(b, h)
        loss = h.float().pow(2).mean()
        t1 = time.perf_counter()
        loss.backward()
        self.shares.append((t1 - t0) / (time.perf_counter() - t0))


def time_interleaved(steps: Mapping[str, Step], rounds: int, per_round: int) -> dict[str, float]:
    """Median seconds per call of each step, measured in interleaved rounds."""
    for step in steps.values():  # warm up
        step()
        step()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(rounds):
        order = list(steps.items())
        if r % 2:
            order.reverse()  # no variant always runs right after the same other one
        for name, step in order:
            t0 = time.perf_counter()
            for _ in range(per_round):
                step()
            samples[name].append((time.perf_counter() - t0) / per_round)
    return {name: statistics.median(s) for name, s in samples.items()}


def peak_bytes(step: Step, params: list[nn.Parameter]) -> int:
    """Peak of the bytes allocated during one step, over what was held when it started.

    Summed from the profiler's allocation events (frees are negative), so the profiler's running
    totals, which also count blocks from before profiling, do not leak in. Gradients are dropped
    before profiling starts so that the step frees nothing it did not allocate.
    """
    from torch.profiler import ProfilerActivity, profile

    step()  # warm
    for p in params:
        p.grad = None
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events: list[tuple[int, int]] = []

    def walk(nodes: Any) -> None:
        for node in nodes:
            extra = node.extra_fields
            if type(extra).__name__ == "_ExtraFields_Allocation":
                events.append((node.start_time_ns, extra.alloc_size))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    events.sort()
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak


def bench_model(
    name: str, blocks: list[nn.Module], x: torch.Tensor, rounds: int, per_round: int
) -> None:
    for b in blocks:
        b.train()
    x.requires_grad_(True)
    steps = {v: TimedStep(blocks, x, wrap) for v, wrap in VARIANTS.items()}
    plain_step = steps["plain"]

    def plain_plus_forward() -> None:  # what a recompute of everything costs at best
        plain_step()
        h = x
        for b in blocks:
            h = b(h)

    times = time_interleaved({**steps, "plain+fwd": plain_plus_forward}, rounds, per_round)
    # measured on the plain step's own timed calls, so under the same machine conditions
    share = statistics.median(plain_step.shares)
    params = [p for b in blocks for p in b.parameters()]
    peaks = {v: peak_bytes(s, params) for v, s in steps.items()}
    mib = 1 << 20
    print(f"\n== {name}: {len(blocks)} blocks, every block checkpointed (use_reentrant=False)")
    for v in steps:
        print(f"  {v:6s} step {times[v] * 1e3:8.2f} ms   peak +{peaks[v] / mib:8.2f} MiB")
    r_torch = times["ours"] / times["torch"]
    r_plain = times["ours"] / times["plain"]
    limit = 1 + share + 0.03
    print(f"  plain step + one more forward: {times['plain+fwd'] * 1e3:8.2f} ms (reference)")
    print(f"  forward share of the plain step: {share:.3f}")
    print(f"  ours / torch  step time  {r_torch:.3f}  (target <= 1.02: {_ok(r_torch <= 1.02)})")
    print(f"  torch / plain step time  {times['torch'] / times['plain']:.3f}")
    met = _ok(r_plain <= limit)
    print(f"  ours / plain  step time  {r_plain:.3f}  (target <= {limit:.3f}: {met})")
    p_ratio = peaks["ours"] / max(peaks["torch"], 1)
    print(f"  ours / torch  peak       {p_ratio:.3f}  (target <= 1: {_ok(p_ratio <= 1.0)})")
    print(f"  plain / torch peak       {peaks['plain'] / max(peaks['torch'], 1):.3f}")


def bench_overhead(rounds: int, per_round: int) -> None:
    x = torch.randn(8, requires_grad=True)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return t.sin()

    def step_plain() -> None:
        fn(x).sum().backward()

    def step_ours() -> None:
        checkpoint(fn, x, use_reentrant=False).sum().backward()

    def step_torch() -> None:
        tuc.checkpoint(fn, x, use_reentrant=False).sum().backward()

    def step_ours_re() -> None:
        checkpoint(fn, x, use_reentrant=True).sum().backward()

    def step_torch_re() -> None:
        tuc.checkpoint(fn, x, use_reentrant=True).sum().backward()

    times = time_interleaved(
        {
            "plain": step_plain,
            "ours": step_ours,
            "torch": step_torch,
            "ours_re": step_ours_re,
            "torch_re": step_torch_re,
        },
        rounds,
        per_round,
    )
    over = {k: (v - times["plain"]) * 1e6 for k, v in times.items() if k != "plain"}
    ratio = over["ours"] / over["torch"]
    print("\n== per-call overhead: checkpoint(tiny fn), forward + backward, minus the plain step")
    print(f"  plain step {times['plain'] * 1e6:7.1f} us")
    print(
        f"  ours  +{over['ours']:6.1f} us   torch +{over['torch']:6.1f} us   (use_reentrant=False)"
    )
    print(
        f"  ours  +{over['ours_re']:6.1f} us   torch +{over['torch_re']:6.1f} us   "
        "(use_reentrant=True)"
    )
    print(f"  ours / torch overhead {ratio:.3f}  (target <= 0.5: {_ok(ratio <= 0.5)})")


def _ok(met: bool) -> str:
    return "met" if met else "NOT met"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a busy box)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller models, fewer rounds")
    args = parser.parse_args(argv)
    _uninstall()  # torch's checkpoint exactly as shipped
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.rounds} rounds")
    if args.quick:
        bench_model("MLP chain", *make_mlp(128, 4), args.rounds, 2)
        bench_model("transformer", *make_transformer(64, 2), args.rounds, 2)
        bench_overhead(args.rounds, 200)
    else:
        bench_model("MLP chain", *make_mlp(512, 8), args.rounds, 1)
        bench_model("transformer", *make_transformer(256, 6), args.rounds, 1)
        bench_overhead(args.rounds, 1000)


if __name__ == "__main__":
    main()
