"""A ``torch.compile`` (inductor) training step recorded on the native path runs compiled
(NOTE [ Compiled code on the native path ] in recorder/compiled.py): no graph break from ckview,
meta ``compiled``, the compiled graph's blocks attributed to its regions, and the step's
allocation peak as torch.profiler measures it on the same compiled step."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ckview.trace.schema import Category, Phase
from recorder import Recorder
from tests.conftest import ROOT, read_run

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "c++")) is None,
        reason="no C++ compiler: neither the native recorder nor inductor's kernels build here",
    ),
    # torch warns on every call of a compiled module while global module hooks (the
    # recorder's) are installed: they fire for the wrapper too, which the recorder passes over.
    pytest.mark.filterwarnings(
        "ignore:Using `torch.compile\\(module\\)` when there are global hooks"
    ),
]


def _MLP() -> nn.Module:
    """examples/loops/compiled.py's model, tiny: inductor builds its C++ kernels quickly."""
    spec = importlib.util.spec_from_file_location(
        "compiled_example", ROOT / "examples" / "loops" / "compiled.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.MLP(16, 32, 2)  # type: ignore[no-any-return]


def _step_fn() -> Callable[[], None]:
    torch.manual_seed(0)
    model = _MLP()
    compiled = torch.compile(model)  # inductor, the default backend
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        # A batch whose step peaks near 1 MB: at batch 64 (63 KB) one 4 KiB block, its source
        # not found, was 6.5% of it (a fresh-clone CI run: 67,340 B recorded, 63,244 B by the
        # profiler, on another step).
        x = torch.randn(1024, 16)
        opt.zero_grad(set_to_none=True)
        compiled(x).square().mean().backward()
        opt.step()

    return step


def _profiler_peak(step: Callable[[], None]) -> int:
    """The peak of torch.profiler's allocation bytes over one step: the cumulative sum of its
    memory events (every allocation and free the allocator reports, in time order)."""
    from torch.profiler import ProfilerActivity, profile

    # Garbage of earlier tests in this process, freed in the window, would be counted against
    # the step: the CPU allocator reports the free of a block it sized while an earlier
    # recorder's reporter was on (seen in CI: 4,096 B less than the step's own peak).
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    return int(np.cumsum(_frees_of_the_window([e.nbytes() for e in events])).max())


def _frees_of_the_window(deltas: list[int]) -> list[int]:
    """``deltas`` without the frees of blocks allocated before the window: a free counts only
    against an earlier allocation of its size in the window (the profiler's events carry no
    address). A block from an earlier test freed in the window otherwise lowered the peak:
    seen in CI, 2,048 B below the recorded step's own peak, after gc.collect()."""
    open_by_size: dict[int, int] = {}
    kept = []
    for delta in deltas:
        if delta > 0:
            open_by_size[delta] = open_by_size.get(delta, 0) + 1
        elif open_by_size.get(-delta, 0):
            open_by_size[-delta] -= 1
        else:
            continue
        kept.append(delta)
    return kept


def _recorded_peak(tables: dict[str, Any]) -> int:
    """The peak of the recorded step's allocations: blocks allocated in the step, counted from
    their allocation to their free (as the profiler, which reports no free of a block allocated
    before it started, counts them)."""
    st, steps = tables["storages"], tables["steps"]
    t0, t1 = int(steps["start_ns"][0]), int(steps["end_ns"][0])
    made = (st["alloc_ns"] >= t0) & (st["alloc_ns"] <= t1)
    freed = made & (st["free_ns"] >= 0) & (st["free_ns"] <= t1)
    times = np.concatenate([st["alloc_ns"][made], st["free_ns"][freed]])
    delta = np.concatenate([st["nbytes"][made], -st["nbytes"][freed]])
    return int(np.cumsum(delta[np.argsort(times, kind="stable")]).max())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One compiled model, compiled before recording, profiled for a step, then recorded (one
    warmup step, one recorded step) on the native path; dynamo's counters of the recording."""
    from torch._dynamo.utils import counters

    step = _step_fn()
    step()  # compiles
    step()
    profiler_peak = _profiler_peak(step)
    path = tmp_path_factory.mktemp("compiled") / "t.h5"
    counters.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CKVIEW_RECORDER", "native")
        with Recorder(path, steps=1, warmup=1, progress=False):
            step()
            step()
    seen = {name: dict(counters[name]) for name in ("stats", "graph_break", "frames")}
    counters.clear()
    yield {
        "path": path,
        "tables": read_run(path),
        "profiler_peak": profiler_peak,
        "counters": seen,
    }


def test_compiled_step_runs_compiled_while_recorded(recorded: dict[str, Any]) -> None:
    tables, seen = recorded["tables"], recorded["counters"]
    assert tables["meta"].recorder == "native"
    assert tables["meta"].compiled == "compiled"
    # the compiled model's eager call is the forward its compiled call began, not a second one
    # (NOTE [ A compiled call begins a forward ] in recorder/hooks.py)
    assert tables["meta"].step_rule.endswith("held 1 forward, 1 backward, 1 optimizer step")
    assert seen["graph_break"] == {}, "ckview's hooks broke the compiled graph"
    assert "unique_graphs" not in seen["stats"], "recompiled under the recorder"
    strings, ops = tables["strings"], tables["ops"]
    names = {strings[i] for i in ops["name"]}
    assert {"CompiledFunction", "CompiledFunctionBackward"} <= names
    assert not names & {"aten.addmm.default", "aten.gelu.default", "aten.native_layer_norm.default"}


def test_compiled_graph_blocks_are_attributed_to_its_regions(recorded: dict[str, Any]) -> None:
    tables = recorded["tables"]
    strings, ops, st = tables["strings"], tables["ops"], tables["storages"]
    op_name = np.asarray([strings[ops["name"][o]] if o >= 0 else "" for o in st["op"]])
    forward = op_name == "CompiledFunction"
    backward = op_name == "CompiledFunctionBackward"
    assert forward.any() and backward.any()
    assert (ops["phase"][st["op"][forward]] == Phase.FORWARD).all()
    assert (ops["phase"][st["op"][backward]] == Phase.BACKWARD).all()
    # what the partitioner saved for backward went through the pack hook: activations
    assert (st["category"][forward] == Category.ACTIVATION).any()
    assert (tables["saved_events"]["kind"] == 0).any()
    # the compiled model's own call (its hooks run around the compiled forward) holds them
    paths = [strings[i] for i in tables["modules"]["path"]]
    assert {paths[m] for m in st["module"][forward | backward]} == {""}


def test_recorded_peak_matches_the_profiler_on_the_compiled_step(
    recorded: dict[str, Any],
) -> None:
    ours, theirs = _recorded_peak(recorded["tables"]), recorded["profiler_peak"]
    assert theirs > 0
    assert abs(ours - theirs) <= 0.01 * theirs, (ours, theirs)


def test_record_and_verify_say_what_plans_promise_on_compiled_code(
    recorded: dict[str, Any],
) -> None:
    from ckview.cli.recording import compiled_plans_note

    note = compiled_plans_note(recorded["path"])
    assert note is not None and "promises nothing" in note
    assert compiled_plans_note(ROOT / "sample_traces" / "mlp.h5") is None  # not compiled


def _ckview_native(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m ckview ARGS`` on the native path, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["CKVIEW_RECORDER"] = "native"
    return subprocess.run(
        [sys.executable, "-m", "ckview", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    compiled(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
from torch._dynamo.utils import counters
print("graph breaks", len(counters["graph_break"]), "graphs", counters["stats"]["unique_graphs"])
"""


def test_script_that_compiles_under_ckview_record(tmp_path: Path) -> None:
    """``ckview record`` enters the recorder before the script imports dynamo: the script's
    first ``torch.compile`` hides the extension's hooks from dynamo. The graph compiles under
    the recorder without a break, and once more when recording ends (its guards held the
    recorder's hooks)."""
    script = tmp_path / "compiled.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "t.h5"
    done = _ckview_native("record", "-o", str(trace), "--timing-steps", "0", str(script))
    assert done.returncode == 0, done.stderr
    assert "graph breaks 0 graphs 2" in done.stdout
    tables = read_run(trace)
    assert tables["meta"].compiled == "compiled"
    names = {tables["strings"][i] for i in tables["ops"]["name"]}
    assert "CompiledFunction" in names and "aten.addmm.default" not in names


def _compile_before(
    how: str, tmp_path: Path, step: Callable[[], None]
) -> contextlib.AbstractContextManager[Any]:
    """Compile what ``how`` says before ``step`` is recorded; the context to record it in."""
    import torch._functorch.config

    if how == "this function, before recording":  # nothing compiles while recorded
        step()
    elif how == "an identical model, recorded before":  # this file's order: AOTAutograd's
        first = _step_fn()  # cache holds the graph, no backward is traced while recorded
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CKVIEW_RECORDER", "native")
            with Recorder(tmp_path / "first.h5", steps=1, warmup=1, progress=False):
                first()
                first()
    else:  # compiled while recorded, its backward traced (NOTE [ Backward traced by a compile ])
        return torch._functorch.config.patch(enable_autograd_cache=False)
    return contextlib.nullcontext()


@pytest.mark.parametrize(
    "before",
    [
        "this function, before recording",
        "an identical model, recorded before",
        "nothing, no graph in AOTAutograd's cache",
    ],
)
def test_a_compiled_function_around_the_model_is_a_forward(tmp_path: Path, before: str) -> None:
    """Compiled around the model, no module call runs: the compiled call begins a forward (NOTE
    [ A compiled call begins a forward ] in recorder/hooks.py), whatever was compiled before.
    The recorded step is the second iteration, whole (the optimizer was built before the
    recorder): its compiled forward graph FORWARD, what it saves for backward activations, not
    inputs. Before, the first backward's end closed the warmup iteration (a traced backward's,
    inside the compile, where the graph was not in AOTAutograd's cache) and the recorded step
    held an optimizer step alone, or the rest of the first iteration."""
    torch.manual_seed(0)
    model = _MLP()
    forward = torch.compile(lambda x: model(x))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        forward(torch.randn(64, 16)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    with pytest.MonkeyPatch.context() as mp, _compile_before(before, tmp_path, step):
        mp.setenv("CKVIEW_RECORDER", "native")
        with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
            for _ in range(2):
                step()
    tables = read_run(tmp_path / "t.h5")
    strings, ops, st, steps = tables["strings"], tables["ops"], tables["storages"], tables["steps"]
    assert tables["meta"].compiled == "compiled"
    assert tables["meta"].step_rule.endswith("held 1 forward, 1 backward, 1 optimizer step")
    counts = [int(steps[k][0]) for k in ("forwards", "backwards", "optimizer_steps")]
    assert counts == [1, 1, 1]
    assert len(tables["module_calls"]["module"]) == 0
    graph = [i for i, name in enumerate(ops["name"]) if strings[name] == "CompiledFunction"]
    assert len(graph) == 1 and (ops["phase"][graph] == Phase.FORWARD).all()
    assert (ops["phase"] == Phase.OPTIMIZER).any()
    made = np.isin(st["op"], graph)
    assert (st["category"][made] == Category.ACTIVATION).any()
    assert not (st["category"][made] == Category.INPUT).any()


def test_a_compiled_training_step_is_one_step(tmp_path: Path) -> None:
    """``torch.compile(train_step)``: dynamo breaks the graph at ``backward()`` and traces the
    optimizer's step (its hooks are no-ops there: no optimizer is known), so each call of the
    compiled step begins a forward and steps end at the next one (NOTE [ A compiled call
    begins a forward ] in recorder/hooks.py), not where each backward ends."""
    torch.manual_seed(0)
    model = _MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile
    def train_step(x: torch.Tensor) -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CKVIEW_RECORDER", "native")
        with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False):
            for _ in range(4):
                train_step(torch.randn(64, 16))
    tables = read_run(tmp_path / "t.h5")
    strings, ops, steps = tables["strings"], tables["ops"], tables["steps"]
    assert tables["meta"].step_rule.startswith(
        "auto: no optimizer; the first forward after a backward ends a step"
    )
    assert steps["forwards"].tolist() == steps["backwards"].tolist() == [1, 1]
    graph = np.asarray([strings[name] == "CompiledFunction" for name in ops["name"]])
    assert np.bincount(ops["step"][graph]).tolist() == [1, 1]
    assert (ops["phase"][graph] == Phase.FORWARD).all()


PLANNED = f"""
import sys, torch
sys.path.insert(0, {str(ROOT / "examples" / "loops")!r})
from compiled import MLP
torch.manual_seed(0)
model = MLP(16, 16, 4)
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    compiled(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_plans_on_a_compiled_model_run_and_record_no_compilation(tmp_path: Path) -> None:
    """Plans on compiled code run as torch's checkpoint inside the graph (NOTE [ Checkpoint
    inside a compiled graph ] in ckpt_runtime/checkpoint.py); the recompilation a plan causes
    happens in an unrecorded settling step (NOTE [ Runs of compiled code ] in
    recorder/runs.py), so each run's two recorded steps run the same ops."""
    script = tmp_path / "planned.py"
    script.write_text(PLANNED)
    trace = tmp_path / "t.h5"
    plans = ("--plan", "all", "--plan", "sqrt", "--steps", "2", "--no-grad-check")
    done = _ckview_native("verify", *plans, "--stop-after", "-o", str(trace), str(script))
    assert done.returncode == 0, done.stderr
    assert "promises nothing for plans over modules inside it" in done.stderr
    for run in ("baseline", "plan:all", "plan:sqrt"):
        tables = read_run(trace, run)
        assert tables["meta"].compiled == "compiled"
        per_step = np.bincount(tables["ops"]["step"])
        assert len(per_step) == 2 and per_step[0] == per_step[1], (run, per_step)


def test_a_model_compiled_whole_is_the_main_model() -> None:
    """``torch.compile(nn.Sequential(...))`` runs none of its modules as a module call: only
    the wrapper's call is seen, and the model it wraps is the one plans apply to (before, a
    plan said "no model found")."""
    from recorder.modules import ModuleRegistry

    registry = ModuleRegistry(lambda text: 0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(RuntimeError, match="no model found"):
        registry.main_model()
    assert registry.passes_through(torch.compile(model))
    assert registry.main_model() is model
    assert registry.saw_compiled()
