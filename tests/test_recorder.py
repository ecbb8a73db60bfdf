"""The recorder against independent counts: saved-tensor bytes, analytic shapes, losses."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from ckview.trace.schema import Category, MemoryEventKind, Phase, SavedEventKind
from recorder import Recorder, StopScript
from tests.conftest import load_example, read_run

pytestmark = [pytest.mark.torch, pytest.mark.recorder]


def _train(model: nn.Module, steps: int, batch: int = 16, optimizer: bool = True) -> list[float]:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer else None
    losses = []
    for _ in range(steps):
        x = torch.randn(batch, 64)
        y = torch.randn(batch, 32)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))


def _activation_bytes(tables: dict[str, Any], step: int) -> int:
    storages, steps = tables["storages"], tables["steps"]
    start, end = steps["start_ns"][step], steps["end_ns"][step]
    in_step = (storages["alloc_ns"] >= start) & (storages["alloc_ns"] <= end)
    activation = storages["category"] == Category.ACTIVATION
    return int(storages["nbytes"][in_step & activation].sum())


def _independent_saved_bytes(model: nn.Module) -> int:
    """Distinct storages autograd saves in one step, minus parameters and the batch."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        saved[st.data_ptr()] = st.nbytes()
        return t.detach()

    torch.manual_seed(0)
    x, y = torch.randn(16, 64), torch.randn(16, 32)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    exclude = params | {x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}
    return sum(n for ptr, n in saved.items() if ptr not in exclude)


def test_activation_bytes_match_analytic_and_independent_count(tmp_path: Path) -> None:
    model = _mlp()
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False) as rec:
        _train(model, 3)
    assert rec.steps_recorded == 2
    tables = read_run(tmp_path / "t.h5")
    # ReLU keeps its 16x128 output; pow keeps the 16x32 difference; float32.
    analytic = (16 * 128 + 16 * 32) * 4
    assert _independent_saved_bytes(model) == analytic
    assert _activation_bytes(tables, 0) == analytic
    assert _activation_bytes(tables, 1) == analytic


def test_recording_leaves_losses_unchanged(tmp_path: Path) -> None:
    plain = _train(_mlp(), 4)
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False):
        recorded = _train(_mlp(), 4)
    assert recorded == plain


def test_parameters_gradients_and_optimizer_state_are_recognised(tmp_path: Path) -> None:
    model = _mlp()
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters())
        for _ in range(2):
            loss = model(torch.randn(16, 64)).square().mean()
            loss.backward()
            opt.step()  # grads stay (no zero_grad): they live across steps
    tables = read_run(tmp_path / "t.h5")
    st = tables["storages"]
    param_bytes = sum(p.numel() * 4 for p in model.parameters())

    def total(cat: Category) -> int:
        return int(st["nbytes"][st["category"] == cat].sum())

    assert total(Category.PARAMETER) == param_bytes
    assert total(Category.GRADIENT) == param_bytes
    assert total(Category.OPTIMIZER_STATE) >= 2 * param_bytes  # exp_avg, exp_avg_sq (+ step)
    assert int(tables["modules"]["param_bytes"].sum()) == param_bytes


def test_preexisting_storages_seen_through_views_are_not_allocations(tmp_path: Path) -> None:
    model = _mlp()
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        _train(model, 2)
    tables = read_run(tmp_path / "t.h5")
    st, ev = tables["storages"], tables["memory_events"]
    params = st["category"] == Category.PARAMETER
    assert (st["alloc_ns"][params] == -1).all()
    alloc_rows = ev["storage"][ev["kind"] == MemoryEventKind.ALLOC]
    assert not params[alloc_rows].any(), "a parameter (seen via weight.t()) counted as allocated"


