"""How fast the planner answers a budget, on a synthetic step with 200 candidate regions.

    python benchmarks/planner_speed.py [--events N] [--blocks B] [--share S] [--repeat R]

Builds the synthetic step of ``projection_speed.synthetic_run`` (B blocks in a ModuleList, about
N memory events), then times ``plan_for_budget`` at S x the baseline peak: building the
``ProjectionModel`` over the B block candidates and searching (B > 12 blocks is beyond the exact
size, so this is the heuristic, NOTE [ Planner heuristic ] in ckview/analysis/planner.py). Prints
the best of R runs of each part, the total's ratio to the 1 s target, and the plan beside the
presets. The model build is timed alone too, side by side, since it is most of the total on large
steps and is shared with every other projection of the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from typing import Any

from ckview.analysis import Planner, ProjectionModel, format_bytes
from ckview.analysis.regions import ModuleRegion

TARGET_S = 1.0


def _synthetic_run(events: int, blocks: int) -> dict[str, Any]:
    path = Path(__file__).with_name("projection_speed.py")
    spec = importlib.util.spec_from_file_location("projection_speed", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tables: dict[str, Any] = module.synthetic_run(events, blocks)
    return tables


def _best(repeat: int, fn: Any) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls of ``fn`` and its last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--share", type=float, default=0.6, help="budget / baseline peak")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    tables = _synthetic_run(args.events, args.blocks)
    n_events = len(tables["memory_events"]["kind"])
    candidates = [ModuleRegion(row) for row in range(2, args.blocks + 2)]
    model_s, _ = _best(args.repeat, lambda: ProjectionModel(tables, candidates))
    build_s, planner = _best(args.repeat, lambda: Planner(tables))
    budget = round(args.share * planner.baseline_peak)

    def answer() -> Any:
        fresh = Planner(tables)
        start = time.perf_counter()
        result = fresh.for_budget(budget)
        return time.perf_counter() - start, result

    search_s, result = float("inf"), None
    for _ in range(args.repeat):
        elapsed, result = answer()
        search_s = min(search_s, elapsed)
    assert result is not None
    total_s = build_s + search_s
    print(
        f"{n_events} events, {len(planner.candidates)} candidate regions "
        f"({'exact' if result.exact else 'heuristic'}, {result.evaluations} projections)"
    )
    print(f"  ProjectionModel build  {model_s * 1e3:8.1f} ms")
    print(f"  Planner(tables)        {build_s * 1e3:8.1f} ms  (model build, costs, conflicts)")
    print(f"  for_budget             {search_s * 1e3:8.1f} ms")
    print(
        f"  plan_for_budget total  {total_s * 1e3:8.1f} ms  = {total_s / TARGET_S:.2f} x the "
        f"{TARGET_S:.0f} s target"
    )
    print(
        f"budget {format_bytes(budget)} ({args.share:.0%} of {format_bytes(planner.baseline_peak)})"
    )
    rows = [(p.name, p.peak_bytes, p.extra_compute_ns, len(p.regions)) for p in result.presets]
    rows.append(("planner", result.peak_bytes, result.extra_compute_ns, len(result.regions)))
    for name, peak, extra, count in rows:
        fits = "fits" if peak <= budget else "over"
        print(
            f"  {name:<8} {format_bytes(peak):>10} {fits}  extra {extra / 1e6:7.2f} ms  "
            f"{count:4d} regions"
        )


if __name__ == "__main__":
    main()
