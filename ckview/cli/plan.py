"""``ckview plan``: the cheapest checkpoint plan whose projected peak fits a memory budget.

The planner (``ckview.analysis.planner``) searches the plans over the run's chain of blocks,
judging each with the projection; this verb prints its plan beside the presets, the peak /
extra-compute front with ``--pareto``, and writes the plan file with ``-o``. Imports no torch.

Exit codes: 0 with a plan that fits; 1 when no plan reaches the budget (the lowest projected
peak is reported); 2 for bad input (``CLIError``, ``TraceError``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.common import read_run, times_line
from ckview.cli.errors import CLIError

if TYPE_CHECKING:
    from ckview.analysis import Budget
    from ckview.app.run import Run

EXIT_UNREACHABLE = 1
"""Exit code when no plan reaches the budget."""

MAX_LINES = 30
"""Longer region lists and fronts are shortened in text output (JSON has them all)."""


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "plan",
        help="find the cheapest checkpoint plan for a memory budget",
        description=(
            "Find the checkpoint plan with the least extra compute whose projected peak fits "
            "BUDGET, over the chain of blocks of a recorded run; print it beside the presets."
        ),
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.add_argument(
        "--budget",
        metavar="B",
        help="peak memory budget: a size ('3GiB', '512MB'), a share of the run's peak ('60%%'), "
        "or 'device': the capacity of the device the trace was recorded on",
    )
    p.add_argument("-o", "--output", type=Path, metavar="PLAN.json", help="write the plan file")
    p.add_argument(
        "--pareto", action="store_true", help="print the peak / extra-compute front of plans"
    )
    p.add_argument(
        "--level",
        choices=("module", "op"),
        default="module",
        help="what a plan chooses: whole modules to recompute (module, the default), or also "
        "which ops' outputs each one saves (op: a format-2 plan)",
    )
    p.add_argument(
        "--offload",
        action="store_true",
        help="with --level op: a block may also offload what it saves to host memory (CUDA)",
    )
    p.add_argument(
        "--host-budget",
        metavar="B",
        help="with --offload: most host memory the plan may use ('8GiB'; default: no limit)",
    )
    p.add_argument(
        "--link-bandwidth",
        type=float,
        metavar="GBPS",
        help="with --offload: device-host bandwidth in GB/s for the transfer time (default: "
        "16, about half of PCIe 4.0 x16; the trace does not record the link)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--run", help="run to plan over (default: 'baseline' if any, else 'main')")
    p.set_defaults(handler=run)


# ----------------------------------------------------------------------------- the verb


def run(args: argparse.Namespace) -> int:
    if args.budget is None and not args.pareto:
        raise CLIError("give a budget (--budget 3GiB or --budget 60%), or ask for --pareto")
    if args.output is not None and args.budget is None:
        raise CLIError("-o writes the plan for a budget; add --budget")
    if args.output is not None:
        from ckview.cli.outputs import refuse_inputs

        refuse_inputs(args.output, [args.trace])
    wanted = _parse_budget(args.budget) if args.budget is not None else None
    base = _read_run(args.trace, args.run)
    name, tables = base.name, base.tables
    if wanted is not None:
        wanted = _on_device(wanted, args.trace, base.device_total_bytes)
    from ckview.analysis import Planner

    if args.offload and args.level != "op":
        raise CLIError("--offload is an op-level choice: add --level op")
    if args.host_budget is not None and not args.offload:
        raise CLIError("--host-budget limits what --offload moves to the host: add --offload")
    if args.link_bandwidth is not None and (not args.offload or args.link_bandwidth <= 0):
        raise CLIError("--link-bandwidth is a positive number of GB/s, used with --offload")
    host = _parse_budget(args.host_budget) if args.host_budget is not None else None
    try:
        planner = Planner(
            tables,
            level=args.level,
            offload=args.offload,
            host_budget=None if host is None else host.bytes(base.peak.bytes),
        )
    except ValueError as exc:
        raise CLIError(f"{args.trace}, run {name}: {exc}") from None
    result = planner.for_budget(wanted.bytes(planner.baseline_peak)) if wanted else None
    front = _fronts(planner) if args.pareto else None
    context = _Context(args.trace, name, tables["modules"], tables["strings"], planner)
    context.json = args.json
    context.times = times_line(tables)
    from ckview.analysis.projection.results import DEFAULT_LINK_BANDWIDTH

    context.bandwidth = (args.link_bandwidth or 0) * 1e9 or DEFAULT_LINK_BANDWIDTH
    if wanted is not None:
        context.budget = wanted.describe(planner.baseline_peak)
    if args.json:
        json.dump(_document(context, result, front), sys.stdout, indent=2)
        print()
    else:
        print(_report(context, result, front))
    return _finish(result, args.output, context)


def _fronts(planner: Any) -> dict[str, Any]:
    """The peak / extra-compute front at each of the three levels (module, op, op with
    offload), the planner's own first."""
    from ckview.analysis import Planner

    own = "offload" if planner.offload else planner.level
    fronts = {own: planner.pareto()}
    for name, level, offload in (("module", "module", False), ("op", "op", False)):
        if name not in fronts:
            fronts[name] = Planner(planner.tables, level=level, offload=offload).pareto()
    if "offload" not in fronts:
        fronts["offload"] = Planner(planner.tables, level="op", offload=True).pareto()
    return fronts


