"""``ckview verify``: record a script's step without and with checkpoint plans, and check that
the projection from the un-checkpointed run predicts what each plan measures.

One run of the script records run ``baseline`` (checkpointing bypassed), then one run
``plan:<name>`` per plan (applied to the script's model with ``ckpt_runtime``, the script's own
checkpointing bypassed: the plan replaces it), as ``ckview record --plan`` does. Each plan is
then projected over ``baseline`` (``ckview project``) and compared with its run: peak memory,
and extra time (the plan run's recompute ops against the projected recompute). Both sides
describe the same computation; where the script's checkpointing could not be bypassed
(NOTE [ Recompute in a bypassed run ] in ckview/analysis/recompute.py) the output says so.
Options and the script's arguments are split exactly as by ``ckview record`` (NOTE [ The
script's arguments are the script's ] in ckview/cli/command.py). Then the gradient gate runs the
script's step again per plan and checks that each keeps the un-checkpointed step's loss and
gradients (NOTE [ The gradient gate ] in recorder/gradient_gate.py; ckview/cli/gradients.py): a
plan that changes them fails verify.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckview.analysis.gradients import GradientGate
from ckview.cli import common, gradients
from ckview.cli.distributed import is_launcher, print_json, run_launcher
from ckview.cli.errors import CLIError
from ckview.cli.recording import (
    ARGS_HELP,
    USAGE,
    add_record_options,
    check_command,
    check_target,
    compiled_plans_note,
    default_output,
    hint_misplaced,
    load_plans,
    record_script,
    report,
    unlike_step_warnings,
)
from ckview.cli.sizes import add_fit_option, verify_fit
from ckview.trace.ranks import this_rank_path

BASELINE = "baseline"


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "verify",
        help="record a script with checkpoint plans and compare projected vs measured",
        usage=USAGE,
        description=(
            "Run a training script once, recording run 'baseline' (checkpointing bypassed) and "
            "then run 'plan:<name>' for each --plan; project each plan over the baseline and "
            "compare with what its run measured. Then the gradient gate runs the script's first "
            "recorded step again, twice without checkpointing (a step that does not repeat, "
            "such as unseeded data, is reported and fails nothing) and once per plan, and fails "
            "a plan whose loss or gradients differ from the un-checkpointed step's (bitwise "
            f"unless --grad-tolerance). {ARGS_HELP}"
        ),
    )
    add_record_options(p)
    add_fit_option(p)
    _set_help(p, "output", "trace file to write (default: <script>-verify.h5); it is kept")
    _set_help(
        p,
        "plan",
        "a plan to verify: a plan file or a preset (none, all, every:K, sqrt); "
        "repeatable, at least one",
    )
    _set_help(p, "compare", argparse.SUPPRESS)
    p.add_argument(
        "--json", action="store_true", help="print JSON (the script's stdout goes to stderr)"
    )
    gradients.add_options(p)
    p.set_defaults(handler=run)


VERIFY_OPTIONS = ("--json", "--fit", *gradients.OPTIONS)
"""verify's options besides record's (for hint_misplaced)."""


def _set_help(parser: argparse.ArgumentParser, dest: str, text: str) -> None:
    """Reword the help of an option that ``record``'s option set adds."""
    for action in parser._actions:
        if action.dest == dest:
            action.help = text


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Check:
    """One plan: projected over the baseline run, and measured in its own run."""

    projection: common.PlanProjection
    measured_peak_bytes: int
    measured_extra_ns: int
    """The plan run's RECOMPUTE op time."""
    checkpointing: str = "plan"
    """The plan run's ``checkpointing`` (see ckview.analysis.recompute.run_checkpointing)."""
    leftover: Any = None
    """Recompute in the plan run outside the plan's regions (LeftoverRecompute), or None."""
    shared_recompute: bool = False
    """The leftover recompute is the baseline's too (NOTE [ Recompute in a bypassed run ])."""
    time: Any = None
    """ExtraTime per step, projected vs measured, or None (NOTE [ Extra time, like for like ])."""
    start_offset_bytes: int = 0
    """Parameters, gradients and optimizer state the plan run began with beyond the baseline's
    (NOTE [ Runs that begin from another state ] in ckview/analysis/timeline.py)."""
    state_peak_bytes: int | None = None
    """The projection from the plan run's own training state (that NOTE); None: the same as
    the baseline's."""

    @property
    def like_for_like(self) -> bool:
        """Whether the plan run is what the projection describes: no recompute in it beyond the
        plan's (the script's own checkpointing was bypassed), or the same as the baseline's."""
        return self.leftover is None or self.shared_recompute

    @property
    def projected_peak_bytes(self) -> int:
        """The projection over the baseline, from the training state of the plan run."""
        if self.state_peak_bytes is None:
            return self.projection.peak_bytes
        return self.state_peak_bytes

    @property
    def peak_error(self) -> float:
        """(projected - measured) / measured peak."""
        measured = self.measured_peak_bytes
        return (self.projected_peak_bytes - measured) / measured if measured else 0.0

    @property
    def extra_error(self) -> float | None:
        """(projected - measured) / measured extra time; None if nothing was recomputed."""
        measured = self.measured_extra_ns
        return (self.projection.extra_compute_ns - measured) / measured if measured else None

    def to_json(self) -> dict[str, Any]:
        extra = self.extra_error
        return {
            "plan": self.projection.plan,
            "source": self.projection.source,
            "run": f"plan:{self.projection.plan}",
            "projected_peak_bytes": self.projected_peak_bytes,
            "projected_peak_over_baseline_bytes": self.projection.peak_bytes,
            "start_offset_bytes": self.start_offset_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "peak_error_percent": round(100 * self.peak_error, 3),
            "projected_extra_ns": self.projection.extra_compute_ns,
            "measured_extra_ns": self.measured_extra_ns,
            "extra_error_percent": None if extra is None else round(100 * extra, 3),
            "checkpointing": self.checkpointing,
            "like_for_like": self.like_for_like,
            "recompute_as_in_baseline": self.shared_recompute,
            "leftover_recompute": None if self.leftover is None else self.leftover.to_json(),
            "extra_time_per_step": None if self.time is None else self.time.to_json(),
            "projection": self.projection.to_json(),
        }


