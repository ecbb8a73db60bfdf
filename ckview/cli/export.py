"""``ckview export``: a report-ready figure (PNG or SVG) of traces and projected plans, their
memory curves as CSV, or a run as a PyTorch memory snapshot pickle (``--snapshot``), without a
display and without torch.

The figure is drawn by ``ckview.gui.report`` on Qt's offscreen platform; the runs are read as
``ckview.app.run.Run``, plans are resolved like ``ckview project`` does (``read_plan``) and
projected over the first trace's baseline run with the explorer's ``PlanSession``, so the report
shows the numbers the GUI shows. The CSV needs no Qt: ``--csv`` alone imports none.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.common import one_line, read_plan
from ckview.cli.errors import CLIError, no_such_run

if TYPE_CHECKING:
    from ckview.app.report import PlanCurve
    from ckview.app.run import Axis, Run, TraceData
    from ckview.trace import TraceMeta

OUTPUTS = (".png", ".svg", ".csv")
MIN_WIDTH, MAX_WIDTH = 400, 10000


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "export",
        help="write a report figure (PNG/SVG) and the memory curves (CSV)",
        description=(
            "Draw every run of each TRACE (total memory compared, then live memory by category "
            "per run) and the projection of each PLAN over the first trace's baseline run, into "
            "one PNG or SVG figure; optionally write the curves as CSV. Needs no display."
        ),
    )
    p.add_argument(
        "traces", type=Path, nargs="+", metavar="TRACE", help="trace files from ckview record"
    )
    p.add_argument(
        "--plan",
        dest="plans",
        action="append",
        default=[],
        metavar="PLAN",
        help="a plan file or a preset (none, all, every:K, sqrt) to project; repeatable",
    )
    p.add_argument("--run", help="only the run of this name in each trace (default: every run)")
    p.add_argument(
        "-o",
        "--output",
        help="the figure: .png or .svg (or .csv for the curves only); default report.png, "
        "none with --snapshot or --csv",
    )
    p.add_argument(
        "--snapshot",
        type=Path,
        metavar="PICKLE",
        help="write the run (--run, or the trace's only run) as a PyTorch memory snapshot that "
        "pytorch.org/memory_viz opens (docs/snapshots.md)",
    )
    p.add_argument(
        "--csv",
        type=Path,
        help="write the curves to this CSV file (and no figure, unless -o names one)",
    )
    p.add_argument("--width", type=int, default=1600, help="figure width in pixels (default 1600)")
    p.add_argument(
        "--theme", choices=("light", "dark"), default="light", help="colours (default light)"
    )
    p.add_argument(
        "--x",
        dest="axis",
        choices=("time", "op"),
        default="time",
        help="x axis: milliseconds since each run's start, or op index (default time)",
    )
    p.add_argument("--title", help="title line (default: the trace file names)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ckview.app.run import Axis

    if args.snapshot is not None:
        done = [_write_snapshot(args)]
        if args.output is None and args.csv is None:
            print("wrote " + done[0])
            return 0
    default = "report.png" if args.csv is None else None  # --csv alone: only the CSV
    figure, csv_paths = _outputs(args.output or default, args.csv)
    from ckview.cli.outputs import refuse_inputs

    for path in [figure, *csv_paths]:
        if path is not None:
            refuse_inputs(path, [*args.traces, *(p for p in args.plans if os.path.isfile(p))])
    if figure is not None and not MIN_WIDTH <= args.width <= MAX_WIDTH:
        raise CLIError(f"--width {args.width} is out of range; use {MIN_WIDTH} to {MAX_WIDTH}")
    traces = _load(args.traces)
    runs = _select_runs(traces, args.run)
    plans = _project(traces[0], args.plans)
    axis = Axis(args.axis)
    done = []
    if figure is not None:
        size = _render(figure, runs, plans, traces, args, axis)
        done.append(
            f"{figure} ({size[0]}x{size[1]}, {_count(runs, 'run')}, {_count(plans, 'plan')})"
        )
    for path in csv_paths:
        from ckview.app.report import write_csv

        try:
            rows = write_csv(runs, plans, path)
        except OSError as exc:
            raise CLIError(f"cannot write {path}: {one_line(exc)}") from None
        done.append(f"{path} ({rows} rows)")
    print("wrote " + ", ".join(done))
    if plans:
        from ckview.app.report import plan_notes

        for note in plan_notes(plans):  # also drawn in the figure
            print(f"note: {note}")
        for name, outcome, _ in plans:  # NOTE [ Saves the projection cannot hold ]
            for line in outcome.warnings:
                print(f"ckview: warning: plan {name}: {line}", file=sys.stderr)
    return 0


def _write_snapshot(args: argparse.Namespace) -> str:
    """Write the chosen run of the only trace as a snapshot pickle; what was written."""
    import pickle

    from ckview.snapshot.export import trace_to_snapshot
    from ckview.trace import open_trace

    path: Path = args.snapshot
    if len(args.traces) != 1:
        raise CLIError("--snapshot writes one run of one trace; pass a single TRACE")
    if path.suffix.lower() in (".h5", ".hdf5"):
        raise CLIError(f"--snapshot {path} would be a pickle, not a trace; name it NAME.pickle")
    if not path.parent.is_dir():
        raise CLIError(f"cannot write {path}: no directory {path.parent}")
    with open_trace(args.traces[0]) as trace:
        names = trace.run_names
        name = args.run or (names[0] if len(names) == 1 else None)
        if name is None:
            raise CLIError(
                f"{trace.path} has {len(names)} runs; pick one with --run NAME "
                f"(runs: {', '.join(names) or 'none'})"
            )
        if name not in names:
            raise no_such_run(trace.path, name, names)
        tables = trace.read_run(name, all_devices=True)  # a snapshot has every device
    snapshot = trace_to_snapshot(tables, tables["strings"])
    staging = path.with_name(f".{path.name}.partial")
    try:
        with open(staging, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)  # torch's own _dump_snapshot protocol
        os.replace(staging, path)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {one_line(exc)}") from None
    finally:
        if staging.exists():
            staging.unlink()
    events = sum(len(t) for t in snapshot["device_traces"])
    return f"{path} (run {name}, {events} snapshot events; open it at pytorch.org/memory_viz)"


def _outputs(output: str | None, csv_path: Path | None) -> tuple[str | None, list[str]]:
    """The figure to draw (None for a CSV-only export: ``output`` None or a .csv) and the CSV
    files to write."""
    figure, csvs = None, [str(csv_path)] if csv_path is not None else []
    if output is not None:
        ext = os.path.splitext(output)[1].lower()
        if ext not in OUTPUTS:
            raise CLIError(
                f"cannot tell the format of {output!r} from its extension; "
                f"use one of {', '.join(OUTPUTS)}"
            )
        if ext == ".csv":
            csvs.insert(0, output)
        else:
            figure = output
    for path in [figure, *csvs]:
        folder = os.path.dirname(path or "") or "."
        if not os.path.isdir(folder):
            raise CLIError(f"cannot write {path}: no directory {folder}")
    return figure, csvs


def _count(items: list[Any], what: str) -> str:
    return f"{len(items)} {what}{'' if len(items) == 1 else 's'}"


def _load(paths: list[Path]) -> list[TraceData]:
    """Every trace, fully read (a bad file raises TraceError: one line, exit 2)."""
    from ckview.app.run import load_trace

    return [load_trace(path) for path in paths]


def _select_runs(traces: list[TraceData], wanted: str | None) -> list[Run]:
    """Every run of every trace, or only the runs named ``wanted``."""
    if wanted is None:
        return [run for trace in traces for run in trace.runs]
    runs = []
    for trace in traces:
        if wanted not in trace.names:
            raise no_such_run(trace.path, wanted, trace.names)
        runs.append(trace.run(wanted))
    return runs


def _project(trace: TraceData, sources: list[str]) -> list[PlanCurve]:
    """Each plan projected over the trace's baseline run ('baseline', else 'main')."""
    if not sources:
        return []
    from ckview.analysis import plan_name, regions_from_plan
    from ckview.app.planning import PlanSession

    names = trace.names
    wanted = "baseline" if "baseline" in names else "main"  # as ``ckview project`` picks
    if wanted not in names:
        raise CLIError(
            f"{trace.path} has no 'baseline' or 'main' run to project the plans over; "
            f"runs: {', '.join(names) or 'none'}"
        )
    base = trace.run(wanted)
    session = PlanSession(base)
    session.prepare()
    t = base.tables
    curves = []
    for source in sources:
        plan = read_plan(source)
        try:
            session.set_selection(regions_from_plan(plan, t["modules"], t["strings"]))
            name = plan_name(plan)
        except ValueError as exc:
            raise CLIError(f"plan {source}: {one_line(exc)}") from None
        curves.append((name, session.outcome(), base))
    return curves


