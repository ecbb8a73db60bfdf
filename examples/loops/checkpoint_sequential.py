"""Train a deep residual MLP driven by ``torch.utils.checkpoint.checkpoint_sequential``.

The model's blocks sit in an ``nn.Sequential``; with ``--checkpoint`` the forward runs it with
``checkpoint_sequential(self.layers, segments, x)`` (only each segment's input is kept; the
segments are recomputed in backward), otherwise it calls the Sequential.

    python examples/loops/checkpoint_sequential.py --steps 6
    python examples/loops/checkpoint_sequential.py --checkpoint --segments 3
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int, depth: int, segments: int, checkpoint: bool) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(Block(dim, hidden) for _ in range(depth)))
        self.head = nn.Linear(dim, dim)
        self.segments = segments
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint:
            x = checkpoint_sequential(self.layers, self.segments, x, use_reentrant=False)
        else:
            x = self.layers(x)
        return self.head(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="use checkpoint_sequential")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = Model(args.dim, args.hidden, args.depth, args.segments, args.checkpoint)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed)
    target = torch.randn(args.dim, args.dim, generator=gen) / args.dim**0.5

    model.train()
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.dim, generator=gen)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), torch.tanh(x @ target))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
