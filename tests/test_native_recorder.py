"""The native event sources (recorder/native): what they see, how they attribute it, and how
they are built, cached, refused and bypassed."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from ckview.trace.schema import Category, Phase
from recorder.native import build
from recorder.native.attribute import Attribution, Columns, StepFacts
from recorder.native.rows import DIMS, Rows, drain
from recorder.native.source import NativeSource

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

ROOT = Path(__file__).resolve().parent.parent


def categorize(blocks: Columns) -> np.ndarray:
    """What a drain's rows alone say of each block's category: ACTIVATION where autograd saved
    it, TEMPORARY where freed within the drain, else OTHER."""
    category = np.full(len(blocks["ptr"]), int(Category.OTHER), np.uint8)
    category[blocks["free_ns"] >= 0] = Category.TEMPORARY
    category[blocks["saved"]] = Category.ACTIVATION
    return category


def layout_texts(
    dtype: np.ndarray, ndim: np.ndarray, dims: np.ndarray, dtype_names: dict[int, str]
) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """Dtype and shape strings as the Python recorder writes them: (dtype texts, index per
    row, shape texts, index per row); index -1 where unknown (ndim < 0)."""
    known = ndim >= 0
    codes, dtype_index = np.unique(dtype[known], return_inverse=True)
    dtypes = [dtype_names.get(int(c), f"dtype{int(c)}") for c in codes]
    key = np.concatenate([ndim[known, None].astype(np.int64), dims[known]], axis=1)
    shapes_u, shape_index = np.unique(key, axis=0, return_inverse=True)
    shapes = [_shape_text(int(row[0]), row[1:]) for row in shapes_u]
    d = np.full(len(ndim), -1, np.int64)
    s = np.full(len(ndim), -1, np.int64)
    d[known] = dtype_index.reshape(-1)
    s[known] = shape_index.reshape(-1)
    return dtypes, d, shapes, s


def _shape_text(ndim: int, dims: np.ndarray) -> str:
    if ndim == 0:
        return "scalar"
    text = "x".join(str(int(v)) for v in dims[: min(ndim, DIMS)])
    return text + "x..." if ndim > DIMS else text


# -- the build, once per session --------------------------------------------------------------


@pytest.fixture(scope="session")
def ext() -> Any:
    """The extension, built into the user's cache on the first run (under a minute, once)."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C++ compiler ({compiler}): the native recorder cannot be built here")
    with _env(CKVIEW_RECORDER="native"):
        loaded = build.load()
    assert loaded.ext is not None, loaded.reason
    return loaded.ext


@contextmanager
def _env(**values: str | None) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- steps (issue 20's reference steps, smaller) -------------------------------------------------


def small_op_step(optimizer: str) -> Callable[[], None]:
    """40 x (Linear(64, 64), GELU), batch 64, SGD or AdamW."""
    torch.manual_seed(0)
    layers = [m for _ in range(40) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())]
    model = torch.nn.Sequential(*layers)
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-4)
    )
    x = torch.randn(64, 64)

    def step() -> None:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.model = model  # type: ignore[attr-defined]
    step.input = x  # type: ignore[attr-defined]
    return step


