"""``ckview summary``: the peak of each run and what fills memory there (text or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.errors import no_such_run

if TYPE_CHECKING:
    from ckview.analysis import RunSummary
    from ckview.analysis.recompute import LeftoverRecompute
    from ckview.analysis.steadiness import UnlikeSteps
    from ckview.app.run import Run
    from ckview.cli.device import RunDevice


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "summary",
        help="peak memory and what fills it, per run",
        description="Print the peak of each run of TRACE, its breakdown and the top tensors.",
    )
    p.add_argument(
        "traces",
        type=Path,
        nargs="+",
        metavar="TRACE",
        help="a trace; several (run.rank*.h5), or the common stem run.h5 of rank traces, are "
        "shown side by side: each rank's peak, the imbalance, the same module in each",
    )
    p.add_argument(
        "--run", dest="runs", action="append", help="only this run (repeatable); default: all"
    )
    p.add_argument("--top", type=int, default=8, help="modules and tensors to list (default 8)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ckview.trace.ranks import expand_rank_paths

    paths = expand_rank_paths(args.traces)
    if len(paths) > 1:
        return _run_ranks(paths, args)
    args.trace = paths[0]
    return _run_one(args)


@dataclass(frozen=True)
class _RunFigures:
    """What the summary says of one run, beside the run itself."""

    run: Run
    summary: RunSummary
    peak_phase: str
    activation_peak_phase: str
    reserved: int
    """The most the CUDA caching allocator reserved (0 on the CPU)."""
    modelled: int | None
    """The most the model of the caching allocator reserves over the run's allocations
    (``ckview.analysis.reserved``), None on the CPU."""
    device: RunDevice
    """Device states and OOM."""
    leftover: LeftoverRecompute | None
    """Recompute left in a run whose checkpointing was bypassed (``_leftover``)."""
    unlike: UnlikeSteps | None
    """Recorded steps whose peaks differ (NOTE [ Steps that are not alike ])."""
    untracked: int | None
    """NOTE [ Allocated beyond the recorded tensors ]; None where no device sample says."""

    @classmethod
    def of(cls, run: Run, top: int, allocator_settings: str = "") -> _RunFigures:
        """``allocator_settings``: the trace's meta field, for the allocator model."""
        from ckview.analysis import summarize_run
        from ckview.analysis.stacks import reserved_peak
        from ckview.analysis.steadiness import unlike_steps
        from ckview.analysis.timeline import phase_at
        from ckview.cli.device import RunDevice

        t = run.tables
        summary = summarize_run(t, t["modules"], t["strings"], top=top)
        untracked = _untracked(run, summary)
        return cls(
            run=run,
            summary=summary,
            peak_phase=phase_at(t["ops"], t["memory_events"], summary.peak_event),
            activation_peak_phase=phase_at(
                t["ops"], t["memory_events"], summary.activation_peak.event
            ),
            reserved=reserved_peak(t["segments"]) or _sampled_reserved(run),
            modelled=_modelled_reserved(t, allocator_settings, untracked),
            device=RunDevice.of(run, top),
            leftover=_leftover(run),
            unlike=unlike_steps(t["storages"], t["memory_events"], t["steps"]),
            untracked=untracked,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.summary.to_json(),
            "peak_phase": self.peak_phase,
            "activation_peak_phase": self.activation_peak_phase,
            "leftover_recompute": self.leftover and self.leftover.to_json(),
            "unlike_steps": self.unlike and self.unlike.to_json(),
            "reserved_peak_bytes": self.reserved,
            "allocator_allocated_peak_bytes": _allocated(self.run),
            "untracked_bytes": self.untracked,
            "modelled_reserved_peak_bytes": self.modelled,
            "timeline_device": self.run.timeline_device,
            "left_out_storages": self.run.left_out,
            **self.device.to_json(),
        }

    def lines(self, snapshot: bool) -> list[str]:
        """The run's block of the text summary."""
        name = self.run.name
        phases = (self.peak_phase, self.activation_peak_phase)
        text = _format_run(name, self.summary, *phases, snapshot=snapshot)
        lines = [_with_reserved(text, self.reserved, self.modelled, self.untracked)]
        if self.run.timeline_device is not None:
            lines.append(_scope_line(self.run.timeline_device, self.run.left_out))
        if self.leftover is not None:
            lines.append(f"  warning: {self.leftover.describe(name)}")
        if self.unlike is not None:
            lines.append(f"  warning: {self.unlike.describe()}")
        return lines + self.device.state_lines()


