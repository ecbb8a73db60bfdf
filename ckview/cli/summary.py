"""``ckview summary``: the peak of each run and what fills memory there (text or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ckview.cli.errors import CLIError


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "summary",
        help="peak memory and what fills it, per run",
        description="Print the peak of each run of TRACE, its breakdown and the top tensors.",
    )
    p.add_argument("trace", type=Path, metavar="TRACE")
    p.add_argument(
        "--run", dest="runs", action="append", help="only this run (repeatable); default: all"
    )
    p.add_argument("--top", type=int, default=8, help="modules and tensors to list (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ckview.analysis import summarize_run
    from ckview.trace import open_trace

    with open_trace(args.trace) as trace:
        names = args.runs or trace.run_names
        missing = [n for n in names if n not in trace.run_names]
        if missing:
            raise CLIError(
                f"{args.trace} has no run {missing[0]!r}; runs: {', '.join(trace.run_names)}"
            )
        strings = trace.strings
        modules = trace.modules.read()
        runs = {}
        leftovers: dict[str, Any] = {}
        for name in names:
            tables = {t: trace.run(name).table(t).read() for t in _TABLES}
            summary = summarize_run(tables, modules, list(strings), top=args.top)
            phases = (
                _peak_phase(tables, summary.peak_event),
                _peak_phase(tables, summary.activation_peak.event),
            )
            runs[name] = (summary, phases)
            leftovers[name] = _leftover(trace.run(name), tables, list(strings))
        meta = trace.meta
    if args.json:
        doc = {
            "trace": str(args.trace),
            "meta": _jsonable(meta),
            "runs": {
                n: {
                    **s.to_json(),
                    "peak_phase": ph[0],
                    "activation_peak_phase": ph[1],
                    "leftover_recompute": leftovers[n] and leftovers[n].to_json(),
                }
                for n, (s, ph) in runs.items()
            },
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    print(_header(args.trace, meta, len(runs)))
    if len(runs) > 1:
        print()
        print(_comparison({name: summary for name, (summary, _) in runs.items()}))
    for name, (summary, phases) in runs.items():
        print()
        print(_format_run(name, summary, *phases))
        if leftovers[name] is not None:
            print(f"  warning: {leftovers[name].describe(name)}")
    return 0


_TABLES = (
    "steps",
    "module_calls",
    "ops",
    "memory_events",
    "storages",
    "recompute_regions",
    "timing_steps",
)


def _leftover(run: Any, tables: dict[str, Any], strings: list[str]) -> Any:
    """Recompute in a run whose script checkpointing was bypassed, or None
    (NOTE [ Recompute in a bypassed run ] in ckview/analysis/recompute.py)."""
    from ckview.analysis.recompute import PLAN, SCRIPT, leftover_recompute, run_checkpointing

    kind = run_checkpointing(run.name, run.checkpointing)
    if kind == SCRIPT:
        return None
    return leftover_recompute(tables, strings, plan_run=kind == PLAN)


def _peak_phase(tables: dict[str, dict[str, Any]], event: int) -> str:
    """The phase of the op at (or just before) the peak event, e.g. 'backward'."""
    from ckview.trace.schema import Phase

    if event < 0:
        return "start"
    op = int(tables["memory_events"]["op"][event])
    return "start" if op < 0 else Phase(int(tables["ops"]["phase"][op])).name.lower()


def _jsonable(meta: Any) -> dict[str, Any]:
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(meta).items()}


def _header(path: Path, meta: Any, n_runs: int) -> str:
    state = "complete" if meta.complete else f"INCOMPLETE: {meta.error}"
    lines = [
        f"{path}: {meta.steps_recorded} step(s) recorded on {meta.device} in {n_runs} run(s) "
        f"(torch {meta.torch_version}, ckview {meta.ckview_version}), {state}",
        f"command: {' '.join(meta.command)}",
    ]
    if meta.step_rule:
        lines.append(f"steps: {meta.step_rule}")
    if meta.compiled == "eager":
        lines.append(f"torch.compile: {_COMPILED.get(meta.compiled, meta.compiled)}")
    return "\n".join(lines)


_COMPILED = {
    "no": "not used",
    "eager": "the script compiles code; ckview ran it eagerly while recording, so these steps "
    "hold eager memory (compiled code usually saves less for backward)",
}


def _comparison(runs: dict[str, Any]) -> str:
    """The runs side by side: peak and activations at the peak, step time (plain where every
    run has timing steps: NOTE [ Extra compute from plain times ] in analysis/timing.py)."""
    from ckview.analysis import format_bytes as fb

    first_name, first = next(iter(runs.items()))
    plain = all(s.plain_step is not None for s in runs.values())
    width = max(len(n) for n in runs) + 2
    lines = [
        f"{'run':<{width}}{'peak':>11}{'vs ' + first_name:>16}{'activations':>13}"
        f"{'step time':>12}{'vs ' + first_name:>16}"
    ]
    for name, s in runs.items():
        change = _change(s.peak_bytes, first.peak_bytes)
        step, spread = _step_time(s, plain)
        slower = _change(step, _step_time(first, plain)[0])
        lines.append(
            f"{name:<{width}}{fb(s.peak_bytes):>11}{change:>+15.1%} "
            f"{fb(s.activation_bytes_saved):>12}{step / 1e6:>9.1f} ms{slower:>+15.1%}{spread}"
        )
    if plain:
        n = min(s.plain_step.count for s in runs.values())
        lines.append(f"step time: median of {n} plain (unrecorded) steps per run (low..high)")
    else:
        lines.append(
            "step time: mean of the recorded steps, with the recorder's per-op cost (it "
            "inflates recompute most); record with --timing-steps 3 for plain step times"
        )
    return "\n".join(lines)


def _change(value: float, reference: float) -> float:
    return (value - reference) / reference if reference else 0.0


def _step_time(s: Any, plain: bool) -> tuple[float, str]:
    """One step's time (plain median, else the recorded mean) and its spread as text."""
    if plain:
        p = s.plain_step
        return p.median_ns, f"  ({p.low_ns / 1e6:.1f}..{p.high_ns / 1e6:.1f})"
    return s.step_ns / max(len(s.steps), 1), ""


