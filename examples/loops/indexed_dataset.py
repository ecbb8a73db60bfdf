"""Train a small MLP on an in-memory dataset tensor that the loop indexes: ``x = data[idx]``.

The whole (synthetic) dataset lives in two tensors made up front; each step draws random
indices and gathers its batch from them, as many research loops do instead of a DataLoader.

    python examples/loops/indexed_dataset.py --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    data = torch.randn(args.samples, args.dim, generator=gen)
    targets = (data[:, : args.dim // 2].sum(1) > 0).long()
    model = nn.Sequential(
        nn.Linear(args.dim, args.hidden),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 2),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    model.train()
    for step in range(args.steps):
        idx = torch.randint(0, args.samples, (args.batch_size,), generator=gen)
        x, y = data[idx], targets[idx]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
