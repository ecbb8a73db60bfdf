"""``ckview record``: run a training script unchanged and record its steps into a trace."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ckview.cli.distributed import is_launcher, run_launcher
from ckview.cli.errors import CLIError
from ckview.trace.ranks import this_rank_path

USAGE = "%(prog)s [OPTIONS] script.py [ARGS ...]\n       %(prog)s [OPTIONS] -m module [ARGS ...]"
ARGS_HELP = (
    "ckview's options go before the script (or -m module); everything after it goes to the "
    "script unchanged, as with python script.py ARGS, '--' and options named like ckview's "
    "included."
)


def add_parser(verbs: Any) -> None:
    p = verbs.add_parser(
        "record",
        help="record training steps of a script into a trace",
        usage=USAGE,
        description=f"Run a training script with its own arguments and record steps. {ARGS_HELP}",
    )
    add_record_options(p)
    p.set_defaults(handler=run)


TIMING_STEPS = 3
"""Rounds of plain timing steps (NOTE [ Plain timing steps ] in recorder/timing.py)."""


def add_record_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", type=Path, help="trace file to write (default: <script>.h5)")
    p.add_argument("--steps", type=_positive, default=1, help="steps to record (default 1)")
    p.add_argument(
        "--warmup", type=_non_negative, default=1, help="steps to skip first (default 1)"
    )
    p.add_argument(
        "--step-every",
        default="auto",
        metavar="RULE",
        help="what one step (one training iteration) is: auto (default: until every optimizer "
        "has stepped; without one, until the next forward after a backward), optimizer:N "
        "(N optimizer steps), backward:N (N backward passes) or manual (only "
        "Recorder.mark_step()); warmup counts steps the same way",
    )
    p.add_argument(
        "--stop-after", action="store_true", help="end the script once the steps are recorded"
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="record run 'baseline' (checkpointing bypassed), then run 'checkpointed' (as the "
        "script does it)",
    )
    p.add_argument(
        "--plan",
        action="append",
        metavar="PLAN",
        help="also record a run with this checkpoint plan applied to the script's model, in place "
        "of the script's own checkpointing (bypassed): a plan file or a preset (none, all, "
        "every:K, sqrt); repeatable",
    )
    p.add_argument(
        "--timing-steps",
        type=_non_negative,
        default=TIMING_STEPS,
        metavar="N",
        help="after the recorded runs, N rounds of plain (unrecorded) steps per run, timed "
        "for step times and extra compute without the recorder's cost (default "
        f"{TIMING_STEPS}; 0: times from the recorded steps)",
    )
    p.add_argument(
        "--stacks",
        action="store_true",
        help="record where in the script each tensor was made (file, line, function): shown by "
        "summary and the explorer; costs microseconds per op",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="a line on stderr per step (default: on when stderr is a terminal)",
    )
    p.add_argument(
        "-m",
        dest="module",
        metavar="MODULE",
        help="run a module, as python -m MODULE; it ends ckview's options like a script does",
    )


def check_command(args: argparse.Namespace) -> None:
    """A script (or module) was named: CLIError with the usage otherwise."""
    if args.target is None:
        raise CLIError(
            f"name the script: ckview {args.verb} [OPTIONS] script.py [ARGS ...] "
            "(or -m module [ARGS ...])"
        )


def hint_misplaced(args: argparse.Namespace, exit_code: int, extra: Sequence[str] = ()) -> None:
    """The script failed as argparse does (exit 2) on arguments named like ckview's options
    (``extra``: the verb's own besides record's): say where ckview's options go
    (NOTE [ The script's arguments are the script's ] in ckview/cli/command.py)."""
    from ckview.cli.command import misplaced_options

    parser = argparse.ArgumentParser(add_help=False)
    add_record_options(parser)
    named_like_ours = misplaced_options(args.args, [*parser._option_string_actions, *extra])
    if exit_code != 2 or not named_like_ours:
        return
    target = f"-m {args.target}" if args.module else args.target
    print(
        f"ckview: hint: {' '.join(named_like_ours)} went to the script, as everything after it "
        f"does; ckview's options go before it: ckview {args.verb} [OPTIONS] {target} [ARGS ...]",
        file=sys.stderr,
    )


def run(args: argparse.Namespace) -> int:
    check_command(args)
    if args.plan and args.warmup == 0:
        raise CLIError("--plan needs a warmup step to find the model in; use --warmup 1 or more")
    if is_launcher(args.target, args.module):  # NOTE [ Recording every rank ]
        return run_launcher(args, default_output)
    check_target(args.target, args.module)
    output = this_rank_path(args.output or default_output(args.target))
    runs = plan_runs(load_plans(args.plan or []), args.compare, args.compare)
    ending = record_script(args, output, runs)
    exit_code = report(output, ending, args, len(runs))
    hint_misplaced(args, ending.exit_code)
    if ending.steps and ending.written == output and len(runs) > 1:
        for line in leftover_warnings(output):
            print(f"ckview: warning: {line}", file=sys.stderr)
        if args.compare and never_checkpointed(output):
            print(
                "ckview: note: the script never checkpointed (nothing was recomputed in run "
                "'checkpointed'), so runs 'baseline' and 'checkpointed' are the same step and "
                "comparing them shows nothing; to see what checkpointing would change, add "
                "--plan sqrt or run: ckview plan " + str(output),
                file=sys.stderr,
            )
    return exit_code


def default_output(target: str, suffix: str = "") -> Path:
    """The trace a script records into without -o: ``train.py`` -> ``train{suffix}.h5``."""
    return Path(f"{Path(target).stem.split('.')[-1]}{suffix}.h5")


def never_checkpointed(output: Path) -> bool:
    """Whether run 'checkpointed' was recorded and recomputed nothing (no checkpointed region,
    no recompute op): then it is the same step as run 'baseline'."""
    import numpy as np

    from ckview.trace import open_trace
    from ckview.trace.schema import Phase

    with open_trace(output) as trace:
        if "checkpointed" not in trace.run_names:
            return False
        run = trace.run("checkpointed")
        if run.steps_recorded == 0 or len(run.table("recompute_regions")):
            return False
        return not np.any(run.table("ops").column("phase") == Phase.RECOMPUTE)


def leftover_warnings(output: Path) -> list[str]:
    """One line naming every run whose script checkpointing was bypassed and that still
    recomputed (NOTE [ Recompute in a bypassed run ] in ckview/analysis/recompute.py), with
    the first one's figures; none if there is none."""
    from ckview.analysis.recompute import PLAN, SCRIPT, leftover_recompute, run_checkpointing
    from ckview.trace import open_trace

    found = []
    with open_trace(output) as trace:
        strings = list(trace.strings)
        for name in trace.run_names:
            run = trace.run(name)
            kind = run_checkpointing(name, run.checkpointing)
            if kind == SCRIPT or run.steps_recorded == 0:
                continue
            tables = {t: run.table(t).read() for t in ("ops", "recompute_regions")}
            leftover = leftover_recompute(tables, strings, plan_run=kind == PLAN)
            if leftover is not None:
                found.append((name, leftover))
    return [found[0][1].describe(*(name for name, _ in found))] if found else []


