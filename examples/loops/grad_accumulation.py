"""Train a small MLP regressor with gradient accumulation: k micro-batches per optimizer step.

Each iteration runs forward and backward on ``--accumulate`` micro-batches (the loss scaled by
1/k so the gradient is the mean over the large batch), then one ``optimizer.step()`` and
``zero_grad()``.

    python examples/loops/grad_accumulation.py --steps 6 --accumulate 4
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def build_model(dim: int, hidden: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(dim, hidden), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    layers.append(nn.Linear(hidden, 1))
    return nn.Sequential(*layers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--accumulate", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--micro-batch", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = build_model(args.dim, args.hidden, args.depth)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed)
    w_true = torch.randn(args.dim, 1, generator=gen)

    model.train()
    for step in range(args.steps):
        total = 0.0
        for _ in range(args.accumulate):
            x = torch.randn(args.micro_batch, args.dim, generator=gen)
            y = torch.sin(x @ w_true)
            loss = F.mse_loss(model(x), y) / args.accumulate
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {total:.6f}", flush=True)


if __name__ == "__main__":
    main()
