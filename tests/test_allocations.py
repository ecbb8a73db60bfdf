"""The merge of the allocator's events into the op hook's rows (recorder/allocations.py), on
synthetic windows where the right answer is known: NOTE [ Matching blocks ]."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from recorder.allocations import (
    AllocatorEvents,
    AllocatorMerge,
    AllocatorWindow,
    Block,
    clock_offset,
)

pytestmark = pytest.mark.torch

ALLOC, FREE, SEEN = 0, 1, 2


def window(*events: tuple[int, int, int], device: str = "cpu") -> AllocatorWindow:
    """Allocator events ``(time_ns, address, +bytes or -bytes)``."""
    t, a, n = (np.asarray(c, dtype=np.int64) for c in zip(*events, strict=True))
    return AllocatorWindow(time_ns=t, address=a, nbytes=n, device=[device] * len(t))


class Workspaces:
    """``add_workspaces`` that appends storage rows after ``first`` existing ones."""

    def __init__(self, first: int) -> None:
        self.next = first
        self.made: list[tuple[Block, int]] = []

    def __call__(self, blocks: list[Block], ops: np.ndarray) -> int:
        self.made += zip(blocks, ops.tolist(), strict=True)
        self.next += len(blocks)
        return self.next - len(blocks)


def rows(*events: tuple[int, int, int, int]) -> np.ndarray:
    return np.asarray(events, dtype=np.int64).reshape(-1, 4)


def merged(
    merge: AllocatorMerge,
    window: AllocatorWindow,
    events: np.ndarray,
    address: np.ndarray,
    nbytes: np.ndarray,
    **rest: Any,
) -> np.ndarray:
    """``merge.merge`` given the address and size of each storage row (the recorder passes
    those of the storage each event row names)."""
    sids = events[:, 1]
    return merge.merge(window, events, address[sids], nbytes[sids], **rest)


def test_a_storage_takes_its_blocks_times_and_a_workspace_becomes_a_storage() -> None:
    # Op 0 runs 100..200: allocates its output (storage 0 at 0x1000, 64 B) at 110 and a
    # workspace (0x2000, 32 B) at 120, freed at 150; the op hook stamped the ALLOC at 200.
    merge = AllocatorMerge()
    made = Workspaces(first=1)
    out = merged(
        merge,
        window((110, 0x1000, 64), (120, 0x2000, 32), (150, 0x2000, -32)),
        rows((ALLOC, 0, 0, 200)),
        address=np.array([0x1000]),
        nbytes=np.array([64]),
        op_start_ns=np.array([100]),
        first_op=0,
        add_workspaces=made,
    )
    assert out.tolist() == [[ALLOC, 0, 0, 110], [ALLOC, 1, 0, 120], [FREE, 1, 0, 150]]
    ((block, op),) = made.made
    assert (block.address, block.nbytes, block.alloc_ns, block.free_ns, op) == (
        0x2000,
        32,
        120,
        150,
        0,
    )
    assert [(b.storage, b.alloc_ns) for b in merge.touched] == [(0, 110)]


def test_the_peak_inside_an_op_is_the_allocators() -> None:
    """The point of it all: live bytes after each merged event reach the allocator's peak
    (output and workspace at once), which the op hook's rows alone never do."""
    merge = AllocatorMerge()
    out = merged(
        merge,
        window((110, 0x1000, 64), (120, 0x2000, 32), (150, 0x2000, -32)),
        rows((ALLOC, 0, 0, 200)),
        address=np.array([0x1000]),
        nbytes=np.array([64]),
        op_start_ns=np.array([100]),
        first_op=0,
        add_workspaces=Workspaces(first=1),
    )
    sizes = {0: 64, 1: 32}
    live = np.cumsum([sizes[s] * (1 if k == ALLOC else -1) for k, s, _, _ in out.tolist()])
    assert live.max() == 96


def test_a_reused_address_matches_the_block_alive_when_the_op_ended() -> None:
    # 0x1000 is handed out twice: a temporary (storage 0, op 0) freed at 130, then storage 1
    # (op 1, 200..300) allocated at 210.
    merge = AllocatorMerge()
    out = merged(
        merge,
        window((110, 0x1000, 64), (130, 0x1000, -64), (210, 0x1000, 64)),
        rows((ALLOC, 0, 0, 120), (FREE, 0, 0, 131), (ALLOC, 1, 1, 300)),
        address=np.array([0x1000, 0x1000]),
        nbytes=np.array([64, 64]),
        op_start_ns=np.array([100, 200]),
        first_op=0,
        add_workspaces=Workspaces(first=2),
    )
    assert out.tolist() == [[ALLOC, 0, 0, 110], [FREE, 0, 0, 130], [ALLOC, 1, 1, 210]]