def record_script(
    args: argparse.Namespace,
    output: Path,
    runs: list[Any],
    stdout_to_stderr: bool = False,
) -> Ending:
    """Run the script under the recorder; how it ended.

    The trace is closed (incomplete if the script failed) and settled whatever happens, also on
    Ctrl-C and SIGTERM (NOTE [ Writing beside the target ] in ckview/trace/staging.py). After the
    recorded runs come ``args.timing_steps`` rounds of plain timing steps (NOTE [ Plain timing
    steps ] in recorder/timing.py), written to the trace.
    """
    if not output.parent.exists():
        raise CLIError(f"cannot write {output}: folder {output.parent} does not exist")
    check_output(output, args)
    existed = output.exists()
    from ckview.cli.stops import signals_stop_the_script
    from recorder import Recorder, StopScript, run_script
    from recorder.steps import StepRule, StepRuleError

    try:
        step_rule = StepRule.parse(args.step_every)
    except StepRuleError as exc:
        raise CLIError(f"--step-every: {exc}") from None
    verb = args.verb
    command = ["ckview", verb, *sys.argv[2:]] if sys.argv[1:2] == [verb] else sys.argv
    recorder = Recorder(
        output,
        steps=args.steps,
        warmup=args.warmup,
        stop_after=args.stop_after,
        command=list(command),
        runs=runs,
        progress=args.progress,
        step_every=step_rule,
        timing_steps=args.timing_steps,
        stacks=args.stacks,
    )
    try:
        recorder.__enter__()
    except OSError as exc:
        raise CLIError(f"cannot write {output}: {exc.strerror or exc}") from None
    outcome = None
    parent = os.getpid()
    try:
        with (
            _stdout_to_stderr(stdout_to_stderr),
            signals_stop_the_script(),
            _os_exit_closes(recorder, lambda ending: report(output, ending, args), existed),
        ):
            outcome = run_script(args.target, args.args, module=args.module)
    except StopScript as abort:  # PlanCheck: a plan does not fit the model
        _exit_if_child(parent, 1)
        recorder.close(error=str(abort))
        if recorder.written is not None:
            recorder.written.unlink(missing_ok=True)  # nothing was recorded in it
        raise CLIError(str(abort)) from None
    finally:
        _exit_if_child(parent, outcome.exit_code if outcome else 1)
        recorder.close(error=outcome.error if outcome else "KeyboardInterrupt: interrupted")
    return _ending(recorder, outcome, existed)


