"""Byte sizes for people: ``format_bytes(1536) == '1.50 KiB'``, ``parse_bytes('3GiB')``, and
memory budgets (``parse_budget('60%')``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _unit_bytes() -> dict[str, int]:
    """Lowercase unit -> bytes. IEC units and bare prefixes (``512M``, as in docker or
    ``ulimit``) are binary; SI units (``kB``, ``MB``...) are decimal, as their standard says."""
    units = {"": 1, "b": 1}
    for power, prefix in enumerate("kmgtpe", start=1):
        units |= {f"{prefix}ib": 1024**power, prefix: 1024**power, f"{prefix}b": 1000**power}
    return units


_UNIT_BYTES = _unit_bytes()
_SHARE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*")
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def format_bytes(n: int) -> str:
    """``n`` bytes with a binary unit and three significant digits: '1.50 GiB', '12.0 MiB'.

    Plain bytes are shown exactly ('512 B'); negative sizes (differences) keep their sign.
    """
    sign, size = ("-" if n < 0 else ""), abs(int(n))
    if size < 1024:
        return f"{sign}{size} B"
    power = 1
    # Move up a unit while the value would round to 1024 or more in this one.
    while power < len(_BINARY_UNITS) - 1 and round(size / 1024**power) >= 1024:
        power += 1
    value = size / 1024**power
    digits = next(d for d in (2, 1, 0) if round(value, d) < 10 ** (3 - d) or d == 0)
    return f"{sign}{value:.{digits}f} {_BINARY_UNITS[power]}"


MINUS = "\u2212"
"""The real minus sign, which reads better than a hyphen in a window or a figure."""


def format_signed_bytes(n: int, minus: str = "-") -> str:
    """A difference of ``n`` bytes with its sign: '+1.50 MiB', '-512 B' (``minus`` for the
    sign of a negative one: ``MINUS`` in the GUI), '0 B'."""
    return ("+" if n > 0 else "") + format_bytes(n).replace("-", minus)


def format_change(share: float, minus: str = "-") -> str:
    """A signed percentage with one decimal: '+12.5%', '-58.8%' (``minus`` as above)."""
    return f"{share:+.1%}".replace("-", minus)


def parse_bytes(text: str) -> int:
    """Parse a size such as '3GiB', '1.5 GiB', '512MB', '2G' or '4096' into bytes.

    Units are case-insensitive: KiB/MiB/GiB/TiB and bare K/M/G/T are powers of 1024, kB/MB/GB/TB
    powers of 1000, no unit or B means bytes. Fractions are rounded to whole bytes. Raises
    ``ValueError`` saying what is accepted when ``text`` is not such a size.
    """
    match = _SIZE.fullmatch(text)
    unit = _UNIT_BYTES.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ValueError(
            f"cannot read {text!r} as a size: write a non-negative number and an optional unit, "
            "e.g. '512MiB', '1.5 GiB', '3GB' or '4096' (units: B, KiB, MiB, GiB, TiB, "
            "K, M, G, T = powers of 1024; kB, MB, GB, TB = powers of 1000)"
        )
    value = Decimal(match.group(1)) * unit
    return int(value.to_integral_value(rounding=ROUND_HALF_EVEN))


DEVICE_BUDGET = "device"
"""The budget that means the capacity of the device the trace was recorded on."""

NO_DEVICE_CAPACITY = (
    "budget 'device': the trace has no device capacity (recorded on the CPU, or by an older "
    "ckview); give the budget as a size instead, e.g. 3GiB"
)


@dataclass(frozen=True)
class Budget:
    """A memory budget: a size, or a share of a run's peak (exactly one is set), or the
    capacity of the recording device (``device``; its size is set by ``on_device``)."""

    size: int | None = None
    share: float | None = None
    device: bool = False
    """``'device'``: the capacity of the device the trace was recorded on."""

    def on_device(self, total_bytes: int) -> Budget:
        """This budget for a trace whose device capacity is ``total_bytes`` (its meta
        ``device_total_bytes``, -1 if unknown): a device budget gets that size, any other is
        unchanged. Raises ``ValueError`` (``NO_DEVICE_CAPACITY``) for a device budget on a trace
        that does not know its device's capacity."""
        if not self.device:
            return self
        if total_bytes < 0:
            raise ValueError(NO_DEVICE_CAPACITY)
        return Budget(size=total_bytes, device=True)

    def bytes(self, peak_bytes: int) -> int:
        """The budget in bytes, for a run whose peak is ``peak_bytes``."""
        assert not self.device or self.size is not None, "a device budget needs on_device first"
        return self.size if self.size is not None else round(peak_bytes * (self.share or 0.0))

    def describe(self, peak_bytes: int, of: str = "the recorded peak") -> str:
        """The budget for people: ``'53.3 MiB (60% of the recorded peak 88.8 MiB)'`` for a
        share (saying what it is a share of), ``'16.0 GiB (the device's capacity)'`` for the
        device, ``'60.0 MiB'`` for a size."""
        shown = format_bytes(self.bytes(peak_bytes))
        if self.device:
            return f"{shown} (the device's capacity)"
        if self.share is None:
            return shown
        return f"{shown} ({self.share * 100:g}% of {of} {format_bytes(peak_bytes)})"


def parse_budget(text: str) -> Budget:
    """``'60%'`` (of a run's peak), a size with a unit that ``parse_bytes`` reads (``'3GiB'``,
    ``'512 B'``), or ``'device'`` (any case: the capacity of the device the trace was recorded
    on, known once ``Budget.on_device`` is given the trace's). Raises ``ValueError`` with a
    one-line message for anything else, for no memory at all, and for a number without a unit:
    a bare '60' is far more often meant as 60 MiB or 60% than as 60 bytes, so it is refused
    with both readings as a hint."""
    if text.strip().lower() == DEVICE_BUDGET:
        return Budget(device=True)
    bare = _SIZE.fullmatch(text)
    if bare is not None and not bare.group(2) and float(bare.group(1)) > 0:
        number = bare.group(1)
        raise ValueError(
            f"budget {text.strip()!r} has no unit: write a size such as '{number} MiB' or a share "
            f"of the run's peak such as '{number}%'"
        )
    match = _SHARE.fullmatch(text)
    if match is not None:
        share = float(match.group(1)) / 100
        if share <= 0:
            raise ValueError(
                f"budget {text!r} is no memory at all; give a positive share, e.g. 60%"
            )
        return Budget(share=share)
    try:
        size = parse_bytes(text)
    except ValueError as exc:
        raise ValueError(
            f"budget: {exc}, or a share of the run's peak such as '60%', or 'device' (the "
            "capacity of the device the trace was recorded on)"
        ) from None
    if size <= 0:
        raise ValueError(f"budget {text!r} is no memory at all; give a positive size, e.g. 3GiB")
    return Budget(size=size)


def plural(count: int, noun: str) -> str:
    """'1 step', '2 steps' (nouns that take an s)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