def transformer_step() -> Callable[[], None]:
    """A small TransformerEncoder (2 layers, d=64), AdamW."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, nhead=4, dim_feedforward=128, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4, 16, 64)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.model = model  # type: ignore[attr-defined]
    return step


STEPS = {
    "small-op-sgd": lambda: small_op_step("sgd"),
    "small-op-adamw": lambda: small_op_step("adamw"),
    "transformer": transformer_step,
}


def record(ext: Any, step: Callable[[], None], outputs: bool = False) -> Rows:
    """One step with every native source on; its rows."""
    hooks = [
        register_module_forward_pre_hook(ext.pre_hook),
        register_module_forward_hook(ext.post_hook, always_call=True),
    ]
    ext.start(ops=True, memory=True, outputs=outputs)
    try:
        drain(ext)
        with torch.autograd.graph.saved_tensors_hooks(ext.pack, ext.unpack):
            step()
        return drain(ext)
    finally:
        ext.stop()
        for h in hooks:
            h.remove()


def profiler_allocation_sizes(step: Callable[[], None]) -> Counter[int]:
    """Sizes of the blocks torch.profiler(profile_memory=True) sees allocated in one step."""
    from torch._C._profiler import _ExtraFields_Allocation

    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    )
    with prof:
        step()
    todo, sizes = list(prof.profiler.kineto_results.experimental_event_tree()), []
    while todo:
        event = todo.pop()
        if type(event.extra_fields) is _ExtraFields_Allocation:
            sizes.append(event.extra_fields.alloc_size)
        else:
            todo.extend(event.children)
    return Counter(s for s in sizes if s > 0)


@pytest.fixture(scope="module")
def small_op(ext: Any) -> tuple[Callable[[], None], Rows, StepFacts]:
    step = small_op_step("adamw")
    for _ in range(3):  # optimizer state and caches exist before the recorded step
        step()
    rows = record(ext, step, outputs=True)
    return step, rows, Attribution(ext).step(rows)


# -- what the sources see ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(STEPS))
def test_allocation_sizes_are_the_profilers(ext: Any, name: str) -> None:
    step = STEPS[name]()
    for _ in range(3):
        step()
    rows = record(ext, step)
    mine = Counter(rows.memory["bytes"][rows.memory["bytes"] > 0].tolist())
    assert sum(mine.values()) > 100
    assert mine == profiler_allocation_sizes(step)


def test_every_block_of_the_step_is_freed_once_and_attributed(small_op: Any) -> None:
    _, rows, facts = small_op
    blocks = facts.blocks
    assert len(blocks["block"]) == int((rows.memory["bytes"] > 0).sum())
    freed = blocks["free_ns"] >= 0
    assert (blocks["free_ns"][freed] >= blocks["alloc_ns"][freed]).all()
    # every free of the step closes a block of the step: all were allocated while recording
    assert freed.sum() == (rows.memory["bytes"] < 0).sum()
    assert len(facts.unknown_frees["ptr"]) == 0
    assert (blocks["op"] >= 0).all() and (blocks["top_op"] >= 0).all()
    ops = facts.ops
    i = np.searchsorted(ops["id"], blocks["top_op"])
    assert (ops["id"][i] == blocks["top_op"]).all()
    assert (ops["parent"][i] == -1).all(), "a top-level op has no parent"


def test_every_op_a_row_names_is_drained_and_no_other_nested_range(small_op: Any) -> None:
    """NOTE [ Nested ranges that leave no row ] in ckrec_ops.cpp: the ops that blocks, frees,
    saved tensors, outputs and nested ranges name are all in the drain; of the nested ranges
    that are not ops of the trace, only those named or telling something of their own stay."""
    _, rows, _ = small_op
    ops = rows.ops
    ids = set(ops["id"].tolist())
    named = {*rows.memory["op"].tolist(), *rows.saved["op"].tolist(), *rows.outputs["op"].tolist()}
    named |= set(ops["parent"].tolist())
    assert named - {-1} <= ids
    assert len(set(ops["outer"].tolist()) - {-1} - ids) == 0
    nested_other = (ops["parent"] >= 0) & (ops["outer"] != ops["id"]) & (ops["scope"] == 0)
    nested_other &= ops["seq"] < 0
    unnamed = [i for i in ops["id"][nested_other].tolist() if i not in named]
    assert not unnamed, f"{len(unnamed)} nested ranges left a row no other row names"
    assert nested_other.sum() < (ops["outer"] == ops["id"]).sum()  # most kernels are gone


def _module_types(model: torch.nn.Module, facts: StepFacts) -> dict[int, str]:
    by_address = {id(m): type(m).__name__ for m in model.modules()}
    calls = facts.calls
    pairs = zip(calls["module"].tolist(), calls["address"].tolist(), strict=True)
    return {m: by_address[a] for m, a in pairs}


def test_blocks_get_their_module_in_forward_and_backward(ext: Any, small_op: Any) -> None:
    step, _rows, facts = small_op
    names = ext.names()
    types = _module_types(step.model, facts)
    blocks, ops = facts.blocks, facts.ops
    nodes = ops["scope"] == 1
    node_name = dict(
        zip(ops["seq"][nodes].tolist(), [names[n] for n in ops["name"][nodes]], strict=True)
    )
    top_name = [names[ops["name"][np.searchsorted(ops["id"], t)]] for t in blocks["top_op"]]

    forward = blocks["phase"] == Phase.FORWARD
    assert forward.sum() >= 80  # an addmm and a gelu result per layer
    for k in np.flatnonzero(forward):
        expected = {"aten.linear.default": "Linear", "aten.gelu.default": "GELU"}[top_name[k]]
        assert types[int(blocks["module"][k])] == expected

    backward = np.flatnonzero(blocks["phase"] == Phase.BACKWARD)
    assert len(backward) >= 120
    loss_nodes = {"MeanBackward0", "PowBackward0"}
    for k in backward:
        node = node_name.get(int(blocks["node_seq"][k]), "(none)")
        if node in loss_nodes:  # the loss runs outside every module
            assert blocks["module"][k] == -1
            continue
        expected = {"AddmmBackward0": "Linear", "TBackward0": "Linear", "GeluBackward0": "GELU"}
        assert node in expected, f"backward block under {node}"
        assert types.get(int(blocks["module"][k])) == expected[node], node


def test_saved_blocks_are_the_forward_activations(ext: Any, small_op: Any) -> None:
    _, _rows, facts = small_op
    names = ext.names()
    blocks, ops = facts.blocks, facts.ops
    saved = blocks["saved"]
    top_name = np.array(
        [names[ops["name"][np.searchsorted(ops["id"], t)]] for t in blocks["top_op"]]
    )
    # each layer's addmm result is saved (GELU's input and the next addmm's mat1)
    assert ((top_name == "aten.linear.default") & saved).sum() == 40
    assert (blocks["phase"][saved] != Phase.BACKWARD).all()
    # saved activations die in backward, after their last unpack
    packs = facts.saved
    for b in np.flatnonzero(saved):
        unpacks = packs["t"][(packs["block"] == blocks["block"][b]) & (packs["kind"] == 1)]
        assert len(unpacks) and blocks["free_ns"][b] >= unpacks.max()
    # packs that hit no recorded block are parameters and the input (made before recording)
    step = small_op[0]
    before = {p.untyped_storage().data_ptr() for p in [*step.model.parameters(), step.input]}
    assert set(packs["ptr"][packs["block"] < 0].tolist()) <= before
    assert (categorize(blocks)[saved] == Category.ACTIVATION).all()


def test_op_outputs_give_dtype_and_shape(ext: Any, small_op: Any) -> None:
    _, _, facts = small_op
    blocks = facts.blocks
    dtype_names = {
        ext.dtype_code(torch.empty(0, dtype=d)): str(d).removeprefix("torch.")
        for d in (torch.float32, torch.int64, torch.bool)
    }
    dtypes, d, shapes, s = layout_texts(
        blocks["dtype"], blocks["ndim"], blocks["dims"], dtype_names
    )
    forward = blocks["phase"] == Phase.FORWARD
    assert {dtypes[i] for i in d[forward]} == {"float32"}
    assert {shapes[i] for i in s[forward]} == {"64x64"}
    # what no op returned (Python scalars wrapped before dispatch) has no layout
    assert (d[~forward] >= -1).all() and (d[forward] >= 0).all()


def test_ops_phases_and_backward_sequence_numbers(ext: Any, small_op: Any) -> None:
    step, _rows, facts = small_op
    ops = facts.ops
    names = ext.names()
    types = _module_types(step.model, facts)
    addmm_nodes = np.flatnonzero([names[n] == "AddmmBackward0" for n in ops["name"]])
    assert len(addmm_nodes) == 40
    assert {types[m] for m in ops["module"][addmm_nodes].tolist()} == {"Linear"}
    assert (ops["end_ns"] >= ops["start_ns"]).all()
    nodes = ops["scope"] == 1
    assert nodes.sum() > 100
    assert (ops["phase"][nodes] == Phase.BACKWARD).all()
    assert (ops["phase"][ops["call"] >= 0] == Phase.FORWARD).all()
    assert (ops["seq_nr"][ops["phase"] != Phase.BACKWARD] == -1).all()
    assert (
        len(facts.calls["call"]) == 81 and (facts.calls["end_ns"] > facts.calls["start_ns"]).all()
    )


def test_spans_set_the_optimizer_phase(ext: Any) -> None:
    step = small_op_step("sgd")
    step()
    opt_t: list[int] = []
    model = step.model  # type: ignore[attr-defined]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows = record(
        ext,
        lambda: (
            model(torch.randn(8, 64)).sum().backward(),
            opt_t.append(ext.now_ns()),
            opt.step(),
            opt_t.append(ext.now_ns()),
        ),
    )
    facts = Attribution(ext).step(rows, spans=[(Phase.OPTIMIZER, np.array([opt_t]))])
    ops = facts.ops
    inside = (ops["t0"] >= opt_t[0]) & (ops["t0"] <= opt_t[1])
    assert inside.any() and (ops["phase"][inside] == Phase.OPTIMIZER).all()
    assert (ops["phase"][~inside] != Phase.OPTIMIZER).all()


def test_blocks_span_drains(ext: Any) -> None:
    att = Attribution(ext)
    ext.start(ops=True, memory=True)
    try:
        drain(ext)
        kept = torch.ones(1000)
        assert ext.pending_rows() >= 2  # the op and its block
        first = att.step(drain(ext))
        del kept
        second = att.step(drain(ext))
    finally:
        ext.stop()
    assert ext.pending_rows() == 0
    block = first.blocks["block"][first.blocks["nbytes"] == 4000]
    assert len(block) == 1 and first.blocks["free_ns"][first.blocks["block"] == block[0]] == -1
    assert second.late_frees["block"].tolist() == block.tolist()


def test_many_live_blocks_keep_their_ids(ext: Any) -> None:
    """The extension's block table grows past its first size (NOTE [ Blocks by address ])."""
    ext.start(ops=False, memory=True)
    try:
        drain(ext)
        kept = [torch.empty(3) for _ in range(40_000)]
        first = drain(ext)
        del kept
        second = drain(ext)
    finally:
        ext.stop()
    allocated = first.memory[first.memory["bytes"] > 0]
    assert len(allocated) >= 40_000
    assert len(np.unique(allocated["block"])) == len(allocated)
    freed = second.memory[second.memory["bytes"] < 0]
    assert set(allocated["block"][allocated["bytes"] == 12].tolist()) <= set(
        freed["block"].tolist()
    )
    assert (freed["block"] >= 0).all()


