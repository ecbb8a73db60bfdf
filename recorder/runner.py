"""Run a user's script or module in this process, as ``python script.py`` would."""

from __future__ import annotations

import contextlib
import gc
import os
import runpy
import signal
import sys
import traceback
from dataclasses import dataclass

from ckpt_runtime import PlanError
from recorder.runs import StopScript


class SignalExit(SystemExit):
    """Raised in the script by ckview's handler of SIGTERM and SIGHUP: it unwinds the script
    like Ctrl-C does, so that the trace is closed (marked incomplete); the exit status is the
    one the signal would give, 128 + N."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


@dataclass(frozen=True)
class Outcome:
    """How the script ended: its exit code, and why the recording is incomplete if it is."""

    exit_code: int
    error: str | None


def run_script(target: str, args: list[str], *, module: bool = False) -> Outcome:
    """Run ``target`` (a path, or a module name with ``module=True``) as ``__main__``.

    The script sees its own ``sys.argv`` and ``sys.path[0]``; its exit code is returned, an
    uncaught exception is printed as Python would print it. Nothing here raises except
    for errors in ckview itself.
    """
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else ""
    saved_cwd = os.getcwd()  # NOTE [ Paths from where ckview started ] in run.py
    sys.argv = [target, *args]
    try:
        if module:
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except StopScript as stop:
        if stop.args:
            raise  # an abort with a reason: the caller reports it
        return Outcome(0, None)
    except SignalExit as stop:
        name = signal.Signals(stop.signum).name
        print(f"{name}: the script was stopped", file=sys.stderr)
        return Outcome(128 + stop.signum, f"{name}: stopped by a signal")
    except SystemExit as exit_:
        return _exit_outcome(exit_.code)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        return Outcome(130, "KeyboardInterrupt: interrupted")
    except BaseException as exc:
        if not isinstance(exc, PlanError):  # ckpt_runtime's refusals are one line already
            _print_user_traceback(exc)
        _release_the_script(exc)
        return Outcome(1, f"{type(exc).__name__}: {exc}")
    finally:
        sys.argv = saved_argv
        if sys.path:
            sys.path[0] = saved_path0
        with contextlib.suppress(OSError):  # the script went elsewhere (os.chdir)
            os.chdir(saved_cwd)
    return Outcome(0, None)


def _release_the_script(exc: BaseException) -> None:
    """NOTE [ A failed script's memory is released first ]
    A script that failed, an out-of-memory above all, still holds its tensors through the
    exception's traceback (every frame's locals) and through reference cycles of its module's
    functions; writing the trace then needs memory that is not there (HDF5 failed to allocate a
    chunk and crashed the process). So the frames are cleared and the cycles collected before
    the trace is closed."""
    traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None
    gc.collect()


def _exit_outcome(code: object) -> Outcome:
    if code is None:
        return Outcome(0, None)
    if isinstance(code, int):
        return Outcome(code, None if code == 0 else f"SystemExit: {code}")
    print(code, file=sys.stderr)
    return Outcome(1, f"SystemExit: {code}")


def _print_user_traceback(exc: BaseException) -> None:
    """Print the traceback as Python would for the script alone: without runpy's frames and
    ckview's (the recorder's op hook sits under every op the script calls)."""
    printed = traceback.TracebackException.from_exception(exc)
    frames = [f for f in printed.stack if not _is_ours(f.filename)]
    printed.stack = traceback.StackSummary.from_list(frames or printed.stack)
    print("".join(printed.format()), end="", file=sys.stderr)


_OURS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
    for name in ("recorder", "ckview")
)


def _is_ours(filename: str) -> bool:
    """runpy's frames and ckview's own."""
    if filename == "<frozen runpy>" or filename.endswith("runpy.py"):
        return True
    return not filename.startswith("<") and os.path.abspath(filename).startswith(_OURS)
