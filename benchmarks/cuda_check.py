"""On a CUDA GPU: both recorder paths against the caching allocator, compiled code, offload,
an OOM, device times, and the recorder's cost.

    python benchmarks/cuda_check.py [--rounds 5] [--layers 4] [--batch 16] [--paths native,python]

For each recorder path (``CKVIEW_RECORDER=native`` and ``python``):

1. Records a transformer training step (TransformerEncoder, d=256, seq 128) without and with
   checkpointing (``torch.utils.checkpoint`` per layer): the recorded peak against the
   allocator's peak the trace's ``device_samples`` hold; what lies between (library workspaces)
   must be the same in both.
2. Forces an OOM under ``torch.cuda.set_per_process_memory_fraction``: the trace says OOM, with
   the op, the module and the bytes asked for.

Then once:

3. Plain timing steps (``timing_steps``) against synchronised steps timed here: device time,
   not launch time.
4. The native memory reporter: the CUDA blocks it saw against ``max_memory_allocated``.
5. A ``torch.compile`` (inductor) step recorded on the native path: meta ``compiled``, the
   compiled regions' blocks, and the recorded allocation peak against torch.profiler's
   (its CUDA memory events over the same step).
6. Offload (``ckpt_runtime``, issue 22): the device peak, step time and gradients of an offload
   plan (every layer's saved tensors to pinned host memory on a side stream) beside no plan and
   recompute-all.
7. Plain and recorded step times in interleaved rounds (medians, CUDA synchronised), per path.

Prints one table. On a machine without a GPU it prints one line, "no GPU: ...", and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckpt_runtime import apply_plan  # noqa: E402
from ckpt_runtime.gradients import compare_gradients, gradients_of  # noqa: E402
from ckview.analysis import format_bytes as fb  # noqa: E402
from ckview.analysis import summarize_run  # noqa: E402
from ckview.analysis.device import Oom, device_states  # noqa: E402
from ckview.trace import open_trace  # noqa: E402
from recorder import Recorder  # noqa: E402

Step = Callable[[], None]
D_MODEL, SEQ, HEADS = 256, 128, 8
PATHS = ("native", "python")
OFFLOAD_PLAN = {
    "format": "ckview-plan",
    "version": 2,
    "name": "offload-layers",
    "regions": [{"module": "layers.*", "save": ["*"], "offload": True}],
}


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


def make_model(layers: int, checkpointed: bool = False) -> Encoder:
    torch.manual_seed(0)
    return Encoder(layers, checkpointed).cuda()


def make_step(layers: int, batch: int, checkpointed: bool = False, model: Any = None) -> Step:
    """A training step of ``model`` (default: a new Encoder; ``model`` may be its compiled form),
    AdamW; each step seeds its batch and dropout, so steps of two models are alike."""
    module = make_model(layers, checkpointed) if model is None else model
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)

    def step() -> None:
        torch.manual_seed(1)
        x = torch.randn(batch, SEQ, D_MODEL, device="cuda")
        module(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


@contextlib.contextmanager
def recorder_path(path: str) -> Iterator[None]:
    """``CKVIEW_RECORDER=path`` while recording (read as a recording begins)."""
    before = os.environ.get("CKVIEW_RECORDER")
    os.environ["CKVIEW_RECORDER"] = path
    try:
        yield
    finally:
        if before is None:
            del os.environ["CKVIEW_RECORDER"]
        else:
            os.environ["CKVIEW_RECORDER"] = before


def timed(step: Step) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def release() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def record(step: Step, path: Path, steps: int = 1) -> list[float]:
    """Record ``steps`` timed steps after one warm-up, and one more that closes the trace
    (untimed: writing the file is no per-step cost); the times."""
    times = []
    with Recorder(path, steps=steps + 1, warmup=1, progress=False, command=["cuda_check"]):
        step()
        times += [timed(step) for _ in range(steps)]
        step()
    return times


def read(path: Path) -> tuple[dict[str, Any], Any]:
    with open_trace(path) as trace:
        return trace.read_run("main"), trace.meta


def check_peaks(args: argparse.Namespace, tmp: Path, path: str) -> list[str]:
    """The recorded peak against the allocator's (the device samples: the recorder resets the
    allocator's peaks as each step begins, so max_memory_allocated read here is the last
    step's tail). What lies between is what the recorder does not see as a storage (NOTE
    [ Allocated beyond the recorded tensors ] in ckview/cli/summary.py): the same with and
    without checkpointing, or the recorder missed something that a plan changes."""
    lines, gaps = [], []
    for checkpointed in (False, True):
        name = "checkpointed" if checkpointed else "plain"
        trace = tmp / f"{path}-{name}.h5"
        with recorder_path(path):
            record(make_step(args.layers, args.batch, checkpointed), trace)
        tables, meta = read(trace)
        recorded = summarize_run(tables, tables["modules"], tables["strings"]).peak_bytes
        states = device_states(tables["device_samples"], tables["strings"])
        allocated = states[0].allocated if states else -1
        reserved = states[0].reserved if states else -1
        gaps.append(allocated - recorded)
        lines.append(
            f"{path:<8}{name:<14}{fb(recorded):>12}{fb(allocated):>12}{fb(gaps[-1]):>12}"
            f"{fb(reserved):>12}  {meta.recorder}"
        )
        release()
    same = abs(gaps[0] - gaps[1]) <= (1 << 20) and min(gaps) >= 0
    lines[-1] += f": {'ok' if same else 'FAILED'} (the gap is the same with checkpointing)"
    return lines


PEAKS_HEADER = (
    f"{'path':<8}{'step':<14}{'recorded':>12}{'allocator':>12}{'beyond':>12}{'reserved':>12}"
    "  recorder"
)


def check_oom(args: argparse.Namespace, tmp: Path, path: str) -> list[str]:
    """A step under a memory fraction too small for it: the trace must say OOM."""
    trace = tmp / f"{path}-oom.h5"
    step = make_step(args.layers, args.batch * 8)
    total = torch.cuda.get_device_properties(0).total_memory
    # What the model holds now and 256 MiB more: 8x the batch's activations need well over.
    fraction = min((torch.cuda.memory_reserved() + (256 << 20)) / total, 1.0)
    torch.cuda.set_per_process_memory_fraction(fraction)
    raised = False
    try:
        with recorder_path(path), Recorder(trace, steps=1, warmup=0, progress=False):
            for _ in range(3):
                step()
    except torch.OutOfMemoryError:
        raised = True
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        del step
        release()
    if not raised:
        return [f"{path}: OOM: none under memory fraction {fraction:.3f}: FAILED (no OOM)"]
    with open_trace(trace) as opened:
        oom = Oom.of_run(opened.run("main"))
        total_bytes = opened.meta.device_total_bytes
    ok = oom is not None and oom.op and oom.nbytes > 0 and total_bytes > 0
    said = oom.headline() if oom is not None else "the trace has no OOM"
    return [
        f"{path}: OOM under memory fraction {fraction:.3f}: {said}; device {fb(total_bytes)}: "
        f"{'ok' if ok else 'FAILED'}"
    ]


def check_timing(args: argparse.Namespace, tmp: Path) -> list[str]:
    """Plain timing steps on CUDA measure device time (NOTE [ Times on an accelerator ] in
    recorder/timing.py): the trace's plain step time against synchronised steps timed here."""
    from ckview.analysis.timing import plain_times

    lines = []
    for path in args.paths:
        step = make_step(args.layers, args.batch)
        for _ in range(3):
            step()
        trace = tmp / f"{path}-timing.h5"
        with (
            recorder_path(path),
            Recorder(trace, steps=1, warmup=1, timing_steps=5, progress=False),
        ):
            for _ in range(1 + 1 + 2 * 5 + 2):
                step()
        times = plain_times(read(trace)[0])
        here = statistics.median(timed(step) for _ in range(9)) * 1e9
        if times is None:
            lines.append(f"{path}: timing: the trace has no plain timing steps: FAILED")
            continue
        ratio = times.step.median_ns / here
        verdict = "ok" if 0.8 <= ratio <= 1.25 else "FAILED"
        lines.append(
            f"{path}: timing: plain step in the trace {times.step.median_ns / 1e6:.2f} ms, "
            f"synchronised here {here / 1e6:.2f} ms ({ratio:.2f}x): {verdict}"
        )
        release()
    return lines