@dataclass(frozen=True)
class Baseline:
    """What the plans were projected over."""

    checkpointing: str
    leftover: Any
    """LeftoverRecompute in the baseline run, or None (NOTE [ Recompute in a bypassed run ])."""


# ----------------------------------------------------------------------------- the verb


def run(args: argparse.Namespace) -> int:
    """Record, project, compare; the script's exit code (1 if a plan run is missing)."""
    check_command(args)
    if args.fit is not None:  # a fit's answer, recorded at its size
        return verify_fit(args, default_output(args.target, "-verify"))
    _check_args(args)
    if is_launcher(args.target, args.module):  # NOTE [ Recording every rank ]
        return run_launcher(args, lambda target: default_output(target, "-verify"))
    check_target(args.target, args.module)
    output = this_rank_path(args.output or default_output(args.target, "-verify"))
    plans = load_plans(args.plan)
    from recorder.plans import plan_runs

    runs = plan_runs(plans, baseline=True, checkpointed=False)
    ending = record_script(args, output, runs, args.json)
    exit_code = report(output, ending, args)
    hint_misplaced(args, ending.exit_code, VERIFY_OPTIONS)
    if ending.error or ending.steps == 0 or ending.written != output:
        return exit_code
    checks, missing, baseline = _verify(output, plans)
    gate = _gradient_gate(args, plans, checks)
    _print(output, checks, missing, baseline, args.json, gate)
    for line in unlike_step_warnings(output):
        print(f"ckview: warning: {line}", file=sys.stderr)
    if note := compiled_plans_note(output):
        print(f"ckview: note: {note}", file=sys.stderr)
    for plan in gate.failed():
        print(f"ckview: {gate.failure_line(plan)}", file=sys.stderr)
    if missing:
        print(_missing_note(missing, args), file=sys.stderr)
        return exit_code or 1
    return exit_code or (1 if gate.failed() else 0)


def _timing(args: argparse.Namespace) -> int:
    """Unrecorded steps per run: a warm-up, a kept step and one that times module calls per
    timing round (one warm-up in all with a single run: NOTE [ Plain timing steps ] and NOTE
    [ Quiet timing steps ] in recorder/timing.py)."""
    return 3 * args.timing_steps


def _check_args(args: argparse.Namespace) -> None:
    if args.compare:
        raise CLIError("verify records its own 'baseline' run; drop --compare")
    if not args.plan:
        raise CLIError(
            "verify needs a plan: --plan PLAN (a plan file or a preset: none, all, every:K, sqrt)"
        )
    if args.warmup == 0:
        raise CLIError("--plan needs a warmup step to find the model in; use --warmup 1 or more")
    gradients.check_args(args)


# ----------------------------------------------------------------------------- comparing


