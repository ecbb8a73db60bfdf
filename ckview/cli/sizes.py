"""Recording a script at several sizes (``ckview record --sizes``) and checking a ``ckview fit``
answer by recording at the size it names (``ckview verify --fit``).

NOTE [ One recording per size ]
    ``ckview record --sizes batch=4,8 script.py --batch {}`` records the script once per value,
    each time with every ``{}`` among the script's arguments replaced by the value, into
    ``<trace stem>.batch4.h5``, ``<trace stem>.batch8.h5`` (``.size4.h5`` without a name). Each
    size is recorded by its own ``ckview record`` process: a size must not inherit what the
    last one left (the caching allocator's segments on a GPU, caches of the script's modules),
    or the two recordings would not describe the same step at two sizes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckview.cli.errors import CLIError

SLOT = "{}"
"""Where the size goes among the script's arguments."""

_SIZES = re.compile(r"(?:([A-Za-z_][A-Za-z0-9_]*)=)?(\d+(?:,\d+)+)")

FORWARDED = (
    "steps",
    "warmup",
    "step_every",
    "stop_after",
    "plan",
    "compare",
    "timing_steps",
    "stacks",
    "progress",
)
"""``ckview record``'s options that each size's recording gets as given (the test checks that
this is every one of them but -o and -m)."""


@dataclass(frozen=True)
class Sizes:
    """``--sizes [NAME=]A,B,...``: the size's name and its values."""

    name: str
    values: tuple[int, ...]

    def path(self, trace: Path, value: int) -> Path:
        return size_path(trace, self.name, value)


def size_path(trace: Path, name: str, value: int) -> Path:
    """The trace of one size: ``run.h5`` -> ``run.batch4.h5``."""
    return trace.with_name(f"{trace.stem}.{name}{value}{trace.suffix or '.h5'}")


def _sizes(text: str) -> Sizes:
    match = _SIZES.fullmatch(text.strip())
    values = tuple(int(v) for v in match.group(2).split(",")) if match else ()
    if match is None or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(
            f"--sizes takes a name and two or more different positive whole numbers, e.g. "
            f"batch=4,8 (or 4,8), not {text!r}"
        )
    return Sizes(match.group(1) or "size", values)


def add_sizes_option(p: argparse.ArgumentParser) -> None:
    """``ckview record``'s ``--sizes``."""
    p.add_argument(
        "--sizes",
        type=_sizes,
        metavar="[NAME=]A,B",
        help="record the script once per size, each {} among its arguments replaced by the "
        "size, into TRACE.NAMEA.h5, TRACE.NAMEB.h5 (e.g. --sizes batch=4,8 script.py --batch "
        "{}), for ckview fit",
    )


def add_fit_option(p: argparse.ArgumentParser) -> None:
    """``ckview verify``'s ``--fit``."""
    p.add_argument(
        "--fit",
        type=Path,
        metavar="FIT.json",
        help="check what 'ckview fit --json' answered: record the script at the size it names "
        "(each {} among its arguments replaced by it) and compare the peaks",
    )


# ----------------------------------------------------------------------------- record --sizes


def record_at_sizes(args: argparse.Namespace, default: Path) -> int:
    """Record the script at each of ``args.sizes`` (NOTE [ One recording per size ]); the
    first failing recording's exit code, else 0. ``default``: the trace without -o."""
    sizes: Sizes = args.sizes
    _check_slot(args.args, "--sizes")
    trace = args.output or default
    written = []
    for value in sizes.values:
        path = sizes.path(trace, value)
        code = _record(args, value, path)
        if code != 0:
            return code
        written.append(path)
    names = " ".join(str(p) for p in written)
    values = " ".join(str(v) for v in sizes.values[:2])
    print(
        f"ckview: recorded {sizes.name} {', '.join(map(str, sizes.values))}: {names}; next: "
        f"ckview fit {' '.join(str(p) for p in written[:2])} --sizes {values} --at N "
        "(or --budget 16GiB)",
        file=sys.stderr,
    )
    return 0


def _check_slot(script_args: Sequence[str], option: str) -> None:
    if not any(SLOT in a for a in script_args):
        raise CLIError(
            f"{option} puts the size where {SLOT} stands among the script's arguments, and "
            f"there is none: e.g. ckview record {option} batch=4,8 train.py --batch {SLOT}"
        )


def _record(
    args: argparse.Namespace,
    value: int,
    output: Path,
    plans: Sequence[str] | None = None,
    to_stderr: bool = False,
) -> int:
    """One ``ckview record`` process: the script at size ``value`` into ``output`` (with
    ``plans`` in place of ``args.plan`` where given); its exit code."""
    options = _forwarded(args, plans)
    target = ["-m", args.target] if args.module else [args.target]
    script_args = [a.replace(SLOT, str(value)) for a in args.args]
    command = [sys.executable, "-m", "ckview", "record", *options, "-o", str(output)]
    if not to_stderr:
        return subprocess.run([*command, *target, *script_args]).returncode
    # --json: stdout is the JSON's; the recording's output goes to stderr, as verify's does
    done = subprocess.run([*command, *target, *script_args], stdout=subprocess.PIPE, text=True)
    sys.stderr.write(done.stdout)
    return done.returncode


