"""Train a plain multilayer perceptron: one flat ``nn.Sequential`` of alternating Linear / ReLU.

python examples/loops/linear_relu.py --steps 6
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
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=8, help="Linear/ReLU pairs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.dim, args.dim), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.dim, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(args.seed)
    means = torch.randn(10, args.dim, generator=gen)

    for step in range(args.steps):
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        x = means[y] + torch.randn(args.batch_size, args.dim, generator=gen)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
