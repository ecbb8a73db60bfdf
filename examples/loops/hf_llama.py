"""Causal-LM training of a tiny Llama (Hugging Face transformers) with AdamW.

The model is built from a LlamaConfig (no download) and trained on random tokens.

    python examples/loops/hf_llama.py --steps 6
    python examples/loops/hf_llama.py --checkpoint    # gradient_checkpointing_enable()
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def enable_checkpointing(model: torch.nn.Module) -> None:
    """transformers' per-layer checkpointing (renamed in transformers 5; same thing)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="gradient checkpointing")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=False,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    if args.checkpoint:
        enable_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(args.seed)

    model.train()
    for step in range(args.steps):
        input_ids = torch.randint(
            0, config.vocab_size, (args.batch_size, args.seq_len), generator=gen
        )
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
