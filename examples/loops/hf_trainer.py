"""Fine-tune a tiny BERT classifier with the Hugging Face ``Trainer``.

The model is built from a BertConfig (no download); the dataset is a small in-memory list of
random token sequences whose label is whether token 7 occurs in them. Nothing is written to
disk except into a temporary output folder that is removed at the end.

    python examples/loops/hf_trainer.py --steps 6
    python examples/loops/hf_trainer.py --checkpoint   # TrainingArguments(activation_checkpointing)
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class RandomTokens(torch.utils.data.Dataset):
    """``n`` random sequences, labelled 1 if they contain token 7."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(5, vocab, (n, seq_len), generator=gen)
        self.labels = (self.input_ids == 7).any(dim=1).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


class PrintLoss(TrainerCallback):
    """Print the training loss the Trainer logs every step."""

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if logs and "loss" in logs:
            print(f"step {state.global_step - 1} loss {logs['loss']:.6f}", flush=True)


def checkpointing_argument(on: bool) -> dict[str, bool]:
    """The TrainingArguments field for per-layer checkpointing (renamed in transformers 5)."""
    fields = TrainingArguments.__dataclass_fields__
    name = (
        "activation_checkpointing"
        if "activation_checkpointing" in fields
        else ("gradient_checkpointing")
    )
    return {name: on}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true", help="gradient checkpointing")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    config = BertConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        num_labels=2,
        use_cache=False,
        attn_implementation="eager",
    )
    model = BertForSequenceClassification(config)
    dataset = RandomTokens(256, args.seq_len, config.vocab_size, args.seed)

    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as out:
        training_args = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=5e-4,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=True,
            seed=args.seed,
            **checkpointing_argument(args.checkpoint),
        )
        trainer = Trainer(
            model=model, args=training_args, train_dataset=dataset, callbacks=[PrintLoss()]
        )
        trainer.train()


if __name__ == "__main__":
    main()
