"""Train a small MLP wrapped in DistributedDataParallel (gloo backend, one process).

A single-process "cluster" (world size 1, rank 0) on 127.0.0.1: the usual DDP training loop
without a launcher. ``--world-size`` is fixed at 1 so that the script runs anywhere.

    python examples/loops/ddp.py --steps 6
"""

from __future__ import annotations

import argparse
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(args.seed)
        model = nn.Sequential(
            nn.Linear(args.dim, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, 10),
        )
        ddp_model = DDP(model)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(args.seed + dist.get_rank())
        means = torch.randn(10, args.dim, generator=gen)

        for step in range(args.steps):
            y = torch.randint(0, 10, (args.batch_size,), generator=gen)
            x = means[y] + torch.randn(args.batch_size, args.dim, generator=gen)
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(x), y)
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            if dist.get_rank() == 0:
                print(f"step {step} loss {loss.item():.6f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
