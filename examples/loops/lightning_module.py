"""Train a small MLP classifier with PyTorch Lightning (automatic optimization).

With automatic optimization Lightning runs ``training_step`` (the forward and the backward)
inside ``optimizer.step(closure)``. No logger, no checkpoint files, no progress bar; Lightning's
working folder is a temporary directory removed at the end.

    python examples/loops/lightning_module.py --steps 6
    python examples/loops/lightning_module.py --steps 6 --residual 6   # a residual MLP
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Residual(nn.Module):
    """A pre-norm MLP block with a skip connection: ``x + net(x)``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class Classifier(L.LightningModule):
    def __init__(self, dim: int, hidden: int, classes: int, lr: float, residual: int = 0) -> None:
        super().__init__()
        self.lr = lr
        if residual:  # a residual MLP: blocks in an nn.Sequential
            self.net = nn.Sequential(
                nn.Linear(dim, hidden),
                *(Residual(hidden) for _ in range(residual)),
                nn.Linear(hidden, classes),
            )
            return
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.LayerNorm(hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.LayerNorm(hidden),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        print(f"step {self.global_step - 1} loss {outputs['loss'].item():.6f}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def make_data(n: int, dim: int, classes: int, seed: int) -> TensorDataset:
    """Gaussian blobs: class c has its own random mean."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, dim, generator=gen) * 2
    y = torch.randint(0, classes, (n,), generator=gen)
    x = means[y] + torch.randn(n, dim, generator=gen)
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--residual", type=int, default=0, help="N residual blocks instead")
    args = parser.parse_args(argv)

    # Lightning's banner (devices, hints) goes to the console logger; keep the output to losses.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    L.seed_everything(args.seed, verbose=False)
    model = Classifier(args.dim, args.hidden, classes=10, lr=1e-3, residual=args.residual)
    data = make_data(args.batch_size * args.steps, args.dim, 10, args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    with tempfile.TemporaryDirectory(prefix="lightning-") as root:
        trainer = L.Trainer(
            max_steps=args.steps,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(model, loader)


if __name__ == "__main__":
    main()