def _activation_lines(peak: Any, phase: str) -> list[str]:
    """The activation high-water mark and the modules whose saved tensors make it up."""
    from ckview.analysis import format_bytes as fb

    if peak.bytes == 0:
        return ["  activations      0 B  (nothing was saved for backward)"]
    lines = [
        f"  activations {fb(peak.bytes):>11}  at most, at {peak.time_ns / 1e6:.1f} ms "
        f"(step {peak.step}, {phase}), saved by:"
    ]
    lines += [f"    {fb(b):>11}  {path}" for path, b in peak.top_modules[:3]]
    return lines


def _format_run(name: str, s: Any, phase: str, phase_at_activation_peak: str) -> str:
    from ckview.analysis import format_bytes as fb

    lines = [
        f"run {name}",
        f"  peak        {fb(s.peak_bytes):>11}  at {s.peak_time_ns / 1e6:.1f} ms "
        f"(step {s.peak_step}, {phase})",
        f"  at start    {fb(s.baseline_bytes):>11}",
        *_activation_lines(s.activation_peak, phase_at_activation_peak),
        f"  ops {s.n_ops}, memory events {s.n_memory_events}, "
        f"recompute {s.recompute_ns / 1e6:.1f} ms of {s.step_ns / 1e6:.1f} ms (recorded)",
        *_plain_step_line(s.plain_step),
        "  at the peak, by category:",
    ]
    for category, nbytes in sorted(s.by_category.items(), key=lambda kv: -kv[1]):
        share = 100 * nbytes / s.peak_bytes if s.peak_bytes else 0.0
        lines.append(f"    {category:<16}{fb(nbytes):>11}  {share:5.1f}%")
    lines.append("  at the peak, by module (a parameter, its gradient and state count with it):")
    lines += [f"    {fb(b):>11}  {path}" for path, b in s.top_modules]
    lines.append("  largest tensors at the peak:")
    for t in s.top_storages:
        where = t["module"] + (f" ({t['op']})" if t["op"] else "")
        kind = f"{t['category']:<15} {t['dtype']:<9} {t['shape']:<16}"
        lines.append(f"    {fb(t['nbytes']):>11}  {kind} {where}")
    lines.append("  steps:")
    for st in s.steps:
        lines.append(
            f"    step {st['step']}: {st['duration_ns'] / 1e6:8.1f} ms, {_held(st)}, "
            f"peak {fb(st['peak_bytes'])}, "
            f"allocated in step up to {fb(st['allocated_peak_bytes'])}"
        )
    return "\n".join(lines)


def _plain_step_line(step: Any) -> list[str]:
    if step is None:
        return []
    return [
        f"  plain step  {step.median_ns / 1e6:8.1f} ms  (median of {step.count} unrecorded "
        f"steps, {step.low_ns / 1e6:.1f}..{step.high_ns / 1e6:.1f} ms)"
    ]


def _held(step: dict[str, int]) -> str:
    """What a step held: '4 fwd, 4 bwd, 1 opt' ('?' where a v1 trace does not say), and
    'partial' for a step cut short (the script ended or failed inside it)."""
    parts = [
        f"{'?' if step[key] < 0 else step[key]} {label}"
        for key, label in (("forwards", "fwd"), ("backwards", "bwd"), ("optimizer_steps", "opt"))
    ]
    return ", ".join(parts) + ("" if step["complete"] else ", partial")
