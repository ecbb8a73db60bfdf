"""``ckview fit``: the peak at another size, or the largest size that fits a budget, from two
recordings of one step at two sizes (batch, sequence length, image side).

The two runs are matched and each storage's scaling read from its shapes
(``ckview.analysis.fit``); the step at size N is then projected as plans project a recorded
run, so ``--plan``, the presets and the planner apply to it. ``--budget device`` compares what
the CUDA caching allocator would reserve (``ckview.analysis.reserved``) plus what the recording
saw taken outside PyTorch with the device's capacity. Imports no torch.

Exit codes: 0; 1 when no size fits the budget without checkpointing; 2 for bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.common import one_line, read_plan, read_run, resolve_plan, save_warning_lines
from ckview.cli.errors import CLIError

if TYPE_CHECKING:
    from ckview.analysis.allocator import AllocatorSettings
    from ckview.analysis.fit import SizeFit
    from ckview.app.run import Run

EXIT_NONE_FITS = 1
"""Exit code of ``--budget`` when not even size 1 fits without checkpointing."""

TOP_MODULES = 5
"""Modules listed under the projected peak in text (JSON has ten)."""


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "fit",
        help="project the peak at another batch or sequence size, or the largest size that fits",
        description=(
            "From two recordings of the same step at two sizes (batch, sequence length, image "
            "side: record both with 'ckview record --sizes batch=4,8 script.py --batch {}'), "
            "project the step at another size: its peak (--at N), or the largest size whose "
            "projected peak fits a budget (--budget X), without and with checkpointing."
        ),
    )
    p.add_argument("traces", type=Path, nargs=2, metavar="TRACE", help="the two recordings")
    p.add_argument(
        "--sizes",
        type=_size,
        nargs=2,
        required=True,
        metavar=("A", "B"),
        help="the size each trace was recorded at, in the order of the traces",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--at", type=_size, metavar="N", help="project the step at size N")
    what.add_argument(
        "--budget",
        metavar="X",
        help="the largest size that fits X: a size ('16GiB'), a share of the first trace's "
        "peak ('80%%'), or 'device' (a CUDA trace: reserved memory plus what CUDA and "
        "libraries took, against the device's capacity)",
    )
    p.add_argument(
        "--plan",
        metavar="PLAN",
        help="a plan file or a preset (none, all, every:K, sqrt): --at projects it (default "
        "none); --budget adds it to the presets and the planner's plan",
    )
    p.add_argument("--run", help="run of both traces (default: 'baseline' if any, else 'main')")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(handler=run)


def _size(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a size is a positive whole number, not {text!r}")
    return int(text)


# ----------------------------------------------------------------------------- the verb


def run(args: argparse.Namespace) -> int:
    from ckview.analysis.fit import StreamsPart, fit_sizes

    path_a, path_b = args.traces
    run_a, run_b = read_run(path_a, args.run), read_run(path_b, args.run)
    sizes = (args.sizes[0], args.sizes[1])
    try:
        fit = fit_sizes(run_a.tables, run_b.tables, sizes)
    except (StreamsPart, ValueError) as exc:
        raise CLIError(f"{path_a} and {path_b}: {exc}") from None
    context = _Context(args, fit, run_a, run_b)
    code = _at(context, args.at) if args.at is not None else _budget(context, args.budget)
    for line in _save_warnings(context):  # NOTE [ Saves the projection cannot hold ]
        print(f"ckview: warning: {line}", file=sys.stderr)
    return code


def _save_warnings(context: _Context) -> list[str]:
    """``--plan``'s save entries the projection cannot hold, judged on the first recording
    (the ops of a block are the same at every size)."""
    source = context.args.plan
    if source is None:
        return []
    return save_warning_lines(context.run_a.tables, read_plan(source), source)


@dataclass
class _Context:
    """The fit and what the answers need from the recordings."""

    args: argparse.Namespace
    fit: SizeFit
    run_a: Run
    run_b: Run
    settings: AllocatorSettings | None = None
    """The allocator's settings (the first trace's meta) where the run holds CUDA storages,
    else None."""
    overhead: int = 0
    """Device memory the recordings saw taken outside PyTorch (the most of both)."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from ckview.analysis.allocator import settings_from_meta
        from ckview.analysis.reserved import cuda_ordinals
        from ckview.trace import open_trace

        tables = self.run_a.tables
        if not cuda_ordinals(tables["strings"], tables["storages"]["device"]):
            return  # a CPU trace: no allocator to model

        with open_trace(self.args.traces[0]) as trace:
            conf = trace.meta.allocator_settings
        try:
            self.settings = settings_from_meta(conf)
        except ValueError as exc:
            self.notes.append(f"allocator settings not understood ({exc}); torch's defaults used")
            from ckview.analysis.allocator import AllocatorSettings

            self.settings = AllocatorSettings()
        seen = [r.device.not_by_pytorch for r in (self.run_a, self.run_b) if r.device]
        known = [s for s in seen if s >= 0]
        self.overhead = max(known, default=0)
        if not known:
            self.notes.append("NVML did not say what CUDA and libraries took: counted as 0")

    def header(self) -> str:
        a, b = self.args.traces
        counts = self.fit.counts()
        parts = [f"{counts[k]} {k}" for k in ("constant", "linear", "quadratic", "higher")]
        parts = [p for p in parts if not p.startswith("0 ")]
        if counts["from_bytes"]:
            parts.append(f"{counts['from_bytes']} fitted from their bytes")
        n = len(self.fit.degree)
        return (
            f"{a} at {self.fit.sizes[0]}, {b} at {self.fit.sizes[1]} (run {self.run_a.name!r}): "
            f"{n} storages, {', '.join(parts)}"
        )

    def reserved(self, tables: Any, projection: Any) -> int:
        """What the caching allocator would reserve over ``projection`` of ``tables``."""
        from ckview.analysis.reserved import reserved_over, reserved_peak

        assert self.settings is not None
        events = projection.events
        return reserved_peak(
            reserved_over(
                tables["storages"], tables["strings"], events.table(), events.copy, self.settings
            )
        )


