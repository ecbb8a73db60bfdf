"""Train a stack of blocks that each end in an activation (Tanh, ReLU or GELU).

Each block is ``Linear -> LayerNorm -> activation``, so the last op of a block is one that
saves its own output (Tanh, ReLU) or input (GELU) for backward; the blocks sit in an
``nn.Sequential``. Regression onto a fixed random map with MSE and Adam.

    python examples/loops/activation_blocks.py --steps 6 --activation tanh
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


def block(dim: int, activation: str) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim), ACTIVATIONS[activation]())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--activation", choices=sorted(ACTIVATIONS), default="tanh")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Sequential(*(block(args.dim, args.activation) for _ in range(args.depth))),
        nn.Linear(args.dim, args.dim),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed)
    target = torch.randn(args.dim, args.dim, generator=gen) / args.dim**0.5

    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.dim, generator=gen)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), torch.tanh(x @ target))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
