"""The "HeavyModel" of a popular gradient-checkpointing tutorial: a very deep graph of tiny ops.

``heavy_function`` adds a learnable scalar 100 times (``x = x + a``); the forward calls it
``--size`` times (1,000 by default: 100,000 autograd nodes per forward). There is no optimizer:
the loop only runs forward and backward and reports the loss. With ``--checkpoint`` every call
of ``heavy_function`` is checkpointed.

    python examples/loops/heavy_model.py --steps 4
    python examples/loops/heavy_model.py --checkpoint --size 50
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class HeavyModel(nn.Module):
    def __init__(self, calls: int, use_checkpoint: bool) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.01))
        self.calls = calls
        self.use_checkpoint = use_checkpoint

    def heavy_function(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(100):
            x = x + self.a
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.calls):
            if self.use_checkpoint:
                # The tutorial's checkpoint() predates use_reentrant and so ran the reentrant
                # variant, which always recomputes (the non-reentrant one recomputes only
                # when backward unpacks a saved tensor, and these adds save none).
                x = checkpoint(self.heavy_function, x, use_reentrant=True)
            else:
                x = self.heavy_function(x)
        return x


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--size", type=int, default=1000, help="calls of heavy_function per forward (100 adds each)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each call")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = HeavyModel(args.size, args.checkpoint)
    for step in range(args.steps):
        x = torch.randn(16, requires_grad=True)
        loss = model(x).sum()
        loss.backward()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