def test_an_op_open_at_the_drain_ends_later(ext: Any) -> None:
    """NOTE [ Op ends ]: a drain inside an op (a custom op calling back into Python)."""
    drained: list[Rows] = []

    @torch.library.custom_op("ckview_test::drains", mutates_args=())
    def drains(x: torch.Tensor) -> torch.Tensor:
        drained.append(drain(ext))
        return x.clone()

    ext.start(ops=True, memory=True)
    try:
        drain(ext)
        drains(torch.ones(3))
        drained.append(drain(ext))
    finally:
        ext.stop()
    att = Attribution(ext)
    first, second = (att.step(r) for r in drained)
    open_ = first.ops["end_ns"] == -1
    assert open_.any()
    assert set(second.late_op_ends["id"].tolist()) == set(first.ops["id"][open_].tolist())


def test_an_op_defined_after_another_was_deregistered_has_its_own_name(ext: Any) -> None:
    """NOTE [ Interning op names ]: a deregistered op's schema frees its name, and an op defined
    later may get its address (here about one time in five); the cache by pointer must not name
    it after the first."""
    x = torch.ones(2)
    expected = []
    ext.start(ops=True, memory=False)
    try:
        for i in range(40):
            op = ("first", "other")[i % 2]  # names of one length: the freed memory fits the next
            lib = torch.library.Library("ckview_reuse", "DEF")
            lib.define(f"{op}(Tensor x) -> Tensor")
            lib.impl(op, lambda t: t, "CompositeExplicitAutograd")
            getattr(torch.ops.ckview_reuse, op)(x)
            expected.append(f"ckview_reuse.{op}.default")
            lib._destroy()
        rows = drain(ext)
    finally:
        ext.stop()
    table = ext.names()
    names = [table[i] for i in rows.ops["name"].tolist() if table[i].startswith("ckview_reuse")]
    assert names == expected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_graph_leaves_are_the_tensors_backward_trains(ext: Any) -> None:
    # NOTE [ Leaves of a graph ]: each leaf that requires grad once, however often it is used;
    # neither a constant nor an intermediate result.
    w, b = torch.randn(4, 3, requires_grad=True), torch.zeros(3, requires_grad=True)
    x = torch.randn(2, 4)
    loss = (torch.tanh(x @ w + b) @ w.t()).sum() + (b * 2).sum()
    leaves = ext.graph_leaves([loss])
    assert sorted(id(t) for t in leaves) == sorted([id(w), id(b)])
    assert ext.graph_leaves([x]) == []  # no graph
    assert len(ext.graph_leaves([loss], limit=1)) < 2  # the walk stops