# ----------------------------------------------------------------------------- --at


def _at(context: _Context, n: int) -> int:
    from ckview.analysis import bytes_by_category, bytes_by_module, module_paths, project
    from ckview.app.run import CATEGORY_LABELS

    tables = context.fit.tables_at(n)
    source = context.args.plan or "none"
    regions = resolve_plan(read_plan(source), tables, source)
    projection = project(tables, list(regions.regions))
    live = projection.live.storage
    by_category = {
        CATEGORY_LABELS[c]: b for c, b in bytes_by_category(tables["storages"], live).items() if b
    }
    paths = module_paths(tables["modules"], tables["strings"])
    by_module = [
        (paths[m] if m >= 0 else "(no module)", b)
        for m, b in bytes_by_module(tables["storages"], live)
    ]
    doc: dict[str, Any] = {
        "at": n,
        "sizes": list(context.fit.sizes),
        "plan": regions.name,
        "projected_peak_bytes": int(projection.peak.bytes),
        "extra_compute_ns": int(projection.extra_compute_ns),
        "by_category": by_category,
        "by_module": [{"module": m, "bytes": b} for m, b in by_module],
        "scaling": context.fit.counts(),
        "notes": context.notes,
    }
    if context.settings is not None:
        doc["projected_reserved_bytes"] = context.reserved(tables, projection)
        doc["not_by_pytorch_bytes"] = context.overhead
        doc["device_total_bytes"] = context.run_a.device_total_bytes
    if context.args.json:
        _print_json(doc)
    else:
        print("\n".join(_at_lines(context, doc)))
    return 0


