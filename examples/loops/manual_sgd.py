"""Train a small MLP classifier with hand-written SGD: no optimizer object.

After ``loss.backward()`` the parameters are updated in place under ``torch.no_grad()`` and
their gradients zeroed, as in the PyTorch "Learning PyTorch with examples" tutorial.

    python examples/loops/manual_sgd.py --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

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
    gen = torch.Generator().manual_seed(args.seed)
    means = torch.randn(10, args.dim, generator=gen)

    for step in range(args.steps):
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        x = means[y] + torch.randn(args.batch_size, args.dim, generator=gen)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= args.lr * p.grad
                p.grad.zero_()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