def _verify(
    output: Path, plans: Sequence[tuple[str, Any]]
) -> tuple[list[Check], list[str], Baseline | None]:
    """Each recorded plan run against its projection; the plan runs not recorded; and what
    the plans were projected over (None without a baseline run). Extra times come from the
    runs' plain timing steps where the trace has them (NOTE [ Extra time, like for like ])."""
    from ckview.analysis import phase_time_ns, project
    from ckview.analysis.projection import peak_from_state
    from ckview.analysis.recompute import leftover_recompute, run_checkpointing
    from ckview.analysis.timeline import stretch_offsets
    from ckview.trace import open_trace
    from ckview.trace.schema import Phase

    checks, missing = [], []
    with open_trace(output) as trace:
        if not _has_steps(trace, BASELINE):
            return [], [f"plan:{plan.name}" for _, plan in plans], None
        base = common.read_tables(trace, BASELINE)
        strings = base["strings"]
        baseline = Baseline(
            checkpointing=_checkpointing(trace, BASELINE),
            leftover=leftover_recompute(base, strings),
        )
        for source, plan in plans:
            name = f"plan:{plan.name}"
            if not _has_steps(trace, name):
                missing.append(name)
                continue
            run = trace.read_run(name)
            projection = common.project_plan(base, plan.to_json(), source)
            offsets = stretch_offsets(base, run)
            state_peak = None  # NOTE [ Runs that begin from another state ]
            if offsets.any():
                raw = project(base, list(projection.regions.regions))
                state_peak = peak_from_state(raw, base, run)
            leftover = leftover_recompute(run, strings, plan_run=True)
            checks.append(
                Check(
                    projection=projection,
                    measured_peak_bytes=common.run_peak(run),
                    measured_extra_ns=phase_time_ns(run["ops"], Phase.RECOMPUTE),
                    checkpointing=run_checkpointing(name, _checkpointing(trace, name)),
                    leftover=leftover,
                    shared_recompute=leftover is not None and leftover.same_as(baseline.leftover),
                    time=_extra_time(base, run, projection),
                    start_offset_bytes=int(offsets[0]),
                    state_peak_bytes=state_peak,
                )
            )
    return checks, missing, baseline


def _gradient_gate(
    args: argparse.Namespace, plans: Sequence[tuple[str, Any]], checks: Sequence[Check]
) -> GradientGate:
    """The gradient gate over the plans whose runs were recorded (NOTE [ The gradient gate ] in
    recorder/gradient_gate.py); not run where no plan run was recorded."""
    recorded = {c.projection.plan for c in checks}
    gated = [(source, plan) for source, plan in plans if plan.name in recorded]
    if not gated:
        return GradientGate.not_checked("no plan run was recorded", args.grad_tolerance)
    return gradients.run_gate(args, gated)


