"""What a report shows, without Qt: the projected plans beside the runs, their names and notes,
and the curves as CSV (``ckview export --csv`` writes it without importing Qt; the figure is
drawn by ``ckview.gui.report``)."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckview.app.planning import PlanOutcome
from ckview.app.run import CATEGORY_LABELS, STACK_ORDER, Axis, Run
from ckview.trace.schema import Category

PlanCurve = tuple[str, PlanOutcome, Run]
"""A projected plan: its name, its outcome and the baseline run it was projected over."""


def default_title(runs: Sequence[Run]) -> str:
    """``Memory of a training step: a.h5, b.h5`` (the trace files, in order)."""
    names = dict.fromkeys(os.path.basename(r.source) for r in runs)
    return "Memory of a training step: " + ", ".join(names)


def short_names(runs: Sequence[Run]) -> list[str]:
    """Names that tell ``runs`` apart: the run name if all come from one file, the file name
    for a 'main' run, else ``file · run``."""
    one_file = len(runs) > 1 and len({r.source for r in runs}) == 1
    names = []
    for r in runs:
        if one_file:
            names.append(r.name)
        elif r.name == "main":
            names.append(os.path.basename(r.source))
        else:
            names.append(r.label)
    return names


def plan_x(outcome: PlanOutcome, run: Run, axis: Axis) -> np.ndarray:
    """x of each state of a projected curve, on the axis of the run it was projected over."""
    if axis is Axis.TIME:
        return run.x_of_time_ns(outcome.time_ns)
    return run.x_op[np.asarray(outcome.point, dtype=np.int64)]


def plan_notes(plans: Sequence[PlanCurve]) -> list[str]:
    """One line per plan with regions that cannot take effect, saying why (NOTE [ Regions that
    cannot take effect ] in ckpt_runtime/resolve.py)."""
    return [
        f"plan {name}: {summary}"
        for name, outcome, _ in plans
        if (summary := outcome.idle_summary()) is not None
    ]


def plan_label(name: str, run: Run) -> str:
    """How a projected plan is named in the CSV: ``plan:<name> over <run label>``."""
    return f"plan:{name} over {run.label}"


def category_column(category: Category) -> str:
    """CSV column of a category: 'optimizer state' -> ``optimizer_state_bytes``."""
    return CATEGORY_LABELS[category].replace(" ", "_") + "_bytes"


CSV_COLUMNS = (
    "run",
    "point",
    "time_ms",
    "op_index",
    "total_bytes",
    *(category_column(c) for c in STACK_ORDER),
)


def write_csv(runs: Sequence[Run], plans: Sequence[PlanCurve], path: str) -> int:
    """Write every run's timeline (all n+1 points) and every plan's projected curve to ``path``
    as long-format CSV (``CSV_COLUMNS``; a plan's category cells are empty); returns the number
    of data rows."""
    rows = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for run in runs:
            rows += _write_run_rows(writer, run)
        for name, outcome, run in plans:
            rows += _write_plan_rows(writer, plan_label(name, run), outcome, run)
    return rows


# ----------------------------------------------------------------------------- CSV


def _write_run_rows(writer: Any, run: Run) -> int:
    n = run.n_events + 1
    columns: list[Any] = [
        [run.label] * n,
        range(n),
        [f"{v:.6f}" for v in run.x_time.tolist()],
        run.x_op.astype(np.int64).tolist(),
        run.timeline.total.astype(np.int64).tolist(),
    ]
    columns += [run.timeline.by_category[c].astype(np.int64).tolist() for c in STACK_ORDER]
    writer.writerows(zip(*columns, strict=True))
    return n


def _write_plan_rows(writer: Any, label: str, outcome: PlanOutcome, run: Run) -> int:
    point = np.asarray(outcome.point, dtype=np.int64)
    empty = [""] * len(STACK_ORDER)
    rows = zip(
        point.tolist(),
        plan_x(outcome, run, Axis.TIME).tolist(),
        run.x_op[point].astype(np.int64).tolist(),
        np.asarray(outcome.total, dtype=np.int64).tolist(),
        strict=True,
    )
    writer.writerows([label, p, f"{t:.6f}", op, total, *empty] for p, t, op, total in rows)
    return len(point)
