"""Train a deep residual MLP on synthetic regression data.

A small, self-contained training script: no downloads, CPU friendly, deterministic.

    python examples/mlp.py --steps 6
    python examples/mlp.py --checkpoint          # gradient checkpointing per block
    ckview record -o mlp.h5 --steps 2 examples/mlp.py   # record 2 steps
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    """Pre-norm residual MLP block: x + Linear(GELU(Linear(LayerNorm(x))))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, depth: int, checkpoint: bool = False) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim, hidden) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, dim)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint:
            for block in self.blocks:
                # Only the block input is kept; the activations inside the block are
                # recomputed during backward.
                x = checkpoint(block, x, use_reentrant=False)
        else:
            x = self.blocks(x)  # calling the Sequential lets a ckview plan segment it
        return self.head(self.norm(x))


def build_model(
    dim: int = 512, hidden: int = 2048, depth: int = 8, checkpoint: bool = False
) -> ResidualMLP:
    return ResidualMLP(dim, hidden, depth, checkpoint=checkpoint)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Train a deep residual MLP on synthetic regression data."
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each block")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = build_model(args.dim, args.hidden, args.depth, checkpoint=args.checkpoint)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    # A fixed random linear map is the "ground truth" the model has to learn.
    data_gen = torch.Generator().manual_seed(args.seed)
    target_map = torch.randn(args.dim, args.dim, generator=data_gen) / args.dim**0.5

    model.train()
    for step in range(args.steps):
        # A fresh batch every step, as a data loader would yield.
        x = torch.randn(args.batch_size, args.dim, generator=data_gen)
        y = torch.tanh(x @ target_map)

        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
