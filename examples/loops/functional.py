"""Train an MLP written as plain functions over plain tensors: no ``nn.Module`` at all.

The parameters are leaf tensors with ``requires_grad``; the model is a function of them, as in
JAX-style or "from scratch" PyTorch code. By default Adam updates them; ``--manual`` updates
them by hand under ``torch.no_grad()`` instead (no optimizer either).

    python examples/loops/functional.py --steps 6
    python examples/loops/functional.py --manual
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F


def init(dims: list[int], gen: torch.Generator) -> list[torch.Tensor]:
    """Weights and biases of each layer, as leaf tensors that require grad."""
    params = []
    for fan_in, fan_out in itertools.pairwise(dims):
        w = torch.randn(fan_in, fan_out, generator=gen) / fan_in**0.5
        params += [w.requires_grad_(), torch.zeros(fan_out, requires_grad=True)]
    return params


def mlp(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for i in range(0, len(params) - 2, 2):
        x = torch.tanh(x @ params[i] + params[i + 1])
    return x @ params[-2] + params[-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--manual", action="store_true", help="SGD by hand, no optimizer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    gen = torch.Generator().manual_seed(args.seed)
    params = init([args.dim] + [args.hidden] * args.depth + [10], gen)
    optimizer = None if args.manual else torch.optim.Adam(params, lr=args.lr)
    means = torch.randn(10, args.dim, generator=gen)

    for step in range(args.steps):
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        x = means[y] + torch.randn(args.batch_size, args.dim, generator=gen)
        loss = F.cross_entropy(mlp(params, x), y)
        loss.backward()
        if optimizer is None:
            with torch.no_grad():
                for p in params:
                    p -= 100 * args.lr * p.grad
                    p.grad = None
        else:
            optimizer.step()
            optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
