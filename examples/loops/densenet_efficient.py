"""Train a small memory-efficient DenseNet whose checkpointing is a hand-written autograd.Function.

As in csrhddlam/pytorch-checkpoint (a multi-GPU friendly take on the memory-efficient DenseNet):
``CheckpointFunction`` runs the concat-BN-ReLU-Conv1x1 "bottleneck" of each dense layer under
``torch.no_grad()`` in forward and recomputes it in its own ``backward``. The recompute is part
of the model's autograd graph, so it cannot be switched off from outside.

    python examples/loops/densenet_efficient.py --steps 6
    python examples/loops/densenet_efficient.py --checkpoint   # efficient=True
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class CheckpointFunction(torch.autograd.Function):
    """Run ``run_function`` without saving anything; recompute it in backward."""

    @staticmethod
    def forward(
        ctx: Any, run_function: Callable[..., torch.Tensor], length: int, *args: torch.Tensor
    ) -> torch.Tensor:
        ctx.run_function = run_function
        ctx.input_tensors = list(args[:length])
        ctx.input_params = list(args[length:])
        with torch.no_grad():
            return run_function(*ctx.input_tensors)

    @staticmethod
    def backward(ctx: Any, *output_grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.input_tensors]
        with torch.enable_grad():
            outputs = ctx.run_function(*inputs)
        grads = torch.autograd.grad(
            outputs, inputs + ctx.input_params, output_grads, allow_unused=True
        )
        return (None, None, *grads)


def bn_function_factory(
    norm: nn.Module, relu: nn.Module, conv: nn.Module
) -> Callable[..., torch.Tensor]:
    def bn_function(*inputs: torch.Tensor) -> torch.Tensor:
        return conv(relu(norm(torch.cat(inputs, 1))))

    return bn_function


class DenseLayer(nn.Module):
    def __init__(self, in_features: int, growth: int, bn_size: int, efficient: bool) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(in_features, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)
        self.efficient = efficient

    def forward(self, *prev_features: torch.Tensor) -> torch.Tensor:
        bn_function = bn_function_factory(self.norm1, self.relu1, self.conv1)
        if self.efficient and any(f.requires_grad for f in prev_features):
            params = (*self.norm1.parameters(), *self.conv1.parameters())
            bottleneck = CheckpointFunction.apply(
                bn_function, len(prev_features), *prev_features, *params
            )
        else:
            bottleneck = bn_function(*prev_features)
        return self.conv2(self.relu2(self.norm2(bottleneck)))


class DenseBlock(nn.Module):
    def __init__(
        self, layers: int, in_features: int, growth: int, bn_size: int, efficient: bool
    ) -> None:
        super().__init__()
        for i in range(layers):
            layer = DenseLayer(in_features + i * growth, growth, bn_size, efficient)
            self.add_module(f"denselayer{i + 1}", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.children():
            features.append(layer(*features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(
        self,
        growth: int = 8,
        blocks: tuple[int, ...] = (3, 3, 3),
        bn_size: int = 4,
        classes: int = 10,
        efficient: bool = False,
    ) -> None:
        super().__init__()
        features = 2 * growth
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, features, 3, padding=1, bias=False))
        for i, n in enumerate(blocks):
            block = DenseBlock(n, features, growth, bn_size, efficient)
            self.features.add_module(f"denseblock{i + 1}", block)
            features += n * growth
            if i != len(blocks) - 1:
                transition = nn.Sequential(
                    nn.BatchNorm2d(features),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(features, features // 2, 1, bias=False),
                    nn.AvgPool2d(2),
                )
                self.features.add_module(f"transition{i + 1}", transition)
                features //= 2
        self.features.add_module("norm_final", nn.BatchNorm2d(features))
        self.classifier = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.features(x), inplace=True)
        return self.classifier(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="memory-efficient mode: recompute each bottleneck in backward",
    )
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = DenseNet(efficient=args.checkpoint)
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
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
