"""The allocator's own record of every allocation and free, from torch's profiler.

NOTE [ Allocator events ]
The op hook sees the storages that ops return, not the memory an op takes and gives back before
it returns: cuDNN/oneDNN and convolution workspaces, the buffers of a fused kernel, the
intermediate results of a composite op. On a checkpointed DenseNet the peak falls inside
``convolution_backward``'s workspace, 1.7% above what the op hook alone saw. So while recording,
torch's profiler runs with ``profile_memory`` (no shapes, no stacks: those cost per op and keep
tensors alive) and reports every block the allocator hands out and takes back, on the CPU and
on CUDA, with its address and size. The profiler keeps its events in C++ until it stops, so the
recorder works in *windows*: the profiler is stopped at every step boundary (and when a window
grows past ``WINDOW_ROWS``), its allocation events are merged into the window's rows
(``merge_window``), and it is started again. A process killed mid-window loses that window's
allocator events only; the rows of every finished window are on disk.

Why the profiler and not CUDA's allocator history (``_record_memory_history``): it is the only
source on the CPU, where ckview is developed and tested, and one source for both devices keeps
the merge exact in one way. Measured costs are in ``docs/recording.md``.

NOTE [ Profiler clock ]
The profiler stamps events in Unix nanoseconds (a cycle counter converted by a linear fit); the
recorder stamps in ``perf_counter_ns``. Both tick at the same rate, so one offset maps one onto
the other: the tightest of a few bracketed ``(perf_counter_ns, time_ns)`` readings taken when the
window opens. Measured error: under 2 microseconds, less than the time between an op's last
allocation and its return, which is all the merge relies on (NOTE [ Matching blocks ]).

NOTE [ Matching blocks ]
At one address the allocator's events alternate: a block is allocated, freed, perhaps handed out
again. A storage the op hook saw at address ``p`` is matched to the block at ``p`` that was
allocated last before the op that returned it ended (the storage exists then); its ALLOC and
FREE take the block's times and its size the block's size (on CUDA, the caching allocator's
rounded size: what ``max_memory_allocated`` counts). A FREE of a storage that existed before
recording is matched to the free at its address nearest in time. Blocks that no storage
claims are what only the allocator saw: a storage row each (``Category.TEMPORARY``, no dtype or
shape), attributed to the op running when the block was allocated. A block still allocated when
the window ends stays known by address, so a later window matches its free.
"""

from __future__ import annotations

import os
import sys
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import attrgetter
from time import perf_counter_ns
from typing import Any

import numpy as np

WINDOW_ROWS = 1 << 20
"""Memory events a window may buffer before it is merged mid-step (NOTE [ Allocator events ])."""

_MATCH_FREE_NS = 1_000_000
"""How far from the op hook's FREE the allocator's free of a pre-existing block may be."""


@dataclass
class AllocatorWindow:
    """The allocator's events of one window, in time order, on the recorder's clock."""

    time_ns: np.ndarray
    """int64: when, on the ``perf_counter_ns`` clock (NOTE [ Profiler clock ])."""
    address: np.ndarray
    """int64: the block's address (the ``data_ptr`` of the storages it backs)."""
    nbytes: np.ndarray
    """int64: bytes allocated (> 0) or freed (< 0)."""
    device: list[str]
    """The device of each event, e.g. 'cpu' or 'cuda:0'."""


def clock_offset(samples: int = 5) -> int:
    """``time_ns() - perf_counter_ns()``, from the tightest of a few bracketed readings."""
    best_width, offset = None, 0
    for _ in range(samples):
        before = perf_counter_ns()
        unix = time.time_ns()
        after = perf_counter_ns()
        if best_width is None or after - before < best_width:
            best_width, offset = after - before, unix - (before + after) // 2
    return offset