def _run_one(args: argparse.Namespace) -> int:
    from ckview.app.run import read_run
    from ckview.trace import open_trace

    with open_trace(args.trace) as trace:
        names = args.runs or trace.run_names
        missing = [n for n in names if n not in trace.run_names]
        if missing:
            raise no_such_run(args.trace, missing[0], trace.run_names)
        meta = trace.meta
        runs = {
            name: _RunFigures.of(read_run(trace, name), args.top, meta.allocator_settings)
            for name in names
        }
    if args.json:
        doc = {
            "trace": str(args.trace),
            "meta": _jsonable(meta),
            "runs": {name: figures.to_json() for name, figures in runs.items()},
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    for name, figures in runs.items():
        if figures.device.oom is not None:
            print(figures.device.oom_lines(name, args.trace, figures.summary))
            print()
    print(_header(args.trace, meta, len(runs)))
    if len(runs) > 1:
        print()
        print(_comparison({name: figures.summary for name, figures in runs.items()}))
    for figures in runs.values():
        print()
        print("\n".join(figures.lines(snapshot=meta.source == "snapshot")))
    return 0


def _scope_line(device: str | None, left_out: dict[str, int]) -> str:
    """What the figures count, for a run on several devices."""
    others = ", ".join(f"{n:,} on {d}" for d, n in left_out.items())
    return f"  memory on {device} only; left out: storages {others}"


_ALL_MODULES = 1_000_000  # module rows summarize_run lists for the comparison of ranks


def _run_ranks(paths: list[Path], args: argparse.Namespace) -> int:
    """Several traces (the ranks of one run): per run, each rank's peak, the imbalance and the
    modules that fill the ranks' peaks, side by side."""
    from ckview.analysis import summarize_run
    from ckview.analysis.ranks import compare_ranks
    from ckview.app.run import read_run
    from ckview.trace import open_trace
    from ckview.trace.ranks import rank_of

    labels = [_rank_label(p, rank_of(p)) for p in paths]
    by_run: dict[str, list[Any]] = {}
    states = []
    for path in paths:
        with open_trace(path) as trace:
            meta = trace.meta
            states.append("complete" if meta.complete else f"INCOMPLETE: {meta.error}")
            names = args.runs or trace.run_names
            for name in names:
                if name not in trace.run_names:
                    raise no_such_run(path, name, trace.run_names)
                t = read_run(trace, name).tables
                summary = summarize_run(t, t["modules"], t["strings"], top=_ALL_MODULES)
                by_run.setdefault(name, []).append(summary)
    complete = {n: s for n, s in by_run.items() if len(s) == len(paths)}
    comparisons = {n: compare_ranks(labels, s, top=args.top) for n, s in complete.items()}
    if args.json:
        doc = {
            "traces": [str(p) for p in paths],
            "states": states,
            "runs": {n: c.to_json() for n, c in comparisons.items()},
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"{len(paths)} traces: "
        + ", ".join(f"{p} ({s})" for p, s in zip(paths, states, strict=True))
    )
    for name, comparison in comparisons.items():
        print()
        print(_format_ranks(name, comparison, by_run[name]))
    missing = sorted(set(by_run) - set(complete))
    if missing:
        print(f"\nruns not in every trace (see each trace's summary): {', '.join(missing)}")
    return 0


def _rank_label(path: Path, rank: int | None) -> str:
    return path.name if rank is None else f"rank {rank}"


def _format_ranks(name: str, c: Any, summaries: list[Any]) -> str:
    from ckview.analysis import format_bytes as fb

    width = max(len(label) for label in c.labels) + 2
    lines = [
        f"run {name}",
        f"  {'':<{width}}{'peak':>11}  {'at':<22}{'activations':>12}",
    ]
    for label, s in zip(c.labels, summaries, strict=True):
        at = f"step {s.peak_step}, {s.peak_time_ns / 1e6:.1f} ms"
        lines.append(
            f"  {label:<{width}}{fb(s.peak_bytes):>11}  {at:<22}{fb(s.activation_peak.bytes):>12}"
        )
    ratio = "inf" if c.imbalance == float("inf") else f"{c.imbalance:.2f}x"
    if c.highest == c.lowest:  # every peak equal
        lines.append(f"  imbalance: none (every peak {fb(c.peaks[c.highest])})")
    else:
        lines.append(
            f"  imbalance: highest peak / lowest = {ratio} ({c.labels[c.highest]} "
            f"{fb(c.peaks[c.highest])}, {c.labels[c.lowest]} {fb(c.peaks[c.lowest])})"
        )
    lines.append("  by module, at each rank's peak:")
    lines.append("    " + "".join(f"{label:>12}" for label in c.labels) + "  module")
    for path, values in c.modules:
        lines.append("    " + "".join(f"{fb(v):>12}" for v in values) + f"  {path}")
    return "\n".join(lines)


_FSDP_CATEGORIES = ("sharded_parameter", "unsharded_parameter", "comm_buffer")
_QUIET_CATEGORIES = (*_FSDP_CATEGORIES, "unknown")
"""Categories shown only where the run has some: FSDP's, and UNKNOWN (imported snapshots)."""


def _leftover(run: Run) -> LeftoverRecompute | None:
    """Recompute in a run whose script checkpointing was bypassed, or None
    (NOTE [ Recompute in a bypassed run ] in ckview/analysis/recompute.py)."""
    from ckview.analysis.recompute import PLAN, SCRIPT, leftover_recompute, run_checkpointing

    kind = run_checkpointing(run.name, run.checkpointing)
    if kind == SCRIPT:
        return None
    return leftover_recompute(run.tables, run.tables["strings"], plan_run=kind == PLAN)


def _jsonable(meta: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(meta)


def _header(path: Path, meta: Any, n_runs: int) -> str:
    from ckview.analysis.units import plural

    state = "complete" if meta.complete else f"INCOMPLETE: {meta.error}"
    if meta.source == "snapshot":
        what = f"imported from a PyTorch memory snapshot, {plural(n_runs, 'device')}"
    else:
        what = f"{plural(meta.steps_recorded, 'step')} recorded on {meta.device}"
    lines = [
        f"{path}: {what} in {plural(n_runs, 'run')} "
        f"(torch {meta.torch_version or '?'}, ckview {meta.ckview_version}"
        f"{f', {meta.recorder} recorder' if meta.recorder else ''}), {state}",
        f"command: {' '.join(meta.command)}",
    ]
    if meta.step_rule:
        lines.append(f"steps: {meta.step_rule}")
    if meta.compiled in ("eager", "compiled"):
        lines.append(f"torch.compile: {_COMPILED.get(meta.compiled, meta.compiled)}")
    return "\n".join(lines)


_COMPILED = {
    "no": "not used",
    "eager": "the script compiles code; ckview ran it eagerly while recording, so these steps "
    "hold eager memory (compiled code usually saves less for backward)",
    "compiled": "compiled code ran compiled while recording; a compiled graph's forward and "
    "backward are one op each, and modules inside it have no calls of their own",
}


def _comparison(runs: dict[str, Any]) -> str:
    """The runs side by side: peak and activations at the peak, step time (plain where every
    run has timing steps: NOTE [ Extra compute from plain times ] in analysis/timing.py). A run
    without a complete step (the script ended before or in its first step) is listed as such,
    never compared: its peak is not a step's."""
    from ckview.analysis import format_bytes as fb

    width = max(len(n) for n in runs) + 2
    recorded = {name: s for name, s in runs.items() if _complete_steps(s)}
    if not recorded:
        return "\n".join(f"{name:<{width}}  no step recorded" for name in runs)
    first_name, first = next(iter(recorded.items()))
    plain = all(s.plain_step is not None for s in recorded.values())
    lines = [
        f"{'run':<{width}}{'peak':>11}{'vs ' + first_name:>16}{'activations':>13}"
        f"{'step time':>12}{'vs ' + first_name:>16}"
    ]
    for name, s in runs.items():
        if name not in recorded:
            lines.append(f"{name:<{width}}  no step recorded (the script ended first)")
            continue
        change = _change(s.peak_bytes, first.peak_bytes)
        step, spread = _step_time(s, plain)
        slower = _change(step, _step_time(first, plain)[0])
        lines.append(
            f"{name:<{width}}{fb(s.peak_bytes):>11}{change:>+15.1%} "
            f"{fb(s.activation_bytes_saved):>12}{step / 1e6:>9.1f} ms{slower:>+15.1%}{spread}"
        )
    if plain:
        n = min(s.plain_step.count for s in recorded.values())
        lines.append(f"step time: median of {n} plain (unrecorded) steps per run (low..high)")
    else:
        lines.append(
            "step time: mean of the recorded steps, with the recorder's per-op cost (it "
            "inflates recompute most); record with --timing-steps 3 for plain step times"
        )
    return "\n".join(lines)


def _complete_steps(s: Any) -> int:
    return sum(1 for st in s.steps if st["complete"])


def _change(value: float, reference: float) -> float:
    return (value - reference) / reference if reference else 0.0


def _step_time(s: Any, plain: bool) -> tuple[float, str]:
    """One step's time (plain median, else the recorded mean) and its spread as text."""
    if plain:
        p = s.plain_step
        return p.median_ns, f"  ({p.low_ns / 1e6:.1f}..{p.high_ns / 1e6:.1f})"
    return s.step_ns / max(_complete_steps(s), 1), ""  # step_ns: complete steps only


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


def _format_run(
    name: str, s: Any, phase: str, phase_at_activation_peak: str, snapshot: bool = False
) -> str:
    """One run's summary; ``snapshot``: the trace was imported from a memory snapshot, which
    says nothing of ops, modules, categories and saved tensors (shown as unknown)."""
    from ckview.analysis import format_bytes as fb

    lines = [
        f"run {name}",
        f"  peak        {fb(s.peak_bytes):>11}  at {s.peak_time_ns / 1e6:.1f} ms "
        f"(step {s.peak_step}, {phase})",
        f"  at start    {fb(s.baseline_bytes):>11}",
    ]
    if snapshot:  # NOTE [ Unknown, never guessed ] in ckview/snapshot/convert.py
        if not s.activation_peak.bytes:
            lines.append("  activations     unknown  (a snapshot does not say what autograd saved)")
        lines.append(
            f"  memory events {s.n_memory_events} (from a snapshot: ops and modules unknown)"
        )
    else:
        lines += [
            *_activation_lines(s.activation_peak, phase_at_activation_peak),
            f"  ops {s.n_ops}, memory events {s.n_memory_events}, "
            f"recompute {s.recompute_ns / 1e6:.1f} ms of {s.step_ns / 1e6:.1f} ms (recorded)",
            *_plain_step_line(s.plain_step),
        ]
    lines.append("  at the peak, by category:")
    for category, nbytes in sorted(s.by_category.items(), key=lambda kv: -kv[1]):
        if nbytes == 0 and (snapshot or category in _QUIET_CATEGORIES):
            continue  # categories this run never has would only add empty lines
        share = 100 * nbytes / s.peak_bytes if s.peak_bytes else 0.0
        lines.append(f"    {category:<20}{fb(nbytes):>11}  {share:5.1f}%")
    if not snapshot:
        lines.append(
            "  at the peak, by module (a parameter, its gradient and state count with it):"
        )
        lines += [f"    {fb(b):>11}  {path}" for path, b in s.top_modules]
    lines.append("  largest tensors at the peak:")
    for t in s.top_storages:
        lines.append(f"    {fb(t['nbytes']):>11}  {_tensor_line(t, snapshot)}")
    lines.append("  steps:")
    for st in s.steps:
        lines.append(
            f"    step {st['step']}: {st['duration_ns'] / 1e6:8.1f} ms, {_held(st)}, "
            f"peak {fb(st['peak_bytes'])}, "
            f"allocated in step up to {fb(st['allocated_peak_bytes'])}"
        )
    return "\n".join(lines)


def _sampled_reserved(run: Run) -> int:
    """The allocator's reserved peak as the device samples saw it (0 if none did)."""
    return max(run.device.reserved, 0) if run.device is not None else 0


def _modelled_reserved(tables: Any, allocator_settings: str, untracked: int | None) -> int | None:
    """What the model of the caching allocator reserves at most over the run's allocations
    with the trace's settings (torch's defaults where they are not understood); None if no
    storage of the run is on a CUDA device, or the run has more than ``reserved.MAX_EVENTS``
    memory events."""
    from ckview.analysis.allocator import AllocatorSettings, settings_from_meta
    from ckview.analysis.reserved import MAX_EVENTS, reserved_over, reserved_peak

    if len(tables["memory_events"]["kind"]) > MAX_EVENTS:
        return None  # too long to replay here (reserved.MAX_EVENTS)
    try:
        settings = settings_from_meta(allocator_settings)
    except ValueError:
        settings = AllocatorSettings()
    curve = reserved_over(
        tables["storages"], tables["strings"], tables["memory_events"], None, settings
    )
    if curve is None:
        return None
    # what the recording did not see is in segments of its own, held throughout (NOTE
    # [ Allocated beyond the recorded tensors ]) if it is large: 2 MiB segments; a little may
    # share the small pool's segments, which the model cannot say
    untracked = untracked or 0
    outside = -(-untracked // _SEGMENT) * _SEGMENT if untracked > _SMALL else 0
    return reserved_peak(curve) + outside


_SEGMENT, _SMALL = 2 << 20, 1 << 20
"""The CUDA caching allocator's rounding of a large segment, and its largest small block."""


# NOTE [ Allocated beyond the recorded tensors ]
# On CUDA the caching allocator's own peak of allocated bytes (the device samples, as
# torch.cuda.max_memory_allocated counts them) is above the recorded peak by what the recorder
# does not see as a storage of the run: libraries' workspaces (cuBLAS keeps one per handle and
# stream, 32 MiB each on Hopper), memory allocated before the recording that no op of it
# touches, and the allocator's slack in blocks reused whole (NOTE [ Block sizes on CUDA ] in
# recorder/native/attribute.py). It is a constant the plans do not change, so projections
# leave it out; the summary says how large it is, and the allocator model's reserved memory
# counts it as segments of its own held throughout. Seen on an H200 (torch 2.11): 65 MiB on a
# 4-layer TransformerEncoder step whose recorded peak was 202 MiB.
def _allocated(run: Run) -> int | None:
    """The most the CUDA caching allocator had allocated, as the device samples saw it."""
    device = run.device
    return device.allocated if device is not None and device.allocated > 0 else None


def _untracked(run: Run, summary: RunSummary) -> int | None:
    """NOTE [ Allocated beyond the recorded tensors ]: the allocator's allocated peak less the
    recorded peak; None where no device sample says."""
    allocated = _allocated(run)
    return None if allocated is None else allocated - summary.peak_bytes


def _untracked_line(untracked: int) -> str:
    from ckview.analysis import format_bytes as fb

    if untracked <= 0:
        return "  allocated   as recorded   at the CUDA caching allocator's peak"
    return (
        f"  allocated   {fb(untracked):>11}  more at the allocator's peak: workspaces, "
        "memory not seen as tensors"
    )


def _with_reserved(text: str, reserved: int, modelled: int | None, untracked: int | None) -> str:
    """A run's summary with, after its peak, what the allocator held beyond the recorded tensors
    and its reserved memory, recorded and as the allocator model projects it from the run's
    allocations, where it has any."""
    if not reserved and modelled is None and untracked is None:
        return text
    from ckview.analysis import format_bytes as fb

    lines = text.split("\n")
    at = 2
    if untracked is not None:
        lines.insert(at, _untracked_line(untracked))
        at += 1
    if reserved:
        what = "at most (CUDA caching allocator segments)"
        lines.insert(at, f"  reserved    {fb(reserved):>11}  {what}")
        at += 1
    if modelled is not None:
        off = f" ({_change(modelled, reserved):+.1%} vs recorded)" if reserved else ""
        what = f"projected by the allocator model from the allocations{off}"
        lines.insert(at, f"  reserved    {fb(modelled):>11}  {what}")
    return "\n".join(lines)


def _tensor_line(t: dict[str, Any], snapshot: bool) -> str:
    """What one of the largest tensors is and where it came from: its module and op, and the
    frame that allocated it when the trace has stacks (NOTE [ The frame that names an
    allocation ] in ckview/analysis/stacks.py)."""
    site = t.get("allocated_at", "")
    if snapshot:
        return f"{t['category']:<9} {site or '(no stack)'}"
    where = t["module"] + (f" ({t['op']})" if t["op"] else "")
    kind = f"{t['category']:<19} {t['dtype']:<9} {t['shape']:<16}"
    return f"{kind} {where}" + (f"  at {site}" if site else "")


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
