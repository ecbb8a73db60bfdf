"""The CUDA caching allocator model (NOTE [ The caching allocator's rules ] in
ckview/analysis/allocator.py): the real snapshot fixture's reserved memory replayed exactly, each
rule on a hand-made stream, and reserved >= allocated on random streams."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from snapshot_helpers import fixture_path, today, torch_2_1

from ckview.analysis.allocator import (
    EVENT_DTYPE,
    LARGE_BUFFER,
    SMALL_BUFFER,
    AllocatorReplay,
    AllocatorSettings,
    events_from_run,
    parse_alloc_conf,
    replay,
    reserved_curve,
    round_size,
    settings_from_meta,
)
from ckview.snapshot import SnapshotError, load_snapshot, snapshot_to_trace
from ckview.trace import open_trace
from ckview.trace.schema import MemoryEventKind

MIB = 1 << 20
FIXTURE = fixture_path()


def allocs(*sizes: int, stream: int = 0) -> list[tuple[int, int, int, int, int]]:
    """Events allocating ``sizes`` as blocks 0, 1, ... at times 0, 1, ..."""
    return [(i, size, i, stream, 0) for i, size in enumerate(sizes)]


def deltas(events: list[tuple[int, int, int, int, int]], **conf: Any) -> list[int]:
    """Segment changes of a replay from empty, in order."""
    return replay(events, AllocatorSettings(**conf)).segment_events["delta"].tolist()


def fixture_replay(
    model: AllocatorReplay | None = None,
) -> tuple[list[tuple[int, int]], Any]:
    """The fixture's history through the model, from the state it began with.

    The initial state: segments of the final state that the history never reserved, holding the
    blocks live in the final state that the history never allocated (the fixture frees no block
    it did not allocate), given to ``model`` (a fresh one by default). Returns the recorded
    ``(event, bytes)`` of each ``segment_alloc`` (the event being the allocation it served) and
    the replay.
    """
    assert FIXTURE is not None
    snap = load_snapshot(FIXTURE)
    (history,) = snap["device_traces"]
    reserved_in_history = {e["addr"] for e in history if e["action"] == "segment_alloc"}
    open_blocks: set[int] = set()
    for e in history:
        if e["action"] == "alloc":
            open_blocks.add(e["addr"])
        elif e["action"] == "free_completed":
            assert e["addr"] in open_blocks, "the fixture frees a block live before its history"
            open_blocks.discard(e["addr"])
    model = model if model is not None else AllocatorReplay()
    for seg in snap["segments"]:
        if seg["address"] not in reserved_in_history:
            live = [
                (b["address"], b["address"], b["size"])
                for b in seg["blocks"]
                if b["state"] == "active_allocated" and b["address"] not in open_blocks
            ]
            small = seg["segment_type"] == "small"
            model.add_segment(0, seg["stream"], small, seg["address"], seg["total_size"], live)
    events: list[tuple[int, int, int, int, int]] = []
    recorded: list[tuple[int, int]] = []
    for e in history:
        if e["action"] == "alloc":
            events.append((e["time_us"], e["size"], e["addr"], e["stream"], 0))
        elif e["action"] == "free_completed":
            events.append((e["time_us"], -e["size"], e["addr"], e["stream"], 0))
        elif e["action"] in ("segment_alloc", "segment_free"):
            sign = 1 if e["action"] == "segment_alloc" else -1
            # segment_alloc comes just before the alloc it serves; segment_free (empty_cache or
            # the OOM path) just after the event that released it.
            recorded.append((len(events) - (sign < 0), sign * e["size"]))
    return recorded, replay(events, model=model)


@pytest.mark.skipif(FIXTURE is None, reason="the CUDA snapshot fixture is absent")
def test_fixture_reserved_curve_is_replayed_exactly() -> None:
    """All rules together: every segment the real allocator reserved, at the same event with the
    same size, and no other; the reserved memory at the end is that of the final segments."""
    recorded, curve = fixture_replay()
    assert curve.oom_index is None
    got = curve.segment_events[["index", "delta"]].tolist()
    assert len(recorded) == 7
    assert got == recorded
    snap = load_snapshot(FIXTURE) if FIXTURE else {}
    assert curve.reserved[-1] == sum(s["total_size"] for s in snap["segments"])
    assert (curve.reserved >= curve.allocated).all()


@pytest.mark.skipif(FIXTURE is None, reason="the CUDA snapshot fixture is absent")
def test_fixture_final_blocks_are_replayed_exactly() -> None:
    """Splitting and merging (rules 3, 5, 6): every block of every final segment, at the same
    offset in its segment, of the same size and state. The model's own segments are matched to
    the recorded ones by the order they were reserved in."""
    snap = load_snapshot(FIXTURE) if FIXTURE else {}
    history = snap["device_traces"][0]
    model = AllocatorReplay()
    assert fixture_replay(model)[1].oom_index is None
    recorded_order = [e["addr"] for e in history if e["action"] == "segment_alloc"]
    initial = [s["address"] for s in snap["segments"] if s["address"] not in recorded_order]
    final = {
        s["address"]: [
            (b["address"] - s["address"], b["size"], b["state"] == "active_allocated")
            for b in s["blocks"]
        ]
        for s in snap["segments"]
    }
    layout = model.layout(0)
    assert len(layout) == len(final) == 10
    for real, (start, _, blocks) in zip(initial + recorded_order, layout, strict=True):
        assert [(a - start, size, live) for a, size, live in blocks] == final[real]


def test_rule_1_rounding() -> None:
    assert [round_size(n) for n in (0, 1, 512, 513, 82880)] == [512, 512, 512, 1024, 82944]
    divided = AllocatorSettings(roundup_power2_divisions=4)
    # 1.2 MB lies between 1 MiB and 2 MiB, in quarters of 256 KiB: rounded up to 1.25 MiB.
    assert round_size(1_200_000, divided) == 1_310_720
    assert round_size(1 << 21, divided) == 1 << 21
    assert round_size(1000, divided) == 1024  # not above 512 x 4: plain 512 B rounding


def test_rules_2_and_4_pools_and_segment_sizes() -> None:
    # The small pool: 2 MiB segments; up to 1 MiB is small.
    assert deltas(allocs(1000, 5000)) == [SMALL_BUFFER]
    assert deltas(allocs(MIB)) == [SMALL_BUFFER]
    # The large pool: 20 MiB for up to 10 MiB, else rounded up to 2 MiB.
    assert deltas(allocs(MIB + 1)) == [LARGE_BUFFER]
    assert deltas(allocs(10 * MIB - 512)) == [LARGE_BUFFER]
    assert deltas(allocs(10 * MIB)) == [10 * MIB]
    assert deltas(allocs(11 * MIB + 1)) == [12 * MIB]
    # Pools are per stream: the same small request on another stream reserves its own segment.
    assert deltas([*allocs(1000), (1, 1000, 1, 7, 0)]) == [SMALL_BUFFER, SMALL_BUFFER]


def test_rule_3_best_fit() -> None:
    model = AllocatorReplay()
    for block, size in enumerate((12 * MIB, 14 * MIB, 16 * MIB)):
        model.alloc(block, size)
    model.free(0)
    model.free(2)
    model.alloc(3, 11 * MIB)  # the smallest that fits: the 12 MiB block, not the 16 MiB one
    assert model.changes == [] and model.largest_free(0) == 16 * MIB
    model.alloc(4, 13 * MIB)  # the 16 MiB block, split: 3 MiB stay free
    assert model.changes == [] and model.largest_free(0) == 3 * MIB


def test_rule_5_splitting_thresholds() -> None:
    # Large pool: 11 MiB remain of a 20 MiB segment: split, the next 9 MiB fits without a segment.
    curve = replay(allocs(9 * MIB, 9 * MIB))
    assert curve.segment_events["delta"].tolist() == [LARGE_BUFFER]
    assert curve.allocated.tolist() == [9 * MIB, 18 * MIB]
    # Exactly 1 MiB would remain: not split, the request takes the whole 20 MiB segment.
    assert replay(allocs(19 * MIB)).allocated.tolist() == [LARGE_BUFFER]
    # Small pool: 512 B remaining is split off and serves the next 512 B request.
    curve = replay(allocs(MIB, MIB - 512, 512))
    assert curve.segment_events["delta"].tolist() == [SMALL_BUFFER]
    assert curve.allocated[-1] == SMALL_BUFFER


def test_rule_6_free_merges_and_keeps_segments() -> None:
    events = [*allocs(3 * MIB, 3 * MIB), (2, -1, 0, 0, 0), (3, -1, 1, 0, 0)]
    curve = replay(events)
    assert curve.reserved.tolist() == [LARGE_BUFFER] * 4
    assert curve.allocated.tolist() == [3 * MIB, 6 * MIB, 3 * MIB, 0]
    assert curve.largest_free.tolist() == [17 * MIB, 14 * MIB, 14 * MIB, LARGE_BUFFER]


def test_rule_3_and_5_max_split_size() -> None:
    # A cached 50 MiB block serves a small request by default (split) ...
    events = [(0, 50 * MIB, 0, 0, 0), (1, -1, 0, 0, 0), (2, 5 * MIB, 1, 0, 0)]
    assert deltas(events) == [50 * MIB]
    # ... but not under max_split_size (40 MiB): the request reserves its own segment.
    assert deltas(events, max_split_size=40 * MIB) == [50 * MIB, LARGE_BUFFER]
    # A request over it takes a block less than 20 MiB larger whole, never split.
    events[2] = (2, 45 * MIB, 1, 0, 0)
    curve = replay(events, AllocatorSettings(max_split_size=40 * MIB))
    assert curve.segment_events["delta"].tolist() == [50 * MIB]
    assert curve.allocated[-1] == 50 * MIB


def test_rule_7_release_cached_then_out_of_memory() -> None:
    conf = AllocatorSettings(capacity=40 * MIB)
    events = [(0, 12 * MIB, 0, 0, 0), (1, -1, 0, 0, 0), (2, 30 * MIB, 1, 0, 0)]
    curve = replay([*events, (3, 20 * MIB, 2, 0, 0)], conf)
    # No room for 30 MiB beside the cached 12 MiB: that segment is released, then 30 reserved.
    assert curve.segment_events[["index", "delta"]].tolist() == [
        (0, 12 * MIB),
        (2, -12 * MIB),
        (2, 30 * MIB),
    ]
    # Nothing cached is left to release for 20 MiB more: out of memory at that event.
    assert curve.oom_index == 3 and len(curve.reserved) == 3
    assert "no room for a 20971520-byte segment" in curve.oom_message


def test_rule_7_releases_oversize_blocks_first() -> None:
    conf = AllocatorSettings(max_split_size=40 * MIB, capacity=80 * MIB)
    events = [*allocs(50 * MIB, 12 * MIB), (2, -1, 0, 0, 0), (3, -1, 1, 0, 0)]
    curve = replay([*events, (4, 30 * MIB, 2, 0, 0)], conf)
    # The 50 MiB block (over max_split_size) goes; the cached 12 MiB segment stays.
    assert curve.segment_events["delta"].tolist()[2:] == [-50 * MIB, 30 * MIB]
    assert curve.reserved[-1] == 42 * MIB


def test_rule_7_oversize_blocks_not_enough_then_all_cached() -> None:
    conf = AllocatorSettings(max_split_size=40 * MIB, capacity=120 * MIB)
    frees = [(3 + i, -1, i, 0, 0) for i in range(3)]
    curve = replay([*allocs(50 * MIB, 46 * MIB, 12 * MIB), *frees, (6, 100 * MIB, 3, 0, 0)], conf)
    # 50 + 46 MiB of oversize blocks do not cover 100 MiB: every cached segment goes, then 100.
    assert curve.segment_events["delta"].tolist()[3:] == [
        -50 * MIB,
        -46 * MIB,
        -12 * MIB,
        100 * MIB,
    ]


def test_expandable_segments_grow_by_pages() -> None:
    conf = AllocatorSettings(expandable_segments=True)
    curve = replay(allocs(5 * MIB, 5 * MIB, 30 * MIB), conf)
    # One segment: 20 MiB mapped, then the 10 MiB free at its end plus one 20 MiB page.
    assert curve.reserved.tolist() == [LARGE_BUFFER, LARGE_BUFFER, 2 * LARGE_BUFFER]
    assert curve.allocated[-1] == 40 * MIB


def test_parse_alloc_conf() -> None:
    conf = parse_alloc_conf(
        "max_split_size_mb:128, expandable_segments:True,roundup_power2_divisions:4,"
        "garbage_collection_threshold:0.6",
        capacity=80 * MIB,
    )
    assert conf == AllocatorSettings(128 * MIB, 4, True, 80 * MIB)
    assert parse_alloc_conf("max_split_size_mb:1").max_split_size == 20 * MIB  # torch's floor
    assert parse_alloc_conf("") == AllocatorSettings()
    for bad in ("max_split_size_mb", "max_split_size_mb:x", "roundup_power2_divisions:[256:1,>:4]"):
        with pytest.raises(ValueError):
            parse_alloc_conf(bad)


# torch's allocator_settings of a snapshot (torch/csrc/cuda/Module.cpp), 16 intervals.
TORCH_SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,roundup_power2_divisions:[2:4,>:8]",
    "max_split_size": 64 * MIB,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_malloc": False,
    "pinned_use_host_register": False,
    "roundup_power2_divisions": {str(1 << i): 4 if i < 2 else 8 for i in range(16)},
}


def test_settings_from_meta() -> None:
    conf = settings_from_meta(json.dumps(TORCH_SETTINGS), capacity=80 * MIB)
    assert conf == AllocatorSettings(64 * MIB, (4, 4) + (8,) * 14, False, 80 * MIB)
    # Below 4 MiB in quarters, above in eighths: 3 MiB + 1 -> 3.5 MiB; 5 MiB + 1 -> 5.5 MiB.
    assert round_size(3 * MIB + 1, conf) == 7 * MIB // 2
    assert round_size(5 * MIB + 1, conf) == 11 * MIB // 2
    unlimited = json.dumps({**TORCH_SETTINGS, "max_split_size": 2**64 - 1})
    assert settings_from_meta(unlimited).max_split_size is None
    # A recording's meta may hold the environment string alone.
    only_env = json.dumps({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert settings_from_meta(only_env).expandable_segments
    assert settings_from_meta("") == AllocatorSettings()


def test_snapshot_import_keeps_allocator_settings(tmp_path: Path) -> None:
    snap = today(1)
    snap["allocator_settings"] = TORCH_SETTINGS
    snapshot_to_trace(snap, tmp_path / "new.h5")
    snapshot_to_trace(torch_2_1(), tmp_path / "old.h5")
    with open_trace(tmp_path / "new.h5") as trace:
        assert json.loads(trace.meta.allocator_settings) == TORCH_SETTINGS
        assert settings_from_meta(trace.meta.allocator_settings).max_split_size == 64 * MIB
    with open_trace(tmp_path / "old.h5") as trace:
        assert trace.meta.allocator_settings == ""  # torch 2.1 wrote none
    snap["allocator_settings"] = ["max_split_size_mb:64"]
    with pytest.raises(SnapshotError, match="allocator_settings is a list, not a dict"):
        snapshot_to_trace(snap, tmp_path / "bad.h5")
    assert not (tmp_path / "bad.h5").exists()


def test_events_from_run() -> None:
    kinds = np.array(
        [
            MemoryEventKind.SEEN,
            MemoryEventKind.ALLOC,
            MemoryEventKind.ALLOC,
            MemoryEventKind.FREE,
            MemoryEventKind.ALLOC,
        ],
        np.uint8,
    )
    storage = np.array([0, 1, 2, 1, 3])
    times = np.arange(5) * 10
    nbytes = np.array([100, 200, 300, 0])
    device_of = np.array([5, 5, 9, 5])  # string ids: 5 is "cuda:1", 9 is "cpu"
    rows = events_from_run(kinds, storage, times, nbytes, device_of, {5: 1})
    assert rows.tolist() == [(0, 100, 0, 0, 1), (10, 200, 1, 0, 1), (30, -200, 1, 0, 1)]
    times_out, reserved, segments = reserved_curve(rows)
    assert times_out.tolist() == [0, 10, 30] and reserved.tolist() == [SMALL_BUFFER] * 3
    assert segments[["index", "device", "delta"]].tolist() == [(0, 1, SMALL_BUFFER)]


SIZES = st.one_of(st.integers(1, MIB), st.integers(MIB, 12 * MIB), st.integers(12 * MIB, 64 * MIB))


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), SIZES, st.integers(0, 1)), max_size=60),
    max_split=st.sampled_from([None, 24 * MIB]),
    expandable=st.booleans(),
    capacity=st.sampled_from([None, 200 * MIB]),
)
def test_reserved_covers_allocated_and_moves_only_at_segment_events(
    ops: list[tuple[bool, int, int]], max_split: int | None, expandable: bool, capacity: int | None
) -> None:
    """The invariants of NOTE [ The caching allocator's rules ]: reserved >= allocated at every
    event, and reserved changes only by the segment changes reported at that event."""
    live: list[int] = []
    events = []
    for t, (free, size, stream) in enumerate(ops):
        if free and live:
            events.append((t, -1, live.pop(size % len(live)), 0, 0))
        else:
            live.append(t)
            events.append((t, size, t, stream, 0))
    conf = AllocatorSettings(max_split, 0, expandable, capacity)
    curve = replay(np.array(events, dtype=EVENT_DTYPE), conf)
    assert (curve.reserved >= curve.allocated).all()
    assert (curve.largest_free <= curve.reserved - curve.allocated).all()
    step = np.diff(curve.reserved, prepend=0)
    moved = np.zeros(len(step), np.int64)
    np.add.at(moved, curve.segment_events["index"], curve.segment_events["delta"])
    assert (step == moved).all()
    if capacity is not None:
        assert (curve.reserved <= capacity).all()
