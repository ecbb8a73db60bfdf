"""A model of PyTorch's CUDA caching allocator: reserved memory from a stream of allocations.

``reserved_curve(events, settings)`` replays (time, +/-bytes, block id, stream, device) events
through the allocator's rules (torch's ``c10/cuda/CUDACachingAllocator.cpp``, written again here
in Python, torch-free) and gives the reserved bytes after every event and each segment the model
reserves or releases. ``AllocatorReplay`` is the replay itself, for callers that need the
allocated bytes, the fragmentation or an initial state (segments already reserved).
``parse_alloc_conf`` reads a ``PYTORCH_CUDA_ALLOC_CONF`` string and ``settings_from_meta`` a
trace's meta ``allocator_settings``; ``events_from_run`` turns a run's tables into events.

NOTE [ The caching allocator's rules ]
  1. A request is rounded up to a multiple of 512 B (``round_size``; or to a fraction of its power
     of two with ``roundup_power2_divisions``), at least 512 B.
  2. Rounded sizes up to 1 MiB come from the small pool, larger ones from the large pool. Pools
     are per device and per stream: a block freed on one stream is never reused on another.
  3. A request takes the smallest free block of its pool and stream that fits (best fit; equal
     sizes: the lowest address; the model's own segments get increasing addresses, where
     cudaMalloc's may not be). With ``max_split_size``, a request below it never takes a block
     of at least ``max_split_size``, and a request of at least ``max_split_size`` never takes a
     block 20 MiB or more larger than itself.
  4. With no block, a segment is reserved (``cudaMalloc``) of ``allocation_size``: 2 MiB for the
     small pool, 20 MiB for large requests under 10 MiB, else the request rounded up to 2 MiB.
  5. The block is split when what remains is worth keeping (``should_split``): 512 B or more in
     the small pool, more than 1 MiB in the large pool and only for requests below
     ``max_split_size``. Otherwise the request gets the whole block.
  6. A freed block merges with its free neighbours of the same segment. Segments are not
     released on free: reserved memory only changes when a segment is reserved or released.
  7. When the device has no room for a segment (``capacity``): first (with ``max_split_size``)
     free cached blocks of the request's pool of at least ``max_split_size``, the smallest that
     covers the request or else the largest ones; if that fails or leaves no room, every cached
     segment wholly free; if there is still no room, the request is an out-of-memory
     (``OutOfMemory``).
  Only a block that is a whole segment is ever released, so reserved >= allocated always.
  Tests: tests/test_allocator_model.py cites each rule by number; the real snapshot fixture
  replayed through all of them gives the recorded segments and final blocks exactly.

NOTE [ Expandable segments (approximate) ]
  With ``expandable_segments``, torch keeps one segment per pool and stream and maps pages into it
  as needed (2 MiB pages for the small pool, 20 MiB for the large). The model grows that segment
  by whole pages at its end and splits any block (512 B or more remaining), but places blocks as
  the rules above do, not with torch's exact address choices; it releases trailing free pages
  only on the out-of-memory path. Reserved memory from it is an estimate, not a replay.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ckview.trace.schema import MemoryEventKind

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20
#: torch reports an unlimited max_split_size as SIZE_MAX; anything this large is unlimited.
UNLIMITED = 1 << 62

#: One allocation event: positive ``delta`` allocates ``delta`` bytes as ``block``, negative
#: frees ``block`` (its magnitude is not used: the block knows its size).
EVENT_DTYPE = np.dtype(
    [("time", "<i8"), ("delta", "<i8"), ("block", "<i8"), ("stream", "<i8"), ("device", "<i8")]
)

#: A segment reserved (``delta`` > 0) or released (< 0) by the model, after event ``index``.
SEGMENT_EVENT_DTYPE = np.dtype(
    [
        ("index", "<i8"),
        ("time", "<i8"),
        ("device", "<i8"),
        ("stream", "<i8"),
        ("delta", "<i8"),
        ("address", "<i8"),
    ]
)


@dataclass(frozen=True)
class AllocatorSettings:
    """The allocator settings the model follows (``PYTORCH_CUDA_ALLOC_CONF``) and the device size.

    ``max_split_size`` is in bytes (None: unlimited, torch's default);
    ``roundup_power2_divisions`` is one value for all sizes or one per power-of-two interval from
    1 MiB (torch's 16: below 2 MiB, 2-4 MiB, ..., 32 GiB and over); ``capacity`` is the device
    memory in bytes the segments may take (None: unlimited).
    """

    max_split_size: int | None = None
    roundup_power2_divisions: int | tuple[int, ...] = 0
    expandable_segments: bool = False
    capacity: int | None = None


def parse_alloc_conf(conf: str, capacity: int | None = None) -> AllocatorSettings:
    """Settings from a ``PYTORCH_CUDA_ALLOC_CONF`` string, e.g. ``"max_split_size_mb:128"``.

    Keys the model does not follow (``garbage_collection_threshold``, ``backend`` and others) are
    ignored; a malformed entry or a per-size ``roundup_power2_divisions`` list is a ValueError
    (a snapshot's ``allocator_settings`` give those lists resolved: ``settings_from_meta``).
    """
    if "[" in conf:
        raise ValueError(
            "per-size lists in PYTORCH_CUDA_ALLOC_CONF are not supported; give one value"
        )
    max_split: int | None = None
    divisions = 0
    expandable = False
    for entry in filter(None, (part.strip() for part in conf.split(","))):
        key, sep, value = entry.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF entry {entry!r} is not 'key:value'")
        if key == "max_split_size_mb":
            # torch raises a smaller value to 20 MiB (kLargeBuffer).
            max_split = max(_integer(key, value), LARGE_BUFFER >> 20) << 20
        elif key == "roundup_power2_divisions":
            divisions = _integer(key, value)
        elif key == "expandable_segments":
            if value not in ("True", "False"):
                raise ValueError(f"expandable_segments must be True or False, not {value!r}")
            expandable = value == "True"
    return AllocatorSettings(max_split, divisions, expandable, capacity)


def settings_from_meta(settings_json: str, capacity: int | None = None) -> AllocatorSettings:
    """Settings from a trace's meta ``allocator_settings`` (a JSON object, '' if unknown): torch's
    own fields (a snapshot's ``allocator_settings``) where present, else its
    ``PYTORCH_CUDA_ALLOC_CONF`` string; ValueError if it is neither."""
    if not settings_json:
        return AllocatorSettings(capacity=capacity)
    fields = json.loads(settings_json)
    if not isinstance(fields, dict):
        raise ValueError("allocator_settings is not a JSON object")
    if "max_split_size" not in fields:
        return parse_alloc_conf(str(fields.get("PYTORCH_CUDA_ALLOC_CONF", "")), capacity)
    max_split = int(fields["max_split_size"])
    divisions = fields.get("roundup_power2_divisions", 0)
    if isinstance(divisions, dict):  # {"1": d, "2": d, "4": d, ...}: interval start in MiB
        divisions = tuple(int(divisions[k]) for k in sorted(divisions, key=int))
    return AllocatorSettings(
        None if max_split >= UNLIMITED else max_split,
        divisions if isinstance(divisions, tuple) else int(divisions),
        bool(fields.get("expandable_segments", False)),
        capacity,
    )


def _integer(key: str, value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{key} must be a non-negative integer, not {value!r} (lists unsupported)")
    return int(value)


def round_size(size: int, settings: AllocatorSettings = AllocatorSettings()) -> int:
    """The block size a request of ``size`` bytes takes (rule 1)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    divisions = _divisions(size, settings.roundup_power2_divisions)
    if divisions > 1 and size > MIN_BLOCK * divisions:
        return _next_division(size, divisions)
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def _divisions(size: int, divisions: int | tuple[int, ...]) -> int:
    """The divisions that apply to ``size``: its power-of-two interval's, counted from 1 MiB."""
    if isinstance(divisions, int):
        return divisions
    index = max(size.bit_length() - 1 - 20, 0)
    return divisions[min(index, len(divisions) - 1)] if divisions else 0


def _next_division(size: int, divisions: int) -> int:
    """``size`` rounded up to one of ``divisions`` equal steps between two powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def is_small(size: int) -> bool:
    """Whether a rounded size comes from the small pool (rule 2)."""
    return size <= SMALL_SIZE


def allocation_size(size: int) -> int:
    """The segment reserved for a rounded request no cached block can take (rule 4)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(
    block_size: int, size: int, small: bool, settings: AllocatorSettings = AllocatorSettings()
) -> bool:
    """Whether a free block of ``block_size`` given to a request of ``size`` is split (rule 5)."""
    remaining = block_size - size
    if small or settings.expandable_segments:
        return remaining >= MIN_BLOCK
    below_max = settings.max_split_size is None or size < settings.max_split_size
    return below_max and remaining > SMALL_SIZE


class OutOfMemory(Exception):
    """A segment could not be reserved even after releasing the cached ones (rule 7)."""


@dataclass(eq=False)
class _Segment:
    device: int
    stream: int
    small: bool
    address: int
    size: int
    expandable: bool = False


@dataclass(eq=False)
class _Block:
    segment: _Segment
    address: int
    size: int
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def whole(self) -> bool:
        return self.prev is None and self.next is None


@dataclass
class SegmentChange:
    """A segment the model reserved (``delta`` > 0) or released, on ``device`` and ``stream``."""

    device: int
    stream: int
    delta: int
    address: int


@dataclass
class _Device:
    """The allocator of one device: its segments' blocks, free blocks sorted by (size, address)."""

    pools: dict[tuple[int, bool], list[tuple[int, int, _Block]]] = field(default_factory=dict)
    reserved: int = 0
    allocated: int = 0


class AllocatorReplay:
    """Replays allocations and frees through the caching allocator's rules, one event at a time.

    Blocks are named by the caller's ids. ``changes`` lists the segment changes of the last
    ``alloc``/``free``/``release_cached`` call; ``reserved``/``allocated`` are totals over devices
    (``allocated`` counts rounded block sizes, as ``torch.cuda.memory_allocated`` does).
    """

    def __init__(self, settings: AllocatorSettings = AllocatorSettings()) -> None:
        self.settings = settings
        self.changes: list[SegmentChange] = []
        self._devices: dict[int, _Device] = {}
        self._blocks: dict[int, _Block] = {}
        self._segments: list[_Segment] = []  # reserved now, in the order reserved
        self._next_address = 1 << 40

    @property
    def reserved(self) -> int:
        return sum(d.reserved for d in self._devices.values())

    @property
    def allocated(self) -> int:
        return sum(d.allocated for d in self._devices.values())

    def device_reserved(self, device: int) -> int:
        """Bytes reserved on one device."""
        return self._device(device).reserved

    def largest_free(self, device: int) -> int:
        """The largest free block inside the reserved segments of ``device`` (0 if none)."""
        pools = self._device(device).pools.values()
        return max((pool[-1][0] for pool in pools if pool), default=0)

    def layout(self, device: int) -> list[tuple[int, int, list[tuple[int, int, bool]]]]:
        """``(address, size, blocks)`` of each segment reserved on ``device``, in the order
        reserved, its blocks ``(address, size, allocated)`` in address order. Addresses of
        segments the model reserved are its own, not the device's."""
        blocks: dict[int, list[_Block]] = {}
        for block in self._blocks_of(device):
            blocks.setdefault(id(block.segment), []).append(block)
        return [
            (
                seg.address,
                seg.size,
                [(b.address, b.size, b.allocated) for b in sorted(blocks[id(seg)], key=_address)],
            )
            for seg in self._segments
            if seg.device == device and seg.size
        ]

    def add_segment(
        self,
        device: int,
        stream: int,
        small: bool,
        address: int,
        size: int,
        blocks: Iterable[tuple[int, int, int]] = (),
    ) -> None:
        """An initial state: a segment already reserved, with its live ``(block id, address,
        size)`` blocks; the gaps between them are free blocks. Not a segment change."""
        seg = _Segment(device, stream, small, address, size)
        self._segments.append(seg)
        self._device(device).reserved += size
        cursor, last = address, None
        for block_id, start, length in sorted(blocks, key=lambda b: b[1]):
            if start < cursor or start + length > address + size:
                raise ValueError(f"block {block_id} at {start:#x} overlaps or leaves its segment")
            if start > cursor:
                last = self._link(last, _Block(seg, cursor, start - cursor))
                self._insert_free(last)
            last = self._link(last, _Block(seg, start, length, allocated=True))
            self._blocks[block_id] = last
            self._device(device).allocated += length
            cursor = start + length
        if cursor < address + size:
            self._insert_free(self._link(last, _Block(seg, cursor, address + size - cursor)))

    def alloc(self, block_id: int, nbytes: int, stream: int = 0, device: int = 0) -> None:
        """Allocate ``nbytes`` as ``block_id``; OutOfMemory if the device has no room."""
        self.changes = []
        if block_id in self._blocks:
            raise ValueError(f"block {block_id} is allocated twice")
        size = round_size(nbytes, self.settings)
        small = is_small(size)
        block = self._find_free(device, stream, small, size) or self._new_segment(
            device, stream, small, size
        )
        self._remove_free(block)
        if should_split(block.size, size, small, self.settings):
            rest = _Block(block.segment, block.address + size, block.size - size, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, rest.prev, block.size = rest, block, size
            self._insert_free(rest)
        block.allocated = True
        self._blocks[block_id] = block
        self._device(device).allocated += block.size

    def free(self, block_id: int) -> None:
        """Free ``block_id``: it returns to its pool, merged with free neighbours (rule 6)."""
        self.changes = []
        block = self._blocks.pop(block_id, None)
        if block is None:
            raise ValueError(f"block {block_id} is freed but not allocated")
        block.allocated = False
        self._device(block.segment.device).allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                block = _merge(block, neighbour)
        self._insert_free(block)

    def release_cached(self, device: int) -> None:
        """Release every wholly free segment of ``device`` (``torch.cuda.empty_cache()``)."""
        for pool in list(self._device(device).pools.values()):
            for _, _, block in list(pool):
                self._release(block)

    def _device(self, device: int) -> _Device:
        return self._devices.setdefault(device, _Device())

    def _pool(self, block: _Block) -> list[tuple[int, int, _Block]]:
        seg = block.segment
        return self._device(seg.device).pools.setdefault((seg.stream, seg.small), [])

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._pool(block), (block.size, block.address, block), key=_key)

    def _remove_free(self, block: _Block) -> None:
        pool = self._pool(block)
        i = bisect.bisect_left(pool, (block.size, block.address), key=_key)
        if i < len(pool) and pool[i][2] is block:
            del pool[i]

    @staticmethod
    def _link(prev: _Block | None, block: _Block) -> _Block:
        if prev is not None:
            prev.next, block.prev = block, prev
        return block

    def _find_free(self, device: int, stream: int, small: bool, size: int) -> _Block | None:
        """Best fit in the request's pool and stream, within max_split_size's limits (rule 3)."""
        pool = self._device(device).pools.get((stream, small), [])
        i = bisect.bisect_left(pool, (size, -1), key=_key)
        if i == len(pool):
            return None
        found = pool[i][2]
        limit = self.settings.max_split_size
        if limit is None or small:
            return found
        if size < limit <= found.size or (size >= limit and found.size >= size + LARGE_BUFFER):
            return None
        return found

    def _new_segment(self, device: int, stream: int, small: bool, size: int) -> _Block:
        """Reserve a segment for ``size``, releasing cached ones if out of room (rules 4, 7)."""
        if self.settings.expandable_segments:
            return self._grow(device, stream, small, size)
        nbytes = allocation_size(size)
        if not self._room(device, nbytes) and not (
            self._release_oversize(device, stream, small, size) and self._room(device, nbytes)
        ):
            self.release_cached(device)
        if self._room(device, nbytes):
            seg = _Segment(device, stream, small, self._next_address, nbytes)
            self._next_address += -(-nbytes // ROUND_LARGE) * ROUND_LARGE
            self._reserve(seg, nbytes)
            block = _Block(seg, seg.address, nbytes)
            self._insert_free(block)
            return block
        raise OutOfMemory(self._oom_message(device, size, nbytes))

    def _room(self, device: int, nbytes: int) -> bool:
        capacity = self.settings.capacity
        return capacity is None or self._device(device).reserved + nbytes <= capacity

    def _reserve(self, seg: _Segment, nbytes: int) -> None:
        if seg.size == nbytes:  # a new segment, not an expandable one growing
            self._segments.append(seg)
        self._device(seg.device).reserved += nbytes
        self.changes.append(SegmentChange(seg.device, seg.stream, nbytes, seg.address))

    def _release(self, block: _Block) -> None:
        """Release a free block's memory if it is a whole segment (or an expandable tail)."""
        seg = block.segment
        if seg.expandable:
            self._unmap_tail(block)
        elif block.whole:
            self._remove_free(block)
            self._segments.remove(seg)
            self._device(seg.device).reserved -= seg.size
            self.changes.append(SegmentChange(seg.device, seg.stream, -seg.size, seg.address))

    def _release_oversize(self, device: int, stream: int, small: bool, size: int) -> bool:
        """Free cached blocks of the request's pool of at least max_split_size: the smallest
        that covers the request, else the largest ones until their total does; False if
        they cannot (what was freed stays freed), as torch's ``release_available_cached_blocks``.
        """
        limit = self.settings.max_split_size
        if limit is None:
            return False
        pool = self._device(device).pools.get((stream, small), [])
        want = max(size, limit)
        i = bisect.bisect_left(pool, (want, -1), key=_key)
        if i < len(pool):
            self._release(pool[i][2])
            return True
        total = 0
        for block in [b for _, _, b in reversed(pool) if b.size >= limit and b.whole]:
            if total >= want:
                break
            total += block.size
            self._release(block)
        return total >= want

    def _grow(self, device: int, stream: int, small: bool, size: int) -> _Block:
        """Expandable segments: map pages at the end of the pool's one segment
        (NOTE [ Expandable segments (approximate) ])."""
        page = SMALL_BUFFER if small else LARGE_BUFFER
        tail = self._expandable_tail(device, stream, small)
        have = 0 if tail is None or tail.allocated else tail.size
        nbytes = -(-(size - have) // page) * page
        if not self._room(device, nbytes):
            self.release_cached(device)
            tail = self._expandable_tail(device, stream, small)
            have = 0 if tail is None or tail.allocated else tail.size
            nbytes = -(-(size - have) // page) * page
            if not self._room(device, nbytes):
                raise OutOfMemory(self._oom_message(device, size, nbytes))
        if tail is None:
            seg = _Segment(device, stream, small, self._next_address, 0, expandable=True)
            self._next_address += 1 << 36  # room to grow, as torch reserves address space
            block = _Block(seg, seg.address, 0)
        elif tail.allocated:
            block = self._link(tail, _Block(tail.segment, tail.address + tail.size, 0))
        else:
            self._remove_free(tail)
            block = tail
        block.size += nbytes
        block.segment.size += nbytes
        self._reserve(block.segment, nbytes)
        self._insert_free(block)
        return block

    def _expandable_tail(self, device: int, stream: int, small: bool) -> _Block | None:
        """The last block of the expandable segment of a pool, None before it has one."""
        tails = [
            b
            for b in self._blocks_of(device)
            if b.segment.expandable
            and b.next is None
            and (b.segment.stream, b.segment.small) == (stream, small)
        ]
        return tails[0] if tails else None

    def _blocks_of(self, device: int) -> Iterable[_Block]:
        yield from (b for b in self._blocks.values() if b.segment.device == device)
        for pool in self._device(device).pools.values():
            yield from (b for _, _, b in pool)

    def _unmap_tail(self, block: _Block) -> None:
        """Unmap the whole pages of a free block at the end of an expandable segment."""
        seg = block.segment
        if block.next is not None:
            return
        page = SMALL_BUFFER if seg.small else LARGE_BUFFER
        pages = (block.size // page) * page if block.prev is not None else block.size
        if pages == 0:
            return
        self._remove_free(block)
        block.size -= pages
        seg.size -= pages
        self._device(seg.device).reserved -= pages
        self.changes.append(SegmentChange(seg.device, seg.stream, -pages, seg.address + seg.size))
        if block.size:
            self._insert_free(block)
        elif block.prev is not None:
            block.prev.next = None
        if seg.size == 0:
            self._segments.remove(seg)

    def _oom_message(self, device: int, size: int, nbytes: int) -> str:
        dev = self._device(device)
        return (
            f"cuda:{device}: no room for a {nbytes}-byte segment for a {size}-byte block "
            f"({dev.reserved} reserved, {dev.allocated} allocated, capacity "
            f"{self.settings.capacity})"
        )


def _address(block: _Block) -> int:
    return block.address


def _key(entry: tuple[int, int] | tuple[int, int, _Block]) -> tuple[int, int]:
    return entry[0], entry[1]


def _merge(block: _Block, neighbour: _Block) -> _Block:
    """One free block from two adjacent ones of a segment."""
    first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
    first.size += second.size
    first.next = second.next
    if second.next is not None:
        second.next.prev = first
    return first


@dataclass
class ReservedCurve:
    """What ``reserved_curve`` gives: after each event replayed, the reserved and allocated
    bytes and the largest free block (summed over devices); the segment changes; and, when the
    replay ran out of memory, the event it failed at (``oom_index``, the curves stop before it)."""

    times: np.ndarray
    reserved: np.ndarray
    allocated: np.ndarray
    largest_free: np.ndarray
    segment_events: np.ndarray
    oom_index: int | None = None
    oom_message: str = ""


def replay(
    events: np.ndarray | Sequence[tuple[int, int, int, int, int]],
    settings: AllocatorSettings = AllocatorSettings(),
    model: AllocatorReplay | None = None,
) -> ReservedCurve:
    """Replay ``events`` (EVENT_DTYPE rows or 5-tuples, in order) through ``model`` (a fresh
    one by default, or one given an initial state with ``add_segment``)."""
    rows = events if isinstance(events, np.ndarray) else np.array(events, dtype=EVENT_DTYPE)
    if rows.dtype != EVENT_DTYPE:
        raise TypeError(f"events must have EVENT_DTYPE, not {rows.dtype}")
    model = model if model is not None else AllocatorReplay(settings)
    n = len(rows)
    reserved, allocated, largest = (np.zeros(n, np.int64) for _ in range(3))
    changes: list[tuple[int, int, int, int, int, int]] = []
    devices = sorted(set(rows["device"].tolist()))
    for i, (time, delta, block, stream, device) in enumerate(rows.tolist()):
        try:
            if delta > 0:
                model.alloc(block, delta, stream, device)
            else:
                model.free(block)
        except OutOfMemory as oom:
            return _curve(rows[:i], reserved, allocated, largest, changes, i, str(oom))
        changes.extend((i, time, c.device, c.stream, c.delta, c.address) for c in model.changes)
        reserved[i], allocated[i] = model.reserved, model.allocated
        largest[i] = max(model.largest_free(d) for d in devices)
    return _curve(rows, reserved, allocated, largest, changes, None, "")


def _curve(
    rows: np.ndarray,
    reserved: np.ndarray,
    allocated: np.ndarray,
    largest: np.ndarray,
    changes: list[tuple[int, int, int, int, int, int]],
    oom_index: int | None,
    oom_message: str,
) -> ReservedCurve:
    n = len(rows)
    return ReservedCurve(
        rows["time"].copy(),
        reserved[:n],
        allocated[:n],
        largest[:n],
        np.array(changes, dtype=SEGMENT_EVENT_DTYPE),
        oom_index,
        oom_message,
    )


def reserved_curve(
    events: np.ndarray | Sequence[tuple[int, int, int, int, int]],
    settings: AllocatorSettings = AllocatorSettings(),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(times, reserved, segment_events)`` of ``events`` replayed from an empty allocator:
    the reserved bytes after each event and the segments reserved and released
    (SEGMENT_EVENT_DTYPE). The curves stop before an out-of-memory event (see ``replay``)."""
    curve = replay(events, settings)
    return curve.times, curve.reserved, curve.segment_events


def events_from_run(
    kinds: np.ndarray,
    storage: np.ndarray,
    times: np.ndarray,
    nbytes: np.ndarray,
    device_of: np.ndarray,
    cuda_devices: Mapping[int, int],
) -> np.ndarray:
    """Allocation events (EVENT_DTYPE) from a run's ``memory_events`` columns (``kind``,
    ``storage``, ``time_ns``) and its ``storages`` columns (``nbytes``, ``device``).

    ``cuda_devices`` maps the string id of each CUDA device to its ordinal; storages on other
    devices, and empty storages (torch allocates nothing for them), are left out. A storage
    first SEEN (live before recording) is allocated there. Traces do not record streams: every
    event is on stream 0. The block id is the storage's row.
    """
    on_cuda = np.isin(device_of[storage], list(cuda_devices)) & (nbytes[storage] > 0)
    kinds, storage, times = kinds[on_cuda], storage[on_cuda], times[on_cuda]
    rows = np.zeros(len(kinds), EVENT_DTYPE)
    rows["time"], rows["block"] = times, storage
    sign = np.where(kinds == MemoryEventKind.FREE, -1, 1)  # ALLOC and SEEN allocate
    rows["delta"] = sign * nbytes[storage]
    lookup = np.vectorize(cuda_devices.__getitem__, otypes=[np.int64])
    rows["device"] = lookup(device_of[storage]) if len(rows) else 0
    return rows