def _at_lines(context: _Context, doc: dict[str, Any]) -> list[str]:
    from ckview.analysis import format_bytes as fb

    lines = [context.header(), ""]
    lines.append(
        f"at {doc['at']}, plan {doc['plan']}: projected peak {fb(doc['projected_peak_bytes'])}"
        + (
            f", extra compute {doc['extra_compute_ns'] / 1e6:.1f} ms"
            if doc["plan"] != "none"
            else ""
        )
    )
    if "projected_reserved_bytes" in doc:
        total = doc["projected_reserved_bytes"] + doc["not_by_pytorch_bytes"]
        lines.append(
            f"  reserved (allocator model) {fb(doc['projected_reserved_bytes'])} + outside "
            f"PyTorch {fb(doc['not_by_pytorch_bytes'])} = {fb(total)}"
            + _of_device(total, doc["device_total_bytes"])
        )
    if doc["extra_compute_ns"]:
        lines.append(f"  {EXTRA_TIMES}")
    lines.append("  by category at the peak:")
    lines += [f"    {name:<22}{fb(b):>12}" for name, b in doc["by_category"].items()]
    lines.append("  by module at the peak:")
    lines += [
        f"    {row['module']:<40}{fb(row['bytes']):>12}" for row in doc["by_module"][:TOP_MODULES]
    ]
    return lines + [f"note: {note}" for note in context.notes]


def _of_device(total: int, capacity: int) -> str:
    from ckview.analysis import format_bytes as fb

    if capacity < 0:
        return ""
    verdict = "fits" if total <= capacity else "does NOT fit"
    return f" of the device's {fb(capacity)}: {verdict}"


# ----------------------------------------------------------------------------- --budget


@dataclass(frozen=True)
class _Verdict:
    """One plan at one size: its projected peak (reserved + outside PyTorch on a device
    budget), whether that fits, its extra compute and its regions as the plan names them."""

    peak: int
    fits: bool
    extra_ns: int
    plan: str


def _budget(context: _Context, text: str) -> int:
    from ckview.analysis import parse_budget
    from ckview.analysis.fit import largest_size

    try:
        wanted = parse_budget(text)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    path = context.args.traces[0]
    if wanted.device:
        if context.settings is None:
            raise CLIError(
                f"{path} was recorded on the CPU: --budget device needs a CUDA trace (or give a "
                "size, e.g. --budget 16GiB)"
            )
        try:
            wanted = wanted.on_device(context.run_a.device_total_bytes)
        except ValueError as exc:
            raise CLIError(f"{path}: {exc}") from None
    budget = wanted.bytes(context.run_a.peak.bytes)
    judge = _Judge(context, budget, wanted.device)
    rows = []
    for name in judge.names():
        largest = largest_size(functools.partial(judge.fits, name), context.fit.sizes[0])
        there = judge.at(largest).get(name) if largest else None
        rows.append(_row(name, largest, there))
    doc = {
        "sizes": list(context.fit.sizes),
        "budget_bytes": budget,
        "budget": wanted.describe(context.run_a.peak.bytes, "the first trace's peak"),
        "device": wanted.device,
        "largest": rows[0]["largest"],
        "plans": rows,
        "scaling": context.fit.counts(),
        "notes": context.notes,
    }
    if wanted.device:
        doc["not_by_pytorch_bytes"] = context.overhead
    if context.args.json:
        _print_json(doc)
    else:
        print("\n".join(_budget_lines(context, doc, judge)))
    return EXIT_NONE_FITS if rows[0]["largest"] == 0 else 0


def _row(name: str, largest: int | None, there: _Verdict | None) -> dict[str, Any]:
    return {
        "plan": name,
        "largest": largest,
        "projected_peak_bytes": there.peak if there else None,
        "extra_compute_ns": there.extra_ns if there else None,
        "plan_name": there.plan if there else None,
    }


