"""Train a residual MLP whose ``nn.Sequential`` of blocks is looped over in Python.

``forward`` runs ``for layer in self.layers: x = layer(x)`` (so ``nn.Sequential.forward`` itself
never runs); with ``--checkpoint`` each block call is wrapped in ``torch.utils.checkpoint``.

    python examples/loops/python_loop_sequential.py --steps 6
    python examples/loops/python_loop_sequential.py --checkpoint
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int, depth: int, checkpoint: bool) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(Block(dim, hidden) for _ in range(depth)))
        self.head = nn.Linear(dim, dim)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpoint else layer(x)
        return self.head(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each block")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = Model(args.dim, args.hidden, args.depth, args.checkpoint)
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