def test_a_forked_child_records_nothing(ext: Any) -> None:
    """NOTE [ Forked children ]: a DataLoader worker forked mid-recording goes inert."""
    source = NativeSource(ext, lambda kind, facts: None)
    undo = source.install()
    source.begin_run()
    try:
        with warnings.catch_warnings():  # Python 3.12 warns about fork in a threaded process
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: no rows pile up, the profiler slot is free
            before = ext.pending_rows()
            torch.nn.Linear(8, 8)(torch.ones(2, 8)).sum()
            ok = ext.pending_rows() == before and not ext.reporter_active()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        torch.ones(10)
        assert ext.reporter_active() and ext.pending_rows() > 0  # the parent records on
    finally:
        source.end_run()
        undo()


def test_drain_refuses_another_thread(ext: Any) -> None:
    """NOTE [ The recording thread writes without a lock ]: only it may drain."""
    import threading

    errors: list[str] = []

    def drain_elsewhere() -> None:
        try:
            ext.drain()
        except RuntimeError as exc:
            errors.append(str(exc))

    ext.start(ops=True, memory=True)
    try:
        thread = threading.Thread(target=drain_elsewhere)
        thread.start()
        thread.join()
    finally:
        ext.stop()
    assert len(errors) == 1 and "must run on the thread that started" in errors[0]


