"""On a CUDA GPU: the recorder against the caching allocator, an OOM, and the recorder's cost.

    python benchmarks/cuda_check.py [--rounds 5] [--layers 4] [--batch 16]

1. Records a small transformer training step (TransformerEncoder, d=256, seq 128) without and
   with checkpointing (``torch.utils.checkpoint`` per layer) and compares the recorded peak
   with ``torch.cuda.max_memory_allocated()`` over the same step (reset before it), and with the
   allocator's peak the trace's ``device_samples`` hold.
2. Forces an OOM under ``torch.cuda.set_per_process_memory_fraction`` and checks the trace:
   the run is marked as ended in an OOM, with the op, the module and the bytes asked for.
3. Plain timing steps (``timing_steps``) against synchronised steps timed here: device time,
   not launch time.
4. The native recorder's memory reporter: the allocator total it saw against
   ``torch.cuda.max_memory_allocated()`` over one step.
5. Times plain and recorded steps in interleaved rounds (medians, CUDA synchronised).

Prints one table. On a machine without a GPU it prints one line, "no GPU: ...", and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckview.analysis import format_bytes as fb  # noqa: E402
from ckview.analysis import summarize_run  # noqa: E402
from ckview.analysis.device import Oom, device_states  # noqa: E402
from ckview.trace import open_trace  # noqa: E402
from recorder import Recorder  # noqa: E402

Step = Callable[[], None]
D_MODEL, SEQ, HEADS = 256, 128, 8


class Encoder(nn.Module):
    """TransformerEncoder layers, each checkpointed when ``checkpointed``."""

    def __init__(self, layers: int, checkpointed: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, batch_first=True)
            for _ in range(layers)
        )
        self.head = nn.Linear(D_MODEL, D_MODEL)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpointed else layer(x)
        return self.head(x)


def make_step(layers: int, batch: int, checkpointed: bool) -> Step:
    torch.manual_seed(0)
    model = Encoder(layers, checkpointed).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        x = torch.randn(batch, SEQ, D_MODEL, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(step: Step) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def record(step: Step, path: Path, steps: int = 1) -> tuple[list[float], int]:
    """Record ``steps`` timed steps after one warm-up, and one more that closes the trace
    (untimed: writing the file is no per-step cost); the times, and max_memory_allocated over
    the last timed one (reset as it begins)."""
    times, allocated = [], -1
    with Recorder(path, steps=steps + 1, warmup=1, progress=False, command=["cuda_check"]):
        step()
        for _ in range(steps):
            torch.cuda.reset_peak_memory_stats()
            times.append(timed(step))
            allocated = torch.cuda.max_memory_allocated()
        step()
    return times, allocated


def peaks(path: Path) -> tuple[int, int]:
    """The recorded peak of the trace's run, and the allocator's peak its samples hold."""
    with open_trace(path) as trace:
        tables = trace.read_run("main")
        states = device_states(tables["device_samples"], tables["strings"])
    summary = summarize_run(tables, tables["modules"], tables["strings"])
    return summary.peak_bytes, states[0].allocated if states else -1


def check_peaks(args: argparse.Namespace, tmp: Path) -> list[str]:
    lines = [
        f"{'step':<14}{'recorded peak':>15}{'max_memory_allocated':>22}{'diff':>8}"
        f"{'allocator peak (trace)':>24}"
    ]
    for checkpointed in (False, True):
        name = "checkpointed" if checkpointed else "plain"
        path = tmp / f"{name}.h5"
        _, allocated = record(make_step(args.layers, args.batch, checkpointed), path)
        recorded, sampled = peaks(path)
        diff = (recorded - allocated) / allocated if allocated > 0 else 0.0
        lines.append(
            f"{name:<14}{fb(recorded):>15}{fb(allocated):>22}{diff:>+8.1%}"
            f"{fb(sampled) if sampled >= 0 else 'none':>24}"
        )
        torch.cuda.empty_cache()
    return lines


def check_oom(args: argparse.Namespace, tmp: Path) -> list[str]:
    """A step under a memory fraction too small for it: the trace must say OOM."""
    path = tmp / "oom.h5"
    step = make_step(args.layers, args.batch * 8, checkpointed=False)
    total = torch.cuda.get_device_properties(0).total_memory
    # What the model holds now and 256 MiB more: 8x the batch's activations need well over.
    fraction = min((torch.cuda.memory_reserved() + (256 << 20)) / total, 1.0)
    torch.cuda.set_per_process_memory_fraction(fraction)
    raised = False
    try:
        with Recorder(path, steps=1, warmup=0, progress=False, command=["cuda_check"]):
            for _ in range(3):
                step()
    except torch.OutOfMemoryError:
        raised = True
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        del step
        torch.cuda.empty_cache()
    if not raised:
        return [f"OOM: none under memory fraction {fraction:.3f}: FAILED (no OOM to check)"]
    with open_trace(path) as trace:
        oom = Oom.of_run(trace.run("main"))
        total_bytes = trace.meta.device_total_bytes
    ok = oom is not None and oom.op and oom.nbytes > 0 and total_bytes > 0
    verdict = "ok" if ok else "FAILED"
    said = oom.headline() if oom is not None else "the trace has no OOM"
    return [
        f"OOM under memory fraction {fraction:.3f}: {said}; device {fb(total_bytes)}: {verdict}"
    ]


def check_timing(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Plain timing steps on CUDA measure device time (NOTE [ Times on an accelerator ] in
    recorder/timing.py): the trace's plain step time against synchronised steps timed here."""
    from ckview.analysis.timing import plain_times

    step = make_step(args.layers, args.batch, checkpointed=False)
    for _ in range(3):
        step()
    path = tmp / "timing.h5"
    with Recorder(path, steps=1, warmup=1, timing_steps=5, progress=False):
        for _ in range(1 + 1 + 2 * 5 + 2):
            step()
    with open_trace(path) as trace:
        times = plain_times(trace.read_run("main"))
    here = statistics.median(timed(step) for _ in range(9)) * 1e9
    if times is None:
        return ["timing: the trace has no plain timing steps: FAILED"]
    ratio = times.step.median_ns / here
    verdict = "ok" if 0.8 <= ratio <= 1.25 else "FAILED"
    return [
        f"timing: plain step in the trace {times.step.median_ns / 1e6:.2f} ms, synchronised here "
        f"{here / 1e6:.2f} ms ({ratio:.2f}x): {verdict}"
    ]