def check_native(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The native recorder's memory reporter sees the caching allocator's blocks: its running
    total against torch.cuda.max_memory_allocated over one step (recorder/native)."""
    from recorder.native.build import load
    from recorder.native.rows import drain

    with recorder_path("native"):
        ext = load().ext
    assert ext is not None
    step = make_step(args.layers, args.batch)
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
    release()
    return [
        f"native reporter: {len(cuda_rows)} CUDA block events, highest allocated {fb(seen)}, "
        f"max_memory_allocated {fb(peak)}: {verdict}"
    ]


def _profiler_peak(step: Step) -> int:
    """The peak of torch.profiler's CUDA allocation bytes over one step: the cumulative sum of
    its memory events on the GPU, in time order (its "Total Allocated" over the step)."""
    from torch.profiler import ProfilerActivity, profile

    release()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True
    ) as prof:
        step()
        torch.cuda.synchronize()
    events = [
        e
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CUDA
    ]
    events.sort(key=lambda e: e.start_ns())
    return int(np.cumsum([e.nbytes() for e in events]).max()) if events else -1


def _step_peak(tables: dict[str, Any], device: int) -> int:
    """The recorded step's allocation peak on string id ``device``: blocks allocated in the
    step, from their allocation to their free (as the profiler counts them)."""
    st, steps = tables["storages"], tables["steps"]
    t0, t1 = int(steps["start_ns"][0]), int(steps["end_ns"][0])
    here = np.asarray(st["device"]) == device
    made = here & (st["alloc_ns"] >= t0) & (st["alloc_ns"] <= t1)
    freed = made & (st["free_ns"] >= 0) & (st["free_ns"] <= t1)
    times = np.concatenate([st["alloc_ns"][made], st["free_ns"][freed]])
    delta = np.concatenate([st["nbytes"][made], -st["nbytes"][freed]])
    return int(np.cumsum(delta[np.argsort(times, kind="stable")]).max()) if len(delta) else -1


def check_compiled(args: argparse.Namespace, tmp: Path) -> list[str]:
    """An inductor-compiled step recorded on the native path runs compiled: its recorded
    allocation peak against torch.profiler's on the same compiled step."""
    from torch._dynamo.utils import counters

    model = make_model(args.layers)
    step = make_step(args.layers, args.batch, model=torch.compile(model))
    t0 = time.perf_counter()
    for _ in range(3):
        step()  # compiles
    compile_s = time.perf_counter() - t0
    theirs = _profiler_peak(step)
    trace = tmp / "compiled.h5"
    counters.clear()
    with recorder_path("native"), Recorder(trace, steps=1, warmup=1, progress=False):
        step()
        step()
    breaks = sum(counters["graph_break"].values())
    tables, meta = read(trace)
    strings = tables["strings"]
    ours = _step_peak(tables, strings.index("cuda:0"))
    names = {strings[i] for i in tables["ops"]["name"]}
    regions = sorted(names & {"CompiledFunction", "CompiledFunctionBackward"})
    diff = (ours - theirs) / theirs if theirs > 0 else float("inf")
    ok = meta.compiled == "compiled" and abs(diff) <= 0.01 and len(regions) == 2 and not breaks
    release()
    return [
        f"compiled (inductor, compiled in {compile_s:.0f} s): meta compiled={meta.compiled!r}, "
        f"regions {regions}, graph breaks {breaks}; step peak recorded {fb(ours)}, "
        f"torch.profiler {fb(theirs)} ({diff:+.2%}): {'ok' if ok else 'FAILED'}"
    ]


def check_offload(args: argparse.Namespace, tmp: Path) -> list[str]:
    """An offload plan's device peak, step time and gradients beside no plan and recompute-all
    (ckpt_runtime: pinned host memory, a side stream)."""
    batch = args.batch * 4  # activations well above the parameters and optimizer state
    rows, grads = [], {}
    for plan in ("none", "all", OFFLOAD_PLAN):
        name = plan if isinstance(plan, str) else "offload"
        model = make_model(args.layers)
        applied = apply_plan(model, plan)
        x = torch.randn(batch, SEQ, D_MODEL, device="cuda", generator=None)

        def step(model: nn.Module = model, x: torch.Tensor = x) -> None:
            torch.manual_seed(1)
            model(x).square().mean().backward()

        step()
        model.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        grads[name] = gradients_of(model)
        for p in model.parameters():
            p.grad = None
        times = [timed(step) for _ in range(5)]
        rows.append((name, peak, statistics.median(times), applied))
        del model, x
        release()
    lines = []
    for name, peak, seconds, _ in rows:
        same = compare_gradients(grads["none"], grads[name])
        lines.append(
            f"offload check: plan {name:<8} step peak {fb(peak):>10} ({peak / rows[0][1]:.2f}x), "
            f"step {seconds * 1e3:.2f} ms ({seconds / rows[0][2]:.2f}x), gradients vs none: "
            f"{'equal' if same['equal'] else 'max abs diff ' + format(same['max_abs_diff'], '.2e')}"
        )
    return lines


def check_overhead(args: argparse.Namespace, tmp: Path) -> list[str]:
    step = make_step(args.layers, args.batch)
    for _ in range(3):
        step()  # warm up kernels and the allocator
    plain: list[float] = []
    recorded: dict[str, list[float]] = {path: [] for path in args.paths}
    for i in range(args.rounds):
        plain += [timed(step) for _ in range(3)]
        for path in args.paths:
            with recorder_path(path):
                recorded[path] += record(step, tmp / f"overhead-{path}{i}.h5", steps=3)
    p = statistics.median(plain)
    cells = ", ".join(
        f"{path} {statistics.median(t) * 1e3:.2f} ms ({statistics.median(t) / p:.2f}x)"
        for path, t in recorded.items()
    )
    return [
        f"overhead: plain step {p * 1e3:.2f} ms, recorded: {cells} (medians of {len(plain)} "
        f"steps each, {args.rounds} interleaved rounds)"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--paths", default=",".join(PATHS), help="recorder paths to check (native,python)"
    )
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    if not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False; run this on a machine with a CUDA GPU")
        return 0
    print(
        f"cuda_check on {torch.cuda.get_device_name(0)} (torch {torch.__version__}), "
        f"{args.layers} layers, batch {args.batch}, d={D_MODEL}, seq {SEQ}",
        flush=True,
    )
    per_path = (check_peaks, check_oom)
    once: list[Callable[..., list[str]]] = [check_timing, check_overhead]
    if "native" in args.paths:
        once[1:1] = [check_native, check_compiled]
    once.insert(-1, check_offload)
    with tempfile.TemporaryDirectory() as tmp:
        print(PEAKS_HEADER)
        for check in per_path:
            for path in args.paths:
                _print(check, args, Path(tmp), path)
        for check in once:
            _print(check, args, Path(tmp))
    return 0


def _print(check: Callable[..., list[str]], *args: Any) -> None:
    """Run one check and print its lines; a check that raises prints one FAILED line."""
    try:
        lines = check(*args)
    except Exception as exc:  # a failing check must not hide the others on a scarce GPU
        lines = [f"{check.__name__}: FAILED: {type(exc).__name__}: {exc}"]
        release()
    for line in lines:
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
