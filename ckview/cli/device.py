"""The device part of ``ckview summary``: CUDA allocator and NVML figures, and an OOM.

Numbers come from ``ckview.analysis.device``; this module only words them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckview.analysis import format_bytes as fb

if TYPE_CHECKING:
    from ckview.app.run import Run


@dataclass(frozen=True)
class RunDevice:
    """One run's device states (one per CUDA device; none on the CPU) and its OOM, if any."""

    states: list[Any]
    oom: Any
    moment: Any
    total_bytes: int
    phase: str
    """Phase of the last op before the OOM ('forward', ...), '' without an OOM."""

    @classmethod
    def of(cls, run: Run, top: int) -> RunDevice:
        """``run``'s device states and OOM, with the ``top`` modules and tensors live at it."""
        from ckview.analysis.device import oom_moment
        from ckview.analysis.timeline import phase_at

        t = run.tables
        oom = run.oom
        moment = None if oom is None else oom_moment(t, t["modules"], t["strings"], oom, top)
        phase = "" if moment is None else phase_at(t["ops"], t["memory_events"], moment.event)
        return cls(list(run.devices), oom, moment, run.device_total_bytes, phase)

    def to_json(self) -> dict[str, Any]:
        """``devices`` and ``oom`` (with what was live then) for the JSON summary."""
        oom = None
        if self.oom is not None:
            oom = {**self.oom.to_json(), "phase": self.phase, "live": self.moment.to_json()}
        return {"devices": [s.to_json() for s in self.states], "oom": oom}

    def oom_lines(self, run: str, path: Path, summary: Any) -> str:
        """The block a summary opens with when the run ended in an OOM."""
        oom, moment = self.oom, self.moment
        # The OOM ended the run: it fell in the run's last step.
        step = f"step {summary.steps[-1]['step']}, " if summary.steps else ""
        lines = [
            oom.headline(),
            f"  run {run}, at {oom.time_ns / 1e6:.1f} ms ({step}{self.phase}); the trace holds "
            "everything up to the failure",
            f"  live at the failure {fb(moment.live_bytes):>11}, by category:",
        ]
        for category, nbytes in sorted(moment.by_category.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {category:<20}{fb(nbytes):>11}")
        lines.append("  by module:")
        lines += [f"    {fb(b):>11}  {p}" for p, b in moment.top_modules]
        lines.append("  largest tensors live at the failure:")
        for t in moment.top_storages:
            where = t["module"] + (f" ({t['op']})" if t["op"] else "")
            lines.append(
                f"    {fb(t['nbytes']):>11}  {t['category']:<19} {t['dtype']:<9} "
                f"{t['shape']:<16} {where}"
            )
        lines.append(f"  error: {oom.message}")
        lines.append(f"  next: {plan_hint(path, self.total_bytes)}")
        return "\n".join(lines)

    def state_lines(self) -> list[str]:
        """A short block per CUDA device; nothing on a CPU run, no NVML lines without NVML."""
        lines: list[str] = []
        for s in self.states:
            total = f", total {fb(s.total)}" if s.total >= 0 else ""
            lines.append(f"  device {s.device}{total}")
            if s.process >= 0:
                others = f"  (other processes {fb(s.others)})" if s.others >= 0 else ""
                lines.append(f"    this process   {fb(s.process):>11}{others}")
            if s.not_by_pytorch >= 0:
                lines.append(
                    f"    not by PyTorch {fb(s.not_by_pytorch):>11}  (CUDA context, NCCL, "
                    "other libraries)"
                )
            lines.append(
                f"    reserved       {fb(s.reserved):>11}  at most; allocated {fb(s.allocated)}"
            )
            if s.fragmentation >= 0:
                free = f", largest free block {fb(s.largest_free)}" if s.largest_free >= 0 else ""
                lines.append(
                    f"    fragmentation  {fb(s.fragmentation):>11}  (reserved - allocated){free}"
                )
        return lines


def plan_hint(path: Path, total_bytes: int) -> str:
    """The plan command to run after an OOM: for the device's capacity where it is known."""
    if total_bytes >= 0:
        return f"ckview plan {path} --budget device  (the device's {fb(total_bytes)})"
    return f"ckview plan {path} --budget SIZE  (e.g. 3GiB: the memory the step must fit in)"


def oom_report(path: Path, kept: str = "") -> str | None:
    """The one line ``ckview record`` prints when the recording ended in an OOM, else None."""
    from ckview.analysis.device import Oom
    from ckview.trace import open_trace
    from ckview.trace.errors import TraceError

    try:
        with open_trace(path) as trace:
            ooms = [Oom.of_run(trace.run(name)) for name in trace.run_names]
            total = trace.meta.device_total_bytes
    except TraceError:
        return None
    oom = next((o for o in ooms if o is not None), None)
    if oom is None:
        return None
    return (
        f"ckview: the step ran out of memory ({oom.headline()}); the trace of everything up to "
        f"the failure is {path}{kept}: see ckview summary {path}, then "
        + plan_hint(path, total).split("  (")[0]
    )


_ALLOCATION_ERRORS = ("OutOfMemoryError: ", "MemoryError: ")
_CPU_ALLOCATOR = "can't allocate memory"


def warmup_oom_report(error: str, warmup_done: int, warmup: int, path: Path) -> str | None:
    """The one line for a script that ran out of memory in a warm-up step (nothing of it was
    recorded), else None."""
    failed_to_allocate = error.startswith(_ALLOCATION_ERRORS) or _CPU_ALLOCATOR in error
    if not failed_to_allocate or warmup_done >= warmup:
        return None
    return (
        f"ckview: the script ran out of memory in warm-up step {warmup_done + 1}, before any "
        f"recorded step, so the trace ({path}) holds nothing of it; record with --warmup 0 to "
        "capture it"
    )
