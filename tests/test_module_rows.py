"""The recorder's object -> row maps (``recorder.modules.RowsByIdentity``): modules' rows and
parameters' owners, looked up at every module call and every step."""

from __future__ import annotations

import gc

import pytest
import torch

from ckview.trace.schema import NO_INDEX
from recorder.modules import ModuleRegistry, RowsByIdentity

pytestmark = pytest.mark.torch


def test_rows_go_with_their_objects_and_tell_equal_ones_apart() -> None:
    rows: RowsByIdentity[torch.Tensor] = RowsByIdentity()
    a, b = torch.zeros(2), torch.zeros(2)  # equal values, two objects
    rows[a] = 3
    assert a in rows and b not in rows
    assert rows[a] == 3 and rows.get(b) == NO_INDEX and rows.get(b, 7) == 7
    with pytest.raises(KeyError):
        rows[b]
    assert rows.keys() == [a] and rows.by_id[id(a)][1] == 3
    del a
    gc.collect()
    assert rows.keys() == [] and rows.by_id == {}


def test_a_module_registered_is_found_by_identity_and_forgotten_when_it_dies() -> None:
    registry = ModuleRegistry(lambda text: 0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    row, params = registry.register(model, NO_INDEX)
    assert row == 0 and len(params) == 2
    assert [registry.row(m) for m in model.modules()] == [0, 1, 2]
    assert registry.row(torch.nn.ReLU()) is None and registry.row("not a module") is None
    assert registry.owner(model[0].weight) == 1 and registry.owner(torch.zeros(1)) == NO_INDEX
    assert {id(p) for p in registry.parameters()} == {id(p) for p in model.parameters()}
    del model, params
    gc.collect()
    assert registry.parameters() == [] and registry.owner_table() == {}
