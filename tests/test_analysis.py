"""Tests of ckview.analysis on small hand-made tables, checked against naive Python loops."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckview.analysis import (
    NO_MODULE,
    ActivationPeak,
    activation_peak,
    bytes_by_category,
    bytes_by_module,
    find_peak,
    format_bytes,
    live_storages,
    memory_timeline,
    module_paths,
    parse_bytes,
    step_allocated_peaks,
    summarize_run,
)
from ckview.trace.schema import MODULES, RUN_TABLES, Category, MemoryEventKind

ALLOC, FREE, SEEN = MemoryEventKind.ALLOC, MemoryEventKind.FREE, MemoryEventKind.SEEN
Table = dict[str, np.ndarray]
Event = tuple[MemoryEventKind, int]
Trace = tuple[list[int], list[Event], list[int], list[int]]  # sizes, events, pre, categories


def empty_table(name: str, n: int) -> Table:
    """A run table of ``n`` rows with the schema's dtypes, index columns at -1, others at 0."""
    return {
        c.name: np.full(
            n, -1 if c.name in {"op", "module_call", "module", "parent"} else 0, dtype=c.dtype
        )
        for c in RUN_TABLES[name]
    }


def make_trace(
    sizes: Sequence[int],
    events: Sequence[Event],
    pre: Sequence[int] = (),
    categories: Sequence[int] | None = None,
    times: Sequence[int] | None = None,
) -> tuple[Table, Table]:
    """``(storages, memory_events)`` from storage sizes and a list of (kind, storage) events.

    Storages in ``pre`` existed before recording (``alloc_ns == -1``); events are 10 ns apart
    unless ``times`` says otherwise.
    """
    storages = empty_table("storages", len(sizes))
    storages["nbytes"][:] = sizes
    storages["category"][:] = Category.TEMPORARY if categories is None else categories
    storages["alloc_ns"][list(pre)] = -1
    table = empty_table("memory_events", len(events))
    table["kind"][:] = [kind for kind, _ in events]
    table["storage"][:] = [storage for _, storage in events]
    table["time_ns"][:] = np.arange(len(events)) * 10 if times is None else times
    return storages, table


