"""What several verbs share: reading the run and the plans they work on, and wording that
several verbs print. Verbs import this module, never one another."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ckview.cli.errors import CLIError, pick_run

if TYPE_CHECKING:
    from ckpt_runtime.plan import Plan
    from ckview.analysis.types import RunTables
    from ckview.app.run import Run


def read_run(path: Path, wanted: str | None) -> Run:
    """The run to plan or project over (``wanted``, else 'baseline', else 'main'), read as a
    ``Run`` (``ckview.app.run.read_run``)."""
    from ckview.app.run import read_run as read
    from ckview.trace import open_trace

    with open_trace(path) as trace:
        return read(trace, pick_run(path, trace.run_names, wanted))


def read_plan(source: str) -> Plan:
    """The plan ``source`` names: a preset, or a plan file (``ckpt_runtime.load_plan``, which
    imports no torch: a string that starts like a preset is one, anything else a file, ``./sqrt``
    for a file named ``sqrt``; a file without a ``name`` is named after its stem)."""
    from ckpt_runtime.plan import PlanError, load_plan

    try:
        return load_plan(source)
    except PlanError as exc:
        raise CLIError(str(exc)) from None


def times_line(tables: RunTables) -> str:
    """Where the step time and extra compute come from (NOTE [ Extra compute from plain
    times ] in ckview/analysis/timing.py)."""
    from ckview.analysis.timing import plain_times

    times = plain_times(tables)
    if times is None:
        return (
            "times: recorded op times, with the recorder's per-op cost (record with "
            "--timing-steps 3 for plain times)"
        )
    s, cost = times.step, times.call_cost
    line = (
        f"times: plain, median of {s.count} unrecorded steps: {s.median_ns / 1e6:.1f} ms a step "
        f"({s.low_ns / 1e6:.1f}..{s.high_ns / 1e6:.1f})"
    )
    if cost is not None:
        line += f"; checkpoint's cost {cost.median_ns / 1e3:.0f} us a call included"
    return line


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (for a ``CLIError`` that quotes it)."""
    return " ".join(str(exc).split())
