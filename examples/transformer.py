"""Train a small causal language model built on torch.nn.TransformerEncoder.

A small, self-contained training script: no downloads, CPU friendly, deterministic.
The data is random tokens, so the loss hovers around log(vocab); the point is the
memory profile of a real training step, not the model quality.

    python examples/transformer.py --steps 6
    python examples/transformer.py --checkpoint  # gradient checkpointing per layer
    python examples/transformer.py --device cuda  # on a GPU
    ckview record -o transformer.h5 --steps 2 examples/transformer.py   # record 2 steps
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class CausalLM(nn.Module):
    def __init__(
        self,
        vocab: int = 1000,
        seq_len: int = 64,
        d_model: int = 128,
        nhead: int = 4,
        num_layers: int = 4,
        dim_feedforward: int = 512,
        dropout: float = 0.1,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True
        )
        # enable_nested_tensor only helps with padding masks, and warns with norm_first.
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.checkpoint = checkpoint

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.shape[1]
        positions = torch.arange(seq_len, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(seq_len, device=tokens.device)
        if self.checkpoint:
            # Run the layers one by one so that each can be checkpointed: only the
            # layer inputs are kept, everything inside is recomputed in backward.
            for layer in self.encoder.layers:
                x = checkpoint(layer, x, src_mask=mask, is_causal=True, use_reentrant=False)
        else:
            x = self.encoder(x, mask=mask, is_causal=True)
        return self.lm_head(self.norm(x))


def build_model(vocab: int = 1000, seq_len: int = 64, checkpoint: bool = False) -> CausalLM:
    return CausalLM(vocab, seq_len, checkpoint=checkpoint)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Train a small causal LM built on torch.nn.TransformerEncoder."
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each layer")
    parser.add_argument("--device", default="cpu", help="where to train: cpu (default), cuda")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = build_model(args.vocab, args.seq_len, checkpoint=args.checkpoint).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data_gen = torch.Generator().manual_seed(args.seed)

    model.train()
    for step in range(args.steps):
        # A fresh batch of random tokens every step, as a data loader would yield.
        tokens = torch.randint(
            0, args.vocab, (args.batch_size, args.seq_len + 1), generator=data_gen
        )
        tokens = tokens.to(args.device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]  # predict the next token

        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