def test_module_paths_and_phases(tmp_path: Path) -> None:
    model = _mlp()
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        _train(model, 2)
    tables = read_run(tmp_path / "t.h5")
    strings = tables["strings"]
    paths = [strings[i] for i in tables["modules"]["path"]]
    assert paths == ["", "0", "1", "2"]
    ops = tables["ops"]
    phases = set(ops["phase"].tolist())
    assert {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER} <= phases
    # Backward ops are attributed to the module whose forward created their autograd node.
    calls = tables["module_calls"]
    backward = ops["phase"] == Phase.BACKWARD
    modules = calls["module"][ops["module_call"][backward & (ops["module_call"] >= 0)]]
    assert {1, 3} <= set(modules.tolist())  # the two Linear layers


def test_backward_only_script_records_steps(tmp_path: Path) -> None:
    model = _mlp()
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False) as rec:
        _train(model, 4, optimizer=False)
    assert rec.steps_recorded == 2
    tables = read_run(tmp_path / "t.h5")
    assert len(tables["steps"]["step"]) == 2
    assert _activation_bytes(tables, 1) == (16 * 128 + 16 * 32) * 4


def test_checkpointed_script_records_recompute(tmp_path: Path) -> None:
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
            return x

    torch.manual_seed(0)
    model = Net()
    plain = Net()
    plain.load_state_dict(model.state_dict())
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(8, 64)).square().mean().backward()
            opt.step()
    tables = read_run(tmp_path / "t.h5")
    ops, calls = tables["ops"], tables["module_calls"]
    assert (ops["phase"] == Phase.RECOMPUTE).sum() > 0
    assert (calls["phase"] == Phase.RECOMPUTE).sum() >= 3 * 4  # each block and its 3 layers
    # Recomputed tensors handed to backward are activations; forward ones inside regions are not.
    st = tables["storages"]
    recompute_ops = np.flatnonzero(ops["phase"] == Phase.RECOMPUTE)
    made_in_recompute = np.isin(st["op"], recompute_ops)
    assert (st["category"][made_in_recompute] == Category.ACTIVATION).any()
    unpacked = tables["saved_events"]["kind"] == SavedEventKind.UNPACK
    assert unpacked.any()


def test_reentrant_checkpoint_of_a_function_is_a_recompute_region(tmp_path: Path) -> None:
    """A plain function checkpointed reentrantly runs again in backward: RECOMPUTE ops in one
    region per call, named after the function (no module hook sees it), and the region's own
    backward stays BACKWARD."""
    from torch.utils.checkpoint import checkpoint

    linear = nn.Linear(32, 32)

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(linear(x))

    def step() -> None:
        x = torch.randn(4, 32, requires_grad=True)  # reentrant: some input must need grad
        for _ in range(3):
            x = checkpoint(block, x, use_reentrant=True)
        x.sum().backward()

    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        for _ in range(2):
            step()
    tables = read_run(tmp_path / "t.h5")
    ops, regions = tables["ops"], tables["recompute_regions"]
    names = [tables["strings"][i] for i in regions["name"]]
    assert names == [block.__qualname__] * 3
    recomputed = ops["phase"] == Phase.RECOMPUTE
    op_names = [tables["strings"][i] for i in ops["name"][recomputed]]
    # The block's ops, three times, and no backward op: aten.t, addmm and tanh below autograd,
    # as the dispatch mode sees them (NOTE [ Ops as a dispatch mode sees them ] in ckrec_ops.cpp).
    assert op_names.count("aten.addmm.default") == op_names.count("aten.tanh.default") == 3
    assert "aten.linear.default" not in op_names
    assert not any("Backward" in name for name in op_names)
    assert (ops["phase"] == Phase.BACKWARD).sum() > recomputed.sum()


def test_recorder_never_keeps_a_tensor_alive(tmp_path: Path) -> None:
    model = _mlp()
    refs: list[weakref.ref[Any]] = []
    with Recorder(tmp_path / "t.h5", steps=2, warmup=0, progress=False):
        x = torch.randn(16, 64)
        hidden = model[1](model[0](x))
        loss = model[2](hidden).square().mean()
        refs.append(weakref.ref(hidden.untyped_storage()))
        loss.backward()
        del hidden, loss, x
        assert refs[0]() is None  # freed at once: no recorder reference, no cycle
        gc.collect()


