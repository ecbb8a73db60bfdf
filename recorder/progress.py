"""Steps recorded / to go, one line each on stderr (the script's own stdout stays untouched).

NOTE [ Progress on its own line ]
A live bar (tqdm's ``\\r`` redraws) leaves the cursor after itself, so whatever the script
prints next runs into it ("...3.54s/step]step 0 loss 7.08"). Progress is therefore whole
lines: before each, the script's buffered stdout is flushed (its text comes first), and each
ends with a newline (the script's next text starts on a line of its own). By default it shows
only when stderr is a terminal: a log file or a pipe gets none unless asked (``--progress``).
"""

from __future__ import annotations

import contextlib
import sys
from time import perf_counter


class StepProgress:
    """One line per warmup or recorded step; ``enabled=None`` means "if stderr is a TTY"."""

    def __init__(self, warmup: int, steps: int, enabled: bool | None = None) -> None:
        self._warmup = warmup
        self._steps = steps
        self._enabled = enabled
        self._on = False
        self._warmed = 0
        self._recorded = 0
        self._t = 0.0

    def start(self) -> None:
        self._on = _stderr_is_tty() if self._enabled is None else self._enabled
        self._t = perf_counter()

    def step_done(self, warmup: bool) -> None:
        """A warmup step (``warmup``) or a recorded step ended. The warmup can last longer than
        asked, until the training settles (NOTE [ Warm-up until steady ] in steady.py)."""
        if warmup:
            self._warmed += 1
        else:
            self._recorded += 1
        if not self._on:
            return
        now = perf_counter()
        took, self._t = now - self._t, now
        if warmup and self._warmed <= self._warmup:
            self._line(f"warmup step {self._warmed}/{self._warmup} done ({took:.2f} s)")
        elif warmup:
            settling = "until the training settles"
            self._line(f"warmup step {self._warmed} done ({took:.2f} s; {settling})")
        elif self._recorded <= self._steps:
            self._line(f"recorded step {self._recorded}/{self._steps} ({took:.2f} s)")

    def close(self) -> None:
        self._on = False

    @staticmethod
    def _line(text: str) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a closed/replaced stdout
            sys.stdout.flush()
        print(f"ckview: {text}", file=sys.stderr, flush=True)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
