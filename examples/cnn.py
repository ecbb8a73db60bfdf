"""Train a small CNN on synthetic 32x32 RGB images with 10 classes.

A small, self-contained training script: no downloads, CPU friendly, deterministic.

    python examples/cnn.py --steps 6
    python examples/cnn.py --checkpoint          # gradient checkpointing per conv block
    ckview record -o cnn.h5 --steps 2 examples/cnn.py   # record 2 steps
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def conv_block(c_in: int, c_out: int, dropout: float) -> nn.Sequential:
    """Two 3x3 convs with BatchNorm and ReLU, then dropout and 2x2 max pooling."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.MaxPool2d(2),
    )


class SmallCNN(nn.Module):
    def __init__(
        self,
        widths: tuple[int, ...] = (32, 64, 128),
        num_classes: int = 10,
        dropout: float = 0.1,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        channels = (3, *widths)
        self.features = nn.Sequential(
            *(conv_block(channels[i], channels[i + 1], dropout) for i in range(len(widths)))
        )
        self.head = nn.Linear(widths[-1], num_classes)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint:
            for block in self.features:
                # The block is recomputed in backward. torch restores the RNG state, so
                # Dropout draws the same mask again. BatchNorm running stats are updated a
                # second time (num_batches_tracked counts 2 per step), but the training loss
                # only uses batch statistics, so it is unchanged.
                x = checkpoint(block, x, use_reentrant=False)
        else:
            x = self.features(x)  # calling the Sequential lets a ckview plan segment it
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.head(x)


def build_model(
    widths: tuple[int, ...] = (32, 64, 128), num_classes: int = 10, checkpoint: bool = False
) -> SmallCNN:
    return SmallCNN(widths, num_classes, checkpoint=checkpoint)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Train a small CNN on synthetic 32x32 RGB images with 10 classes."
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each conv block")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = build_model(checkpoint=args.checkpoint)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    # Synthetic "images": each class has its own mean image, plus noise.
    data_gen = torch.Generator().manual_seed(args.seed)
    class_means = torch.randn(10, 3, 32, 32, generator=data_gen)

    model.train()
    for step in range(args.steps):
        # A fresh batch every step, as a data loader would yield.
        labels = torch.randint(0, 10, (args.batch_size,), generator=data_gen)
        images = class_means[labels] + torch.randn(args.batch_size, 3, 32, 32, generator=data_gen)

        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