def test_stop_after_raises_into_the_script(tmp_path: Path) -> None:
    model = _mlp()
    with (
        pytest.raises(StopScript),
        Recorder(tmp_path / "t.h5", steps=1, warmup=1, stop_after=True, progress=False),
    ):
        _train(model, 10)
    assert read_run(tmp_path / "t.h5")["meta"].complete


def test_exception_leaves_readable_incomplete_trace(tmp_path: Path) -> None:
    model = _mlp()
    with (
        pytest.raises(ZeroDivisionError),
        Recorder(tmp_path / "t.h5", steps=3, warmup=1, progress=False),
    ):
        _train(model, 2)
        raise ZeroDivisionError("boom")
    tables = read_run(tmp_path / "t.h5")
    assert not tables["meta"].complete
    assert "ZeroDivisionError: boom" in tables["meta"].error
    assert len(tables["storages"]["nbytes"]) > 0


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "gpt2"])
def test_examples_losses_identical_under_recording(name: str, tmp_path: Path, capsys: Any) -> None:
    example = load_example(name)
    example.main(["--steps", "3"])
    plain = capsys.readouterr().out
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        example.main(["--steps", "3"])
    assert capsys.readouterr().out == plain


def test_dataloader_workers_do_not_touch_the_trace(tmp_path: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 32))
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=2)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=2, warmup=1, progress=False) as rec:
        for x, y in loader:
            ((model(x * 2) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert rec.steps_recorded == 2
    from ckview.trace import validate_trace

    assert validate_trace(tmp_path / "t.h5").ok


def test_mark_step_by_hand(tmp_path: Path) -> None:
    model = _mlp()
    with Recorder(tmp_path / "t.h5", steps=2, warmup=0, progress=False) as rec:
        for _ in range(2):
            with torch.no_grad():
                model(torch.randn(4, 64))  # inference: no backward, no optimizer
            rec.mark_step()
    assert rec.steps_recorded == 2
    assert len(read_run(tmp_path / "t.h5")["steps"]["step"]) == 2


def test_module_inputs_and_outputs(tmp_path: Path) -> None:
    from ckview.trace.schema import IOKind

    model = _mlp()
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        _train(model, 2)
    tables = read_run(tmp_path / "t.h5")
    io, calls, st = tables["module_io"], tables["module_calls"], tables["storages"]
    nbytes = dict.fromkeys(range(len(calls["module"])), 0)
    for call, storage, kind in zip(io["call"], io["storage"], io["kind"], strict=True):
        if kind == IOKind.INPUT:
            nbytes[int(call)] += int(st["nbytes"][storage])
    # Each call of the Sequential (module row 0) gets the 16x64 batch; its first layer too.
    root_calls = np.flatnonzero(calls["module"] == 0)
    assert [nbytes[int(c)] for c in root_calls] == [16 * 64 * 4]
    outputs = io["storage"][(io["call"] == root_calls[0]) & (io["kind"] == IOKind.OUTPUT)]
    assert [int(st["nbytes"][s]) for s in outputs] == [16 * 32 * 4]


def test_early_stopped_recompute_closes_its_region(tmp_path: Path) -> None:
    """torch's non-reentrant checkpoint stops a recompute by raising inside forward; the
    recorder's forward hook must still close the region (it is called without kwargs then)."""
    from torch.utils.checkpoint import checkpoint

    block = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    head = nn.Linear(64, 1)
    opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
    with Recorder(tmp_path / "t.h5", steps=1, warmup=1, progress=False):
        for _ in range(2):
            x = torch.randn(8, 64, requires_grad=True)
            head(checkpoint(block, x, use_reentrant=False)).sum().backward()
            opt.step()
    tables = read_run(tmp_path / "t.h5")
    regions, ops = tables["recompute_regions"], tables["ops"]
    assert len(regions["step"]) == 1
    first, end = int(regions["first_op"][0]), int(regions["end_op"][0])
    assert (ops["phase"][first:end] == Phase.RECOMPUTE).all()
    # Backward ops after the recompute are backward again, not recompute.
    assert (ops["phase"][end:] == Phase.BACKWARD).any()