def _ending(recorder: Any, outcome: Any, existed: bool) -> Ending:
    """How the recording ended (``existed``: a file was at the target before); CLIError if the
    trace could not be written at all."""
    if recorder.write_error is not None:
        if recorder.written is None:  # not even rebuilt from the journal: the disk is full
            raise CLIError(
                f"cannot write the trace: {recorder.write_error}; the steps recorded before "
                f"are kept in {recorder.journal}: make room, then run: ckview recover "
                f"{recorder.path}"
            )
        print(f"ckview: cannot write the trace: {recorder.write_error}", file=sys.stderr)
        error = f"{recorder.write_error}; the steps recorded before are kept"
        return Ending(
            outcome.exit_code or 1,
            recorder.steps_recorded,
            error,
            recorder.written,
            recorder.warmup_done,
            existed,
        )
    return Ending(
        outcome.exit_code,
        recorder.steps_recorded,
        outcome.error,
        recorder.written,
        recorder.warmup_done,
        existed,
    )


def check_output(output: Path, args: argparse.Namespace) -> None:
    """Refuse an output that is the script, a plan file or a file that is not a trace
    (NOTE [ Never destroy a user's file ] in ckview/cli/outputs.py)."""
    from ckview.cli.outputs import refuse_inputs, refuse_non_trace

    inputs = [] if args.module else [args.target]
    inputs += [p for p in getattr(args, "plan", None) or [] if Path(p).is_file()]
    refuse_inputs(output, inputs)
    refuse_non_trace(output)


def _exit_if_child(parent: int, code: int) -> None:
    """In a process the script forked, the script's end is that process's end: it must not
    close, settle or report the parent's trace (NOTE [ Bad scripts ])."""
    if os.getpid() != parent:
        sys.stdout.flush()
        sys.stderr.flush()
        _REAL_EXIT(code)


_REAL_EXIT = os._exit

# NOTE [ Bad scripts ]
# A script may end in ways that skip ckview's own ending: a forked child that returns from the
# script (it leaves through _exit_if_child, never touching the parent's trace: the recorder
# went inert in it at the fork and HDF5 writes from it go to /dev/null), ``os._exit`` (wrapped
# while the script runs: the trace is closed and reported first, then the process exits as
# asked), SIGTERM and SIGHUP (they stop the script as Ctrl-C does: SignalExit; NOTE [ A stop
# is never lost ] in stops.py), a script that closes every file descriptor (the trace's is put
# back: TraceWriter.check_file; the journal opens its file per record). A kill that nothing can
# catch leaves the journal (NOTE [ The recording journal ] in ckview/trace/journal.py).


@contextlib.contextmanager
def _os_exit_closes(recorder: Any, say: Any, existed: bool) -> Iterator[None]:
    """While the script runs, ``os._exit(n)`` in this process closes and reports the trace
    first (NOTE [ Bad scripts ])."""
    me = os.getpid()

    def exit_(status: int) -> NoReturn:
        if os.getpid() == me:
            os._exit = _REAL_EXIT
            error = f"os._exit({status}) in the script"
            with contextlib.suppress(Exception):
                recorder.close(error=error)
                say(_ending(recorder, _Exited(status, error), existed))
            sys.stdout.flush()
            sys.stderr.flush()
        _REAL_EXIT(status)

    os._exit = exit_
    try:
        yield
    finally:
        os._exit = _REAL_EXIT