class AllocatorEvents:
    """Runs torch's profiler for its allocation events only, one window at a time.

    ``start`` returns False when the profiler cannot be had (the script profiles itself, or
    this build of torch has no kineto): the recording then goes on with what the op hook sees,
    and the trace says so.
    """

    def __init__(self) -> None:
        import torch

        self.running = False
        self._given_up = False
        self.unavailable = ""
        """Why the allocator's events are missing from some window ('' if never)."""
        self._offset = 0
        # NOTE [ Quiet profiler ]: freed at the first start, it spends torch's warning.
        self._unknown_block: Any = torch.empty(1, device="cpu")
        from torch.autograd import profiler as autograd_profiler

        # The originals: ``yield_to`` may wrap the module's names while the recorder runs.
        self._prepare = autograd_profiler._prepare_profiler
        self._enable = autograd_profiler._enable_profiler
        self._disable = autograd_profiler._disable_profiler

    def start(self) -> bool:
        """Start a window; False if the allocator's events cannot be had now."""
        from torch.autograd import profiler as autograd_profiler

        if self.running:
            return True
        if self._given_up:
            return False
        if autograd_profiler._is_profiler_enabled or _torch_profiler_enabled():
            self.unavailable = "the script runs torch.profiler itself"
            return False
        config, activities = _config()
        try:
            with _quiet_stderr():
                self._prepare(config, activities)
                self._enable(config, activities)
                self._unknown_block = None
            _record_ops(False)  # NOTE [ Allocations without ops ]
        except RuntimeError as error:
            self.unavailable = f"torch's profiler could not start ({error})"
            return False
        self._offset = clock_offset()
        self.running = True
        return True

    def give_up(self, why: str) -> None:
        """No more windows in this recording (the trace says ``why``)."""
        self.unavailable = why
        self._given_up = True

    def stop(self) -> AllocatorWindow | None:
        """Stop the profiler and return the window's allocation events (None if not running)."""
        if not self.running:
            return None
        self.running = False
        _record_ops(True)
        with _quiet_stderr():
            result = self._disable()
        return _allocations(result.experimental_event_tree(), self._offset)

    def yield_to_the_script(self) -> Callable[[], None]:
        """Until the returned function is called, a script that starts torch's profiler gets
        it: the window's allocator events are dropped (the trace says why), and no window
        starts while the script's profiler runs. Returns the undo."""
        from torch.autograd import profiler as autograd_profiler

        originals = {"_prepare_profiler": self._prepare, "_enable_profiler": self._enable}

        def wrap(start: Callable[..., Any]) -> Callable[..., Any]:
            def start_for_the_script(*args: Any, **kwargs: Any) -> Any:
                if self.running:
                    self.stop()  # and RecordFunction back on: the script's profiler needs it
                    self.unavailable = "the script runs torch.profiler itself"
                return start(*args, **kwargs)

            return start_for_the_script

        for name, original in originals.items():
            setattr(autograd_profiler, name, wrap(original))

        def undo() -> None:
            for name, original in originals.items():
                setattr(autograd_profiler, name, original)

        return undo


# NOTE [ Allocations without ops ]
# The profiler records every op through torch's RecordFunction callbacks: on a step of small ops
# that costs a third of the step, and stopping the profiler then costs as much again, to build
# op events the recorder does not read (it has its own ops, and finds the op of an allocation by
# time). With RecordFunction off while a window runs, the profiler records allocations only:
# the step runs at its own speed and stopping costs microseconds per allocation. The switch is
# global, so it is turned back on before the profiler stops and whenever the script starts a
# profiler of its own. (``torch.autograd.profiler.record_function`` ranges of the script are
# not recorded meanwhile; nothing records them while ckview records.)


def _record_ops(enabled: bool) -> None:
    import torch

    torch._C._autograd._enable_record_function(enabled)


# NOTE [ Quiet profiler ]
# This torch prints two lines to stderr each time its profiler starts and stops ("USDT: ...
# profiler_start"), and its CPU allocator logs a warning on the first (and every 1000th) free of
# a block allocated while no profiler ran. Neither is the user's business: file descriptor 2 is
# pointed at /dev/null while the recorder starts and stops the profiler (no user code runs
# then), and a block of the recorder's own, made before recording, is freed right after the
# first start, so that the warning's first turn is spent there.


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null for the duration (NOTE [ Quiet profiler ])."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to quiet
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _torch_profiler_enabled() -> bool:
    import torch

    return bool(torch.autograd._profiler_enabled())


def _config() -> tuple[Any, set[Any]]:
    from torch._C._profiler import (
        ProfilerActivity,
        ProfilerConfig,
        ProfilerState,
        _ExperimentalConfig,
    )

    config = ProfilerConfig(
        ProfilerState.KINETO,
        False,  # report_input_shapes: costs per op and keeps tensors alive
        True,  # profile_memory
        False,  # with_stack
        False,  # with_flops
        False,  # with_modules
        _ExperimentalConfig(),
    )
    return config, {ProfilerActivity.CPU}


# The fields read of each allocation event (attrgetters: the loops run in C).
_EXTRA_FIELDS = attrgetter("extra_fields")
_START_NS = attrgetter("start_time_ns")
_DEVICE = attrgetter("device")
_PTR = attrgetter("ptr")
_ALLOC_SIZE = attrgetter("alloc_size")


