"""How well the projection predicts what a checkpoint plan measures, on every bundled example.

    python benchmarks/projection_accuracy.py [--examples mlp cnn ...] [--random 3] [--seed 0]

Per example: record one plain step (``ckview record``) to learn the model's chain of blocks,
write the plans to test as plan files (``random-i``: seeded random subsets of the chain's
blocks; ``planner``: ``ckview.analysis.planner.plan_for_budget`` at 60% of the baseline peak, if
the planner exists), then run ``ckview verify`` once with plans none, all, sqrt and those files:
one run of the script records the baseline and every plan, and each plan is projected over the
baseline. Prints one table: projected vs measured peak (the target is within 2%), and projected
vs measured extra time (the plan run's recompute ops; noisy on shared CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("mlp", "cnn", "transformer", "gpt2")
PRESETS = ("none", "all", "sqrt")
BUDGET_SHARE = 0.6
TARGET = 0.02


def ckview(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ckview ARGS`` from the repository, one thread for torch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ckview", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"ckview {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def baseline_tables(example: str, folder: Path) -> dict[str, Any]:
    """Record one plain step of ``example`` and read its run 'main'."""
    from ckview.cli.project import read_tables
    from ckview.trace import open_trace

    trace = folder / f"{example}-base.h5"
    script = str(ROOT / "examples" / f"{example}.py")
    ckview("record", script, "-o", str(trace), "--steps", "1", "--stop-after", "--no-progress")
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
    """The planner's plan for 60% of the baseline peak (None if there is no planner yet), and a
    note on it."""
    try:
        from ckview.analysis.planner import plan_for_budget
    except ImportError:
        return None, "planner skipped: ckview.analysis.planner.plan_for_budget not there yet"
    from ckview.analysis import format_bytes
    from ckview.cli.project import run_peak

    budget = int(BUDGET_SHARE * run_peak(tables))
    result = plan_for_budget(tables, budget)
    name = "planner" if result.fits else "planner-nofit"
    note = "" if result.fits else f"no plan fits {format_bytes(budget)}: lowest peak shown"
    return {**result.plan, "name": name}, note


def verify(example: str, plan_files: list[Path], folder: Path) -> dict[str, Any]:
    """``ckview verify`` with the presets and ``plan_files``; its JSON document."""
    plans = [*PRESETS, *(str(p) for p in plan_files)]
    script_steps = 1 + (1 + len(plans)) + 2  # warmup, baseline and plans, a margin
    args = [a for plan in plans for a in ("--plan", plan)]
    proc = ckview(
        "verify",
        str(ROOT / "examples" / f"{example}.py"),
        *args,
        "--steps",
        "1",
        "--stop-after",
        "--no-progress",
        "--json",
        "-o",
        str(folder / f"{example}-verify.h5"),
        "--",
        "--steps",
        str(script_steps),
    )
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def verify_example(
    example: str, folder: Path, n_random: int, seed: int
) -> tuple[list[dict[str, Any]], str]:
    """``ckview verify``'s result per plan for one example, and a note ('' or why the planner
    is missing)."""
    tables = baseline_tables(example, folder)
    docs = random_plans(tables, n_random, seed)
    planned, note = planner_plan(tables)
    if planned is not None:
        docs.insert(0, planned)
    files = []
    for doc in docs:
        path = folder / f"{example}-{doc['name']}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        files.append(path)
    result = verify(example, files, folder)
    return list(result["plans"]), note


def _row(example: str, p: dict[str, Any]) -> list[str]:
    from ckview.analysis import format_bytes as fb

    return [
        example,
        p["plan"],
        fb(p["projected_peak_bytes"]),
        fb(p["measured_peak_bytes"]),
        f"{p['peak_error_percent']:+.2f}%",
        f"{p['projected_extra_ns'] / 1e6:.1f}",
        f"{p['measured_extra_ns'] / 1e6:.1f}",
    ]


HEADER = [
    "example",
    "plan",
    "projected peak",
    "measured peak",
    "error",
    "proj. extra ms",
    "meas. extra ms",
]


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = []
    for r in [HEADER, *rows]:
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=EXAMPLES)
    parser.add_argument("--random", type=int, default=3, help="random plans per example")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows: list[list[str]] = []
    errors: list[float] = []
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ckview-accuracy-") as tmp:
        for example in args.examples:
            plans, note = verify_example(example, Path(tmp), args.random, args.seed)
            rows += [_row(example, p) for p in plans]
            errors += [abs(p["peak_error_percent"]) / 100 for p in plans]
            if note:
                notes[example] = note
    print(format_table(rows))
    within = sum(e <= TARGET for e in errors)
    print(
        f"\n{within} of {len(rows)} plans projected within {TARGET:.0%} of the measured peak "
        f"(worst {max(errors, default=0):.3%})"
    )
    for example, note in notes.items():
        print(f"note: {example}: {note}")
    return 0 if within == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
