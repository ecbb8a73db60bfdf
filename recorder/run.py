"""Record a script: run it under a :class:`~recorder.Recorder` and say how the recording ended.

The command line (``ckview record``, ``ckview verify`` and each rank of a distributed launch)
words what :func:`record` returns; nothing here imports the CLI.

NOTE [ Bad scripts ]
A script may end in ways that skip ckview's own ending: a forked child that returns from the
script (it leaves through _exit_if_child, never touching the parent's trace: the recorder
went inert in it at the fork and HDF5 writes from it go to /dev/null), ``os._exit`` (wrapped
while the script runs: the trace is closed and reported first, then the process exits as
asked), SIGTERM and SIGHUP (they stop the script as Ctrl-C does: SignalExit; NOTE [ A stop
is never lost ] in ckview/cli/stops.py), a script that closes every file descriptor (the
trace's is put back: TraceWriter.check_file; the journal opens its file per record). A kill
that nothing can catch leaves the journal (NOTE [ The recording journal ] in
ckview/trace/journal.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from recorder.native import NativeRecorderError
from recorder.runner import run_script
from recorder.runs import RunSpec, StopScript
from recorder.session import Recorder
from recorder.steps import StepRule


@dataclass(frozen=True)
class RecordingResult:
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
    write_error: str | None = None
    """Why writing the trace failed (NOTE [ When the trace cannot be written ] in sink.py)."""
    journal: Path | None = None
    """The recording's journal, kept when the trace could not be rebuilt from it."""


class ClosingInterrupted(KeyboardInterrupt):
    """Ctrl-C while the trace was being closed: the journal keeps every completed step."""

    def __init__(self, journal: Path | None, output: Path) -> None:
        super().__init__(
            f"while the trace was being closed; the steps recorded are kept in {journal}: "
            f"ckview recover {output} (or any verb that reads {output}) brings them back"
        )


class CannotOpenTrace(Exception):
    """The trace or its journal could not be created; the message says why."""


@dataclass(frozen=True)
class RecordOptions:
    """What to record of a script (the ``Recorder``'s arguments)."""

    steps: int = 1
    warmup: int = 1
    stop_after: bool = False
    step_every: str | StepRule = "auto"
    timing_steps: int = 0
    stacks: bool = False
    progress: bool | None = None


def record(
    target: str,
    args: list[str],
    output: Path,
    options: RecordOptions,
    *,
    module: bool = False,
    runs: Sequence[RunSpec] = (),
    command: list[str] | None = None,
    on_exit: Callable[[RecordingResult], object] = lambda result: None,
    guard: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    stdout_to_stderr: bool = False,
) -> RecordingResult:
    """Run the script ``target`` with ``args`` under the recorder; how it ended.

    The trace is closed (incomplete if the script failed) and settled whatever happens, also on
    Ctrl-C and SIGTERM (NOTE [ Writing beside the target ] in ckview/trace/staging.py). After
    the recorded runs come ``options.timing_steps`` rounds of plain timing steps (NOTE [ Plain
    timing steps ] in recorder/timing.py). ``guard`` (the CLI's signal handlers) is entered
    around the script and the closing of its trace; ``on_exit`` hears the result when the
    script calls ``os._exit`` (NOTE [ Bad scripts ]). Raises CannotOpenTrace if the trace
    cannot be created, and ``StopScript(reason)`` if a run aborted the script (a plan that does
    not fit the model; nothing is kept).
    """
    existed = output.exists()
    start = None if output.is_absolute() else Path.cwd()  # NOTE [ Paths from where ckview started ]
    recorder = Recorder(
        output.absolute(),
        steps=options.steps,
        warmup=options.warmup,
        stop_after=options.stop_after,
        command=command,
        runs=runs,
        progress=options.progress,
        step_every=options.step_every,
        timing_steps=options.timing_steps,
        stacks=options.stacks,
    )
    try:
        recorder.__enter__()
    except OSError as exc:
        raise CannotOpenTrace(exc.strerror or str(exc)) from exc
    except NativeRecorderError as exc:  # CKVIEW_RECORDER=native and it cannot load
        raise StopScript(str(exc)) from None
    outcome = None
    parent = os.getpid()
    with guard():  # also while the trace is closed: a stop then waits for it (a launcher's
        # SIGTERM to a rank whose script failed came while it wrote its trace, and killed it)
        try:
            with (
                _stdout_to_stderr(stdout_to_stderr),
                _os_exit_closes(recorder, on_exit, existed, start),
            ):
                outcome = run_script(target, args, module=module)
        except StopScript as abort:  # PlanCheck: a plan does not fit the model
            _exit_if_child(parent, 1)
            recorder.close(error=str(abort))
            if recorder.written is not None:
                recorder.written.unlink(missing_ok=True)  # nothing was recorded in it
            raise
        finally:
            _exit_if_child(parent, outcome.exit_code if outcome else 1)
            try:
                error = outcome.error if outcome else "KeyboardInterrupt: interrupted"
                recorder.close(error=error)
            except KeyboardInterrupt:  # a second Ctrl-C while the trace was being closed
                raise ClosingInterrupted(_as_given(recorder.journal, start), output) from None
    return _result(recorder, outcome.exit_code, outcome.error, existed, start)


def _result(
    recorder: Recorder, exit_code: int, error: str | None, existed: bool, start: Path | None
) -> RecordingResult:
    return RecordingResult(
        exit_code,
        recorder.steps_recorded,
        error,
        _as_given(recorder.written, start),
        recorder.warmup_done,
        existed,
        recorder.write_error,
        _as_given(recorder.journal, start),
    )


def _as_given(path: Path | None, start: Path | None) -> Path | None:
    """NOTE [ Paths from where ckview started ]
    A relative ``-o`` names a file in the folder ckview started in, wherever the script goes
    (``os.chdir``): the recorder writes the trace and its journal at absolute paths, and the
    result names them relative to that folder again, as the user gave them."""
    if path is None or start is None or not path.is_relative_to(start):
        return path
    return path.relative_to(start)


def _exit_if_child(parent: int, code: int) -> None:
    """In a process the script forked, the script's end is that process's end: it must not
    close, settle or report the parent's trace (NOTE [ Bad scripts ])."""
    if os.getpid() != parent:
        sys.stdout.flush()
        sys.stderr.flush()
        _REAL_EXIT(code)


_REAL_EXIT = os._exit


@contextlib.contextmanager
def _os_exit_closes(
    recorder: Recorder,
    say: Callable[[RecordingResult], object],
    existed: bool,
    start: Path | None,
) -> Iterator[None]:
    """While the script runs, ``os._exit(n)`` in this process closes and reports the trace
    first (NOTE [ Bad scripts ])."""
    me = os.getpid()

    def exit_(status: int) -> NoReturn:
        if os.getpid() == me:
            os._exit = _REAL_EXIT
            error = f"os._exit({status}) in the script"
            with contextlib.suppress(Exception):
                recorder.close(error=error)
                say(_result(recorder, status, error, existed, start))
            sys.stdout.flush()
            sys.stderr.flush()
        _REAL_EXIT(status)

    os._exit = exit_
    try:
        yield
    finally:
        os._exit = _REAL_EXIT


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """With ``active``, send what the script prints to stderr (Python and file descriptor 1),
    so that the caller's stdout holds only its own (JSON) output."""
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
