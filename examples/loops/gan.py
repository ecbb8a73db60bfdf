"""Train a small GAN on a 2-D mixture of Gaussians: two models, two optimizers.

Each iteration is a discriminator step (real vs. detached fake samples, ``opt_d.step()``), then
a generator step (fool the discriminator, ``opt_g.step()``), as in the DCGAN tutorial.

    python examples/loops/gan.py --steps 6
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn


def mlp(sizes: list[int], final: nn.Module | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.LeakyReLU(0.2))
    if final is not None:
        layers.append(final)
    return nn.Sequential(*layers)


def real_batch(n: int, gen: torch.Generator) -> torch.Tensor:
    """Samples from 8 Gaussians on a circle of radius 2."""
    k = torch.randint(0, 8, (n,), generator=gen).float() * (2 * math.pi / 8)
    centers = torch.stack([torch.cos(k), torch.sin(k)], dim=1) * 2
    return centers + 0.05 * torch.randn(n, 2, generator=gen)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--latent", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    h = args.hidden
    generator = mlp([args.latent, h, h, h, 2])
    discriminator = mlp([2, h, h, h, 1])
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    gen = torch.Generator().manual_seed(args.seed)
    ones = torch.ones(args.batch_size, 1)
    zeros = torch.zeros(args.batch_size, 1)

    for step in range(args.steps):
        real = real_batch(args.batch_size, gen)
        z = torch.randn(args.batch_size, args.latent, generator=gen)
        fake = generator(z)

        # Discriminator: real -> 1, fake -> 0 (the generator is not updated here).
        opt_d.zero_grad()
        loss_d = F.binary_cross_entropy_with_logits(discriminator(real), ones) + (
            F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
        )
        loss_d.backward()
        opt_d.step()

        # Generator: make the discriminator say 1 on fakes.
        opt_g.zero_grad()
        loss_g = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        loss_g.backward()
        opt_g.step()
        print(f"step {step} loss {loss_d.item() + loss_g.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
