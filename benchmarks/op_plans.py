"""Op-level plans side by side (issue 22, item 7): for budgets of 30-80% of the recorded peak,
on the bundled transformer example and an HF GPT-2 built from a config (no download):

- ckview's op-level plans (``Planner(level="op")``) and module plans (``Planner()``), each
  recorded with the plan applied, as ``ckview verify`` records it;
- torch's ``sac_milp`` (``torch.distributed._tools.sac_ilp``), where it runs on this machine;
- compile's ``torch._functorch.config.activation_memory_budget`` (set to the budget's share):
  the peak of a compiled step, measured with torch's memory profiler (compile projects
  nothing; the recorder runs compiled code eagerly), beside the eager step's peak measured the
  same way, to compare that method with ckview's.

Each row: projected peak (over the verify recording's baseline), measured peak, the extra
compute per step the planner projected (over the run it planned on: times are noisy from one
recording to the next, memory is not), and whether the measured peak met the budget.

    OMP_NUM_THREADS=1 python benchmarks/op_plans.py [--models transformer gpt2]
                                                   [--budgets 30 50 70 80] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckview.analysis import Planner, format_bytes  # noqa: E402
from ckview.cli.common import read_tables  # noqa: E402
from ckview.cli.recording import load_plans  # noqa: E402
from ckview.cli.verify import _verify  # noqa: E402
from ckview.trace import open_trace  # noqa: E402
from recorder import Recorder  # noqa: E402
from recorder.plans import plan_runs  # noqa: E402

Step = Callable[[], None]


@dataclass(frozen=True)
class Row:
    model: str
    budget: int
    share: int
    method: str
    projected: int | None
    measured: int | None
    note: str = ""
    extra_ns: int | None = None
    """Extra compute per step the planner projected over the run it planned on (the plan run
    is a second recording, whose times differ: noise)."""


# ----------------------------------------------------------------------------- models


def transformer() -> tuple[nn.Module, Step]:
    """examples/transformer.py's CausalLM and its training step."""
    sys.path.insert(0, str(ROOT / "examples"))
    from transformer import build_model

    torch.manual_seed(0)
    model = build_model(1000, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        tokens = torch.randint(0, 1000, (8, 65), generator=gen)
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, 1000), tokens[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad()

    return model, step


def gpt2() -> tuple[nn.Module, Step]:
    """A 4-layer GPT-2 from transformers' config (random weights, no download)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=4, n_embd=128, n_head=4, n_positions=64, vocab_size=1000, use_cache=False
    )
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        ids = torch.randint(0, 1000, (8, 64), generator=gen)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    return model, step


MODELS: dict[str, Callable[[], tuple[nn.Module, Step]]] = {
    "transformer": transformer,
    "gpt2": gpt2,
}


# ----------------------------------------------------------------------------- ckview


def record(path: Path, step: Step, sources: list[str]) -> None:
    """A baseline run and one run per plan, as ``ckview verify`` records them."""
    runs = plan_runs(load_plans(sources), True, False)
    with Recorder(path, steps=1, warmup=1, runs=runs, progress=False, timing_steps=1):
        for _ in range(1 + len(runs) * 3 + 1):
            step()


def ckview_rows(name: str, shares: list[int], folder: Path) -> tuple[list[Row], int]:
    """Module and op-level plans per budget, projected and measured; and the baseline peak."""
    _, step = MODELS[name]()
    base_path = folder / f"{name}-baseline.h5"
    record(base_path, step, [])
    with open_trace(base_path) as trace:
        tables = read_tables(trace, "baseline")
    planners = {"module": Planner(tables), "op": Planner(tables, level="op")}
    peak = planners["module"].baseline_peak
    sources, budgets = [], {}
    for share in shares:
        budget = int(share / 100 * peak)
        for level, planner in planners.items():
            plan = dict(planner.for_budget(budget).plan)
            plan["name"] = f"{level}-{share}"
            file = folder / f"{name}-{plan['name']}.json"
            file.write_text(json.dumps(plan))
            sources.append(str(file))
            planned = plan["meta"]["planner"]["extra_compute_ns"]
            budgets[plan["name"]] = (share, budget, level, planned)
    _, step = MODELS[name]()  # a fresh model: the plans are measured from the same start
    path = folder / f"{name}-plans.h5"
    record(path, step, sources)
    checks, missing, _ = _verify(path, load_plans(sources))
    rows = []
    for check in checks:
        share, budget, level, planned = budgets[check.projection.plan]
        method = f"ckview {level}"
        projection = check.projection
        rows.append(
            Row(
                name,
                budget,
                share,
                method,
                projection.peak_bytes,
                check.measured_peak_bytes,
                extra_ns=planned,
            )
        )
    rows += [
        Row(name, budgets[m][1], budgets[m][0], m, None, None, "not recorded") for m in missing
    ]
    return rows, peak


# ----------------------------------------------------------------------------- torch


def sac_milp_rows(name: str, shares: list[int], peak: int) -> list[Row]:
    """torch's sac_milp where it runs: its input comes from ``SACEstimator``, whose runtime
    estimates time ops with CUDA events (``operator-level-benchmark``) or a CUDA roofline
    (``operator-level-cost-model``), and it solves with ``pulp``; without CUDA (or pulp) the
    row's note says why it was not run."""
    why = ""
    if not torch.cuda.is_available():
        why = "not run: the SAC estimator's runtimes need CUDA"
    try:
        import pulp  # noqa: F401
    except ImportError:
        why = (why + "; " if why else "not run: ") + "sac_milp needs the pulp solver"
    if not why:
        why = "not run: this benchmark does not drive sac_milp on CUDA yet"
    return [Row(name, int(s / 100 * peak), s, "torch sac_milp", None, None, why) for s in shares]


def profiled_peak(step: Step) -> int:
    """The peak of live CPU tensor bytes during ``step``, from torch's memory profiler timeline
    (private API: ``_memory_profile``); the recorder cannot measure compiled code, which runs
    eagerly under it (NOTE [ torch.compile under the recorder ] in recorder/compiled.py)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    activities = [ProfilerActivity.CPU]
    with profile(
        activities=activities, profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return int(max(sum(row) for row in sizes))


def compile_rows(name: str, shares: list[int], peak: int) -> list[Row]:
    """The measured peak of a compiled step per ``activation_memory_budget`` share, and the
    eager step's peak measured the same way (to compare the method with ckview's)."""
    import torch._functorch.config as functorch_config

    _, step = MODELS[name]()
    step()
    eager = profiled_peak(step)
    rows = [Row(name, peak, 100, "eager, profiler", None, eager, "the profiler's own peak")]
    for share in shares:
        torch._dynamo.reset()
        model, step = MODELS[name]()
        model.compile()  # in place: the step's model(...) calls run the compiled module
        note = ""
        measured: int | None = None
        try:
            with functorch_config.patch(activation_memory_budget=share / 100):
                step()  # compiles
                measured = profiled_peak(step)
        except Exception as exc:  # a benchmark row, not a crash
            note = f"compile failed: {type(exc).__name__}: {str(exc)[:80]}"
        budget = int(share / 100 * peak)
        rows.append(Row(name, budget, share, "compile budget", None, measured, note))
    return rows


# ----------------------------------------------------------------------------- table


def table(rows: list[Row]) -> str:
    lines = [
        f"{'model':<12}{'budget':>16}  {'method':<16}{'projected':>12}{'measured':>12}"
        f"{'error':>9}{'extra':>10}  budget",
    ]
    for r in rows:
        budget = f"{r.share}% {format_bytes(r.budget)}"
        proj = format_bytes(r.projected) if r.projected is not None else "-"
        meas = format_bytes(r.measured) if r.measured is not None else "-"
        error = (
            f"{(r.projected - r.measured) / r.measured:+.2%}"
            if r.projected is not None and r.measured
            else "-"
        )
        verdict = "-" if r.measured is None else ("met" if r.measured <= r.budget else "MISSED")
        extra = f"{r.extra_ns / 1e6:.1f} ms" if r.extra_ns is not None else "-"
        lines.append(
            f"{r.model:<12}{budget:>16}  {r.method:<16}{proj:>12}{meas:>12}{error:>9}{extra:>10}"
            f"  {verdict}" + (f"  ({r.note})" if r.note else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--budgets", nargs="+", type=int, default=[30, 40, 50, 60, 70, 80])
    parser.add_argument("--no-compile", action="store_true", help="skip the compile rows")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in args.models:
            found, peak = ckview_rows(name, args.budgets, folder)
            print(f"{name}: baseline peak {format_bytes(peak)}", flush=True)
            rows += found + sac_milp_rows(name, args.budgets, peak)
            if not args.no_compile:
                rows += compile_rows(name, args.budgets, peak)
    rows.sort(key=lambda r: (r.model, r.share, r.method))
    print(table(rows))


if __name__ == "__main__":
    main()