def _finish(result: Any, output: Path | None, context: _Context) -> int:
    """Write the plan file if asked and the plan fits; the exit code."""
    from ckview.analysis import budget_answer

    if result is None:
        return 0
    if not result.fits:
        print(
            f"ckview: {budget_answer(result, context.budget)}; "
            + (
                "; ".join(result.notes)  # nothing could be checkpointed: say why
                if result.notes and not result.regions
                else "raise the budget"
            )
            + (" (no plan file written)" if output is not None else ""),
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    if output is not None:
        try:
            output.write_text(json.dumps(result.plan, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise CLIError(f"cannot write the plan file {output}: {exc.strerror or exc}") from None
        print(
            f"wrote {output}: apply it with ckpt_runtime.apply_plan(model, {str(output)!r})",
            file=sys.stderr if context.json else sys.stdout,
        )
    return 0


# ----------------------------------------------------------------------------- input


def _parse_budget(text: str) -> Budget:
    """The ``--budget`` argument, read before the trace is (CLIError if it is no budget)."""
    from ckview.analysis import parse_budget

    try:
        return parse_budget(text)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _on_device(wanted: Budget, path: Path, total_bytes: int) -> Budget:
    """``wanted`` for the trace at ``path``: ``--budget device`` becomes the capacity of the
    device it was recorded on, ``total_bytes`` (CLIError if it has none)."""
    if not wanted.device:
        return wanted
    try:
        return wanted.on_device(total_bytes)
    except ValueError as exc:
        raise CLIError(f"{path}: {exc}") from None


def _read_run(path: Path, wanted: str | None) -> Run:
    """The run to plan over (``wanted``, else 'baseline', else 'main')."""
    run = read_run(path, wanted)
    if not len(run.tables["modules"]["path"]):
        raise CLIError(
            f"{path}, run {run.name}: no module ran in it (a trace imported from a memory "
            "snapshot has none), so there is nothing to checkpoint; record the script with "
            "'ckview record' to plan"
        )
    return run


# ----------------------------------------------------------------------------- output


class _Context:
    """What the report needs besides the results: where they come from, region names."""

    def __init__(
        self, path: Path, run: str, modules: Any, strings: list[str], planner: Any
    ) -> None:
        self.path, self.run, self.planner = path, run, planner
        self.modules, self.strings = modules, strings
        self.json = False
        self.times = ""
        """Where step time and extra compute come from (``common.times_line``)."""
        self.budget: str | None = None
        """The budget as shown (``Budget.describe``): a share says what it is a share of."""
        self.bandwidth = 0.0
        """Device-host bytes per second for an offload plan's transfer time."""

    def transfer_ns(self, offloaded: int) -> int:
        """Time to move ``offloaded`` bytes to the host and back (NOTE [ Offloaded
        instances ] in ckview.analysis.projection)."""
        return round(2 * offloaded / self.bandwidth * 1e9)

    def region(self, region: Any) -> str:
        """A region as a plan names it: a module path, or ``path[start:stop]``."""
        path = self.strings[int(self.modules["path"][region.module])] or "<model>"
        if hasattr(region, "start"):
            return f"{path}[{region.start}:{region.stop}]"
        if region.offload:
            return f"{path} (offload)"
        if region.save is not None:
            return f"{path} (save {', '.join(region.save)})"
        return path

    def regions(self, regions: Any) -> list[str]:
        return [self.region(r) for r in regions]

    def share(self, extra_ns: int) -> float:
        """Extra compute as a share of the step time (``ckview.analysis.cost``)."""
        from ckview.analysis.cost import share

        return share(extra_ns, self.planner.step_ns)

    def change(self, peak: int) -> float:
        base = self.planner.baseline_peak
        return (peak - base) / base if base else 0.0


def _report(context: _Context, result: Any, front: Any) -> str:
    from ckview.analysis import format_bytes as fb

    planner = context.planner
    lines = [
        f"{context.path}, run {context.run}: peak {fb(planner.baseline_peak)}, "
        f"step {planner.step_ns / 1e6:.1f} ms",
        context.times,
    ]
    lines += [f"note: {note}" for note in planner.notes()]
    if result is not None:
        lines += [
            "",
            *_plan_lines(context, result),
            "",
            *_preset_lines(context, result),
        ]
    for level, points in (front or {}).items():
        lines += ["", *_front_lines(context, points, level)]
    return "\n".join(lines)


def _plan_lines(context: _Context, result: Any) -> list[str]:
    from ckview.analysis import budget_answer
    from ckview.analysis import format_bytes as fb
    from ckview.analysis.timing import extra_range_text

    how = (
        f"exact: every plan judged, {result.evaluations} projections"
        if result.exact
        else f"heuristic search, {result.evaluations} projections"
    )
    title = "plan" if result.fits else "no plan fits the budget; the lowest peak is plan"
    lines = [budget_answer(result, context.budget), f"{title} {result.plan['name']} ({how}):"]
    names = context.regions(result.regions)
    if len(names) > MAX_LINES:
        names = [f"{name}  ({len(names)} regions)" for name in [", ".join(_compact(names))]]
    if not names:
        # NOTE: never "no plan fits" beside "the baseline already fits" (issue 9, item 4).
        names = [
            "(nothing: the baseline already fits)"
            if result.fits
            else "(nothing: no plan over the candidates lowers the peak)"
        ]
    lines += [f"  checkpoint {name}" for name in names]
    verdict = "fits" if result.fits else "does NOT fit"
    lines += [
        f"  projected peak  {fb(result.peak_bytes):>10}  ({context.change(result.peak_bytes):+.1%} "
        f"vs baseline {fb(result.baseline_peak_bytes)}; {verdict} the budget)",
        f"  extra compute   {result.extra_compute_ns / 1e6:>7.1f} ms  "
        f"({context.share(result.extra_compute_ns):.1%} of the step"
        f"{extra_range_text(result.extra_compute_range_ns)})",
    ]
    offloaded = result.plan.get("meta", {}).get("planner", {}).get("offloaded_bytes", 0)
    if offloaded:
        lines.append(
            f"  offloaded       {fb(offloaded):>10}  (to host and back: "
            f"{context.transfer_ns(offloaded) / 1e6:.1f} ms at {context.bandwidth / 1e9:g} GB/s)"
        )
    return lines


def _preset_lines(context: _Context, result: Any) -> list[str]:
    from ckview.analysis import format_bytes as fb

    if not result.presets:
        return ["presets: none apply (the model has no chain of blocks)"]
    lines = [f"  {'preset':<8}{'peak':>11}{'vs baseline':>13}{'extra compute':>18}  fits"]
    rows = [(p.name, p.peak_bytes, p.extra_compute_ns) for p in result.presets]
    rows.append(("planner", result.peak_bytes, result.extra_compute_ns))
    for name, peak, extra in rows:
        fits = "yes" if peak <= result.budget_bytes else "no"
        lines.append(
            f"  {name:<8}{fb(peak):>11}{context.change(peak):>+13.1%}"
            f"{extra / 1e6:>9.1f} ms {context.share(extra):>5.1%}  {fits}"
        )
    lines += [f"  {p.name}: {p.idle}" for p in result.presets if p.idle is not None]
    return ["beside the presets:", *lines]


def _front_lines(context: _Context, front: Any, level: str) -> list[str]:
    from ckview.analysis import format_bytes as fb

    shown = _thin(front, MAX_LINES)
    notes = [f"{level}-level plans no other plan of that level beats on both"]
    if not context.planner.exact:
        notes.append("heuristic: among the plans judged")
    if len(shown) < len(front):
        notes.append(f"{len(shown)} of {len(front)} shown, --json for all")
    lines = [
        f"peak vs extra compute ({'; '.join(notes)}):",
        f"  {'peak':>11}{'vs baseline':>13}{'extra compute':>18}  regions",
    ]
    for point in shown:
        names = _clip(", ".join(_compact(context.regions(point.regions))), len(point.regions))
        lines.append(
            f"  {fb(point.peak_bytes):>11}{context.change(point.peak_bytes):>+13.1%}"
            f"{point.extra_compute_ns / 1e6:>9.1f} ms {context.share(point.extra_compute_ns):>5.1%}"
            f"  {names}"
        )
    return lines


def _document(context: _Context, result: Any, front: Any) -> dict[str, Any]:
    """The JSON output: the run, the plan and presets (with --budget), the front (--pareto)."""
    planner = context.planner
    doc: dict[str, Any] = {
        "trace": str(context.path),
        "run": context.run,
        "baseline_peak_bytes": planner.baseline_peak,
        "step_ns": planner.step_ns,
        "times": "plain" if planner.plain_times else "recorded",
        "exact": planner.exact,
        "level": planner.level,
        "offload": planner.offload,
        "notes": list(planner.notes()),
    }
    if result is not None:
        doc |= {
            "budget_bytes": result.budget_bytes,
            "fits": result.fits,
            "projected_peak_bytes": result.peak_bytes,
            "best_reachable_peak_bytes": result.best_reachable_peak,
            "extra_compute_ns": result.extra_compute_ns,
            "extra_compute_low_ns": result.extra_compute_range_ns[0],
            "extra_compute_high_ns": result.extra_compute_range_ns[1],
            "extra_compute_percent": round(100 * context.share(result.extra_compute_ns), 3),
            "regions": context.regions(result.regions),
            "plan": result.plan,
            "evaluations": result.evaluations,
            "offloaded_bytes": result.plan["meta"]["planner"].get("offloaded_bytes", 0),
            "transfer_ns": context.transfer_ns(
                result.plan["meta"]["planner"].get("offloaded_bytes", 0)
            ),
            "link_bandwidth": context.bandwidth,
            "presets": [
                _point_json(context, p, p.name) | {"not_in_effect": p.idle} for p in result.presets
            ],
        }
    if front is not None:
        doc["pareto"] = [_point_json(context, p) for p in next(iter(front.values()))]
        doc["pareto_levels"] = {
            level: [_point_json(context, p) for p in points] for level, points in front.items()
        }
    return doc


def _point_json(context: _Context, point: Any, name: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {} if name is None else {"name": name}
    return out | {
        "regions": context.regions(point.regions),
        "projected_peak_bytes": point.peak_bytes,
        "extra_compute_ns": point.extra_compute_ns,
        "extra_compute_percent": round(100 * context.share(point.extra_compute_ns), 3),
    }


def _compact(names: list[str]) -> list[str]:
    """Runs of numbered siblings as one range: ``blocks.0, blocks.1, blocks.2`` ->
    ``blocks.0-2``."""
    out: list[str] = []
    run: tuple[str, int, int] | None = None  # (parent, first, last)
    for name in [*names, ""]:
        parent, _, last = name.rpartition(".")
        if run is not None and parent == run[0] and last.isdigit() and int(last) == run[2] + 1:
            run = (run[0], run[1], int(last))
            continue
        if run is not None:
            first = f"{run[0]}.{run[1]}" if run[0] else str(run[1])
            out.append(first if run[1] == run[2] else f"{first}-{run[2]}")
            run = None
        if last.isdigit():
            run = (parent, int(last), int(last))
        elif name:
            out.append(name)
    return out


def _thin(points: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` of ``points``, evenly spread, the first and last kept."""
    if len(points) <= limit:
        return points
    picks = sorted({round(i * (len(points) - 1) / (limit - 1)) for i in range(limit)})
    return [points[i] for i in picks]


def _clip(text: str, count: int, width: int = 80) -> str:
    """``text`` cut to about ``width`` characters, saying how many regions it lists."""
    if not text:
        return "(none)"
    if len(text) <= width:
        return text
    cut = text.rfind(", ", 0, width)
    return text[: cut if cut > 0 else width] + f", ... ({count} regions)"