def naive_live(
    pre: Sequence[int], events: Sequence[Event], categories: Sequence[int]
) -> list[set[int]]:
    """Set of live storages at each point, by replaying the events one by one: pre-existing
    storages are live from the start, inputs and others from their SEEN (NOTE [ Pre-existing
    storages ])."""
    arrives = {s for s in pre if categories[s] in (Category.INPUT, Category.OTHER)}
    live = set(pre) - arrives
    points = [set(live)]
    for kind, storage in events:
        if kind == ALLOC or (kind == SEEN and storage in arrives):
            live.add(storage)
        elif kind == FREE:
            live.discard(storage)
        points.append(set(live))
    return points


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Valid random traces: per storage at most one ALLOC (or a SEEN if pre-existing), then
    at most one FREE, interleaved in any order. Times repeat to exercise NOTE [ Event order ]."""
    n = draw(st.integers(0, 12))
    sizes = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    categories = draw(st.lists(st.sampled_from(list(Category)), min_size=n, max_size=n))
    pre = [s for s in range(n) if draw(st.booleans())]
    lifetimes: dict[int, list[MemoryEventKind]] = {}
    for s in range(n):
        freed = draw(st.booleans())
        if s in pre:  # a FREE comes after a SEEN (the validator's rule)
            lifetimes[s] = [SEEN] if freed or draw(st.booleans()) else []
        else:
            lifetimes[s] = [ALLOC]
        lifetimes[s] += [FREE] if freed else []
    order = draw(st.permutations([s for s, kinds in lifetimes.items() for _ in kinds]))
    events = [(lifetimes[s].pop(0), s) for s in order]
    return sizes, events, pre, [int(c) for c in categories]


@given(traces())
def test_timeline_matches_naive_replay(trace: Trace):
    sizes, events, pre, categories = trace
    storages, table = make_trace(sizes, events, pre, categories, times=[0] * len(events))
    tl = memory_timeline(storages, table)
    for point, live in enumerate(naive_live(pre, events, categories)):
        assert tl.total[point] == sum(sizes[s] for s in live)
        for c in Category:
            assert tl.by_category[c, point] == sum(sizes[s] for s in live if categories[s] == c)
        assert live_storages(storages, table, point - 1).tolist() == sorted(live)
    assert tl.event.tolist() == list(range(-1, len(events)))


@given(traces())
def test_categories_add_up_to_total(trace: Trace):
    sizes, events, pre, categories = trace
    tl = memory_timeline(*make_trace(sizes, events, pre, categories))
    assert tl.by_category.shape == (len(Category), len(events) + 1)
    np.testing.assert_array_equal(tl.by_category.sum(axis=0), tl.total)


def test_preexisting_storage_is_live_from_start_and_seen_changes_nothing():
    # NOTE [ Pre-existing storages ]: storage 0 existed before recording.
    events = [(SEEN, 0), (ALLOC, 1), (FREE, 0), (FREE, 1)]
    storages, table = make_trace([100, 200], events, pre=[0])
    tl = memory_timeline(storages, table)
    assert tl.total.tolist() == [100, 100, 300, 200, 0]
    assert tl.time_ns.tolist() == [0, 0, 10, 20, 30]
    assert live_storages(storages, table, -1).tolist() == [0]
    assert live_storages(storages, table, 0).tolist() == [0]
    assert live_storages(storages, table, 1).tolist() == [0, 1]
    assert live_storages(storages, table, 2).tolist() == [1]


def test_preexisting_storage_never_seen_still_counts():
    storages, table = make_trace([100, 7], [(ALLOC, 1)], pre=[0])
    assert memory_timeline(storages, table).total.tolist() == [100, 107]


def test_empty_trace_has_one_point_at_time_zero():
    storages, table = make_trace([64], [], pre=[0])
    tl = memory_timeline(storages, table)
    assert tl.total.tolist() == [64]
    assert tl.time_ns.tolist() == [0]
    assert tl.event.tolist() == [-1]
    assert find_peak(tl).bytes == 64


def test_point_zero_takes_the_time_of_the_first_event():
    storages, table = make_trace([1], [(ALLOC, 0)], times=[500])
    assert memory_timeline(storages, table).time_ns.tolist() == [500, 500]


def test_events_are_ordered_by_row_even_at_equal_times():
    # NOTE [ Event order ]: the alloc and free share a time; the peak lies between them.
    storages, table = make_trace([8], [(ALLOC, 0), (FREE, 0)], times=[5, 5])
    peak = find_peak(memory_timeline(storages, table))
    assert (peak.point, peak.event, peak.time_ns, peak.bytes) == (1, 0, 5, 8)


def test_find_peak_returns_first_maximum_and_respects_range():
    sizes = [5, 2, 5]
    events = [(ALLOC, 0), (FREE, 0), (ALLOC, 1), (ALLOC, 2), (FREE, 1)]
    tl = memory_timeline(*make_trace(sizes, events))
    assert tl.total.tolist() == [0, 5, 0, 2, 7, 5]
    assert find_peak(tl).point == 4
    assert find_peak(tl, 0, 4).point == 1
    assert find_peak(tl, 5).point == 5
    peak = find_peak(tl, 2, 4)
    assert (peak.point, peak.event, peak.time_ns, peak.bytes) == (3, 2, 20, 2)
    with pytest.raises(ValueError, match="no timeline points"):
        find_peak(tl, 3, 3)


def test_find_peak_first_of_equal_maxima():
    events = [(ALLOC, 0), (FREE, 0), (ALLOC, 1)]
    tl = memory_timeline(*make_trace([4, 4], events))
    assert find_peak(tl).point == 1


def test_live_storages_rejects_out_of_range_event():
    storages, table = make_trace([1], [(ALLOC, 0)])
    with pytest.raises(ValueError, match=r"after_event must be in \[-1, 0\]"):
        live_storages(storages, table, 1)
    with pytest.raises(ValueError):
        live_storages(storages, table, -2)


def test_bytes_by_category_lists_every_category():
    storages, _ = make_trace([10, 20, 30], [], categories=[Category.PARAMETER, 3, 3])
    result = bytes_by_category(storages, np.array([0, 2]))
    assert list(result) == list(Category)
    assert result[Category.PARAMETER] == 10
    assert result[Category.ACTIVATION] == 30
    assert sum(result.values()) == 40


def steps_table(first_events: Sequence[int]) -> Table:
    steps = empty_table("steps", len(first_events))
    steps["step"][:] = np.arange(len(first_events))
    steps["first_memory_event"][:] = first_events
    return steps


def test_step_allocated_peaks_ignores_frees_of_earlier_storages():
    # NOTE [ Allocated since step start ]
    sizes = [100, 50, 30, 10, 1000]
    events = [
        (ALLOC, 0), (ALLOC, 1),                          # step 0: 150
        (FREE, 0), (ALLOC, 2), (FREE, 2), (ALLOC, 3),   # step 1: frees 0 (ignored), peak 30
        (FREE, 1), (FREE, 4), (FREE, 3),                 # step 2: frees only
    ]  # fmt: skip
    storages, table = make_trace(sizes, events, pre=[4])
    peaks = step_allocated_peaks(storages, table, steps_table([0, 2, 6]))
    assert peaks.tolist() == [150, 30, 0]


def test_step_allocated_peaks_skips_events_before_first_step_and_empty_steps():
    events = [(ALLOC, 0), (ALLOC, 1), (FREE, 0), (ALLOC, 2)]
    storages, table = make_trace([7, 5, 3], events)
    assert step_allocated_peaks(storages, table, steps_table([1, 3, 3])).tolist() == [5, 0, 3]
    assert step_allocated_peaks(storages, table, steps_table([4])).tolist() == [0]
    assert step_allocated_peaks(storages, table, steps_table([])).tolist() == []


def test_step_allocated_peaks_rejects_unordered_steps():
    storages, table = make_trace([1], [(ALLOC, 0)])
    with pytest.raises(ValueError, match="non-decreasing"):
        step_allocated_peaks(storages, table, steps_table([1, 0]))


@given(traces(), st.lists(st.integers(0, 30), max_size=4))
def test_step_allocated_peaks_matches_naive_loop(trace: Trace, cuts: list[int]):
    sizes, events, pre, _ = trace
    first = sorted(min(c, len(events)) for c in cuts)
    got = step_allocated_peaks(*make_trace(sizes, events, pre), steps_table(first))
    bounds = [*first, len(events)]
    expected = [naive_allocated_peak(sizes, events[a:b]) for a, b in pairwise(bounds)]
    assert got.tolist() == expected


def naive_allocated_peak(sizes: Sequence[int], events: Sequence[Event]) -> int:
    seen: set[int] = set()
    running = peak = 0
    for kind, storage in events:
        if kind == ALLOC:
            seen.add(storage)
            running += sizes[storage]
        elif kind == FREE and storage in seen:
            running -= sizes[storage]
        peak = max(peak, running)
    return peak


STRINGS = ["", "Net", "fc1", "fc2", "Linear", "aten.mm.default", "aten.relu.default",
           "float32", "64x128", "Loss"]  # fmt: skip


def modules_table(paths: Sequence[int], types: Sequence[int], parents: Sequence[int]) -> Table:
    n = len(paths)
    columns = {"path": paths, "type": types, "parent": parents, "param_bytes": [0] * n}
    columns |= {"container": [0] * n, "sequential_forward": [0] * n}
    return {c.name: np.asarray(columns[c.name], dtype=c.dtype) for c in MODULES}


def test_module_paths_prefix_the_root_type():
    # Net, Net.fc1, Net.fc2, and a second root Loss with a child at path 'fc1'.
    modules = modules_table([0, 2, 3, 0, 2], [1, 4, 4, 9, 4], [-1, 0, 0, -1, 3])
    assert module_paths(modules, STRINGS) == ["Net", "Net.fc1", "Net.fc2", "Loss", "Loss.fc1"]


def test_module_paths_follow_deep_chains_and_reject_cycles():
    modules = modules_table([0, 2, 3], [1, 4, 4], [-1, 0, 1])
    assert module_paths(modules, STRINGS)[2] == "Net.fc2"
    with pytest.raises(ValueError, match="cycle"):
        module_paths(modules_table([2, 3], [4, 4], [1, 0]), STRINGS)


def test_bytes_by_module_groups_outside_calls_under_minus_one():
    storages, _ = make_trace([10, 20, 30, 40, 5], [])
    storages["module"][:] = [-1, 0, 1, 1, 1]
    rows = np.arange(5)
    assert bytes_by_module(storages, rows) == [(1, 75), (0, 20), (-1, 10)]
    assert bytes_by_module(storages, rows, top=1) == [(1, 75)]
    assert bytes_by_module(storages, np.array([], dtype=np.int64)) == []


def two_step_run() -> dict[str, Table]:
    """A two-step run with known numbers (see ``test_summarize_two_step_run``).

    Storages: 0 parameter 1000 and 1 input 100 (both pre-existing), 2 activation 400 (fc1,
    step 0), 3 temporary 50 (fc2, step 0), 4 gradient 1000 (no module, step 0), 5 activation 400
    (fc1, step 1), 6 temporary 300 (fc2, step 1).
    """
    events = [
        (SEEN, 0), (SEEN, 1), (ALLOC, 2), (ALLOC, 3), (FREE, 3), (ALLOC, 4), (FREE, 2),
        (ALLOC, 5), (ALLOC, 6), (FREE, 4), (FREE, 6), (FREE, 5),
    ]  # fmt: skip
    sizes = [1000, 100, 400, 50, 1000, 400, 300]
    A, T = Category.ACTIVATION, Category.TEMPORARY
    categories = [Category.PARAMETER, Category.INPUT, A, T, Category.GRADIENT, A, T]
    storages, memory_events = make_trace(sizes, events, [0, 1], categories, times=None)
    memory_events["time_ns"][:] = np.arange(len(events)) * 100
    storages["module_call"][:] = [-1, -1, 1, 2, -1, 4, 5]
    storages["module"][:] = [-1, -1, 1, 2, -1, 1, 2]
    storages["op"][:] = [-1, -1, 0, 1, 2, 3, 4]
    storages["shape"][:] = 8
    storages["dtype"][:] = 7
    module_calls = empty_table("module_calls", 6)
    module_calls["module"][:] = [0, 1, 2, 0, 1, 2]
    ops = empty_table("ops", 5)
    ops["name"][:] = [5, 6, 5, 5, 6]
    steps = steps_table([0, 7])
    steps["start_ns"][:] = [0, 700]
    steps["end_ns"][:] = [700, 1300]
    steps["forwards"][:] = [4, 1]  # a step of 4 micro-batches, then one cut short
    steps["backwards"][:] = [4, 0]
    steps["optimizer_steps"][:] = [1, 0]
    steps["complete"][:] = [1, 0]
    return {
        "steps": steps,
        "module_calls": module_calls,
        "ops": ops,
        "memory_events": memory_events,
        "storages": storages,
        "saved_events": empty_table("saved_events", 0),
    }


def test_summarize_two_step_run():
    modules = modules_table([0, 2, 3], [1, 4, 4], [-1, 0, 0])
    summary = summarize_run(two_step_run(), modules, STRINGS, top=2)
    # Live after each event: 1000 1100 1500 1550 1500 2500 2100 | 2500 2800 1800 1500 1100
    # (the input arrives at its SEEN: NOTE [ Pre-existing storages ])
    assert summary.baseline_bytes == 1000
    assert (summary.peak_bytes, summary.peak_event, summary.peak_time_ns) == (2800, 8, 800)
    assert summary.peak_step == 1
    assert summary.by_category == {
        "parameter": 1000, "gradient": 1000, "optimizer_state": 0, "activation": 400,
        "temporary": 300, "input": 100, "other": 0, "sharded_parameter": 0,
        "unsharded_parameter": 0, "comm_buffer": 0, "unknown": 0,
    }  # fmt: skip
    assert summary.activation_bytes_saved == 400
    assert summary.top_modules == [(NO_MODULE, 2100), ("Net.fc1", 400)]
    assert [s["storage"] for s in summary.top_storages] == [0, 4]  # tie: lower row first
    assert summary.top_storages[1] == {
        "storage": 4, "nbytes": 1000, "category": "gradient", "shape": "64x128",
        "dtype": "float32", "module": NO_MODULE, "op": "aten.mm.default",
        "allocated_at": "",
    }  # fmt: skip
    assert summary.top_storages[0]["op"] == ""  # pre-existing: no op created it
    held = ({"forwards": 4, "backwards": 4, "optimizer_steps": 1, "complete": 1},
            {"forwards": 1, "backwards": 0, "optimizer_steps": 0, "complete": 0})  # fmt: skip
    assert summary.steps == [
        {"step": 0, "duration_ns": 700, **held[0], "peak_bytes": 2500,
         "allocated_peak_bytes": 1400},
        {"step": 1, "duration_ns": 600, **held[1], "peak_bytes": 2800,
         "allocated_peak_bytes": 700},
    ]  # fmt: skip
    assert (summary.n_ops, summary.n_memory_events) == (5, 12)
    # Storage 2 (fc1, 400 B) is the first activation: the high-water mark, in step 0.
    assert summary.activation_peak == ActivationPeak(
        bytes=400, time_ns=200, event=2, step=0, top_modules=[("Net.fc1", 400)]
    )


@given(traces())
def test_activation_peak_matches_naive_replay(trace: Trace):
    sizes, events, pre, categories = trace
    storages, table = make_trace(sizes, events, pre, categories)
    steps = steps_table([0])
    tables = {"storages": storages, "memory_events": table, "steps": steps}
    paths = [""]
    peak = activation_peak(tables, memory_timeline(storages, table), paths)
    live_activation = [
        sum(sizes[s] for s in live if categories[s] == Category.ACTIVATION)
        for live in naive_live(pre, events, categories)
    ]
    highest = max(live_activation)
    first = live_activation.index(highest)
    assert (peak.bytes, peak.event) == (highest, first - 1)
    assert sum(b for _, b in peak.top_modules) == highest


def test_summary_to_json_is_plain_python():
    modules = modules_table([0, 2, 3], [1, 4, 4], [-1, 0, 0])
    data = summarize_run(two_step_run(), modules, STRINGS).to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["top_modules"][1] == ["Net.fc1", 400]
    modules_of = {s["storage"]: s["module"] for s in data["top_storages"]}
    assert modules_of == {0: NO_MODULE, 4: NO_MODULE, 5: "Net.fc1", 6: "Net.fc2", 1: NO_MODULE}


def test_summary_peak_at_baseline_has_no_step():
    tables = two_step_run()
    tables["memory_events"]["kind"][:] = SEEN  # nothing is ever allocated or freed
    tables["storages"]["category"][1] = Category.GRADIENT  # an input would arrive at its SEEN
    summary = summarize_run(tables, modules_table([0], [1], [-1]), STRINGS)
    assert (summary.peak_bytes, summary.peak_event, summary.peak_step) == (1100, -1, -1)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (12 * 2**20, "12.0 MiB"),
        (int(1.5 * 2**30), "1.50 GiB"),
        (300 * 2**20, "300 MiB"),
        (2**20 - 1, "1.00 MiB"),  # 1023.999 KiB would round to '1024 KiB'
        (int(9.999 * 2**10), "10.0 KiB"),
        (-3 * 2**30, "-3.00 GiB"),
        (2**70, "1024 EiB"),
    ],
)
def test_format_bytes(n: int, text: str):
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("3GiB", 3 * 2**30),
        ("1.5 GiB", 3 * 2**29),
        ("512MB", 512 * 10**6),
        ("512mib", 512 * 2**20),
        ("2G", 2 * 2**30),
        ("4096", 4096),
        ("10 B", 10),
        (" 0.5k ", 512),
        (".25KiB", 256),
        ("1.5", 2),  # rounded to whole bytes, half to even
    ],
)
def test_parse_bytes(text: str, n: int):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "1.5 GiBs", "3 XB", "1e9", "1,5GB", "1 2"])
def test_parse_bytes_rejects_bad_input_with_help(text: str):
    with pytest.raises(ValueError, match=r"cannot read .* as a size.*e\.g\. '512MiB'"):
        parse_bytes(text)


@given(st.integers(0, 2**62))
def test_parse_bytes_reads_back_format_bytes(n: int):
    # Three significant digits: within half a unit of the last digit, i.e. 0.5 %.
    assert abs(parse_bytes(format_bytes(n)) - n) <= 0.005 * n + 1


def test_parse_budget() -> None:
    """One reading of a budget for `ckview plan --budget` and the explorer's budget field."""
    from ckview.analysis import parse_budget

    assert parse_budget(" 60 % ").bytes(1000) == 600
    assert parse_budget("1.5 KiB").bytes(10**9) == 1536
    assert parse_budget("60 B").bytes(10**9) == 60  # bytes, when said so
    for bad, why in (
        ("0%", "no memory at all"),
        ("0", "no memory at all"),
        ("lots", "size"),
        (
            "60",
            "has no unit: write a size such as '60 MiB' or a share of the run's peak such as '60%'",
        ),
        (" 1.5 ", "'1.5 MiB'"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_budget(bad)


def test_compare_ranks_lists_the_same_module_in_each() -> None:
    from ckview.analysis.ranks import compare_ranks

    modules = modules_table([0, 2, 3], [1, 4, 4], [-1, 0, 0])
    one = summarize_run(two_step_run(), modules, STRINGS, top=10)
    c = compare_ranks(["rank 0", "rank 1"], [one, one], top=10)
    assert c.imbalance == 1.0 and c.highest == c.lowest == 0
    assert [values for _, values in c.modules] == [[b, b] for _, b in one.top_modules]
