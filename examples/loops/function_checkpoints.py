"""Train a small transformer-style encoder whose checkpoints wrap plain functions.

The blocks hold the weights (``nn.Module`` containers in an ``nn.ModuleList``), but the model's
forward calls module-level functions ``attention(block, x)`` and ``feed_forward(block, x)``
rather than the blocks themselves; with ``--checkpoint`` each call is
``checkpoint(fn, block, x)``.

    python examples/loops/function_checkpoints.py --steps 6
    python examples/loops/function_checkpoints.py --checkpoint
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class BlockWeights(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)


def attention(block: BlockWeights, x: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = block.qkv(block.norm1(x)).view(b, t, 3, block.heads, d // block.heads).unbind(2)
    scores = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / (d // block.heads) ** 0.5
    out = scores.softmax(-1) @ v.transpose(1, 2)
    return block.proj(out.transpose(1, 2).reshape(b, t, d))


def feed_forward(block: BlockWeights, x: torch.Tensor) -> torch.Tensor:
    return block.fc2(F.gelu(block.fc1(block.norm2(x))))


class Encoder(nn.Module):
    def __init__(self, dim: int, heads: int, depth: int, checkpoint: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(BlockWeights(dim, heads) for _ in range(depth))
        self.head = nn.Linear(dim, 2)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            for fn in (attention, feed_forward):
                if self.checkpoint:
                    x = x + checkpoint(fn, block, x, use_reentrant=False)
                else:
                    x = x + fn(block, x)
        return self.head(x.mean(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each function call")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = Encoder(args.dim, 4, args.depth, args.checkpoint)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed)

    model.train()
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.seq_len, args.dim, generator=gen)
        y = (x[:, :, 0].mean(1) > 0).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
