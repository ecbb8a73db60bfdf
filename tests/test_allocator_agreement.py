"""The recorded memory curve against the CPU allocator's own count on the same step.

``torch.profiler.profile(profile_memory=True)`` (without ``record_shapes``, which keeps tensors
alive) reports every CPU allocation and free; its ``[memory]`` events carry the allocator's
"Total Allocated": bytes allocated since profiling began, minus frees of those. Profiling
exactly the second step of a script makes that the allocator's "allocated since the step began".

The recorder runs torch's profiler itself (NOTE [ Allocator events ] in
``recorder/allocations.py``), so the two cannot watch one run: the script runs twice in this
process, once profiled and once recorded, each from the same seed. Its allocations are the same
both times; the peaks must agree within 0.5% (the issue's bar), and here they agree exactly but
for oneDNN's caches, which a second run may fill differently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ckview.analysis import step_allocated_peaks
from recorder import Recorder
from tests.conftest import EXAMPLES, load_example, read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

TOLERANCE = 0.005


def _main(name: str, *args: str) -> Callable[[], None]:
    """Two steps of an example (``examples/<name>.py``) with its own arguments."""
    return lambda: load_example(name).main(["--steps", "2", *args])


CASES: dict[str, Callable[[], None]] = {
    "mlp": _main("mlp"),
    "cnn": _main("cnn"),
    "transformer": _main("transformer"),
    "gpt2": _main("gpt2"),
    # The peak falls inside convolution_backward's workspace: the op hook alone saw 1.7% less.
    "densenet_checkpointed": _main("loops/densenet", "--batch-size", "8", "--checkpoint"),
    "hf_bert": _main("loops/hf_bert", "--layers", "2"),
}


def _allocator_peak(run: Callable[[], None], path: Path) -> int:
    """Peak of the allocator's "Total Allocated" over the script's second step.

    The CPU allocator's counter is process-wide: blocks allocated in an earlier profile of this
    process and freed while no profiler ran are never subtracted. So the counter is replayed
    from the ``[memory]`` events' own bytes and addresses, counting only the frees of blocks
    allocated during this profile, which is what "Total Allocated" reads in a fresh process.
    """
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

    handle = register_optimizer_step_post_hook(around_step)
    try:
        run()
    finally:
        handle.remove()
    state["prof"].export_chrome_trace(str(path))
    total = peak = 0
    live: dict[int, int] = {}
    for e in json.loads(path.read_text())["traceEvents"]:
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


def _recorded_peak(run: Callable[[], None], trace: Path) -> int:
    with Recorder(trace, steps=1, warmup=1, progress=False, timing_steps=0):
        run()
    tables = read_run(trace)
    assert tables["meta"].allocator_events == "allocator"
    peaks = step_allocated_peaks(tables["storages"], tables["memory_events"], tables["steps"])
    return int(peaks[0])


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_step_peak_matches_allocator(name: str, tmp_path: Path, capsys: Any) -> None:
    allocator = _allocator_peak(CASES[name], tmp_path / "prof.json")
    recorded = _recorded_peak(CASES[name], tmp_path / "t.h5")
    with capsys.disabled():
        print(
            f"\n{name}: recorded {recorded} allocator {allocator} ratio {recorded / allocator:.5f}"
        )
    assert recorded == pytest.approx(allocator, rel=TOLERANCE)


def test_workspaces_are_storages_of_the_op_that_took_them(tmp_path: Path) -> None:
    """Memory only the allocator saw (here convolution_backward's, in a checkpointed DenseNet)
    is a storage of its own: a temporary with no dtype or shape, attributed to the op running
    when it was allocated, freed by the end of the step."""
    _recorded_peak(CASES["densenet_checkpointed"], tmp_path / "t.h5")
    tables = read_run(tmp_path / "t.h5")
    strings, storages, ops = tables["strings"], tables["storages"], tables["ops"]
    unknown = strings.index("")
    workspaces = (storages["shape"] == unknown) & (storages["alloc_ns"] >= 0)
    assert workspaces.any()
    names = {strings[ops["name"][op]] for op in storages["op"][workspaces] if op >= 0}
    assert "aten.convolution_backward.default" in names
    assert (storages["category"][workspaces] == 4).all()  # Category.TEMPORARY
    assert (storages["free_ns"][workspaces] >= storages["alloc_ns"][workspaces]).all()


def test_examples_are_found() -> None:
    assert (EXAMPLES / "loops" / "densenet.py").exists()