def test_clock_is_perf_counter(ext: Any) -> None:
    import time

    before, native, after = time.perf_counter_ns(), ext.now_ns(), time.perf_counter_ns()
    assert before <= native <= after


# -- CUDA (run where a GPU is; skipped elsewhere) -----------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda_step() -> Callable[[], None]:
    """The small-op step on the GPU: backward runs on the autograd engine's device thread."""
    torch.manual_seed(0)
    layers = [m for _ in range(40) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, 64, device="cuda")

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.model = model  # type: ignore[attr-defined]
    return step


@cuda
def test_cuda_blocks_are_the_caching_allocators(ext: Any) -> None:
    step = cuda_step()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    totals: list[tuple[int, int]] = []

    def step_then_totals() -> None:  # read while recording: nothing is freed after it
        step()
        torch.cuda.synchronize()
        totals.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))

    rows = record(ext, step_then_totals)
    on_cuda = rows.memory[rows.memory["device_type"] == 1]
    mine = Counter(on_cuda["bytes"][on_cuda["bytes"] > 0].tolist())
    assert sum(mine.values()) > 100
    # The drain joins each thread's rows (backward runs on the device thread): the totals
    # after the step are those of the latest event, not of the last row.
    last = int(np.argmax(on_cuda["t"]))
    assert (on_cuda["allocated"][last], on_cuda["reserved"][last]) == totals[-1]
    from torch._C._profiler import _ExtraFields_Allocation

    prof = torch.profiler.profile(profile_memory=True)
    with prof:
        step()
        torch.cuda.synchronize()
    todo, sizes = list(prof.profiler.kineto_results.experimental_event_tree()), []
    while todo:
        event = todo.pop()
        if type(event.extra_fields) is _ExtraFields_Allocation:
            fields = event.extra_fields
            sizes.append((fields.alloc_size, fields.device.type))
        else:
            todo.extend(event.children)
    theirs = Counter(b for b, device in sizes if b > 0 and device == "cuda")
    assert mine == theirs


@cuda
def test_cuda_backward_on_the_device_thread_is_seen_and_attributed(ext: Any) -> None:
    step = cuda_step()
    for _ in range(3):
        step()
    facts = Attribution(ext).step(record(ext, step))
    blocks = facts.blocks
    backward = blocks["phase"] == Phase.BACKWARD
    assert backward.sum() >= 120
    types = _module_types(step.model, facts)  # type: ignore[attr-defined]
    with_module = blocks["module"][backward] >= 0
    assert with_module.sum() >= 119
    assert {types[m] for m in blocks["module"][backward][with_module].tolist()} == {
        "Linear",
        "GELU",
    }
    assert (blocks["free_ns"][blocks["saved"]] >= 0).all()


@cuda
def test_cuda_frees_of_older_blocks_are_known_by_size(ext: Any) -> None:
    old = torch.empty(1 << 20, device="cuda")
    ext.start(ops=False, memory=True)
    try:
        drain(ext)
        del old
        facts = Attribution(ext).step(drain(ext))
    finally:
        ext.stop()
    assert (1 << 22) in facts.unknown_frees["nbytes"].tolist()


