"""Train a small DenseNet-BC (BatchNorm, dense connectivity) on synthetic 16x16 images.

The layout follows torchvision's DenseNet: dense layers (BN-ReLU-Conv1x1-BN-ReLU-Conv3x3) that
each see the concatenation of all earlier feature maps, transitions (BN-ReLU-Conv1x1-AvgPool)
between dense blocks, SGD with momentum and weight decay.

    python examples/loops/densenet.py --steps 6
    python examples/loops/densenet.py --checkpoint   # torch.utils.checkpoint per dense layer
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class DenseLayer(nn.Module):
    def __init__(self, in_features: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_features, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, *prev_features: torch.Tensor) -> torch.Tensor:
        x = torch.cat(prev_features, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(
        self, layers: int, in_features: int, growth: int, bn_size: int, checkpoint: bool
    ) -> None:
        super().__init__()
        for i in range(layers):
            self[f"denselayer{i + 1}"] = DenseLayer(in_features + i * growth, growth, bn_size)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            if self.checkpoint and x.requires_grad:
                new = checkpoint(layer, *features, use_reentrant=False)
            else:
                new = layer(*features)
            features.append(new)
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(
            nn.BatchNorm2d(in_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(in_features, out_features, 1, bias=False),
            nn.AvgPool2d(2),
        )


class DenseNet(nn.Module):
    def __init__(
        self,
        growth: int = 8,
        blocks: tuple[int, ...] = (3, 3, 3),
        bn_size: int = 4,
        classes: int = 10,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        features = 2 * growth
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, features, 3, padding=1, bias=False))
        for i, n in enumerate(blocks):
            block = DenseBlock(n, features, growth, bn_size, checkpoint)
            self.features.add_module(f"denseblock{i + 1}", block)
            features += n * growth
            if i != len(blocks) - 1:
                self.features.add_module(f"transition{i + 1}", Transition(features, features // 2))
                features //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(features))
        self.classifier = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.features(x), inplace=True)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.classifier(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each dense layer")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = DenseNet(checkpoint=args.checkpoint)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True
    )
    gen = torch.Generator().manual_seed(args.seed)
    class_means = torch.randn(10, 3, 1, 1, generator=gen)

    model.train()
    for step in range(args.steps):
        y = torch.randint(0, 10, (args.batch_size,), generator=gen)
        shape = (args.batch_size, 3, args.image_size, args.image_size)
        x = class_means[y] + torch.randn(shape, generator=gen)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
