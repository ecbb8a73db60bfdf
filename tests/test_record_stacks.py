"""``ckview record --stacks``: where in the user's code each storage was made (NOTE [ User
frames ] in recorder/stacks.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckview.analysis.stacks import allocation_site, stack_frames
from tests.conftest import read_run
from tests.factory import TANH_SITE, record_stack_net

pytestmark = [pytest.mark.torch, pytest.mark.recorder]


@pytest.fixture(scope="module")
def with_stacks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One recording with stacks, shared by the tests that only read it."""
    return read_run(record_stack_net(tmp_path_factory.mktemp("stacks") / "t.h5"))


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
    assert site == TANH_SITE
    # The callers follow, innermost first: the factory's step, then its training loop.
    frames = stack_frames(tables["stacks"], stack)
    names = [tables["strings"][tables["frames"]["name"][f]] for f in frames]
    assert names[:3] == [
        "StackNet.forward",
        "record_model.<locals>.on_random_input",
        "record_model",
    ]
    assert not any("torch" in tables["strings"][tables["frames"]["file"][f]] for f in frames)


def test_every_allocation_has_a_stack_and_workspaces_take_their_ops(with_stacks: dict) -> None:
    storages = with_stacks["storages"]
    allocated = storages["alloc_ns"] >= 0
    assert (storages["stack"][allocated] >= 0).all()
    assert (storages["stack"][~allocated] == -1).all()  # made before recording: unknown


def test_without_stacks_nothing_is_kept(tmp_path: Path) -> None:
    tables = read_run(record_stack_net(tmp_path / "t.h5", stacks=False))
    assert (tables["storages"]["stack"] == -1).all()
    assert len(tables["frames"]["file"]) == 0 and len(tables["stacks"]["frame"]) == 0
