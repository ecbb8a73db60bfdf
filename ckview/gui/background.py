"""Slow work (reading a trace, building a projection model, planning) off the UI thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_background(work: Callable[[], T], deliver: Callable[[T | Exception], None]) -> None:
    """Run ``work`` on a daemon thread and hand its result, or the exception it raised, to
    ``deliver`` (a signal's ``emit``: Qt queues it to the receiver's thread). If the receiver
    was deleted meanwhile (its window closed), the result is dropped."""

    def run() -> None:
        result: T | Exception
        try:
            result = work()
        except Exception as exc:  # handed to the UI thread, which reports it
            result = exc
        with contextlib.suppress(RuntimeError):  # "wrapped C/C++ object ... has been deleted"
            deliver(result)

    threading.Thread(target=run, daemon=True).start()