@dataclass(frozen=True)
class _Exited:
    exit_code: int
    error: str


@dataclass(frozen=True)
class Ending:
    """How a recording ended."""

    exit_code: int
    """The script's."""
    steps: int
    """Steps recorded, in all runs."""
    error: str | None
    """Why the script failed or was interrupted; None if it ended well."""
    written: Path | None
    """Where the trace went (NOTE [ Writing beside the target ] in ckview/trace/staging.py)."""
    warmup_done: int
    existed: bool = False
    """A trace was at the target before: if the new one went there, it replaced it."""


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """With ``active``, send what the script prints to stderr (Python and file descriptor 1),
    so that ckview's stdout holds only its own (JSON) output."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def report(output: Path, ending: Ending, args: argparse.Namespace, runs: int = 1) -> int:
    """Say how the recording of ``runs`` runs ended; the command's exit code: the script's, or
    1 if no step was recorded."""
    from ckview.analysis.units import plural

    written = ending.written or output
    kept = "" if written == output else f"; {output} was left as it was"
    replaced = ", replacing the trace that was there" if ending.existed else ""
    if ending.error and not _complete(written):
        from ckview.cli.device import oom_report, warmup_oom_report

        print(
            oom_report(written, kept)
            or warmup_oom_report(ending.error or "", ending.warmup_done, args.warmup, written)
            or f"ckview: the script failed ({ending.error}); the trace, marked incomplete, is "
            f"{written}{kept or replaced}",
            file=sys.stderr,
        )
        return ending.exit_code or 1
    if ending.steps == 0:
        if ending.warmup_done < args.warmup:
            why = (
                f"the script ended after {ending.warmup_done} of "
                f"{plural(args.warmup, 'warmup step')}; no step was recorded: lower --warmup or "
                "let the script run more steps"
            )
        else:
            lower = "lower --warmup, " if args.warmup else ""
            why = (
                f"the script ended after {plural(args.warmup, 'warmup step')}, before a recorded "
                f"step ended; no step was recorded: {lower}let the script run more steps, or say "
                f"what a step is with --step-every (now {args.step_every})"
            )
        print(f"ckview: {why} (incomplete trace: {written}{kept})", file=sys.stderr)
        return ending.exit_code or 1
    if written != output:  # complete, yet not valid: never expected (our bug), never hidden
        print(
            f"ckview: the new trace does not pass ckview validate {written}; it is kept there"
            f"{kept}",
            file=sys.stderr,
        )
        return 1
    if ending.error:
        print(f"ckview: the script failed after the recording ({ending.error})", file=sys.stderr)
    elif ending.steps < args.steps * runs:
        per_run = f" ({args.steps} per run)" if runs > 1 else ""
        print(
            f"ckview: the script ended after {ending.steps} of "
            f"{plural(args.steps * runs, 'step')}{per_run}",
            file=sys.stderr,
        )
    print(
        f"ckview: wrote {output} ({plural(ending.steps, 'step')}{replaced}); next: ckview "
        f"summary {shlex.quote(str(output))}",
        file=sys.stderr,
    )
    return ending.exit_code


def _complete(path: Path) -> bool:
    from ckview.trace import open_trace
    from ckview.trace.errors import TraceError

    try:
        with open_trace(path) as trace:
            return bool(trace.meta.complete)
    except (TraceError, OSError):
        return False


def load_plans(sources: list[str]) -> list[tuple[str, Any]]:
    """(source, ckpt_runtime Plan) per --plan; CLIError if two would record the same run."""
    plans = [(source, load_plan(source)) for source in sources]
    seen: dict[str, str] = {}
    for source, plan in plans:
        if plan.name in seen:
            raise CLIError(
                f"plans {seen[plan.name]} and {source} are both named {plan.name!r}; give each "
                'plan file its own "name"'
            )
        seen[plan.name] = source
    return plans


def plan_runs(plans: list[tuple[str, Any]], baseline: bool, checkpointed: bool) -> list[Any]:
    """The runs to record, in order (docs/recording.md "Runs"): 'baseline' (checkpointing
    bypassed), 'checkpointed' (the script as it is), then 'plan:<name>' per plan. The first
    run checks every plan against the script's model before it begins (see PlanCheck)."""
    from recorder import RunSpec

    runs = []
    if baseline:
        runs.append(RunSpec("baseline", _bypassed, checkpointing="bypassed"))
    if checkpointed:
        runs.append(RunSpec("checkpointed", checkpointing="script"))
    runs += [
        RunSpec(f"plan:{plan.name}", plan_context(plan), checkpointing="plan") for _, plan in plans
    ]
    if plans:
        first = runs[0]
        runs[0] = RunSpec(first.name, PlanCheck(plans, first.context), first.checkpointing)
    return runs