def test_a_block_freed_in_a_later_window_keeps_its_storage() -> None:
    merge = AllocatorMerge()
    made = Workspaces(first=0)
    merged(
        merge,
        window((110, 0x3000, 16)),
        rows(),
        address=np.array([], dtype=np.int64),
        nbytes=np.array([], dtype=np.int64),
        op_start_ns=np.array([100]),
        first_op=0,
        add_workspaces=made,
    )
    ((block, _),) = made.made
    later = merged(
        merge,
        window((510, 0x3000, -16)),
        rows(),
        address=np.array([0x3000]),
        nbytes=np.array([16]),
        op_start_ns=np.array([500]),
        first_op=7,
        add_workspaces=made,
    )
    assert later.tolist() == [[FREE, block.storage, 7, 510]]
    assert len(made.made) == 1


def test_a_storage_seen_before_recording_claims_no_later_block() -> None:
    """A SEEN storage (made before recording) freed at 120: the block the allocator later
    hands out at its address is a storage of its own, not the SEEN one's."""
    merge = AllocatorMerge()
    made = Workspaces(first=1)
    out = merged(
        merge,
        window((200, 0x1000, 64), (260, 0x1000, -64)),
        rows((SEEN, 0, -1, 100), (FREE, 0, -1, 120)),
        address=np.array([0x1000]),
        nbytes=np.array([64]),
        op_start_ns=np.array([190]),
        first_op=0,
        add_workspaces=made,
    )
    assert out.tolist() == [
        [SEEN, 0, -1, 100],
        [FREE, 0, -1, 120],
        [ALLOC, 1, 0, 200],
        [FREE, 1, 0, 260],
    ]


def test_a_block_seen_while_live_is_not_a_workspace() -> None:
    """A batch made in another thread (no op hook there) and then used: the SEEN storage
    claims the block, so it is not counted twice."""
    merge = AllocatorMerge()
    made = Workspaces(first=1)
    out = merged(
        merge,
        window((50, 0x5000, 128)),
        rows((SEEN, 0, -1, 100)),
        address=np.array([0x5000]),
        nbytes=np.array([128]),
        op_start_ns=np.array([90]),
        first_op=0,
        add_workspaces=made,
    )
    assert out.tolist() == [[SEEN, 0, -1, 100]]
    assert made.made == []


def test_cuda_blocks_keep_the_allocators_rounded_size() -> None:
    """On CUDA the caching allocator hands out rounded blocks: the storage takes the block's
    size, what ``max_memory_allocated`` counts."""
    merge = AllocatorMerge()
    merged(
        merge,
        window((110, 0x7F0000, 512), device="cuda:0"),
        rows((ALLOC, 0, 0, 150)),
        address=np.array([0x7F0000]),
        nbytes=np.array([400]),
        op_start_ns=np.array([100]),
        first_op=0,
        add_workspaces=Workspaces(first=1),
    )
    (block,) = merge.touched
    assert (block.storage, block.nbytes, block.device) == (0, 512, "cuda:0")


def test_clock_offset_maps_the_profilers_clock_onto_perf_counter() -> None:
    """NOTE [ Profiler clock ]: an allocation lies between the perf_counter readings taken
    just before and after it, once mapped."""
    events = AllocatorEvents()
    from time import perf_counter_ns

    assert events.start()
    before = perf_counter_ns()
    x = torch.empty(1000)
    after = perf_counter_ns()
    del x
    got = events.stop()
    assert got is not None
    allocated = got.time_ns[got.nbytes == 4000]
    assert len(allocated) == 1
    assert before - 20_000 <= allocated[0] <= after + 20_000
    assert abs(clock_offset() - clock_offset()) < 1_000_000


def test_a_script_that_profiles_itself_gets_the_profiler() -> None:
    events = AllocatorEvents()
    undo = events.yield_to_the_script()
    try:
        assert events.start()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            torch.ones(3).sum()
            assert not events.running
            assert not events.start()
        assert events.unavailable == "the script runs torch.profiler itself"
        assert events.start()
        assert events.stop() is not None
    finally:
        undo()
        events.stop()
