"""The recorded memory curve against the CPU allocator's own count on the same step.

``torch.profiler.profile(profile_memory=True)`` (without ``record_shapes``, which keeps tensors
alive) reports every CPU allocation and free; its chrome trace's ``[memory]`` events carry the
allocator's "Total Allocated": bytes allocated since profiling began, minus frees of those.
Profiling exactly the recorded step makes that the allocator's "allocated since the step began".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ckview.analysis import step_allocated_peaks
from recorder import Recorder
from tests.conftest import load_example, read_run


def _profile_second_step(example: Any, trace: Path) -> Any:
    """Run 2 steps of ``example``: warmup, then the step both recorder and profiler see."""
    state: dict[str, Any] = {"steps": 0, "prof": None}

    def around_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        state["steps"] += 1
        if state["steps"] == 1:
            state["prof"] = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            state["prof"].__enter__()
        elif state["steps"] == 2:
            state["prof"].__exit__(None, None, None)

    # Registered before the recorder's hook, so it runs first at both step boundaries.
    handle = register_optimizer_step_post_hook(around_step)
    try:
        with Recorder(trace, steps=1, warmup=1, progress=False):
            example.main(["--steps", "2"])
    finally:
        handle.remove()
    return state["prof"]


def _allocator_peak(prof: Any, path: Path) -> int:
    """Peak of the allocator's "Total Allocated" over the profiled step.

    The CPU allocator's counter is process-wide: blocks allocated in an earlier profile of this
    process and freed while no profiler ran are never subtracted. So the counter is replayed
    from the ``[memory]`` events' own bytes and addresses, counting only the frees of blocks
    allocated during this profile, which is what "Total Allocated" reads in a fresh process.
    """
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    total = peak = 0
    live: dict[int, int] = {}
    for e in events:
        args = e.get("args", {})
        if e.get("name") != "[memory]" or args.get("Device Type") != 0:
            continue
        nbytes, addr = args["Bytes"], args["Addr"]
        if nbytes > 0:
            live[addr] = nbytes
            total += nbytes
        elif addr in live:
            total -= live.pop(addr)
        peak = max(peak, total)
    return peak


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "gpt2"])
def test_recorded_step_peak_matches_allocator(name: str, tmp_path: Path, capsys: Any) -> None:
    prof = _profile_second_step(load_example(name), tmp_path / "t.h5")
    allocator = _allocator_peak(prof, tmp_path / "prof.json")
    tables = read_run(tmp_path / "t.h5")
    recorded = int(
        step_allocated_peaks(tables["storages"], tables["memory_events"], tables["steps"])[0]
    )
    print(f"{name}: recorded {recorded} allocator {allocator} ratio {recorded / allocator:.4f}")
    assert recorded == pytest.approx(allocator, rel=0.01)
