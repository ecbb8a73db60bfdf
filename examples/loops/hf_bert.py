"""Masked-language-model pretraining of a tiny BERT (Hugging Face transformers) with AdamW.

The model is built from a BertConfig (no download); the data are random token ids, 15% of
them replaced by [MASK] and predicted.

    python examples/loops/hf_bert.py --steps 6
    python examples/loops/hf_bert.py --checkpoint     # transformers' own gradient checkpointing
"""

from __future__ import annotations

import argparse

import torch
from transformers import BertConfig, BertForMaskedLM


def enable_checkpointing(model: torch.nn.Module) -> None:
    """transformers' per-layer checkpointing (renamed in transformers 5; same thing)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="gradient checkpointing")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    config = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
        use_cache=False,
        attn_implementation="eager",
    )
    model = BertForMaskedLM(config)
    if args.checkpoint:
        enable_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    mask_id, first_word = 4, 5  # ids below 5 are special tokens
    gen = torch.Generator().manual_seed(args.seed)

    model.train()
    for step in range(args.steps):
        input_ids = torch.randint(
            first_word, config.vocab_size, (args.batch_size, args.seq_len), generator=gen
        )
        masked = torch.rand(input_ids.shape, generator=gen) < 0.15
        labels = input_ids.masked_fill(~masked, -100)
        input_ids = input_ids.masked_fill(masked, mask_id)
        attention_mask = torch.ones_like(input_ids)

        outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        outputs.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {outputs.loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