# -- the script's own profiler -----------------------------------------------------------------


def test_reporter_yields_to_the_scripts_profiler_and_comes_back(ext: Any) -> None:
    got: list[tuple[str, StepFacts]] = []
    source = NativeSource(ext, lambda kind, facts: got.append((kind, facts)))
    undo = source.install()
    try:
        source.begin_run()
        assert ext.reporter_active()
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as prof:
            torch.ones(1000)
        assert any(e.cpu_memory_usage for e in prof.events())
        assert ext.reporter_active()
        source.step_begins(0)
        torch.ones(1000)
        source.step_ends(0)
        source.end_run()
    finally:
        undo()
        ext.stop()
    assert source.yielded == 1 and source.meta() == {"recorder": "native"}
    kinds = [k for k, _ in got]
    assert kinds == ["between", "step"]  # nothing ran after the step: the end hands out none
    step_blocks = got[1][1].blocks
    assert 4000 in step_blocks["nbytes"].tolist()


def test_source_facts_of_identical_steps_agree(ext: Any) -> None:
    """Three identical steps through NativeSource: the same blocks, bytes, modules and saved
    blocks each time; what a step keeps (gradients, none here) is freed in a later one."""
    step = small_op_step("sgd")
    for _ in range(3):
        step()
    got: list[tuple[str, StepFacts]] = []
    source = NativeSource(ext, lambda kind, facts: got.append((kind, facts)))
    undo = source.install()
    try:
        source.begin_run()
        for _ in range(3):
            source.step_begins(0)
            step()
            source.step_ends(0)
        source.end_run()
    finally:
        undo()
        ext.stop()
    steps = [facts for kind, facts in got if kind == "step"]
    assert len(steps) == 3
    summary = [
        (
            len(f.blocks["block"]),
            int(f.blocks["nbytes"].sum()),
            int((f.blocks["module"] >= 0).sum()),
            int(f.blocks["saved"].sum()),
        )
        for f in steps
    ]
    assert summary[0] == summary[1] == summary[2], summary
    # the momentum buffers of SGD live on; every other block of a step dies within it
    assert all(len(f.late_frees["block"]) == 0 for f in steps)


REFUSED_PROFILER = """\
import torch
from recorder.native.build import load
ext = load().ext
ext.start(ops=False, memory=True)
try:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pass
except RuntimeError as exc:
    print("refused" if "already enabled" in str(exc) else f"other: {exc}")
finally:
    ext.stop()
print("inactive" if not ext.reporter_active() else "active")
"""


def test_without_yielding_torch_refuses_its_profiler(ext: Any) -> None:
    """In a process of its own: the profiler torch failed to start stays half prepared, and
    every later profiler in that process fails too."""
    done = subprocess.run(
        [sys.executable, "-c", REFUSED_PROFILER],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CKVIEW_RECORDER": "native", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", "inactive"]


# -- build, cache, modes -----------------------------------------------------------------------


def test_a_build_for_another_torch_is_refused_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKVIEW_CACHE", str(tmp_path))
    monkeypatch.setenv("CKVIEW_RECORDER", "auto")
    directory = build.cache_dir()
    directory.mkdir(parents=True)
    stamp = dict(build._expected_stamp(), torch="2.12.0")
    (directory / build.STAMP).write_text(json.dumps(stamp))
    build._binary(directory).write_bytes(b"not a shared object")  # importing it would fail
    assert build.refused(directory, build._expected_stamp()) == (
        f"it was built for torch 2.12.0, not {torch.__version__}"
    )
    monkeypatch.setattr(build, "_build", lambda d, s: "rebuilt instead")
    assert build.load() == (None, "rebuilt instead")


def test_a_build_in_progress_elsewhere_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from filelock import FileLock

    monkeypatch.setenv("CKVIEW_CACHE", str(tmp_path))
    monkeypatch.setenv("CKVIEW_RECORDER", "auto")
    monkeypatch.setattr(build, "LOCK_TIMEOUT_S", 0.2)
    directory = build.cache_dir()
    directory.mkdir(parents=True)

    def no_build(*args: Any) -> None:
        raise AssertionError("built while another process held the lock")

    monkeypatch.setattr(build, "_build", no_build)
    with FileLock(str(directory / "build.lock")):
        ext, reason = build.load()
    assert ext is None
    assert reason.startswith("another process has been building the native recorder in ")