def _forwarded(args: argparse.Namespace, plans: Sequence[str] | None) -> list[str]:
    """``args``' record options as ``ckview record`` reads them (``FORWARDED``)."""
    out = [
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--step-every={args.step_every}",
        f"--timing-steps={args.timing_steps}",
    ]
    flags = {"stop_after": args.stop_after, "stacks": args.stacks}
    flags["compare"] = getattr(args, "compare", False) and plans is None
    out += [f"--{name.replace('_', '-')}" for name, on in flags.items() if on]
    if args.progress is not None:
        out.append("--progress" if args.progress else "--no-progress")
    for plan in plans if plans is not None else args.plan or []:
        out.append(f"--plan={plan}")
    return out


# ----------------------------------------------------------------------------- verify --fit


TOLERANCE = 0.02
"""How far a projected peak may be from the measured one for ``verify --fit`` to pass."""


@dataclass(frozen=True)
class FitAnswer:
    """What ``ckview fit --json`` said, as ``verify --fit`` checks it."""

    size: int
    plan: str
    projected_bytes: int | None
    """``--at``: the projected peak; None for a budget answer."""
    budget_bytes: int | None
    """``--budget``: the budget (of live bytes); None for an ``--at`` answer."""

    @classmethod
    def read(cls, path: Path) -> FitAnswer:
        """The answer in ``path``; CLIError if it is none that verify can check."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CLIError(f"cannot read {path} as ckview fit's JSON: {exc}") from None
        if isinstance(doc, dict) and isinstance(doc.get("at"), int):
            return cls(
                doc["at"], str(doc.get("plan", "none")), int(doc["projected_peak_bytes"]), None
            )
        if isinstance(doc, dict) and "largest" in doc and "budget_bytes" in doc:
            if doc.get("device"):
                raise CLIError(
                    f"{path} answers --budget device; verify --fit checks a budget of live "
                    "bytes or an --at answer (record at the size and read ckview summary)"
                )
            if not isinstance(doc["largest"], int) or doc["largest"] < 1:
                raise CLIError(f"{path} names no size that fits: nothing to record")
            return cls(doc["largest"], "none", None, int(doc["budget_bytes"]))
        raise CLIError(f"{path} is not the JSON of ckview fit --at or --budget (--json)")


def verify_fit(args: argparse.Namespace, default: Path) -> int:
    """Record the script at the size the fit names and compare: the peak for ``--at`` (with
    its plan), for ``--budget`` that the size fits and the next one does not."""
    if args.plan:
        raise CLIError("verify --fit records with the plan the fit names; drop --plan")
    answer = FitAnswer.read(args.fit)
    _check_slot(args.args, "--fit")
    trace = args.output or default
    sizes = [answer.size] if answer.budget_bytes is None else [answer.size, answer.size + 1]
    plans = [] if answer.plan == "none" else [answer.plan]
    run = "main" if not plans else f"plan:{answer.plan}"
    measured = []
    for value in sizes:
        path = size_path(trace, "size", value)
        code = _record(args, value, path, plans, to_stderr=args.json)
        if code != 0:
            return code
        measured.append((value, path, _peak(path, run)))
    return _say(answer, measured, args.json)


def _peak(path: Path, run: str) -> int:
    from ckview.analysis import find_peak, memory_timeline
    from ckview.trace import open_trace

    with open_trace(path) as trace:
        tables = trace.read_run(run)
    return int(find_peak(memory_timeline(tables["storages"], tables["memory_events"])).bytes)


def _say(answer: FitAnswer, measured: list[tuple[int, Path, int]], as_json: bool) -> int:
    """Print the check; 0 if the answer holds (a peak within 2%, a budget met and exceeded
    where it says), else 1."""
    from ckview.analysis import format_bytes as fb

    doc: dict[str, Any] = {"size": answer.size, "plan": answer.plan}
    if answer.projected_bytes is not None:
        (_, path, real), projected = measured[0], answer.projected_bytes
        error = (projected - real) / real if real else 0.0
        holds = abs(error) <= TOLERANCE
        doc |= {
            "trace": str(path),
            "projected_peak_bytes": projected,
            "measured_peak_bytes": real,
            "error_percent": round(100 * error, 3),
            "holds": holds,
        }
        text = (
            f"fit at {answer.size}, plan {answer.plan}: projected {fb(projected)}, measured "
            f"{fb(real)} in {path} ({error:+.1%})"
        )
    else:
        budget = answer.budget_bytes or 0
        (n, path, real), (_, next_path, next_real) = measured
        holds = real <= budget < next_real
        doc |= {
            "trace": str(path),
            "budget_bytes": budget,
            "measured_peak_bytes": real,
            "next_trace": str(next_path),
            "next_measured_peak_bytes": next_real,
            "holds": holds,
        }
        text = (
            f"fit: largest size {n} under {fb(budget)}: measured {fb(real)} at {n} ("
            f"{'fits' if real <= budget else 'does NOT fit'}), {fb(next_real)} at {n + 1} ("
            f"{'does not fit' if next_real > budget else 'fits too: the answer is too low'})"
        )
    if as_json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(text + ("" if holds else "; the fit's answer does not hold"))
    return 0 if holds else 1