def _render(
    path: str,
    runs: list[Run],
    plans: list[PlanCurve],
    traces: list[TraceData],
    args: argparse.Namespace,
    axis: Axis,
) -> tuple[int, int]:
    # Before the QApplication exists. The report opens no window, so it never needs a display;
    # a platform named by the environment (xcb, or '' meaning the default) could abort the
    # process for want of system libraries (README: Linux desktop).
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from pyqtgraph.Qt import QtWidgets

    from ckview.app.style import THEMES
    from ckview.gui.report import render_report

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(["ckview"])
    assert app is not None  # and referenced until the figure is saved
    try:
        return render_report(
            runs,
            plans,
            path,
            width=args.width,
            theme=THEMES[args.theme],
            axis=axis,
            title=args.title,
            subtitle=_subtitle(traces),
        )
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {one_line(exc)}") from None


def _subtitle(traces: list[TraceData]) -> str:
    """Where and when each trace was recorded; one entry if all traces agree."""
    parts = [_recorded(t.meta) for t in traces]
    if len(set(parts)) == 1:
        return parts[0]
    return "   |   ".join(
        f"{os.path.basename(t.path)}: {p}" for t, p in zip(traces, parts, strict=True)
    )


def _recorded(meta: TraceMeta) -> str:
    start = str(meta.start_time).replace("T", " ")[:16]
    if meta.source == "snapshot":
        return f"{meta.device}, imported from a PyTorch memory snapshot {start}"
    torch = meta.torch_version or "?"
    text = f"{meta.device}, torch {torch}, recorded {start}"
    if not meta.complete:
        text += " (INCOMPLETE recording)"
    return text