def _bypassed(recorder: Any) -> Any:
    from ckpt_runtime import bypass

    return bypass()


class PlanCheck:
    """A run context that first resolves every plan against the script's model, so that a plan
    that does not fit it stops the script at once (``StopScript(reason)``) and is reported as
    one line, instead of failing inside the script when its run begins."""

    def __init__(self, plans: list[tuple[str, Any]], then: Any) -> None:
        self.plans = plans
        self.then = then

    @contextlib.contextmanager
    def __call__(self, recorder: Any) -> Iterator[Any]:
        from ckpt_runtime import PlanError, resolve_plan
        from recorder import StopScript

        try:
            plans = [(s, p) for s, p in self.plans if not p.checks_nothing]
            for source, plan in plans:  # a plan that checkpoints nothing needs no model
                model = recorder.main_model()
                try:
                    resolve_plan(model, plan)
                except PlanError as exc:
                    raise PlanError(f"plan {source}: {exc}") from None
        except (PlanError, RuntimeError) as exc:
            raise StopScript(" ".join(str(exc).split())) from None
        with self.then(recorder) if self.then is not None else contextlib.nullcontext() as value:
            yield value


def load_plan(source: str) -> Any:
    from ckpt_runtime.plan import PlanError, load_plan

    try:
        return load_plan(source)
    except PlanError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"cannot read plan {source}: {exc.strerror or exc}") from None


def plan_context(plan: Any) -> Any:
    """Apply ``plan`` to the recorder's main model for one run, in place of the script's own
    checkpointing, then remove it.

    A plan run means one thing: the script's checkpointing (``torch.utils.checkpoint``, HF's
    ``gradient_checkpointing_enable``, ``ckpt_runtime``) is bypassed, as in run 'baseline', and
    the plan's regions checkpoint (NOTE [ A plan that replaces the script's checkpointing ] in
    ckpt_runtime/bypass.py). So a plan projected over 'baseline' and the plan's run describe
    the same computation.
    """
    from contextlib import contextmanager

    from ckpt_runtime import bypass
    from ckpt_runtime.apply import apply_plan, remove_plan

    @contextmanager
    def applied(recorder: Any) -> Any:
        if plan.checks_nothing:  # no model needed (a loop without modules has none)
            with bypass():
                yield None
            return
        model = recorder.main_model()
        applied_plan = apply_plan(model, plan)
        try:
            with bypass(keep=_planned_modules(model, applied_plan)):
                yield applied_plan
        finally:
            remove_plan(model)

    return applied


def _planned_modules(model: Any, applied: Any) -> list[Any]:
    """The modules whose calls ``applied`` checkpoints: its module regions and the
    ``nn.Sequential`` of each segment."""
    paths = {*applied.modules, *(segment.sequential for segment in applied.segments)}
    return [model.get_submodule(path) for path in sorted(paths)]


def check_target(target: str, module: bool) -> None:
    if module:
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise CLIError(f"no module named {target!r}; check the name or drop -m to run a file")
        if spec.submodule_search_locations is not None and not _has_main(target):
            raise CLIError(
                f"{target} is a package without __main__.py, so python -m cannot run it; "
                "name its training module (-m package.module)"
            )
        return
    path = Path(target)
    if not path.exists():
        raise CLIError(f"script {target} not found; give the path of a Python training script")
    if path.is_dir() and not (path / "__main__.py").exists():
        raise CLIError(f"{target} is a folder without __main__.py; give a Python script")


def _has_main(package: str) -> bool:
    try:
        return importlib.util.find_spec(f"{package}.__main__") is not None
    except (ImportError, ValueError):
        return False


MAX_STEPS = 1_000_000
"""The most --steps, --warmup and --timing-steps take: far above any real recording, it turns
a typo (``--steps 999999999999``) into one line at once."""


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    if value > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_STEPS:,}, got {text}")
    return value
