"""What ``ckview record``, ``ckview verify`` and each rank of a distributed launch share: the
recording options, the checks of the script and the output, and the words for how a recording
ended. The recording itself is ``recorder.run.record`` (imported when a verb runs)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.cli.errors import CLIError

if TYPE_CHECKING:
    from recorder.run import RecordingResult
    from recorder.runs import RunSpec

USAGE = "%(prog)s [OPTIONS] script.py [ARGS ...]\n       %(prog)s [OPTIONS] -m module [ARGS ...]"
ARGS_HELP = (
    "ckview's options go before the script (or -m module); everything after it goes to the "
    "script unchanged, as with python script.py ARGS, '--' and options named like ckview's "
    "included."
)


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


def default_output(target: str, suffix: str = "") -> Path:
    """The trace a script records into without -o: ``train.py`` -> ``train{suffix}.h5``."""
    return Path(f"{Path(target).stem.split('.')[-1]}{suffix}.h5")


def record_script(
    args: argparse.Namespace,
    output: Path,
    runs: Sequence[RunSpec],
    stdout_to_stderr: bool = False,
) -> RecordingResult:
    """Run the script under the recorder (``recorder.run.record``) with the verb's options; how
    it ended. CLIError if the output cannot be written, a plan does not fit the model, or the
    trace could not be written at all."""
    if not output.parent.exists():
        raise CLIError(f"cannot write {output}: folder {output.parent} does not exist")
    check_output(output, args)
    from ckview.cli.stops import signals_stop_the_script
    from recorder import StopScript
    from recorder.run import CannotOpenTrace, RecordOptions, record
    from recorder.steps import StepRule, StepRuleError

    try:
        step_rule = StepRule.parse(args.step_every)
    except StepRuleError as exc:
        raise CLIError(f"--step-every: {exc}") from None
    verb = args.verb
    command = ["ckview", verb, *sys.argv[2:]] if sys.argv[1:2] == [verb] else sys.argv
    options = RecordOptions(
        steps=args.steps,
        warmup=args.warmup,
        stop_after=args.stop_after,
        step_every=step_rule,
        timing_steps=args.timing_steps,
        stacks=args.stacks,
        progress=args.progress,
    )
    try:
        result = record(
            args.target,
            args.args,
            output,
            options,
            module=args.module,
            runs=runs,
            command=list(command),
            on_exit=lambda result: report(output, _kept(result, output), args),
            guard=signals_stop_the_script,
            stdout_to_stderr=stdout_to_stderr,
        )
    except CannotOpenTrace as exc:
        raise CLIError(f"cannot write {output}: {exc}") from None
    except StopScript as abort:
        raise CLIError(str(abort)) from None
    return _kept(result, output)


def _kept(result: RecordingResult, output: Path) -> RecordingResult:
    """``result``, or what was kept of it after the trace could not be written; CLIError if not
    even the journal could be turned into a trace (a full disk)."""
    why = result.write_error
    if why is None:
        return result
    if result.written is None:
        raise CLIError(
            f"cannot write the trace: {why}; the steps recorded before are kept in "
            f"{result.journal}: make room, then run: ckview recover {output}"
        )
    print(f"ckview: cannot write the trace: {why}", file=sys.stderr)
    error = f"{why}; the steps recorded before are kept"
    return dataclasses.replace(result, exit_code=result.exit_code or 1, error=error)


def check_output(output: Path, args: argparse.Namespace) -> None:
    """Refuse an output that is the script, a plan file or a file that is not a trace
    (NOTE [ Never destroy a user's file ] in ckview/cli/outputs.py)."""
    from ckview.cli.outputs import refuse_inputs, refuse_non_trace

    inputs = [] if args.module else [args.target]
    inputs += [p for p in getattr(args, "plan", None) or [] if Path(p).is_file()]
    refuse_inputs(output, inputs)
    refuse_non_trace(output)
    from ckview.cli.journals import recording_now

    journal = recording_now(output)
    if journal is not None:
        raise CLIError(
            f"{output} is being recorded by another ckview ({journal.name}); wait for it to "
            "end, or record into another file with -o"
        )


def report(output: Path, ending: RecordingResult, args: argparse.Namespace, runs: int = 1) -> int:
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
        elif ending.warmup_done > args.warmup:  # NOTE [ Warm-up until steady ] (recorder)
            why = (
                f"the script ended after {plural(ending.warmup_done, 'warmup step')} (more than "
                f"the {args.warmup} asked: the recorder waits until the model and its DataLoaders "
                "settle); no step was recorded: let the script run more steps"
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


def load_plan(source: str) -> Any:
    from ckpt_runtime.plan import PlanError, load_plan

    try:
        return load_plan(source)
    except PlanError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"cannot read plan {source}: {exc.strerror or exc}") from None


def check_target(target: str, module: bool) -> None:
    if module:
        try:
            with _working_folder_first():  # as python -m finds modules
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
        with _working_folder_first():
            return importlib.util.find_spec(f"{package}.__main__") is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def _working_folder_first() -> Iterator[None]:
    """``sys.path`` as ``python -m`` sets it, the working folder first, while a module is
    looked up (``ckview``'s own ``sys.path[0]`` is the folder of its entry point)."""
    saved = sys.path[:]
    sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        sys.path[:] = saved


MAX_STEPS = 1_000_000
"""The most --steps, --warmup and --timing-steps take: far above any real recording, it turns
a typo (``--steps 999999999999``) into one line at once."""


def _positive(text: str) -> int:
    return _whole_number(text, least=1)


def _non_negative(text: str) -> int:
    return _whole_number(text, least=0)


def _whole_number(text: str, least: int) -> int:
    """``text`` as a whole number from ``least`` to MAX_STEPS; one message for any value out
    of that range, whichever side."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not least <= value <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"must be from {least} to {MAX_STEPS:,}, got {text}")
    return value


def unlike_step_warnings(output: Path) -> list[str]:
    """A warning for each run of the trace at ``output`` whose recorded steps are not alike
    (NOTE [ Steps that are not alike ] in ckview/analysis/steadiness.py)."""
    from ckview.analysis.steadiness import unlike_steps
    from ckview.trace import open_trace

    found = []
    with open_trace(output) as trace:
        for name in trace.run_names:
            run = trace.run(name)
            if run.steps_recorded < 2:
                continue
            tables = {t: run.table(t).read() for t in ("storages", "memory_events", "steps")}
            unlike = unlike_steps(tables["storages"], tables["memory_events"], tables["steps"])
            if unlike is not None:
                found.append(f"run {name!r}: {unlike.describe()}")
    return found


def compiled_plans_note(output: Path) -> str | None:
    """What plans promise on a script whose compiled code ran compiled while recorded (docs/
    recording.md, "Plans and --compare on compiled code"); None if it did not."""
    from ckview.trace import open_trace

    with open_trace(output) as trace:
        if trace.meta.compiled != "compiled":
            return None
    return (
        "the script's compiled code ran compiled: each run is measured compiled, but a "
        "projection sees a compiled graph only as a whole (no module calls inside it), so it "
        "promises nothing for plans over modules inside it (docs/recording.md)"
    )
