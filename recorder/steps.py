"""Where one training iteration ends: the step rule, and what each step holds.

NOTE [ Step = one optimizer iteration ]
A recorded step is one iteration of the training loop: every forward, backward and optimizer
step that makes one update of the model. Ending a step at each ``optimizer.step()`` (or each
backward) is wrong for gradient accumulation (k forwards and backwards, then one step), for two
optimizers (a GAN steps both in one iteration) and for ``optimizer.step(closure)`` (the forward
and backward run inside the step). The rule, by ``StepRule.kind``:

* ``auto`` (default) with optimizers: an iteration ends at the optimizer step after which every
  optimizer the recorder knows of has stepped since the iteration began. Known are the
  optimizers constructed while the recorder is installed and any that has stepped (one built
  before a ``with Recorder`` block is known from its first step on). One step of each: a GAN's
  two steps make one iteration, k micro-batches and one step make one. An optimizer that has
  never stepped stops being waited for once another steps twice in one iteration (one built and
  never used would otherwise hold every step open; a WGAN critic's n steps before the
  generator's first are then n iterations, until the generator has stepped once).
* ``auto`` without any optimizer: an iteration ends at the first top-level forward after a
  backward (a manual SGD update under ``no_grad`` then belongs to the step it follows); in a
  loop without any nn.Module, at the end of the backward (NOTE [ A forward without modules ]
  in hooks.py).
* ``optimizer:N``: every N-th optimizer step ends an iteration (all optimizers count).
* ``backward:N``: the first top-level forward after every N-th backward ends one.
* ``manual``: only ``Recorder.mark_step()`` ends a step; calling it switches any rule to this
  (a first call right after an automatic boundary confirms that boundary).

Warmup counts iterations by the same rule, and the counts of the last warmup iteration are kept
to say in the trace what one iteration looked like before recording began.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Any

_KINDS = ("auto", "optimizer", "backward", "manual")
_RULE = re.compile(r"^(auto|manual|(optimizer|backward)(?::([0-9]+))?)$")


class StepRuleError(ValueError):
    """A step rule that cannot be parsed; the message says what is accepted."""


@dataclass(frozen=True)
class StepRule:
    """How steps are delimited; see NOTE [ Step = one optimizer iteration ]."""

    kind: str = "auto"
    count: int = 1

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise StepRuleError(f"unknown step rule {self.kind!r}; use one of {', '.join(_KINDS)}")
        if self.count < 1:
            raise StepRuleError(f"a step rule counts from 1, got {self.count}")

    @classmethod
    def parse(cls, text: str) -> StepRule:
        """``auto``, ``manual``, ``optimizer[:N]`` or ``backward[:N]`` (N defaults to 1)."""
        match = _RULE.match(text.strip())
        if match is None:
            raise StepRuleError(
                f"cannot read step rule {text!r}: use auto, manual, optimizer:N (N optimizer "
                "steps per iteration) or backward:N (N backward passes per iteration)"
            )
        kind = match.group(2) or match.group(1)
        count = int(match.group(3)) if match.group(3) else 1
        return cls(kind, count)

    def __str__(self) -> str:
        return self.kind if self.kind in ("auto", "manual") else f"{self.kind}:{self.count}"


@dataclass(frozen=True)
class StepCounts:
    """What one step held."""

    forwards: int = 0
    """top-level forward passes begun"""
    backwards: int = 0
    """backward passes run to their end"""
    optimizer_steps: int = 0
    """``optimizer.step()`` calls returned"""

    def describe(self) -> str:
        return (
            f"{plural(self.forwards, 'forward')}, {plural(self.backwards, 'backward')}, "
            f"{plural(self.optimizer_steps, 'optimizer step')}"
        )


class IterationTracker:
    """Counts a step's forwards, backwards and optimizer steps and says where a step ends.

    The recorder calls ``on_*`` as it sees each event; a ``True`` return means a step boundary
    falls there (for ``on_forward``: just before the forward). Optimizers are held weakly.
    """

    def __init__(self, rule: StepRule) -> None:
        self.rule = rule
        self._given = rule.kind != "auto"
        self._known: weakref.WeakSet[Any] = weakref.WeakSet()
        self._ever_stepped: weakref.WeakSet[Any] = weakref.WeakSet()
        self._stepped: dict[int, int] = {}  # id(optimizer) -> steps in this iteration
        self._forwards = self._backwards = self._optimizer_steps = 0
        self._backwards_since_boundary = 0
        self.learned: StepCounts | None = None

    # ----------------------------------------------------------------- events

    def add_optimizer(self, optimizer: Any) -> None:
        """An optimizer exists (constructed, found at start, or stepping)."""
        self._known.add(optimizer)

    def on_forward(self) -> bool:
        """A top-level forward is about to begin: True if a step ends just before it. The
        caller ends the step if so, then calls ``forward_begun``."""
        return self.boundary_at_next_forward()

    def forward_begun(self) -> None:
        self._forwards += 1

    def on_backward(self) -> None:
        self._backwards += 1
        self._backwards_since_boundary += 1

    def on_optimizer_step(self, optimizer: Any) -> bool:
        """``optimizer.step()`` returned; True if the iteration ends here."""
        self._known.add(optimizer)
        self._ever_stepped.add(optimizer)
        self._optimizer_steps += 1
        key = id(optimizer)
        self._stepped[key] = self._stepped.get(key, 0) + 1
        kind = self.rule.kind
        if kind == "optimizer":
            return self._optimizer_steps % self.rule.count == 0
        if kind != "auto":
            return False
        if self._stepped[key] > 1:
            # NOTE [ Step = one optimizer iteration ]: stop waiting for never-used optimizers.
            for opt in list(self._known):
                if opt not in self._ever_stepped:
                    self._known.discard(opt)
        return all(id(opt) in self._stepped for opt in self._known)

    def pending_at_close(self) -> bool:
        """At the end of the script: does the open step end at a boundary (a backward-rule
        iteration whose next forward never came)?"""
        return self.boundary_at_next_forward()

    def mark(self) -> None:
        """``Recorder.mark_step()`` was called: from now on only it ends steps."""
        if self.rule.kind != "manual":
            self.rule = StepRule("manual")
            self._given = True

    def boundary(self) -> StepCounts:
        """A step ended: return what it held and start counting the next."""
        counts = StepCounts(self._forwards, self._backwards, self._optimizer_steps)
        self._forwards = self._backwards = self._optimizer_steps = 0
        self._backwards_since_boundary = 0
        self._stepped.clear()
        return counts

    def current(self) -> StepCounts:
        """What the open step holds so far."""
        return StepCounts(self._forwards, self._backwards, self._optimizer_steps)

    # ----------------------------------------------------------------- description

    def describe(self, warmup: int, modules: bool = True) -> str:
        """The rule as stored in the trace's ``step_rule`` meta field (``modules``: whether
        a hook sees each forward begin, a module call's or a compiled call's; NOTE [ A forward
        without modules ] and NOTE [ A compiled call begins a forward ] in hooks.py)."""
        kind, n = self.rule.kind, self.rule.count
        if kind == "manual":
            text = "manual: Recorder.mark_step() ends each step"
        elif kind == "optimizer":
            text = f"given: optimizer:{n}, every {_nth(n)}optimizer step ends a step"
        elif kind == "backward":
            text = (
                f"given: backward:{n}, the first forward after every {_nth(n)}backward ends a step"
            )
        elif len(self._ever_stepped) or len(self._known):
            names = sorted(type(o).__name__ for o in self._known)
            which = (
                f"the optimizer ({names[0]}) has"
                if len(names) == 1
                else f"each of the {len(names)} optimizers ({', '.join(names)}) has"
            )
            text = f"auto: a step ends once {which} stepped"
        else:
            text = "auto: no optimizer; the first forward after a backward ends a step"
            if not modules:
                text = "auto: no optimizer and no nn.Module; the end of a backward ends a step"
        if warmup == 0:
            return text + "; warmup 0: nothing seen before recording, the first step may be partial"
        if self.learned is not None:
            return text + f"; a warmup iteration held {self.learned.describe()}"
        return text

    def ends_at_forward(self) -> bool:
        """Whether steps end where a top-level forward begins (``backward:N``, or ``auto``
        with no optimizer known), not at an optimizer step."""
        kind = self.rule.kind
        return kind == "backward" or (kind == "auto" and not len(self._known))

    def boundary_at_next_forward(self) -> bool:
        """Whether the next top-level forward will begin a new step."""
        if not self.ends_at_forward():
            return False
        return self._backwards_since_boundary >= (
            self.rule.count if self.rule.kind == "backward" else 1
        )


def plural(count: int, noun: str) -> str:
    """'1 step', '2 steps'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _nth(n: int) -> str:
    """'' for 1, else '2nd ', '3rd ', '11th '...: "every {_nth(n)}step"."""
    if n == 1:
        return ""
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10 if n % 100 not in (11, 12, 13) else 0, "th")
    return f"{n}{suffix} "