def test_a_build_killed_midway_leaves_no_baton_to_wait_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's cpp_extension holds a baton file while it builds; one left by a killed build
    made every later recording wait forever (seen when a test timeout killed a build). Under
    ckview's own lock it is stale and goes."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("CKVIEW_CACHE", str(tmp_path))
    monkeypatch.setenv("CKVIEW_RECORDER", "auto")
    directory = build.cache_dir()
    directory.mkdir(parents=True)
    baton = directory / build.TORCH_BATON
    baton.write_text("")  # left by a build that was killed
    seen: list[bool] = []

    def load(**kwargs: Any) -> None:
        seen.append(baton.exists())
        raise RuntimeError("stop here")

    monkeypatch.setattr(cpp_extension, "load", load)
    ext, reason = build.load()
    assert seen == [False]
    assert ext is None and "stop here" in reason


def test_python_mode_never_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKVIEW_CACHE", str(tmp_path))
    monkeypatch.setenv("CKVIEW_RECORDER", "python")

    def no_build(*args: Any) -> None:
        raise AssertionError("built")

    monkeypatch.setattr(build, "_build", no_build)
    monkeypatch.setattr(build, "_import", no_build)
    assert build.load() == (None, "CKVIEW_RECORDER=python")
    assert not any(tmp_path.iterdir())


def test_an_unknown_mode_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKVIEW_RECORDER", "fast")
    with pytest.raises(build.NativeRecorderError, match="'fast' is not one of native, python"):
        build.load()


def test_no_compiler_falls_back_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKVIEW_CACHE", str(tmp_path))
    monkeypatch.setenv("CKVIEW_RECORDER", "auto")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    ext, reason = build.load()
    assert ext is None
    assert reason == "no C++ compiler (/nonexistent/c++ not found; install g++ or set CXX)"


def test_a_failing_build_falls_back_and_native_fails_in_one_line(tmp_path: Path) -> None:
    """A compiler that exists and fails (``false``): ``auto`` says why in one line; ``native``
    exits 1 with one line and no traceback."""
    env = dict(
        os.environ,
        CKVIEW_CACHE=str(tmp_path),
        CXX=shutil.which("false") or "false",
        PYTHONPATH=str(ROOT),
    )
    for mode, rc in (("auto", 1), ("native", 1)):
        env["CKVIEW_RECORDER"] = mode
        done = subprocess.run(
            [sys.executable, "-m", "recorder.native"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert done.returncode == rc
        lines = [
            line for line in done.stderr.splitlines() if not line.startswith("ckview: building")
        ]
        assert len(lines) == 1, done.stderr
        assert "building the native recorder failed" in lines[0]
        assert "Traceback" not in done.stderr
        if mode == "native":
            assert lines[0].startswith("ckview: CKVIEW_RECORDER=native, but ")
    assert any(p.name == "build.log" for p in tmp_path.rglob("*"))
    assert not any(p.name == build.STAMP for p in tmp_path.rglob("*"))


def test_a_cuda_block_takes_the_size_of_the_storage_returned_on_it(ext: Any) -> None:
    """NOTE [ Block sizes on CUDA ]: a cached block reused whole is reported with its slack;
    the block takes its storage's size as the allocator rounds it. CPU blocks, and CUDA blocks
    no tensor was returned on (workspaces), keep the reported size."""
    from recorder.native.rows import MEMORY, OUTPUTS

    memory = np.zeros(4, MEMORY)  # allocations: cuda, cpu, cuda (no output), cuda
    memory["block"] = [1, 2, 3, 4]
    memory["bytes"] = [1_146_880, 1_146_880, 4096, 2048]
    memory["device_type"] = [1, 0, 1, 1]
    memory["op"] = memory["top"] = memory["node_seq"] = memory["call"] = -1
    outputs = np.zeros(4, OUTPUTS)
    outputs["t"] = [1, 2, 3, 0]
    outputs["block"] = [1, 2, 4, 4]  # block 4's first output by time: the last row
    outputs["storage_nbytes"] = [1_049_000, 1_049_000, 100, 3000]
    outputs["ndim"] = [1, 1, 1, 2]
    rows = dataclasses.replace(Rows.empty(), memory=memory, outputs=outputs)
    blocks = Attribution(ext).step(rows).blocks
    assert blocks["nbytes"].tolist() == [1_049_088, 1_146_880, 4096, 2048]
    assert blocks["ndim"].tolist() == [1, 1, -1, 2]
