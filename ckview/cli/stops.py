"""How a signal stops the script that ``ckview record`` runs, and why it is never lost.

NOTE [ A stop is never lost ]
SIGTERM and SIGHUP raise ``SignalExit`` in the script and SIGINT ``KeyboardInterrupt``, as
Python's own SIGINT handler does: the script unwinds and the trace is closed. Python runs a
signal's handler at the next bytecode of the main thread, wherever that is, and two places
would lose or spoil the stop:

- a weak-reference callback, a ``__del__`` or a garbage-collector callback: Python prints the
  exception as "ignored" and goes on, and the script runs to its end. The recorder sees every
  storage's free through such a callback, so under ckview a stop lands there now and then (the
  fault suite's SIGHUP case once ran to its end). ``sys.unraisablehook`` is told of each such
  swallowed exception: for a stop it sends the signal again;
- the recorder's own bookkeeping (an op's rows, a window's merge, a journal record): an
  exception half way through would leave its tables out of step. There the handler does not
  raise: it sends the signal again.

The signal is sent again from a short-lived thread a few milliseconds later, one at a time,
so that its handler runs after the callback or the bookkeeping has returned, in the script's
own code. A script that installs its own handlers keeps them; an ignored SIGHUP (``nohup``)
stays ignored.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from recorder import SignalExit

AGAIN_AFTER_S = 0.005
"""How long after a stop was swallowed or deferred the signal is sent again (NOTE [ A stop is
never lost ])."""

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
        _stop_again_if_swallowed(sys.unraisablehook),
    )
    try:
        yield
    finally:
        sys.unraisablehook = unraisable
        for signum in mine:
            signal.signal(signum, previous[signum])


def _ours_to_take(signum: int, handler: Any) -> bool:
    """SIGTERM and SIGHUP unless ignored; SIGINT where Python's own handler has it."""
    if signum == signal.SIGINT:
        return handler is signal.default_int_handler
    return handler is not signal.SIG_IGN


def _stop(signum: int, frame: FrameType | None) -> None:
    """The handler: stop the script, unless the recorder is in the middle of its bookkeeping."""
    if in_the_recorder(frame):
        _send_again(signum)
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SignalExit(signum)  # unwinds the script so the trace is closed


def _stop_again_if_swallowed(previous: Any) -> Any:
    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        if isinstance(error, SignalExit):
            _send_again(error.signum)
        elif isinstance(error, KeyboardInterrupt):
            _send_again(signal.SIGINT)
        else:
            previous(unraisable)

    return hook


_again = threading.Lock()


def _send_again(signum: int) -> None:
    """Send ``signum`` to this process once more, soon, from another thread (one at a time)."""
    if not _again.acquire(blocking=False):
        return  # one is on its way

    def later() -> None:
        time.sleep(AGAIN_AFTER_S)
        _again.release()
        os.kill(os.getpid(), signum)

    threading.Thread(target=later, name="ckview-stop-again", daemon=True).start()


def in_the_recorder(frame: FrameType | None) -> bool:
    """True when the innermost frame that is not torch's, numpy's, h5py's or the standard
    library's is the recorder's or the trace writer's (the runner of the script excepted)."""
    libraries = _library_roots()
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith("<") and not path.startswith(libraries):
            path = os.path.realpath(path)
            return path != _RUNNER and path.startswith(_INTERNALS)
        frame = frame.f_back
    return False


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
