"""How well the projection predicts what a checkpoint plan measures: the bundled examples and
the training loops of ``examples/loops`` (issue 9's corpus).

    python benchmarks/projection_accuracy.py [--examples mlp cnn ...] [--loops gan lbfgs ...]
                                             [--quick] [--random 3] [--seed 0] [--jobs 1]
                                             [--timing-steps 5] [--keep DIR]
    python benchmarks/projection_accuracy.py --reproject DIR

Per bundled example: record one plain step (``ckview record``) to learn the model's chain of
blocks, write the plans to test as plan files (``random-i``: seeded random subsets of the chain's
blocks; ``planner``: ``ckview.analysis.planner.plan_for_budget`` at 60% of the baseline peak),
then run ``ckview verify`` once with plans none, all, sqrt and those files. Per loop of
``examples/loops/corpus.py``: ``ckview verify`` with the plans of its manifest (none, sqrt and
all = every block, where the model has a chain of blocks), on the script as it runs (and, for
loops with their own checkpointing, once more with ``--checkpoint``). One run of a script
records the baseline and every plan, and each plan is projected over the baseline.

Prints one table: projected vs measured peak (the target is within 2%), and projected vs
measured extra time per step (verify's: the median of plain timing steps per run, with the
spread, MISS where verify flags the projection; noisy on shared CPUs); then the misses and one
line per verify that failed, with its error. ``--examples`` or
``--loops`` alone runs only that group; neither runs both. ``--quick`` runs the loops at the
small sizes the tests use. ``--keep DIR`` keeps the traces and verify's JSON there (to look
into a miss); ``--reproject DIR`` projects the plans of the traces kept there again with this
checkout's model and prints the same table, running nothing (a model change, measured on the
same traces as the model before it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("mlp", "cnn", "transformer", "gpt2")
PRESETS = ("none", "all", "sqrt")
BUDGET_SHARE = 0.6
TARGET = 0.02
TIMING_STEPS = 5
"""Rounds of plain timing steps per run (NOTE [ Plain timing steps ]): the acceptance of issue
21 judges extra time over at least 5."""


def script_steps(n_plans: int, timing_steps: int = TIMING_STEPS) -> int:
    """Iterations a script may run under verify (``--stop-after`` ends it once all are recorded
    and timed): a warmup step, then per run (the baseline and one per plan) the recorded step
    and up to ``MAX_ROUNDS`` rounds (at least ``timing_steps``) of a warm-up and a plain timing
    step (NOTE [ Enough plain steps ]), with one more that times module calls in each of the
    ``timing_steps`` rounds asked for (NOTE [ Quiet timing steps ]), and as many under plan all
    (NOTE [ Timing steps under plan all ]); one more as a margin."""
    from ckview.trace.precision import MAX_ROUNDS

    rounds = max(timing_steps, MAX_ROUNDS)
    return 1 + (1 + n_plans) * (1 + 2 * rounds + timing_steps) + 2 * rounds + 1


def load_corpus() -> Any:
    """``examples/loops/corpus.py`` (the loops' manifest), imported from its file."""
    path = ROOT / "examples" / "loops" / "corpus.py"
    spec = importlib.util.spec_from_file_location("loops_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while building the class
    spec.loader.exec_module(module)
    return module


def ckview_proc(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ckview ARGS`` from the repository, one thread for torch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ckview", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def ckview(*args: str) -> subprocess.CompletedProcess[str]:
    """``ckview_proc``, exiting with its error if it fails."""
    proc = ckview_proc(*args)
    if proc.returncode != 0:
        raise SystemExit(f"ckview {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


# ----------------------------------------------------------------------------- verify runs


@dataclass(frozen=True)
class Case:
    """One ``ckview verify`` to run: a script, its arguments and the plans."""

    label: str
    script: Path
    plans: tuple[str, ...]
    script_args: tuple[str, ...]
    timing_steps: int = TIMING_STEPS


@dataclass(frozen=True)
class Outcome:
    label: str
    plans: list[dict[str, Any]]
    error: str
    """'' when verify succeeded; else why it failed (``failure``)."""


def verify_case(case: Case, folder: Path) -> Outcome:
    """``ckview verify`` of one case, as JSON (kept beside its trace); or why it failed."""
    trace = folder / f"{case.label.replace(' ', '_')}-verify.h5"
    args = [a for plan in case.plans for a in ("--plan", plan)]
    proc = ckview_proc(
        "verify", *args, "--steps", "1", "--stop-after", "--no-progress",
        "--timing-steps", str(case.timing_steps), "--json", "-o", str(trace),
        str(case.script), *case.script_args,
    )  # fmt: skip
    trace.with_suffix(".json").write_text(proc.stdout, encoding="utf-8")
    try:
        doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {}
    plans = list(doc.get("plans", []))
    if proc.returncode != 0 or not plans:
        return Outcome(case.label, plans, failure(proc))
    return Outcome(case.label, plans, "")


def failure(proc: subprocess.CompletedProcess[str]) -> str:
    """Why a verify failed, in one line: the signal that killed it (a crash prints nothing of
    its own), else its exit code and last line of stderr."""
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return f"killed by {name} (exit {proc.returncode}): the recording process crashed"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return f"exit {proc.returncode}: {lines[-1] if lines else '(no output)'}"


def loop_cases(names: Sequence[str], quick: bool, timing_steps: int) -> list[Case]:
    """One case per loop as it runs, and one with ``--checkpoint`` where it has its own."""
    corpus = load_corpus()
    by_name = {loop.name: loop for loop in corpus.LOOPS}
    cases = []
    for name in names:
        loop = by_name[name]
        steps = ("--steps", str(script_steps(len(loop.plans), timing_steps) + loop.settle))
        base = (*loop.args, *(loop.quick if quick else ()), *steps)
        cases.append(Case(name, loop.script, loop.plans, base, timing_steps))
        if loop.checkpoint:
            cases.append(Case(f"{name} --checkpoint", loop.script, loop.plans,
                              (*base, "--checkpoint"), timing_steps))  # fmt: skip
    return cases


# ----------------------------------------------------------------------------- bundled examples


def baseline_tables(example: str, folder: Path) -> dict[str, Any]:
    """Record one plain step of ``example`` and read its run 'main'."""
    from ckview.cli.common import read_tables
    from ckview.trace import open_trace

    trace = folder / f"{example}-base.h5"
    script = str(ROOT / "examples" / f"{example}.py")
    ckview("record", "-o", str(trace), "--steps", "1", "--stop-after", "--no-progress", script)
    with open_trace(trace) as t:
        return read_tables(t, "main")


def random_plans(tables: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` plans, each a seeded random non-empty subset of the chain's blocks (module paths)."""
    from ckview.analysis import ModuleRegion, chain_of_blocks, sequential_children
    from ckview.analysis.plans import plan_from_regions

    modules, strings = tables["modules"], tables["strings"]
    chain = chain_of_blocks(modules, strings)
    if chain is None:
        return []
    blocks = sequential_children(modules, strings, chain)
    rng = np.random.default_rng(seed)
    plans = []
    for i in range(n):
        size = int(rng.integers(1, len(blocks) + 1))
        chosen = sorted(rng.choice(len(blocks), size=size, replace=False).tolist())
        regions = [ModuleRegion(blocks[b]) for b in chosen]
        plans.append(plan_from_regions(regions, modules, strings, f"random-{i}"))
    return plans


def planner_plan(tables: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The planner's plan for 60% of the baseline peak, and a note on it."""
    from ckview.analysis import format_bytes
    from ckview.analysis.planner import plan_for_budget
    from ckview.cli.common import run_peak

    budget = int(BUDGET_SHARE * run_peak(tables))
    result = plan_for_budget(tables, budget)
    name = "planner" if result.fits else "planner-nofit"
    note = "" if result.fits else f"no plan fits {format_bytes(budget)}: lowest peak shown"
    return {**result.plan, "name": name}, note


def example_case(
    example: str, folder: Path, n_random: int, seed: int, timing_steps: int
) -> tuple[Case, str]:
    """The verify case of a bundled example (presets, the planner's and random plans), and a
    note ('' or about the planner)."""
    tables = baseline_tables(example, folder)
    docs = random_plans(tables, n_random, seed)
    planned, note = planner_plan(tables)
    if planned is not None:
        docs.insert(0, planned)
    files = []
    for doc in docs:
        path = folder / f"{example}-{doc['name']}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        files.append(str(path))
    plans = (*PRESETS, *files)
    script = ROOT / "examples" / f"{example}.py"
    steps = ("--steps", str(script_steps(len(plans), timing_steps)))
    return Case(example, script, plans, steps, timing_steps), note


# ----------------------------------------------------------------------------- the table


def reproject(folder: Path) -> list[Outcome]:
    """Each verify trace kept in ``folder`` (``--keep``), its plans projected again with this
    checkout's model against the runs it recorded."""
    from ckview.cli.recording import load_plans
    from ckview.cli.verify import _verify  # what verify compares, without recording

    outcomes = []
    for trace in sorted(folder.glob("*-verify.h5")):
        label = trace.stem.removesuffix("-verify").replace("_", " ")
        text = trace.with_suffix(".json").read_text(encoding="utf-8")
        sources = [p["source"] for p in json.loads(text or "{}").get("plans", [])]
        if not sources:
            outcomes.append(Outcome(label, [], "no plan in its JSON"))
            continue
        checks, _, _ = _verify(trace, load_plans(sources))
        outcomes.append(Outcome(label, [c.to_json() for c in checks], ""))
    return outcomes


def extra_cells(p: dict[str, Any]) -> tuple[str, str]:
    """Projected and measured extra time per step in ms (verify's ``extra_time_per_step``:
    NOTE [ Extra time, like for like ]): the measured median with its spread (lowest..highest
    single-step difference), '*' after it where verify flags the projection as a miss, and
    '(rec)' where the times come from recorded steps (with the recorder's cost) instead of plain
    timing steps."""
    t = p.get("extra_time_per_step")
    if not t:
        return "-", "-"
    measured = (
        f"{t['measured_median_ns'] / 1e6:.1f} "
        f"({t['measured_low_ns'] / 1e6:.1f}..{t['measured_high_ns'] / 1e6:.1f})"
    )
    flags = (" MISS" if t.get("miss") else "") + ("" if t.get("plain_steps", True) else " (rec)")
    return f"{t['projected_ns'] / 1e6:.1f}", measured + flags


def row(label: str, p: dict[str, Any]) -> list[str]:
    from ckview.analysis import format_bytes as fb

    measured = p.get("measured_peak_bytes")
    error = p.get("peak_error_percent")
    return [
        label,
        str(p.get("plan", "?")),
        fb(p["projected_peak_bytes"]) if p.get("projected_peak_bytes") is not None else "-",
        fb(measured) if measured is not None else "-",
        f"{error:+.2f}%" if error is not None else "-",
        *extra_cells(p),
    ]


HEADER = ["loop", "plan", "projected peak", "measured peak", "error",
          "proj. extra ms/step", "meas. extra ms/step: median (low..high)"]  # fmt: skip


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = []
    for r in [HEADER, *rows]:
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells))
    return "\n".join(lines)


EXTRA_TARGET = 0.15
"""Issue 21: median |projected - measured| / measured extra time, over the plans that recompute."""
OUTSIDE_LIMIT = 0.30
"""... and none off by more than this share of its measured extra time outside the spread."""


def extra_time_tally(timed: Sequence[dict[str, Any]]) -> str:
    """One line: the median relative error of the projected extra time over the plans that
    recompute (projected > 0; plan none measures noise around 0), and the plans projected more
    than ``OUTSIDE_LIMIT`` of their measured extra time outside the measured spread."""
    errors, outside = [], 0
    for t in timed:
        projected, measured = t["projected_ns"], t["measured_median_ns"]
        if projected <= 0 or measured == 0:
            continue
        errors.append(abs(projected - measured) / abs(measured))
        off = max(t["measured_low_ns"] - projected, projected - t["measured_high_ns"], 0)
        outside += off > OUTSIDE_LIMIT * abs(measured)
    if not errors:
        return "extra time: no plan recomputes"
    return (
        f"extra time: median |projected - measured| {np.median(errors):.1%} of the measured "
        f"over {len(errors)} plans that recompute (target {EXTRA_TARGET:.0%}); {outside} "
        f"projected more than {OUTSIDE_LIMIT:.0%} outside the measured spread"
    )


def report(outcomes: Sequence[Outcome], notes: dict[str, str]) -> int:
    """Print the table, the tally and the failures; 0 if every plan is within the target."""
    rows = [row(o.label, p) for o in outcomes for p in o.plans]
    errors = [abs(p.get("peak_error_percent") or 0.0) / 100 for o in outcomes for p in o.plans]
    print(format_table(rows))
    within = sum(e <= TARGET for e in errors)
    timed = [
        p["extra_time_per_step"] for o in outcomes for p in o.plans if p.get("extra_time_per_step")
    ]
    misses = sum(bool(t.get("miss")) for t in timed)
    failed = [o for o in outcomes if o.error]
    print(
        f"\n{within} of {len(rows)} plans projected within {TARGET:.0%} of the measured peak "
        f"(worst {max(errors, default=0):.3%}); extra time: {misses} of {len(timed)} projections "
        f"outside the measured spread; {len(failed)} of {len(outcomes)} verify runs failed"
    )
    print(extra_time_tally(timed))
    for o in failed:
        print(f"failed: {o.label}: {o.error}")
    for label, note in notes.items():
        print(f"note: {label}: {note}")
    return 0 if within == len(rows) and not failed else 1


def main(argv: list[str] | None = None) -> int:
    loop_names = [loop.name for loop in load_corpus().LOOPS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", nargs="+", choices=EXAMPLES, help="bundled examples")
    parser.add_argument("--loops", nargs="+", choices=loop_names, help="loops of examples/loops")
    parser.add_argument("--quick", action="store_true", help="loops at the tests' small sizes")
    parser.add_argument("--random", type=int, default=3, help="random plans per example")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="verify runs at once (default 1)")
    parser.add_argument(
        "--timing-steps", type=int, default=TIMING_STEPS, help="plain timing steps per run"
    )
    parser.add_argument("--keep", type=Path, help="keep the traces and verify's JSON here")
    parser.add_argument(
        "--reproject", type=Path, help="project the traces kept in this folder again; run nothing"
    )
    args = parser.parse_args(argv)
    if args.reproject is not None:
        return report(reproject(args.reproject), {})
    both = args.examples is None and args.loops is None
    examples = list(EXAMPLES) if both else args.examples or []
    loops = loop_names if both else args.loops or []
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ckview-accuracy-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        cases = []
        for example in examples:
            case, note = example_case(example, folder, args.random, args.seed, args.timing_steps)
            cases.append(case)
            if note:
                notes[example] = note
        cases += loop_cases(loops, args.quick, args.timing_steps)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(lambda c: verify_case(c, folder), cases))
    return report(outcomes, notes)


if __name__ == "__main__":
    sys.exit(main())
