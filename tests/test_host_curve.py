"""The host curve of offload plans (NOTE [ Host curve ] in ckview.analysis.projection.host):
its maximum is the host peak, it is empty without offload, and device + host relate to the
un-offloaded projection as the NOTE says (a naive oracle over the projected events)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckview.analysis import ProjectionModel, project
from ckview.analysis.plans import resolve_on_trace
from ckview.analysis.projection.effects import NEVER
from ckview.analysis.projection.exact import project_active
from ckview.analysis.projection.host import host_curve
from ckview.analysis.projection.results import Projection
from ckview.analysis.types import RunTables
from ckview.cli.common import read_tables
from ckview.trace import open_trace
from ckview.trace.schema import MemoryEventKind
from tests.conftest import ROOT
from tests.synthetic import on_cuda

pytestmark = pytest.mark.torch

TRACE = ROOT / "sample_traces" / "transformer_compare.h5"


def doc(regions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": "ckview-plan", "version": 2, "name": "offload", "regions": regions}


@pytest.fixture(scope="module")
def tables() -> RunTables:
    with open_trace(TRACE) as trace:
        return read_tables(trace, "baseline")


def offload_model(tables: RunTables, pattern: str) -> ProjectionModel:
    plan = doc([{"module": pattern, "save": ["*"], "offload": True}])
    regions = resolve_on_trace(plan, tables["modules"], tables["strings"]).regions
    return ProjectionModel(tables, list(regions))


def test_the_host_curve_peaks_at_the_host_peak(tables: RunTables) -> None:
    cuda = on_cuda(tables)
    model = offload_model(cuda, "encoder.layers.*")
    moved = model.project(np.ones(len(model.candidates), dtype=bool))
    assert moved.offloaded_bytes > 0
    assert len(moved.host) == len(moved.total)  # one value per projected state
    assert int(moved.host.max()) == moved.host_peak_bytes > 0
    assert moved.host[0] == 0 == moved.host[-1]  # every saved tensor is freed in backward
    # Every saved activation is on the host at once, after the last block's forward.
    assert moved.host_peak_bytes == moved.offloaded_bytes


def test_no_host_curve_without_offload(tables: RunTables) -> None:
    """On a CPU trace an offload region moves nothing; a recompute plan offloads nothing."""
    cpu = offload_model(tables, "encoder.layers.*").project([0])
    assert len(cpu.host) == 0 and cpu.host_peak_bytes == 0
    regions = resolve_on_trace("all", tables["modules"], tables["strings"]).regions
    recompute = project(on_cuda(tables), list(regions))
    assert len(recompute.host) == 0 and recompute.host_peak_bytes == 0


def held_twice(model: ProjectionModel, p: Projection, state_key: np.ndarray) -> np.ndarray:
    """Naive oracle: per state, the bytes of offloaded tensors on both sides (the outputs from
    the instance's end, the copies brought back from their ALLOC), each to its baseline free."""
    eff, base = model.effects, model._base
    pick = p.checkpointed[eff.copy_instance] & eff.offload[eff.copy_instance]
    events = (p.events.storage, p.events.key, p.events.copy, p.events.kind)
    output_free = {
        int(s): int(k)
        for s, k, c, kind in zip(*events, strict=True)
        if not c and kind == MemoryEventKind.FREE  # of an original
    }
    out = np.zeros(len(state_key), dtype=np.int64)
    for i, s in zip(eff.copy_instance[pick], eff.copy_storage[pick], strict=True):
        free = base.free_row[s]
        leave = free * base.width + base.width - 1 if free >= 0 else NEVER
        if output_free.get(int(s), NEVER) > eff.end_key[i]:  # stayed on the device: an output
            out += np.where((state_key >= eff.end_key[i]) & (state_key < leave), base.nbytes[s], 0)
        back = (p.events.copy & (p.events.storage == s)).nonzero()[0]
        if back.size:
            came = p.events.key[back[0]]
            out += np.where((state_key >= came) & (state_key < leave), base.nbytes[s], 0)
    return out


def at_keys(p: Projection, keys: np.ndarray) -> np.ndarray:
    """A projection's device total after every event up to each key."""
    return p.total[np.searchsorted(p.events.key, keys, side="right")]


@pytest.fixture(scope="module")
def mixed(tables: RunTables) -> ProjectionModel:
    """A model over each block offloaded and each block recomputed."""
    cuda = on_cuda(tables)
    offload = offload_model(cuda, "encoder.layers.*").candidates
    recompute = resolve_on_trace("all", cuda["modules"], cuda["strings"]).regions
    return ProjectionModel(cuda, [*offload, *recompute])


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_device_and_host_against_the_un_offloaded_plan(
    mixed: ProjectionModel, data: st.DataObject
) -> None:
    """NOTE [ Host curve ]: after each key, device + host = un-offloaded + held twice, for any
    mix of offloaded and recomputed blocks; the un-offloaded plan is the same instances but
    the offloading ones (a block both offloaded and recomputed is one of them, not both)."""
    model = mixed
    n = len(model.candidates)
    chosen = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    p = model.project(chosen)
    if not p.offloaded_bytes:
        assert len(p.host) == 0
        return
    eff = model.effects
    without_p = project_active(eff, model._base, p.checkpointed & ~eff.offload)
    keys = np.unique(np.concatenate([p.events.key, without_p.events.key]))
    host = p.host[np.searchsorted(p.events.key, keys, side="right")]
    twice = held_twice(model, p, keys)
    np.testing.assert_array_equal(at_keys(p, keys) + host, at_keys(without_p, keys) + twice)


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_the_model_draws_the_exact_host_curve(mixed: ProjectionModel, data: st.DataObject) -> None:
    """``ProjectionModel.curve`` carries the host curve of ``project`` on its own states (each
    state's key: the key it stands for, a spike's just before its recompute's)."""
    model = mixed
    n = len(model.candidates)
    chosen = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    curve, p = model.curve(chosen), model.project(chosen)
    if not p.offloaded_bytes:
        assert len(curve.host) == 0
        return
    ix, c = model._index, model._curve
    assert c is not None
    spike = np.flatnonzero(p.checkpointed[ix.spike_instance])
    orders = np.insert(
        c.order, np.searchsorted(c.order, ix.spike_order[spike]), ix.spike_order[spike]
    )
    state_key = orders // 2  # a spike (2 x key - 1) stands after the events before its key
    expected = p.host[np.searchsorted(p.events.key, state_key, side="right")]
    assert len(curve.host) == len(curve.total)
    np.testing.assert_array_equal(curve.host, expected)
    assert int(curve.host.max()) == p.host_peak_bytes


@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(1, 100)), max_size=12),
)
def test_host_curve_matches_a_naive_count(tensors: list[tuple[int, int, int]]) -> None:
    state_key = np.arange(-1, 32, dtype=np.int64)
    arrive = np.array([a for a, _, _ in tensors], dtype=np.int64)
    leave = np.array([max(a, b) if b < 30 else NEVER for a, b, _ in tensors], dtype=np.int64)
    nbytes = np.array([n for _, _, n in tensors], dtype=np.int64)
    naive = [
        sum(int(n) for a, b, n in zip(arrive, leave, nbytes, strict=True) if a <= k < b)
        for k in state_key
    ]
    assert host_curve(state_key, arrive, leave, nbytes).tolist() == naive
