"""What the recording journal costs per step (NOTE [ The recording journal ]).

    python benchmarks/step_flush.py [--steps N] [--repeat K]

Records N steps of a few models with ``Recorder`` as it is (a journal record per step: the
step's rows flushed from the hot-path buffers, deflated and appended to the journal) and with
the journal switched off, interleaved K times (these machines are noisy; the best run counts),
and prints side by side: ms per recorded step, the ratio, the journal's bytes per step and its
size next to the trace's. No number here is asserted by a test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from recorder import Recorder
from recorder.sink import TraceSink as Session

Model = Callable[[], tuple[torch.nn.Module, torch.Tensor]]


def mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    layers = [torch.nn.Linear(64, 64) for _ in range(8)]
    return torch.nn.Sequential(*layers), torch.randn(32, 64)


def cnn() -> tuple[torch.nn.Module, torch.Tensor]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 16 * 16, 10),
    )
    return model, torch.randn(8, 3, 16, 16)


def transformer() -> tuple[torch.nn.Module, torch.Tensor]:
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), torch.randn(4, 16, 64)


MODELS: dict[str, Model] = {"mlp": mlp, "cnn": cnn, "transformer": transformer}


def record(make: Model, steps: int, folder: Path, journal: bool) -> tuple[float, int, int]:
    """Seconds per recorded step, journal bytes (largest seen), trace bytes."""
    torch.manual_seed(0)
    model, batch = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = folder / f"t-{journal}.h5"
    biggest = [0]
    original = Session.journal_step

    def measured(self: Any, *args: Any) -> None:
        original(self, *args)
        if self.journal.exists():
            biggest[0] = max(biggest[0], self.journal.stat().st_size)

    Session.journal_step = measured if journal else (lambda self, *args: None)  # type: ignore[method-assign]
    try:
        with Recorder(path, steps=steps, warmup=1) as rec:
            start = 0.0
            for i in range(steps + 1):
                if i == 1:
                    start = time.perf_counter()
                model(batch).sum().backward()
                opt.step()
                opt.zero_grad()
            elapsed = time.perf_counter() - start
        del rec
    finally:
        Session.journal_step = original  # type: ignore[method-assign]
    return elapsed / steps, biggest[0], path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"{args.steps} recorded steps per run, best of {args.repeat}, interleaved")
    header = (
        f"{'model':<12} {'no journal':>11} {'journal':>9} {'ratio':>6} "
        f"{'journal/step':>13} {'journal':>9} {'trace':>9}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, make in MODELS.items():
            best = {False: float("inf"), True: float("inf")}
            sizes = (0, 0)
            for _ in range(args.repeat):
                for journal in (False, True):
                    per_step, journal_bytes, trace_bytes = record(make, args.steps, folder, journal)
                    best[journal] = min(best[journal], per_step)
                    if journal:
                        sizes = (journal_bytes, trace_bytes)
            print(
                f"{name:<12} {best[False] * 1e3:>9.2f}ms {best[True] * 1e3:>7.2f}ms "
                f"{best[True] / best[False]:>6.2f} {sizes[0] / args.steps / 1024:>10.1f}KiB "
                f"{sizes[0] / 1024:>7.0f}KiB {sizes[1] / 1024:>7.0f}KiB"
            )


if __name__ == "__main__":
    main()