class _Judge:
    """Each plan's verdict at a size, for every size asked once (a planner per size)."""

    BEST = "planner"
    """The row of the planner's cheapest plan that fits."""

    def __init__(self, context: _Context, budget: int, device: bool) -> None:
        self.context, self.budget, self.device = context, budget, device
        self.plan = read_plan(context.args.plan) if context.args.plan else None
        self._seen: dict[int, dict[str, _Verdict]] = {}
        self._names: list[str] | None = None

    def names(self) -> list[str]:
        """The rows: none, the presets the model has, the planner's plan, then --plan's."""
        if self._names is None:
            self.at(self.context.fit.sizes[0])
        assert self._names is not None
        return self._names

    def fits(self, name: str, n: int) -> bool:
        """Whether plan ``name`` fits the budget at size ``n``."""
        return self.at(n)[name].fits

    def at(self, n: int) -> dict[str, _Verdict]:
        verdicts = self._seen.get(n)
        if verdicts is None:
            verdicts = self._seen[n] = self._judge(n)
            if self._names is None:
                self._names = list(verdicts)
        return verdicts

    def _judge(self, n: int) -> dict[str, _Verdict]:
        from ckview.analysis import Planner

        tables = self.context.fit.tables_at(n)
        out: dict[str, _Verdict] = {}
        limit = self.budget - self.context.overhead if self.device else self.budget
        try:
            result = Planner(tables).for_budget(limit)
        except ValueError as exc:  # no chain of blocks: only the baseline and --plan
            note = f"no presets nor planner: {one_line(exc)}"
            if note not in self.context.notes:
                self.context.notes.append(note)
            out["none"] = self._project(tables, "none", read_plan("none"))
        else:
            for preset in result.presets:
                out[preset.name] = self._verdict(
                    tables, preset.name, preset.regions, preset.peak_bytes, preset.extra_compute_ns
                )
            best = self._verdict(
                tables,
                _regions_text(result.plan["regions"]),
                result.regions,
                result.peak_bytes,
                result.extra_compute_ns,
            )
            out[self.BEST] = best if result.fits else _Verdict(best.peak, False, 0, best.plan)
        if self.plan is not None:
            out[f"--plan {self.context.args.plan}"] = self._project(
                tables, self.context.args.plan, self.plan
            )
        return out

    def _project(self, tables: Any, source: str, plan: Any) -> _Verdict:
        from ckview.analysis import project

        regions = resolve_plan(plan, tables, source)
        projection = project(tables, list(regions.regions))
        return self._verdict(
            tables,
            regions.name,
            regions.regions,
            int(projection.peak.bytes),
            int(projection.extra_compute_ns),
            projection,
        )

    def _verdict(
        self,
        tables: Any,
        name: str,
        regions: Any,
        peak: int,
        extra_ns: int,
        projection: Any = None,
    ) -> _Verdict:
        if not self.device:
            return _Verdict(peak, peak <= self.budget, extra_ns, name)
        from ckview.analysis import project

        projection = projection or project(tables, list(regions))
        total = self.context.reserved(tables, projection) + self.context.overhead
        return _Verdict(total, total <= self.budget, extra_ns, name)


def _regions_text(regions: list[dict[str, Any]]) -> str:
    """A plan's regions as its file names them: 'checkpoint 1.layers.0, 1.layers.1'."""
    names = [
        f"{r['sequential']}[{r['start']}:{r['stop']}]" if "sequential" in r else str(r["module"])
        for r in regions
    ]
    return "checkpoint " + ", ".join(names) if names else "checkpoint nothing"


def _budget_lines(context: _Context, doc: dict[str, Any], judge: _Judge) -> list[str]:
    from ckview.analysis import format_bytes as fb
    from ckview.analysis.fit import MAX_SIZE

    what = (
        "reserved by the caching allocator (model) + outside PyTorch "
        f"{fb(context.overhead)}, against"
        if doc["device"]
        else "projected peak of live tensors against"
    )
    lines = [context.header(), "", f"{what} the budget {doc['budget']}:"]
    width = max(len(r["plan"]) for r in doc["plans"])
    for row in doc["plans"]:
        label = f"  {row['plan']:<{width}}  "
        if row["largest"] is None:
            lines.append(f"{label}every size up to {MAX_SIZE} fits (nothing grows enough)")
        elif row["largest"] == 0:
            lines.append(f"{label}no size fits, not even 1")
        else:
            extra = row["extra_compute_ns"] or 0
            lines.append(
                f"{label}largest size {row['largest']:>7}   peak there "
                f"{fb(row['projected_peak_bytes']):>10}"
                + (f"   extra compute {extra / 1e6:.1f} ms" if extra else "")
                + (f"   ({row['plan_name']})" if row["plan"] == judge.BEST else "")
            )
    if any(row["extra_compute_ns"] for row in doc["plans"]):
        lines.append(EXTRA_TIMES)
    return lines + [f"note: {note}" for note in context.notes]


EXTRA_TIMES = (
    "extra compute: from the first recording's op times, not scaled with the size (record at "
    "the size for its own)"
)


def _print_json(doc: dict[str, Any]) -> None:
    json.dump(doc, sys.stdout, indent=2)
    print()
