"""``ckview record --stacks``: where in the user's code each storage was made (NOTE [ User
frames ] in recorder/stacks.py)."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ckview.analysis.stacks import allocation_site, stack_frames
from ckview.trace import open_trace
from recorder import Recorder
from tests.conftest import read_run

pytestmark = pytest.mark.torch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.a(x))  # the activation Tanh saves is made here
        return self.b(hidden)


TANH_LINE = inspect.getsourcelines(Net.forward)[1] + 1


def _record(path: Path, stacks: bool) -> dict:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(path, steps=1, warmup=1, progress=False, stacks=stacks):
        for _ in range(3):
            model(torch.randn(8, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    tables = read_run(path)
    with open_trace(path) as trace:
        tables["frames"] = trace.root_table("frames").read()
        tables["stacks"] = trace.root_table("stacks").read()
    return tables


@pytest.fixture(scope="module")
def with_stacks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One recording with stacks, shared by the tests that only read it."""
    return _record(tmp_path_factory.mktemp("stacks") / "t.h5", stacks=True)


def _tanh_output(tables: dict) -> int:
    strings, storages, ops = tables["strings"], tables["storages"], tables["ops"]
    names = np.array([strings[n] for n in ops["name"]])
    (tanh,) = np.nonzero(names == "aten.tanh.default")[0][:1]
    (row,) = np.nonzero(storages["op"] == tanh)[0]
    return int(row)


def test_a_storage_names_the_users_line_that_made_it(with_stacks: dict) -> None:
    tables = with_stacks
    row = _tanh_output(tables)
    stack = int(tables["storages"]["stack"][row])
    site = allocation_site(tables["frames"], tables["stacks"], tables["strings"], stack)
    assert site == f"{__file__}:{TANH_LINE} (Net.forward)"
    # The callers follow, innermost first: the training loop in _record.
    frames = stack_frames(tables["stacks"], stack)
    names = [tables["strings"][tables["frames"]["name"][f]] for f in frames]
    assert names[:2] == ["Net.forward", "_record"]
    assert not any("torch" in tables["strings"][tables["frames"]["file"][f]] for f in frames)


def test_every_allocation_has_a_stack_and_workspaces_take_their_ops(with_stacks: dict) -> None:
    storages = with_stacks["storages"]
    allocated = storages["alloc_ns"] >= 0
    assert (storages["stack"][allocated] >= 0).all()
    assert (storages["stack"][~allocated] == -1).all()  # made before recording: unknown


def test_without_stacks_nothing_is_kept(tmp_path: Path) -> None:
    tables = _record(tmp_path / "t.h5", stacks=False)
    assert (tables["storages"]["stack"] == -1).all()
    assert len(tables["frames"]["file"]) == 0 and len(tables["stacks"]["frame"]) == 0
