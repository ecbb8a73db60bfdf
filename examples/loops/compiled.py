"""Train a small MLP compiled with ``torch.compile`` (inductor; on the CPU it builds C++ kernels).

python examples/loops/compiled.py --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())
            for _ in range(depth)
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.out(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = MLP(args.dim, args.hidden, args.depth)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed)
    w_true = torch.randn(args.dim, 1, generator=gen)

    model.train()
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.dim, generator=gen)
        y = torch.tanh(x @ w_true)
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
