"""Train a tiny Hugging Face GPT-2 from scratch on random tokens.

The model is built from a GPT2Config, so nothing is downloaded. The data is random
tokens, so the loss hovers around log(vocab); the point is the memory profile of a
real training step, not the model quality.

    python examples/gpt2.py --steps 6
    python examples/gpt2.py --checkpoint         # HF gradient checkpointing per block
    ckview record -o gpt2.h5 --steps 2 examples/gpt2.py   # record 2 steps
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model(
    vocab: int = 1000,
    n_positions: int = 128,
    n_layer: int = 4,
    n_embd: int = 128,
    n_head: int = 4,
    checkpoint: bool = False,
) -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=n_positions,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        # GPT-2's special tokens default to id 50256; keep them inside our small vocab.
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
        use_cache=False,  # no KV cache in training (and it conflicts with checkpointing)
        attn_implementation="eager",
    )
    model = GPT2LMHeadModel(config)
    # The class name does not end in "ForCausalLM", so transformers cannot infer the loss
    # and warns; name it explicitly (same loss either way).
    model.loss_type = "ForCausalLM"
    if checkpoint:
        # Checkpoint every transformer block; non-reentrant is the recommended variant.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:  # older name, deprecated in newer releases
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Train a tiny Hugging Face GPT-2 from scratch on random tokens."
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="checkpoint each block")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    n_positions = max(128, args.seq_len)
    model = build_model(args.vocab, n_positions, checkpoint=args.checkpoint)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data_gen = torch.Generator().manual_seed(args.seed)

    model.train()
    for step in range(args.steps):
        # A fresh batch of random tokens every step, as a data loader would yield.
        shape = (args.batch_size, args.seq_len)
        input_ids = torch.randint(0, args.vocab, shape, generator=data_gen)

        optimizer.zero_grad(set_to_none=True)
        # With labels=input_ids the model shifts them and returns the next-token loss.
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
