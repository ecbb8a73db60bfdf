"""Train a small CNN on batches that DataLoader worker processes make (``num_workers=2``).

The Dataset builds each sample on the fly (a class-dependent pattern plus noise), as a dataset
that decodes and augments images would; two workers prepare batches while the model trains.

    python examples/loops/dataloader_workers.py --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """``length`` 1x28x28 images of 10 classes; sample ``i`` is the same on every read."""

    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + i)
        label = int(torch.randint(0, 10, (), generator=gen))
        image = self.patterns[label] + 0.5 * torch.randn(1, 28, 28, generator=gen)
        return image, label


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    dataset = SyntheticImages(args.batch_size * args.steps, args.seed)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=False,
    )
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    model.train()
    for step, (images, labels) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