def check_native(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The native recorder's memory reporter sees the caching allocator's blocks: its running
    total against torch.cuda.max_memory_allocated over one step (recorder/native)."""
    from recorder.native.build import load
    from recorder.native.rows import drain

    loaded = load()
    if loaded.ext is None:
        return [f"native reporter: not built ({loaded.reason}): FAILED"]
    ext = loaded.ext
    step = make_step(args.layers, args.batch, checkpointed=False)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ext.start(ops=True, memory=True, outputs=False)
    try:
        drain(ext)
        step()
        torch.cuda.synchronize()
        rows = drain(ext)
    finally:
        ext.stop()
    cuda_rows = rows.memory[rows.memory["device_type"] == 1]
    seen = int(cuda_rows["allocated"].max()) if len(cuda_rows) else -1
    peak = torch.cuda.max_memory_allocated()
    verdict = "ok" if seen == peak else "FAILED"
    return [
        f"native reporter: {len(cuda_rows)} CUDA block events, highest allocated {fb(seen)}, "
        f"max_memory_allocated {fb(peak)}: {verdict}"
    ]


def check_overhead(args: argparse.Namespace, tmp: Path) -> list[str]:
    step = make_step(args.layers, args.batch, checkpointed=False)
    for _ in range(3):
        step()  # warm up kernels and the allocator
    plain: list[float] = []
    recorded: list[float] = []
    for i in range(args.rounds):
        plain += [timed(step) for _ in range(3)]
        recorded += record(step, tmp / f"overhead{i}.h5", steps=3)[0]
    p, r = statistics.median(plain), statistics.median(recorded)
    return [
        f"overhead: plain step {p * 1e3:.2f} ms, recorded {r * 1e3:.2f} ms: {r / p:.2f}x "
        f"(medians of {len(plain)} steps each, {args.rounds} interleaved rounds)"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False; run this on a machine with a CUDA GPU")
        return 0
    name = torch.cuda.get_device_name(0)
    print(
        f"cuda_check on {name} (torch {torch.__version__}), {args.layers} layers, "
        f"batch {args.batch}, d={D_MODEL}, seq {SEQ}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for check in (check_peaks, check_oom, check_timing, check_native, check_overhead):
            for line in check(args, Path(tmp)):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
