"""Steps recorded / to go, on stderr (the script's own stdout stays untouched)."""

from __future__ import annotations

import sys

from tqdm import tqdm


class StepProgress:
    """A progress bar over warmup + recorded steps."""

    def __init__(self, warmup: int, steps: int, enabled: bool = True) -> None:
        self._warmup = warmup
        self._steps = steps
        self._enabled = enabled
        self._bar: tqdm | None = None
        self._done = 0

    def start(self) -> None:
        if self._enabled:
            self._bar = tqdm(
                total=self._warmup + self._steps,
                desc=self._describe(),
                unit="step",
                file=sys.stderr,
                leave=True,
                dynamic_ncols=True,
            )

    def step_done(self) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.set_description_str(self._describe(), refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _describe(self) -> str:
        if self._done < self._warmup:
            return f"ckview: warmup {self._done + 1}/{self._warmup}"
        recorded = min(self._done - self._warmup, self._steps)
        return f"ckview: recorded {recorded}/{self._steps} steps"
