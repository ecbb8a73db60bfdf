"""How a signal stops the script that ``ckview record`` runs, and why it is never lost.

NOTE [ A stop is never lost ]
SIGTERM and SIGHUP raise ``SignalExit`` in the script and SIGINT ``KeyboardInterrupt``, as
Python's own SIGINT handler does: the script unwinds and the trace is closed. Python runs a
signal's handler at the next bytecode of the main thread, wherever that is, and two places
would lose or spoil the stop:

- a weak-reference callback, a ``__del__`` or a garbage-collector callback: Python prints the
  exception as "ignored" and goes on, and the script runs to its end. The recorder sees every
  storage's free through such a callback, so under ckview a stop lands there now and then.
  ``sys.unraisablehook`` is told of each such swallowed exception;
- the recorder's own bookkeeping (an op's rows, a window's merge, a journal record): an
  exception half way through would leave its tables out of step. Under the recorder most of
  a small step's time is bookkeeping.

In both places the stop is *held*, not raised: it is raised at the next line of the innermost
frame outside them (the frame the callback or the bookkeeping returns to), through that frame's
trace function, which Python calls at each of its lines while a trace function is set (as
``pdb.set_trace`` stops a running frame). If that frame returns first, the frame it returns to
takes the stop over. So a held stop is raised once control is back in the script's code,
however loaded the machine and however much of the step the recorder takes; it never depends
on a timer. (Sending the signal again a few milliseconds later, as ckview did before, landed
in the bookkeeping again most of the time on a small step, and the script ran on for steps.)

A script that installs its own handlers keeps them. An ignored SIGHUP (``nohup``) and an
ignored SIGINT (a job started in the background by a non-interactive shell) stay ignored, as
Python itself leaves them: the shell that started ckview asked for it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

from recorder import SignalExit

_CKVIEW = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_INTERNALS = (
    os.path.join(os.path.dirname(_CKVIEW), "recorder") + os.sep,
    os.path.join(_CKVIEW, "trace") + os.sep,
)
"""Where the recorder's bookkeeping runs: the recorder and the trace writer."""
_RUNNER = os.path.join(os.path.dirname(_CKVIEW), "recorder", "runner.py")


@contextlib.contextmanager
def signals_stop_the_script() -> Iterator[None]:
    """While the script runs: SIGTERM and SIGHUP raise SignalExit in it, SIGINT
    KeyboardInterrupt, never inside the recorder's bookkeeping nor lost in a callback."""
    wanted = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
    previous = {s: signal.getsignal(s) for s in wanted}
    mine = [s for s in wanted if _ours_to_take(s, previous[s])]
    for signum in mine:
        signal.signal(signum, _stop)
    unraisable, sys.unraisablehook = (
        sys.unraisablehook,
        _hold_if_swallowed(sys.unraisablehook),
    )
    try:
        yield
    finally:
        pending = _held.signum if _held.frame is not None else 0
        _held.release()
        sys.unraisablehook = unraisable
        for signum in mine:
            signal.signal(signum, previous[signum])
        if pending:  # a stop held to the end (the trace was being closed): now it stops
            raise stop_exception(pending)


def _ours_to_take(signum: int, handler: Any) -> bool:
    """SIGTERM and SIGHUP unless ignored; SIGINT where Python's own handler has it."""
    if signum == signal.SIGINT:
        return handler is signal.default_int_handler
    return handler is not signal.SIG_IGN


def _stop(signum: int, frame: FrameType | None) -> None:
    """The handler: stop the script, or hold the stop while the recorder is in its bookkeeping."""
    if in_the_recorder(frame):
        _held.hold(signum, frame)
        return
    _held.release()
    raise stop_exception(signum)  # unwinds the script so the trace is closed


def stop_exception(signum: int) -> BaseException:
    """What a stop raises in the script: KeyboardInterrupt for SIGINT, else SignalExit."""
    return KeyboardInterrupt() if signum == signal.SIGINT else SignalExit(signum)


def _hold_if_swallowed(previous: Any) -> Any:
    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        if isinstance(error, SignalExit):
            _held.hold(error.signum, sys._getframe(1))
        elif isinstance(error, KeyboardInterrupt):
            _held.hold(signal.SIGINT, sys._getframe(1))
        else:
            previous(unraisable)

    return hook


class _HeldStop:
    """A stop waiting for the next line of a frame outside the recorder (NOTE [ A stop is never
    lost ]); one at a time, in the main thread, where signal handlers run."""

    def __init__(self) -> None:
        self.signum = 0
        self.frame: FrameType | None = None
        self._frame_trace: Any = None
        self._global_trace: Any = None

    def hold(self, signum: int, inner: FrameType | None) -> None:
        """Hold ``signum`` until the frame that ``inner``'s bookkeeping or callback returns to
        runs its next line."""
        frame = frame_outside_the_recorder(inner)
        if frame is None:  # nothing above to raise it in: raise it here after all
            self.release()
            raise stop_exception(signum)
        if self.frame is None:
            self._global_trace = sys.gettrace()
            sys.settrace(self._on_call)
        else:
            self._unhook_frame()
        self.signum = signum
        self.frame = frame
        self._frame_trace = frame.f_trace
        frame.f_trace = self._on_event

    def release(self) -> None:
        """Forget the held stop; the script's own trace functions are back as they were."""
        if self.frame is None:
            return
        self._unhook_frame()
        self.frame = None
        sys.settrace(self._global_trace)
        self._global_trace = None

    def _unhook_frame(self) -> None:
        assert self.frame is not None
        self.frame.f_trace = self._frame_trace
        self._frame_trace = None

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        """The global trace function: new frames are left to the script's own tracer, if any."""
        if self._global_trace is None:
            return None
        return self._global_trace(frame, event, arg)

    def _on_event(self, frame: FrameType, event: str, arg: Any) -> Any:
        """The held frame's trace function: its next line raises the stop; if it returns
        first, its caller takes the stop over."""
        if frame is not self.frame:
            return None
        if event == "line":
            signum = self.signum
            self.release()
            raise stop_exception(signum)
        if event == "return":
            self.hold(self.signum, frame.f_back)
            return None
        return self._on_event


_held = _HeldStop()


def in_the_recorder(frame: FrameType | None) -> bool:
    """True when the innermost frame that is not torch's, numpy's, h5py's or the standard
    library's is the recorder's or the trace writer's (the runner of the script excepted)."""
    return frame is not None and frame_outside_the_recorder(frame) is not frame


def frame_outside_the_recorder(frame: FrameType | None) -> FrameType | None:
    """The frame that the recorder's bookkeeping around ``frame`` returns to: past the
    recorder's frames and the library frames between them; ``frame`` itself when the innermost
    frame that is not a library's is not the recorder's."""
    libraries = _library_roots()
    outermost_internal: FrameType | None = None
    inner = frame
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith("<") and not path.startswith(libraries):
            path = os.path.realpath(path)
            if path == _RUNNER or not path.startswith(_INTERNALS):
                break  # the script's (or ckview's) own code
            outermost_internal = frame
        frame = frame.f_back
    return inner if outermost_internal is None else outermost_internal.f_back


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """The folders of the libraries the recorder calls into."""
    import sysconfig

    import h5py
    import numpy
    import torch

    roots = [sysconfig.get_paths()["stdlib"]]
    roots += [os.path.dirname(m.__file__ or "") for m in (torch, numpy, h5py)]
    return tuple(os.path.realpath(root) + os.sep for root in roots if root)