def _allocations(roots: list[Any], offset: int) -> AllocatorWindow:
    """Every allocation event under ``roots``, in time order, on the recorder's clock. Without
    ops (NOTE [ Allocations without ops ]) the roots are the allocations themselves, read a
    field at a time: each read is a call into torch, the one cost per event left to us."""
    from torch._C._profiler import _ExtraFields_Allocation

    events = roots
    fields = list(map(_EXTRA_FIELDS, events))
    if any(type(f) is not _ExtraFields_Allocation for f in fields):  # ops of another thread
        events = list(_allocation_events(roots, _ExtraFields_Allocation))
        fields = list(map(_EXTRA_FIELDS, events))
    n = len(events)
    # map + attrgetter: a fifth less time than comprehensions (measured).
    times = np.fromiter(map(_START_NS, events), np.int64, n)
    order = np.argsort(times, kind="stable")
    names: dict[Any, str] = {}
    devices = [names.get(d) or names.setdefault(d, str(d)) for d in map(_DEVICE, fields)]
    return AllocatorWindow(
        time_ns=times[order] - offset,
        address=np.fromiter(map(_PTR, fields), np.uint64, n).astype(np.int64)[order],
        nbytes=np.fromiter(map(_ALLOC_SIZE, fields), np.int64, n)[order],
        device=[devices[i] for i in order.tolist()],
    )


def _allocation_events(roots: list[Any], allocation: type) -> Iterator[Any]:
    """The allocation events in the trees under ``roots``."""
    todo = list(roots)
    while todo:
        event = todo.pop()
        if type(event.extra_fields) is allocation:
            yield event
        else:
            todo.extend(event.children)


# ----------------------------------------------------------------------------- the merge

_ALLOC, _FREE = 0, 1  # MemoryEventKind.ALLOC, FREE (the schema's values)

_SLACK_NS = 50_000
"""How long after its free a block may still be matched to an op hook's ALLOC: clock error."""


@dataclass
class Block:
    """One lifetime of one block of memory at an address, as the allocator saw it."""

    address: int
    nbytes: int
    device: str
    alloc_ns: int  # -1: allocated before recording (NOTE [ Matching blocks ])
    free_ns: int = -1  # -1: still allocated
    storage: int = -1  # the storage row it backs, once matched or made
    workspace: bool = False  # its storage row was made for it: no op hook event is its


Workspaces = Callable[[list[Block], np.ndarray], int]
"""(blocks no storage claims, the op running when each was allocated) -> the storage row of the
first; the others follow it in order."""


