"""Fit a small MLP to a 1-D function with L-BFGS: ``optimizer.step(closure)``.

L-BFGS re-evaluates the loss several times per step, so the forward and backward run inside
the closure that ``step`` calls (up to ``max_iter`` times per step).

    python examples/loops/lbfgs.py --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--points", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--max-iter", type=int, default=4, help="L-BFGS iterations per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(1, args.hidden),
        nn.Tanh(),
        nn.Linear(args.hidden, args.hidden),
        nn.Tanh(),
        nn.Linear(args.hidden, 1),
    )
    optimizer = torch.optim.LBFGS(
        model.parameters(), lr=0.5, max_iter=args.max_iter, history_size=10
    )
    x = torch.linspace(-3, 3, args.points).unsqueeze(1)
    y = torch.sin(2 * x) + 0.3 * x

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    for step in range(args.steps):
        loss = optimizer.step(closure)
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
