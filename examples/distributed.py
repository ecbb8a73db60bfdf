"""Data-parallel training of a small MLP with DDP or FSDP (``fully_shard``), gloo on the CPU.

    torchrun --nproc-per-node 2 examples/distributed.py [--fsdp] [--steps N] [--uneven]
    python examples/distributed.py            # no launcher: one rank, in this process
    ckview record -m torch.distributed.run --nproc-per-node 2 examples/distributed.py --fsdp

``--uneven`` gives rank R a batch R+1 times as large (as ranks with longer sequences have), so
that the ranks' peaks differ.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, width: int, ckpt: bool) -> None:
        super().__init__()
        self.ckpt = ckpt
        self.net = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ckpt:
            return x + checkpoint(self.net, x, use_reentrant=False)
        return x + self.net(x)


def build(width: int, depth: int, ckpt: bool) -> nn.Module:
    return nn.Sequential(*(Block(width, ckpt) for _ in range(depth)), nn.Linear(width, 10))


def start_group() -> None:
    """The launcher's process group, or, run without one, a group of this process alone."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        return
    print(
        "distributed.py: no launcher, running as one rank "
        "(torchrun --nproc-per-node 2 examples/distributed.py for two)",
        file=sys.stderr,
    )
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fsdp", action="store_true", help="fully_shard each block (FSDP2)")
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each block")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--uneven", action="store_true", help="rank R takes R+1 batches")
    args = parser.parse_args()

    start_group()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = build(args.width, 3, args.checkpoint)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model[:-1]:
            fully_shard(block)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = args.batch * (rank + 1 if args.uneven else 1)
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(batch, args.width, generator=generator)
        y = torch.randint(0, 10, (batch,), generator=generator)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
