"""Train a small word-level LSTM language model (as in PyTorch's word_language_model example).

Embedding -> 3 stacked LSTMs (dropout between) -> tied decoder, truncated backpropagation
through time over a synthetic token stream, gradient clipping, SGD.

    python examples/loops/lstm_lm.py --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class LSTMLanguageModel(nn.Module):
    """Embedding, a stack of single-layer LSTMs with dropout between them, a tied decoder."""

    def __init__(self, vocab: int, dim: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, dim)
        self.rnns = nn.ModuleList(nn.LSTM(dim, dim) for _ in range(layers))
        self.decoder = nn.Linear(dim, vocab)
        self.decoder.weight = self.encoder.weight  # weight tying

    def forward(
        self, tokens: torch.Tensor, hidden: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        x = self.drop(self.encoder(tokens))
        new_hidden = []
        for rnn, state in zip(self.rnns, hidden, strict=True):
            x, state = rnn(x, state)
            new_hidden.append(state)
            x = self.drop(x)
        return self.decoder(x), new_hidden


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bptt", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    # A token stream with some structure: each token is often the previous one plus one.
    length = args.bptt * args.steps + 1
    stream = torch.randint(0, args.vocab, (length, args.batch_size), generator=gen)
    follow = torch.rand(length, args.batch_size, generator=gen) < 0.5
    for t in range(1, length):
        stream[t] = torch.where(follow[t], (stream[t - 1] + 1) % args.vocab, stream[t])

    model = LSTMLanguageModel(args.vocab, args.dim, args.layers, dropout=0.2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    hidden = [
        (torch.zeros(1, args.batch_size, args.dim), torch.zeros(1, args.batch_size, args.dim))
        for _ in range(args.layers)
    ]

    model.train()
    for step in range(args.steps):
        i = step * args.bptt
        tokens, targets = stream[i : i + args.bptt], stream[i + 1 : i + 1 + args.bptt]
        hidden = [(h.detach(), c.detach()) for h, c in hidden]  # truncated BPTT
        model.zero_grad()
        logits, hidden = model(tokens, hidden)
        loss = F.cross_entropy(logits.view(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