def _extra_time(base: common.Tables, run: common.Tables, projection: common.PlanProjection) -> Any:
    """NOTE [ Extra time, like for like ]: from plain timing steps if both runs have them and
    the projection's times are plain, else from the recorded steps and op times."""
    from ckview.analysis import project
    from ckview.analysis.recompute import extra_time, step_durations
    from ckview.analysis.timing import plain_times, recorded_times_only

    steps = max(1, len(step_durations(base["steps"])))
    base_t, plan_t = plain_times(base), plain_times(run)
    if projection.plain_times and base_t is not None and plan_t is not None:
        projected = projection.extra_compute_ns
        low, high = (n // steps for n in projection.extra_compute_range_ns)
        return extra_time(base_t.steps_ns, plan_t.steps_ns, projected // steps, True, (low, high))
    if projection.plain_times:  # recorded steps against recorded op times
        regions = list(projection.regions.regions)
        projected = project(recorded_times_only(base), regions).extra_compute_ns
    else:
        projected = projection.extra_compute_ns
    base_steps, plan_steps = step_durations(base["steps"]), step_durations(run["steps"])
    return extra_time(base_steps, plan_steps, projected // steps, False)


def _checkpointing(trace: Any, name: str) -> str:
    """The run's ``checkpointing``: its attribute (trace format v2) or what its name means."""
    from ckview.analysis.recompute import run_checkpointing

    return run_checkpointing(name, trace.run(name).checkpointing)


def _has_steps(trace: Any, name: str) -> bool:
    return name in trace.run_names and trace.run(name).steps_recorded > 0


def _missing_note(missing: Sequence[str], args: argparse.Namespace) -> str:
    from ckview.analysis.units import plural

    runs = 1 + len(args.plan)
    timed = runs + 1  # and the timing steps under plan all (NOTE [ Timing steps under plan all ])
    target = f"-m {args.target}" if args.module else args.target
    return (
        f"ckview: the script ended before {plural(len(missing), 'run')} "
        f"({', '.join(missing)}) {'was' if len(missing) == 1 else 'were'} recorded; verify needs "
        f"{plural(args.warmup, 'warmup step')} + {runs} x {plural(args.steps, 'step')} (and "
        f"{timed} x {_timing(args)} more for the timing): let the script run more steps, e.g. "
        f"ckview verify [OPTIONS] {target} --steps N, if the script takes --steps"
    )


# ----------------------------------------------------------------------------- output


def _print(
    output: Path,
    checks: Sequence[Check],
    missing: Sequence[str],
    baseline: Baseline | None,
    as_json: bool,
    gate: GradientGate,
) -> None:
    if as_json:
        doc = {
            "trace": str(output),
            "baseline_run": BASELINE,
            "baseline_peak_bytes": checks[0].projection.run_peak_bytes if checks else None,
            "baseline_step_ns": checks[0].projection.step_ns if checks else None,
            "compared": compared(baseline, checks),
            "baseline_checkpointing": baseline.checkpointing if baseline else None,
            "baseline_recompute": (
                baseline.leftover.to_json() if baseline and baseline.leftover else None
            ),
            "plans": [
                {**c.to_json(), "gradients": gate.check(c.projection.plan).to_json()}
                for c in checks
            ],
            "missing_runs": list(missing),
            "gradient_gate": gate.to_json(),
        }
        print_json(doc)  # NOTE [ One JSON document for all ranks ]
        return
    print(format_table(output, checks, baseline))
    for line in gate.lines([c.projection.plan for c in checks]):
        print(line)


def _extra_cells(c: Check) -> str:
    t = c.time
    if t is None:
        return f"{'-':>23}{'-':>28}"
    measured = f"{t.measured_ns / 1e6:.1f} ({t.low_ns / 1e6:.1f}..{t.high_ns / 1e6:.1f}) ms"
    projected = f"{t.projected_ns / 1e6:.1f}"
    if t.projected_low_ns is not None and t.projected_high_ns is not None:
        projected += f" ({t.projected_low_ns / 1e6:.1f}..{t.projected_high_ns / 1e6:.1f})"
    flag = " MISS" if t.miss else ""
    return f"{projected:>20} ms{measured:>28}{flag}"


def compared(baseline: Baseline | None, checks: Sequence[Check]) -> str:
    """One sentence: what the projection was made over and what each plan run measured."""
    from ckview.analysis.recompute import BYPASSED, PLAN, describe_checkpointing

    over = describe_checkpointing(baseline.checkpointing if baseline else BYPASSED)
    if baseline is not None and baseline.leftover is not None:
        over += ", but for a recompute that cannot be switched off"
    runs = {c.checkpointing for c in checks} or {PLAN}
    measured = "; ".join(describe_checkpointing(r) for r in sorted(runs))
    return (
        f"each plan projected over run {BASELINE!r} ({over}) vs measured in its own run "
        f"'plan:<name>' ({measured})"
    )


def _warnings(baseline: Baseline | None, checks: Sequence[Check]) -> list[str]:
    """NOTE [ Recompute in a bypassed run ]: one line for all the runs that still recompute,
    then the other warnings and notes."""
    lines = _recompute_warnings(baseline, checks)
    lines += [f"warning: {line}" for c in checks for line in c.projection.warning_lines()]
    lines += [
        f"warning: plan {c.projection.plan}: projected extra time {c.time.projected_ns / 1e6:.1f}"
        f" ms per step is outside the measured {c.time.low_ns / 1e6:.1f} .. "
        f"{c.time.high_ns / 1e6:.1f} ms (median {c.time.measured_ns / 1e6:.1f} ms)"
        for c in checks
        if c.time is not None and c.time.miss
    ]
    lines += [
        f"note: run plan:{c.projection.plan} began with {_signed_bytes(c.start_offset_bytes)} of "
        "parameters, gradients and optimizer state than the baseline (optimizer state that "
        "grows from iteration to iteration, as L-BFGS's history does): its projection holds "
        "that run's own state, stretch by stretch (NOTE [ Runs that begin from another "
        "state ] in ckview/analysis/timeline.py)"
        for c in checks
        if c.start_offset_bytes
    ]
    timed = [c.time for c in checks if c.time is not None]
    lines += _precision_notes(checks)
    if any(not t.plain for t in timed):
        lines.append(
            "note: extra times are from recorded steps (the script ended before the timing "
            "steps, or they do not match the recorded calls): they carry the recorder's cost"
        )
    elif timed:
        lines.append(
            f"extra time: median of {min(t.steps for t in timed)} plain steps per run "
            "(unrecorded), projected from the baseline's plain forward times plus "
            "checkpoint's fixed cost per call"
        )
    return lines


def _precision_notes(checks: Sequence[Check]) -> list[str]:
    """One line if a plan's extra time is not measured to the stated spread (NOTE [ Enough
    plain steps ] in ckview/trace/precision.py): how many rounds it needs, and why it has
    fewer (the script ended, or the cap was reached on a noisy machine)."""
    from ckview.trace.precision import FLOOR_SHARE, MAX_ROUNDS, NEEDED_CAP, TARGET_SHARE

    loose = [c for c in checks if c.time is not None and c.time.plain and not c.time.precise]
    if not loose:
        return []
    rounds = min(c.time.steps for c in loose)
    needed = max(c.time.rounds_needed for c in loose)
    about = f"{NEEDED_CAP} or more" if needed >= NEEDED_CAP else f"about {needed}"
    target = (
        f"within {TARGET_SHARE:.0%} of itself or {FLOOR_SHARE:.0%} of the baseline's step, at "
        "95% confidence"
    )
    plans = ", ".join(c.projection.plan for c in loose)
    if rounds >= MAX_ROUNDS:
        return [
            f"note: extra time of {plans} not measured {target} in {rounds} rounds of plain "
            f"steps (the cap; {about} would do): the machine is noisy, so read the "
            "spread beside each figure"
        ]
    # per round: the baseline, each plan and the steps under plan all (NOTE [ Timing steps
    # under plan all ] in recorder/calibration.py), a warm-up and a kept step each
    more = (min(needed, MAX_ROUNDS) - rounds) * 2 * (2 + len(checks))
    cap = f" (verify stops at {MAX_ROUNDS})" if needed > MAX_ROUNDS else ""
    return [
        f"note: the script ran too few steps to measure the extra time of {plans} {target}: "
        f"{rounds} rounds of plain steps, {about} needed{cap}; let the script run {more} "
        "more steps (verify ends it once done with --stop-after)"
    ]


def _recompute_warnings(baseline: Baseline | None, checks: Sequence[Check]) -> list[str]:
    """One warning naming every run that still recomputes (NOTE [ Recompute in a bypassed
    run ]), and whether the plans holding the baseline's recompute are compared like for like."""
    held = [c for c in checks if c.leftover is not None]
    runs = [f"plan:{c.projection.plan}" for c in held]
    first = baseline.leftover if baseline is not None else None
    if first is not None:
        runs.insert(0, BASELINE)
    elif held:
        first = held[0].leftover
    if first is None:
        return []
    lines = ["warning: " + first.describe(*runs)]
    shared = [c.projection.plan for c in held if c.shared_recompute]
    if shared:
        lines.append(
            f"note: plan(s) {', '.join(shared)} still compared like for like: projected over "
            "a baseline that holds that recompute and measured in runs that hold the same, "
            "i.e. the plan on top of the script's own checkpointing"
        )
    return lines


def _signed_bytes(n: int) -> str:
    from ckview.analysis import format_bytes

    return f"{format_bytes(abs(n))} {'more' if n > 0 else 'less'}"


def format_table(output: Path, checks: Sequence[Check], baseline: Baseline | None = None) -> str:
    """Projected vs measured, one line per plan, then what was compared and any warning."""
    from ckview.analysis import format_bytes as fb

    if not checks:
        return f"{output}: no plan run to verify"
    first = checks[0].projection
    width = max(4, *(len(c.projection.plan) for c in checks)) + 2
    lines = [
        f"{output}: plans projected over run {BASELINE!r} (peak {fb(first.run_peak_bytes)}, "
        f"step {first.step_ns / 1e6:.1f} ms) vs measured in their own runs",
        f"{'plan':<{width}}{'projected peak':>15}{'measured peak':>15}{'error':>9}"
        f"{'extra/step: projected':>23}{'measured (95% CI)':>28}",
    ]
    for c in checks:
        p = c.projection
        lines.append(
            f"{p.plan:<{width}}{fb(c.projected_peak_bytes):>15}{fb(c.measured_peak_bytes):>15}"
            f"{c.peak_error:>+8.2%}{' ' if c.like_for_like else '*'}{_extra_cells(c)}"
        )
    if not all(c.like_for_like for c in checks):
        lines.append(
            "* not like for like: the script's own checkpointing still recomputes in that run, "
            "not as in the baseline (warnings below), so the projection describes another step "
            "than the one measured"
        )
    lines.append(f"compared: {compared(baseline, checks)}")
    lines += _warnings(baseline, checks)
    return "\n".join(lines)