@dataclass
class AllocatorMerge:
    """Merges the allocator's windows into the op hook's rows of one run (NOTE [ Matching
    blocks ]). Holds the blocks still allocated, by address, from window to window."""

    by_address: dict[int, list[Block]] = field(default_factory=dict)
    by_storage: dict[int, Block] = field(default_factory=dict)
    """Blocks of storages not yet freed, by storage row."""
    touched: list[Block] = field(default_factory=list)
    """Blocks matched to a storage row since the caller last emptied it: its times and size
    are the allocator's."""

    def merge(
        self,
        window: AllocatorWindow,
        events: np.ndarray,
        address: np.ndarray,
        nbytes: np.ndarray,
        op_start_ns: np.ndarray,
        first_op: int,
        add_workspaces: Workspaces,
    ) -> np.ndarray:
        """The window's memory events with the allocator's times, and the blocks no storage
        claims as storages of their own (``add_workspaces``), in time order.

        ``events``: (n, 4) int64 rows ``kind, storage, op, time_ns`` the op hook wrote in this
        window; ``address`` and ``nbytes``: (n,) the ``data_ptr`` and size of the storage each
        of those rows names; ``op_start_ns``: the start of the window's ops, the first of which
        is row ``first_op``. Storage rows whose times or sizes are the allocator's are in
        ``self.touched``.
        """
        new, freed_old = self._add(window)
        rows = events.copy()
        for i, (kind, sid, _op, when, at, size) in enumerate(
            zip(*events.T.tolist(), address.tolist(), nbytes.tolist(), strict=True)
        ):
            if kind == _FREE:
                block = self.by_storage.pop(sid, None) or self._freed_near(at, size, when)
                if block is not None and block.free_ns >= 0:
                    block.storage = sid
                    self.touched.append(block)
                    rows[i, 3] = block.free_ns
                continue
            # ALLOC takes the block's time; SEEN claims it, so that it is not made a workspace.
            block = self._allocated_at(at, size, when, kind == _ALLOC)
            if block is not None:
                block.storage = sid
                self.by_storage[sid] = block
                self.touched.append(block)
                if kind == _ALLOC:
                    rows[i, 3] = block.alloc_ns
        extra = [rows]
        unclaimed = [block for block in new if block.storage < 0]
        if unclaimed:
            alloc_ns = np.array([block.alloc_ns for block in unclaimed], dtype=np.int64)
            ops = _ops_at(op_start_ns, first_op, alloc_ns)
            first = add_workspaces(unclaimed, ops)
            for i, block in enumerate(unclaimed):
                block.storage, block.workspace = first + i, True
                if block.free_ns < 0:
                    self.by_storage[block.storage] = block
            storages = np.arange(first, first + len(unclaimed), dtype=np.int64)
            extra.append(_rows(_ALLOC, storages, ops, alloc_ns))
        freed = [b for b in (*new, *freed_old) if b.workspace and b.free_ns >= 0]
        if freed:
            for block in freed:
                self.by_storage.pop(block.storage, None)
            free_ns = np.array([block.free_ns for block in freed], dtype=np.int64)
            storages = np.array([block.storage for block in freed], dtype=np.int64)
            extra.append(_rows(_FREE, storages, _ops_at(op_start_ns, first_op, free_ns), free_ns))
        self._forget_freed()
        rows = np.concatenate(extra)
        return rows[np.argsort(rows[:, 3], kind="stable")]

    def _add(self, window: AllocatorWindow) -> tuple[list[Block], list[Block]]:
        """Pair the window's allocs and frees into blocks: the blocks it allocated, and the
        blocks of earlier windows it freed. A free at an address never allocated while
        recording ends a block that existed before (``alloc_ns`` -1)."""
        new: list[Block] = []
        freed_old: list[Block] = []
        fresh: set[int] = set()
        for t, address, nbytes, device in zip(
            window.time_ns.tolist(),
            window.address.tolist(),
            window.nbytes.tolist(),
            window.device,
            strict=True,
        ):
            lifetimes = self.by_address.setdefault(address, [])
            if nbytes > 0:
                block = Block(address, nbytes, device, t)
                lifetimes.append(block)
                new.append(block)
                fresh.add(id(block))
            elif lifetimes and lifetimes[-1].free_ns < 0:
                lifetimes[-1].free_ns = t
                if id(lifetimes[-1]) not in fresh:
                    freed_old.append(lifetimes[-1])
            else:
                lifetimes.append(Block(address, -nbytes, device, -1, t))
        return new, freed_old

    def _allocated_at(self, address: int, nbytes: int, when_ns: int, alloc: bool) -> Block | None:
        """The unclaimed block of ``nbytes`` at ``address`` allocated last at or before ``when_ns``
        and not freed before it (NOTE [ Matching blocks ]); for an ALLOC, one allocated while
        recording, of at least ``nbytes``."""
        lifetimes = self.by_address.get(address)
        if not lifetimes:
            return None
        at = bisect_right([b.alloc_ns for b in lifetimes], when_ns) - 1
        if at < 0:  # every block here is younger: clock error, if only by a little
            if not alloc or lifetimes[0].alloc_ns > when_ns + _SLACK_NS:
                return None
            at = 0
        block = lifetimes[at]
        if block.storage >= 0 or (alloc and block.alloc_ns < 0):
            return None
        if block.nbytes < nbytes or (not alloc and block.nbytes != nbytes):
            return None
        if 0 <= block.free_ns < when_ns - _SLACK_NS:
            return None
        return block

    def _freed_near(self, address: int, nbytes: int, when_ns: int) -> Block | None:
        """The block of ``nbytes`` at ``address`` that was allocated before recording and freed
        nearest ``when_ns``, within a millisecond."""
        best = None
        for block in self.by_address.get(address, ()):
            if block.alloc_ns < 0 and block.nbytes == nbytes and block.storage < 0:
                gap = abs(block.free_ns - when_ns)
                if gap <= _MATCH_FREE_NS and (best is None or gap < abs(best.free_ns - when_ns)):
                    best = block
        return best

    def _forget_freed(self) -> None:
        """Keep only blocks still allocated: later windows match nothing else."""
        for address in list(self.by_address):
            live = [b for b in self.by_address[address] if b.free_ns < 0]
            if live:
                self.by_address[address] = live[-1:]
            else:
                del self.by_address[address]


def _ops_at(op_start_ns: np.ndarray, first_op: int, when_ns: np.ndarray) -> np.ndarray:
    """The row of the op that started last at or before each time (the op before the window,
    or -1, where none did)."""
    at = np.searchsorted(op_start_ns, when_ns, side="right") - 1
    before = first_op - 1 if first_op > 0 else -1
    return np.where(at >= 0, first_op + at, before).astype(np.int64)


def _rows(kind: int, storages: np.ndarray, ops: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Memory event rows ``kind, storage, op, time_ns``."""
    return np.stack((np.full(len(storages), kind, dtype=np.int64), storages, ops, times), axis=1)
