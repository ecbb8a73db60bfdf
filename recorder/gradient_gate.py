"""The gradient gate's runs of a script: does a checkpoint plan change the step's loss and
gradients? ``python -m recorder.gradient_gate SPEC.json RESULT.json`` (``ckview verify`` starts
it; ckview/cli/gradients.py).

NOTE [ The gradient gate ]
``ckview verify`` records its runs one after another in one run of the script: 'baseline' in
the first recorded iteration, each plan in a later one, on other data and other weights. Their
gradients cannot be compared, so the gate runs the script again, in a process of its own (the
verify process keeps what the recording left, and a crash here costs the gate only), once per
run to compare: each time from the start, through the same warm-up, to the same first recorded
iteration, recorded under one run (checkpointing bypassed, or one plan), and stopped after it.
The first recorded step's gradients (NOTE [ When a step's gradients are final ] in
recorder/sources/gradients.py) are kept in host memory and compared with
``ckpt_runtime.compare_gradients``: bitwise, or within a tolerance (max abs difference).

A script whose step does not repeat (unseeded data or initialisation, a data order that varies)
would fail every plan. So the un-checkpointed step runs twice first: if the two differ, the gate
checks nothing and says that the step is not reproducible and to seed it; no plan fails. Where a
step's gradients cannot be taken (no optimizer, a closure), or a run of the script fails, the
gate says "not checked" and why, and fails nothing. The script's imports are paid once: its runs
share this process, each a fresh execution of the script as ``__main__`` (what a script leaves
in other modules, such as a counter, would show as a step that does not repeat).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recorder.runner import run_script
from recorder.runs import RunSpec, StopScript
from recorder.sources.gradients import GradientSource, StepGradients

BASELINE = "baseline"


@dataclass(frozen=True)
class GateSpec:
    """What to run: the script as ``ckview verify`` ran it, and the plans (plan documents)."""

    target: str
    args: list[str]
    module: bool
    warmup: int
    step_every: str
    plans: list[dict[str, Any]]
    tolerance: float = 0.0

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GateSpec:
        return cls(**doc)


def run_gate(spec: GateSpec, folder: Path) -> dict[str, Any]:
    """NOTE [ The gradient gate ]: ``{"why_not": str, "reproducible": comparison | None,
    "plans": {name: comparison}}``, a comparison being ``compare_gradients``'s result with
    ``first_diff`` (the first differing entry's own difference) and ``why_not`` ('' when
    compared); differences that cannot be taken (shapes differ...) are None."""
    from ckpt_runtime.plan import Plan
    from recorder.plans import plan_runs

    reference = _step(spec, plan_runs([], baseline=True, checkpointed=False)[0], folder, 0)
    doc: dict[str, Any] = {"why_not": "", "reproducible": None, "plans": {}}
    if why := _unchecked(reference):
        doc["why_not"] = why
        return doc
    assert isinstance(reference, StepGradients)
    twin = _step(spec, plan_runs([], baseline=True, checkpointed=False)[0], folder, 1)
    doc["reproducible"] = again = _compare(reference, twin, spec.tolerance)
    if again["why_not"] or not again["equal"]:
        doc["why_not"] = again["why_not"] or "the script's step is not reproducible"
        return doc
    for i, plan_doc in enumerate(spec.plans):
        plan = Plan.from_json(plan_doc)
        run = plan_runs([(plan.name, plan)], baseline=False, checkpointed=False)[0]
        doc["plans"][plan.name] = _compare(
            reference, _step(spec, run, folder, 2 + i), spec.tolerance
        )
    return doc


def _step(spec: GateSpec, run: RunSpec, folder: Path, index: int) -> StepGradients | str:
    """Run the script through its first recorded step under ``run``: that step's gradients,
    or why the script did not get there."""
    from recorder.session import Recorder

    recorder: Recorder | None = None
    source = GradientSource(lambda: _model(recorder))
    recorder = Recorder(
        folder / f"gate-{index}.h5",
        steps=1,
        warmup=spec.warmup,
        stop_after=True,
        runs=[run],
        progress=False,
        step_every=spec.step_every,
        sources=[source],
        wait_for_data=False,  # the same iteration in every run, whenever batches arrive
    )
    error = None
    recorder.__enter__()
    try:
        outcome = run_script(spec.target, spec.args, module=spec.module)
        error = outcome.error
    except StopScript as stop:  # the plan does not fit the model (PlanCheck)
        error = str(stop)
    finally:
        recorder.close(error=error)
    step = source.captured.get(run.name)
    if step is None or (not step.complete and error):
        return f"the script failed in the gate's run {run.name}: {error or 'no step recorded'}"
    return step


def _model(recorder: Any) -> Any:
    return recorder.main_model()


def _unchecked(step: StepGradients | str) -> str:
    return step if isinstance(step, str) else step.unchecked()


def _compare(a: StepGradients, b: StepGradients | str, tolerance: float) -> dict[str, Any]:
    """``b`` against ``a`` (see run_gate)."""
    from ckpt_runtime import compare_gradients

    if isinstance(b, str) or b.unchecked():
        return {"why_not": _unchecked(b)}
    left, right = a.compared(), b.compared()
    result = compare_gradients(left, right, tolerance)
    first = result["first_differing"]
    own = None
    if first is not None:
        only = compare_gradients({first: left.get(first)}, {first: right.get(first)})
        own = _finite(only["max_abs_diff"])
    return {
        "why_not": "",
        "equal": result["equal"],
        "max_abs_diff": _finite(result["max_abs_diff"]),
        "first_differing": first,
        "first_diff": own,
    }


def _finite(x: float) -> float | None:
    """A difference, None where values cannot be compared (compare_gradients says inf)."""
    return None if math.isinf(x) else x


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m recorder.gradient_gate SPEC.json RESULT.json``."""
    spec_path, result_path = argv if argv is not None else sys.argv[1:]
    spec = GateSpec.from_json(json.loads(Path(spec_path).read_text()))
    with tempfile.TemporaryDirectory(prefix="ckview-gate-") as folder:
        doc = run_gate(spec, Path(folder))
    Path(result_path).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
