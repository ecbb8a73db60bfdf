"""The recording session: hooks into torch that turn a training step into trace rows.

Four kinds of hook feed one :class:`Recorder`:

* a ``TorchDispatchMode`` sees every aten op below autograd (forward, backward, recompute and
  optimizer alike), its inputs and its outputs; an output storage never seen before is a new
  allocation, and a weak reference with a callback on its storage records the free;
* ``saved_tensors_hooks`` tell which storages autograd keeps for backward (activations);
* global module forward hooks give the module path and the recompute of checkpointed regions;
* global optimizer step hooks and the end of each backward give the step boundaries.

NOTE [ Never hold a user tensor ]
The recorder keeps only integers and weak references to storages. Holding a tensor (or a
storage) would keep its memory alive and change the very curve being measured. The pack hook
returns ``x.detach()`` rather than ``x``: returning an op's own output would create a reference
cycle through its ``grad_fn`` that the garbage collector cannot see, leaking the tensor.

NOTE [ New storage = unknown output storage ]
Before looking at an op's outputs, every input storage is registered (as pre-existing if it was
never seen). An output whose storage is still unknown was therefore allocated by this op; an
output that is a view of an input (``weight.t()``) is found among the inputs and is not an
allocation. This is what makes the recorded "allocated since the step began" agree with the
allocator: pre-existing parameters and inputs are ``SEEN``, never ``ALLOC``.

NOTE [ Cooperating with other saved-tensor hooks ]
Only the innermost saved-tensor hooks apply, so inside a non-reentrant
``torch.utils.checkpoint`` region (or a user's offloading hooks) ours are not called. While
recording, ``saved_tensors_hooks.__init__`` is wrapped so that every hook pair created meanwhile
reports to the recorder too: a pack that returns a tensor keeps that tensor for backward, and an
unpack that returns a tensor (e.g. one recomputed by checkpoint) hands it to backward; both make
the storage an activation. A pack that returns an opaque holder keeps nothing.

NOTE [ Inputs and their sources ]
A storage made outside the step's forward and used by it (or saved by autograd) is an INPUT: a
batch. Batches are often made from other storages between steps: ``x = data[idx]`` gathers from
an in-memory dataset, ``x = batch.float() / 255`` converts a loaded one. Ops outside forward,
backward and optimizer (phase OTHER, few per step) link their new outputs to the storages they
read, and when an output becomes an INPUT, the OTHER storages it was made from become INPUTs
too: the dataset tensor a loop indexes is input data, not "other". A CPU storage in shared
memory when first seen came from a DataLoader worker process: an INPUT too, also a batch a
worker delivered early that the recorded steps never used.

NOTE [ Autograd nodes stay unwrapped ]
Asking torch for the autograd node that runs a backward op (``_current_autograd_node()``) gives
the node a Python object, and (torch 2.13) a node keeps its Python object for as long as it
lives. A graph whose nodes have Python objects is freed recursively, one C stack frame chain per
node: 40,000 of them in one chain overflow an 8 MiB stack and the process dies with SIGSEGV when
the graph is dropped (a chain of 100,000 scalar adds, as in a checkpointing tutorial's
HeavyModel; plain torch does the same to any script that touches ``grad_fn`` of that many
nodes). So the recorder tells "in backward" by ``_current_graph_task_id()``, which creates
nothing, and asks for the node, to attribute backward ops to module calls through its sequence
number, for at most ``_NODE_BUDGET`` nodes per backward pass; past that, ops keep the last
attribution and ``seq_nr`` -1.

NOTE [ FSDP's storages ]
A DTensor (FSDP2's sharded parameters, their gradients and optimizer state) is a wrapper whose
own storage is a placeholder of the global size; its data is its ``_local_tensor``, so the
recorder follows that one (``_local``), and a DTensor parameter's local data is a
SHARDED_PARAMETER. FSDP's own ops name its buffers: ``fsdp.all_gather_copy_in`` makes the flat
all-gather buffers and ``fsdp.chunk_cat`` fills the reduce-scatter input (COMM_BUFFER),
``fsdp.split_with_sizes_copy`` fills the all-gathered parameters (UNSHARDED_PARAMETER). FSDP
frees and re-allocates an unsharded parameter by resizing its storage (no op; the storage
object lives on), so the recorder wraps ``FSDPParam.free_unsharded_param`` and
``alloc_all_gather_outputs``: a resize to 0 is the storage's FREE, and a resize back is a new
storage row (ALLOC) of the same StorageImpl, owned by the parameter's module, its old weak
reference disarmed (``sid`` -1).
"""

from __future__ import annotations

import array
import errno
import functools
import os
import platform
import sys
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter_ns
from typing import Any

import numpy as np
import torch
import torch.utils.checkpoint
from torch._C import _current_autograd_node, _current_graph_task_id, _DisableTorchDispatch
from torch._C._autograd import _get_sequence_nr
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ckview import __version__ as ckview_version
from ckview.trace import TraceWriter
from ckview.trace.errors import TraceError
from ckview.trace.journal import ROWS, JournalWriter, journal_path, recover_journal, room_for
from ckview.trace.ranks import launcher_world, this_rank_path
from ckview.trace.schema import (
    CATEGORY_PRIORITY,
    NO_INDEX,
    RUN_TABLES,
    Category,
    IOKind,
    MemoryEventKind,
    Phase,
    SavedEventKind,
)
from ckview.trace.staging import settle, staging_path
from recorder import buffers, modules, steps
from recorder.allocations import WINDOW_ROWS, AllocatorEvents, AllocatorMerge, Block
from recorder.buffers import MutableTable, RowBuffer
from recorder.compiled import EagerWhileRecording, skip_in_dynamo
from recorder.device import DeviceSampler, recorded_peak_time
from recorder.modules import ModuleRegistry
from recorder.oom import OomWatch
from recorder.progress import StepProgress
from recorder.runs import RunSpec, State, StopScript
from recorder.stacks import Stacks
from recorder.steps import IterationTracker, StepCounts, StepRule, plural
from recorder.timing import RunTimes, StepTimer, plan_call_cost_ns, timing_schedule

_RANK = [0] * len(Category)
for _rank, _cat in enumerate(CATEGORY_PRIORITY):
    _RANK[_cat] = _rank

_FORWARD, _BACKWARD, _RECOMPUTE, _OPTIMIZER, _OTHER = (int(p) for p in Phase)
_ALLOC, _FREE, _SEEN = (int(k) for k in MemoryEventKind)
_PARAMETER = int(Category.PARAMETER)
_INPUT = int(Category.INPUT)
_OTHER_CAT = int(Category.OTHER)
_TEMPORARY = int(Category.TEMPORARY)
_ST_WIDTH = len(RUN_TABLES["storages"])
_ST_CATEGORY = [c.name for c in RUN_TABLES["storages"]].index("category")
_ST_FREE_NS = [c.name for c in RUN_TABLES["storages"]].index("free_ns")
_ST_MODULE = [c.name for c in RUN_TABLES["storages"]].index("module")
_ST_COLUMNS = [c.name for c in RUN_TABLES["storages"]]
_ST_NBYTES, _ST_DEVICE, _ST_DTYPE, _ST_SHAPE, _ST_OP, _ST_CALL, _ST_ALLOC_NS, _ST_STACK = (
    _ST_COLUMNS.index(name)
    for name in ("nbytes", "device", "dtype", "shape", "op", "module_call", "alloc_ns", "stack")
)
_OP_START = [c.name for c in RUN_TABLES["ops"]].index("start_ns")
_OP_CALL = [c.name for c in RUN_TABLES["ops"]].index("module_call")
_CALL_WIDTH = len(RUN_TABLES["module_calls"])  # column 0 of a call row is its module
_ACTIVATION = int(Category.ACTIVATION)
_SHARDED = int(Category.SHARDED_PARAMETER)
_UNSHARDED = int(Category.UNSHARDED_PARAMETER)
_COMM = int(Category.COMM_BUFFER)
_FSDP_OPS = {  # NOTE [ FSDP's storages ]: op -> (category, which of its tensors)
    "fsdp.all_gather_copy_in.default": (_COMM, "result"),
    "fsdp.split_with_sizes_copy.default": (_UNSHARDED, "out"),
    "fsdp.chunk_cat.default": (_COMM, "out"),
}
_FSDP_PARAM_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param"
_INPUT_IO, _OUTPUT_IO = int(IOKind.INPUT), int(IOKind.OUTPUT)
_FILE_FLUSH_NS = 5_000_000_000  # HDF5's flush costs ~20 ms: at most one per 5 s of steps
_APPENDED = ("ops", "memory_events", "saved_events", "module_io")
"""The run tables written in batches as they fill (RowBuffer), journaled as appended rows."""
_WRITE_ERRORS = (OSError, RuntimeError, TraceError)
"""What writing the trace raises when the disk is full or the file was closed under it."""
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_NODE_BUDGET = 8192  # NOTE [ Autograd nodes stay unwrapped ]: 5x below the crash depth


_NO_GRAPH = frozenset(
    {"_local_scalar_dense", "detach", "alias", "equal", "is_nonzero", "eq", "ne", "lt", "le"}
    | {"gt", "ge", "argmax", "argmin", "isnan", "isinf", "isfinite"}
)
"""Ops that never build autograd graph (NOTE [ A forward without modules ])."""


class _StorageRef(weakref.ref):
    """Weak reference to a storage that remembers its trace row and registry key."""

    __slots__ = ("key", "sid")
    sid: int
    key: int


class _OpObserver(TorchDispatchMode):
    """Sees every aten op; the recorder does the bookkeeping."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._rec = recorder

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Dynamo skips this module's code by a flag on each code object (NOTE [ torch.compile
        # under the recorder ]); torch's per-op dynamo-disable wrapper would cost microseconds.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rec = self._rec
        if kwargs is None:
            kwargs = {}
        if rec._no_modules:
            rec._functional_op(func, args, kwargs)  # NOTE [ A forward without modules ]
        if rec._state is State.RECORDING and not rec._busy:
            t0 = perf_counter_ns()
            try:
                out = func._op(*args, **kwargs)  # the C++ op, without OpOverload.__call__'s frame
            except BaseException as exc:
                rec._on_op_failed(func, exc, t0)  # NOTE [ OOM capture ] in recorder/oom.py
                raise
            rec._on_op(func, args, kwargs, out, t0, perf_counter_ns())
            return out
        if not rec._in_backward and rec._state is State.WARMUP and _current_graph_task_id() >= 0:
            rec._enter_backward()
        return func._op(*args, **kwargs)


class Recorder:
    """Record training steps of the code run inside it into a ckview trace.

    >>> with Recorder("trace.h5", steps=2, warmup=1):
    ...     train()          # unchanged training code

    A step is one iteration of the loop (NOTE [ Step = one optimizer iteration ]): by default
    it ends once every optimizer has stepped, or, without an optimizer, at the first forward
    after a backward; ``step_every`` says it when that cannot be learned (``"optimizer:2"``,
    ``"backward:4"``, ``"manual"``), and calling :meth:`mark_step` makes it the only boundary.
    ``warmup`` iterations run unrecorded first; after ``steps`` recorded steps the trace is
    written and closed and the code runs on unrecorded, or stops with :class:`StopScript` if
    ``stop_after`` is set.

    The trace is written beside ``path`` and replaces it only if it is good (NOTE [ Writing
    beside the target ] in ckview/trace/staging.py); :attr:`written` says where it went. No step
    recorded is a failure: the trace is marked incomplete. ``progress``: a line on stderr per
    step; None (default) shows it when stderr is a terminal.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        steps: int = 1,
        warmup: int = 1,
        stop_after: bool = False,
        command: list[str] | None = None,
        runs: Sequence[RunSpec] = (),
        progress: bool | None = None,
        step_every: str | StepRule = "auto",
        timing_steps: int = 0,
        stacks: bool = False,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        if warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {warmup}")
        self.path = this_rank_path(path)  # NOTE [ One file per rank ] in ckview/trace/ranks.py
        self.written: Path | None = None
        """Where the trace went once closed (NOTE [ Writing beside the target ])."""
        self._staging = staging_path(self.path)
        self.journal = journal_path(self._staging)
        """The recording's journal (NOTE [ The recording journal ]): removed once the trace is
        written; kept if the trace could not be rebuilt from it (a full disk)."""
        self.steps = steps
        self.warmup = warmup
        self.stop_after = stop_after
        self.command = command if command is not None else list(sys.argv)
        self.runs = tuple(runs) or (RunSpec("main"),)
        if len({r.name for r in self.runs}) != len(self.runs):
            raise ValueError(f"run names must differ: {[r.name for r in self.runs]}")
        self.steps_recorded = 0
        self.stacks = stacks
        """Record the user's frames of every allocation (NOTE [ User frames ] in stacks.py)."""
        self._stacks: Stacks | None = None
        self._op_stacks = array.array("q")  # the stack of each buffered op, with --stacks
        self._timer = StepTimer(timing_steps)  # NOTE [ Plain timing steps ] in timing.py
        self._schedule = timing_schedule(len(self.runs), timing_steps)
        self._timing_pos = -1  # entry of the schedule under way
        self._timing_run: int | None = None  # the run whose context the timing step is in
        self._run_index = 0
        self._run_context: AbstractContextManager[Any] | None = None
        self._early_context: AbstractContextManager[Any] | None = None  # NOTE [ Early run context ]
        one_line = os.environ.get("LOCAL_RANK", "0") == "0"  # one progress line per machine
        self._progress = StepProgress(warmup, steps * len(self.runs), enabled=progress and one_line)
        rule = step_every if isinstance(step_every, StepRule) else StepRule.parse(step_every)
        self._tracker = IterationTracker(rule)
        self._state = State.WARMUP
        self._busy = False
        self._warmup_done = 0
        self._step = 0
        self._t0 = 0
        # autograd / phase state
        self._in_backward = False
        self._counted_task = -1  # graph task whose backward pass was counted last
        self._optimizer_depth = 0  # > 0 inside optimizer.step(), 0 again inside its closure
        self._recompute_depth = 0
        self._top_phase = _OTHER
        self._no_modules = False  # NOTE [ A forward without modules ]
        self._await_forward = False
        self._in_backward_callback = False
        self._node_budget = _NODE_BUDGET  # NOTE [ Autograd nodes stay unwrapped ]
        # open module calls as (module row, call row or -1)
        self._modules: ModuleRegistry | None = None  # made with the trace's string table
        self._open_region = NO_INDEX
        self._region_inferred = False
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._stack: list[tuple[int, int]] = []
        # backward op -> forward module call, via autograd sequence numbers
        self._fw_seq_begin: list[int] = []
        self._fw_calls: list[int] = []
        self._last_seq = -2
        self._last_seq_call = NO_INDEX
        self._last_op = NO_INDEX
        self._n_ops = 0
        self._last_file_flush = 0
        # storages: registry key (StorageImpl address) -> weak ref, only while alive
        self._known: dict[int, _StorageRef] = {}
        self._names: dict[Any, int] = {}
        self._op_names: dict[int, int] = {}
        self._op_funcs: list[Any] = []
        self._layouts: dict[tuple[Any, Any], tuple[int, int]] = {}
        self._saw_cuda = False
        self._writer: TraceWriter | None = None
        self._journal: JournalWriter | None = None  # NOTE [ The recording journal ]
        self._journal_batches: list[tuple[str, dict[str, np.ndarray]]] = []
        self._journaled: dict[str, int] = {}  # rows of each appended table in the journal
        self._sunk: dict[str, int] = {}  # rows of each appended table handed to the writer
        self._journal_strings = 0
        self._journal_modules: dict[str, np.ndarray] = {}
        self.write_error: str | None = None
        """Why writing the trace failed (a full disk...); the trace then comes from the journal
        (NOTE [ When the trace cannot be written ])."""
        self._handles: list[Any] = []
        self._hooks_cm: torch.autograd.graph.saved_tensors_hooks | None = None
        self._orig_hooks_init: Any = None
        self._restore: list[Callable[[], None]] = []  # undo what _install patched
        self._observer: _OpObserver | None = None
        self._eager_compile = EagerWhileRecording()
        self._op_categories: dict[int, tuple[int, str]] = {}  # NOTE [ FSDP's storages ]
        self._fsdp_wrapped = False
        self._oom = OomWatch()  # NOTE [ OOM capture ] in recorder/oom.py
        self._allocator = AllocatorEvents()  # NOTE [ Allocator events ] in allocations.py

    # ----------------------------------------------------------------- public API

    def __enter__(self) -> Recorder:
        self._open_trace()
        try:
            self._install()
            self._progress.start()
            if self.warmup == 0:
                self._start_recording()
        except BaseException as exc:
            self.close(error=f"{type(exc).__name__}: {exc}")
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc_type is StopScript:
            exc = None
        self.close(error=None if exc is None else f"{exc_type.__name__}: {exc}")

    def mark_step(self) -> None:
        """End the current step by hand; from then on only ``mark_step`` ends steps.

        The first call right after an automatic boundary (``opt.step(); rec.mark_step()``)
        confirms that boundary instead of ending an empty step.
        """
        confirms = self._tracker.rule.kind != "manual" and self._tracker.current() == StepCounts()
        self._tracker.mark()
        if not confirms:
            self._end_step()

    def close(self, error: str | None = None) -> None:
        """Stop recording, write everything recorded so far and close the trace.

        With ``error`` (the script raised or was interrupted) the trace is marked incomplete.
        """
        if self._state is State.RECORDING and error is None and self._tracker.pending_at_close():
            self._end_step()
        if self._state is State.TIMING:
            # Every run is recorded: a script that fails in its timing steps (NOTE [ Plain
            # timing steps ] in timing.py) leaves a complete trace, with what was timed.
            self._stop_timing()
            error = None
        if self._state is not State.DONE:
            self._finish(error or "")
        self._uninstall()
        self._close_trace(error or "")
        self._progress.close()

    @property
    def warmup_done(self) -> int:
        """Warmup steps that ended."""
        return self._warmup_done

    @property
    def timings(self) -> dict[str, RunTimes]:
        """Plain timing steps per run name (``timing_steps``; NOTE [ Plain timing steps ])."""
        return self._timer.runs

    @property
    def _registry(self) -> ModuleRegistry:
        assert self._modules is not None, "the trace is not open"
        return self._modules

    # ----------------------------------------------------------------- trace file

    def _open_trace(self) -> None:
        meta = {
            "ckview_version": ckview_version,
            "torch_version": str(torch.__version__),
            "python_version": platform.python_version(),
            "device": "cpu",
            "command": list(self.command),
            "start_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "steps_requested": self.steps,
            "steps_recorded": 0,
            "warmup": self.warmup,
        }
        meta["rank"], meta["world_size"] = launcher_world()
        self._writer = TraceWriter(self._staging, meta=meta)
        try:
            self._journal = JournalWriter(self.journal, meta)
        except OSError:
            self._writer.close(complete=False, error="cannot write the journal")
            self._staging.unlink(missing_ok=True)
            raise
        self._modules = ModuleRegistry(self._intern)
        self._stacks = Stacks(self._writer) if self.stacks else None
        self._cpu_id = self._intern("cpu")
        self._device = DeviceSampler(self._intern)  # NOTE [ Device samples ] in device.py
        self._begin_run_tables()

    def _begin_run_tables(self) -> None:
        """Fresh tables and counters: every run is self-contained (rows index its own tables)."""
        assert self._writer is not None
        self._run = self._writer.run(self.runs[self._run_index].name)
        self._ops = RowBuffer("ops", self._sink)
        self._mem = RowBuffer("memory_events", self._sink)
        self._saved = RowBuffer("saved_events", self._sink)
        self._io = RowBuffer("module_io", self._sink)
        self._storages = MutableTable("storages")
        self._st_data = self._storages.data
        self._calls = MutableTable("module_calls")
        self._steps = MutableTable("steps")
        self._regions = MutableTable("recompute_regions")
        self._known.clear()  # storages alive across runs are SEEN again in the next run
        self._journal_batches, self._journaled, self._sunk = [], {}, {}
        self._sources: dict[int, list[int]] = {}
        self._step = 0
        self._n_ops = 0
        self._last_op = NO_INDEX
        self._fw_seq_begin, self._fw_calls = [], []
        self._last_seq, self._last_seq_call = -2, NO_INDEX
        self._stack = [(row, NO_INDEX) for row, _ in self._stack]
        self._steps_in_run = 0
        self._open_region = NO_INDEX
        self._oom.clear()
        self._merge = AllocatorMerge()
        self._st_address = array.array("q")  # data_ptr of each storage row

    def _sink(self, table: str, columns: dict[str, np.ndarray]) -> None:
        """Write a batch, turning absolute ``perf_counter_ns`` times into times since start."""
        self._since_start(columns)
        if table in _APPENDED and self._journal is not None:
            self._journal_batches.append((table, columns))
            self._sunk[table] = self._sunk.get(table, 0) + _length(columns)
        self._write(self._run.append, table, columns)

    def _since_start(self, columns: dict[str, np.ndarray]) -> None:
        for name, col in columns.items():
            if name.endswith("_ns"):
                np.subtract(col, self._t0, out=col, where=col >= 0)

    # NOTE [ When the trace cannot be written ]
    # A full disk, or a script that closed the trace's file descriptor and opened another
    # file at its number, makes writing the trace fail. The first failure is kept in
    # ``write_error``, the HDF5 file is never written again (the script runs on, its steps
    # still go to the journal while it can be written) and at close the trace is rebuilt from
    # the journal (NOTE [ The recording journal ] in ckview/trace/journal.py): every step
    # journaled before the failure is kept, in a trace marked incomplete.

    def _write(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``write`` (a TraceWriter method) unless writing failed already; a failure is
        kept in ``write_error`` (NOTE [ When the trace cannot be written ])."""
        if self.write_error is not None or self._writer is None:
            return
        try:
            self._writer.check_file()
            write(*args, **kwargs)
        except _WRITE_ERRORS as exc:
            self.write_error = _describe_write_error(exc)
            self._writer.abandon()  # nothing more goes to it

    def _flush_file(self, now: int) -> None:
        """Put whole steps on disk (the journal keeps them too: NOTE [ The recording journal
        ])."""
        self._flush()
        if self._writer is not None:
            self._write(self._writer.flush)
        self._last_file_flush = now

    def _appended_since_journal(self) -> dict[str, dict[str, np.ndarray]]:
        """Per appended table, its rows since the last journal record: from the batches
        written since (their rows not in the journal yet) and from the buffer, unwritten."""
        batches, self._journal_batches = self._journal_batches, []
        found = {}
        for buf in (self._ops, self._mem, self._saved, self._io):
            table, start = buf.table, self._journaled.get(buf.table, 0)
            end = self._sunk.get(table, 0)
            parts = []
            for name, columns in reversed(batches):
                if name == table and end > start:
                    size = _length(columns)
                    parts.append({c: a[max(start - (end - size), 0) :] for c, a in columns.items()})
                    end -= size
            parts.reverse()
            rest = buf.unflushed(start)
            self._since_start(rest)
            parts.append(rest)
            if buf.rows > start:
                found[table] = {c: np.concatenate([p[c] for p in parts]) for c in rest}
            self._journaled[table] = buf.rows
        return found

    def _journal_step(self) -> None:
        """Append the step that just ended to the journal (NOTE [ The recording journal ])."""
        journal, writer = self._journal, self._writer
        if journal is None or writer is None:
            return
        blocks: dict[str, str] = {}
        arrays: dict[str, np.ndarray] = {}
        for table, columns in self._appended_since_journal().items():
            blocks[table] = "append"
            arrays.update({f"{table}/{name}": col for name, col in columns.items()})
        for mutable in (self._storages, self._calls, self._steps, self._regions):
            rows, columns = mutable.take_changes()
            self._since_start(columns)
            _add_rows(blocks, arrays, mutable.table, rows, columns)
        assert self._modules is not None
        modules = self._modules.columns()
        _add_rows(blocks, arrays, "modules", *_changed(self._journal_modules, modules))
        self._journal_modules = modules
        strings = writer.strings_since(self._journal_strings)
        self._journal_strings += len(strings)
        spec = self.runs[self._run_index]
        header = {
            "kind": "step",
            "run": spec.name,
            "attrs": {
                "steps_recorded": self._steps_in_run,
                "checkpointing": spec.checkpointing,
                "complete": self._steps_in_run >= self.steps,
            },
            "meta": {
                "steps_recorded": self.steps_recorded,
                "device": "cuda" if self._saw_cuda else "cpu",
                "step_rule": self._tracker.describe(self.warmup, modules=not self._no_modules),
                "allocator_events": self._allocator_events(),
            },
            "strings": strings,
            "blocks": blocks,
        }
        if self.write_error is not None:
            return  # the journal's last record is the last step kept: room to rebuild it
        try:
            journal.append(header, arrays)
        except OSError as exc:  # a full disk: the steps journaled so far are what is kept
            self._journal = None
            self.write_error = _describe_write_error(exc)
            writer.abandon()

    def _journal_timing(self) -> None:
        """Put the kept timing steps of the current run in the journal, whole (a few rows), so
        that a recording killed during its timing steps keeps those already timed."""
        journal, run = self._journal, self._timer.current
        if journal is None or run is None or not run.steps_ns or self.write_error is not None:
            return
        blocks: dict[str, str] = {}
        arrays: dict[str, np.ndarray] = {}
        for table, columns in (
            ("timing_steps", run.step_columns()),
            ("timed_calls", run.call_columns()),
        ):
            data = {name: np.asarray(col, dtype=np.int64) for name, col in columns.items()}
            _add_rows(blocks, arrays, table, np.arange(_length(data)), data)
        name = self.runs[self._schedule[self._timing_pos].run].name
        header = {"kind": "timing", "run": name, "strings": [], "meta": {}, "blocks": blocks}
        try:
            journal.append(header, arrays)
        except OSError:  # a full disk: the recorded steps are in the journal already
            self._journal = None

    def _flush(self) -> None:
        if self._allocator.running and len(self._mem.data) > WINDOW_ROWS * self._mem.width:
            self._close_window()
            self._open_window()
        self._busy = True
        try:
            # Ops and memory events wait for their window's merge (NOTE [ Allocator events ]).
            held = (self._ops, self._mem) if self._allocator.running else ()
            for buf in (self._ops, self._mem, self._saved, self._io):
                if buf not in held:
                    buf.flush()
            if self._ops not in held:
                del self._op_stacks[:]
        finally:
            self._busy = False

    # NOTE [ Allocator events ] in allocations.py: the allocator's events come in windows,
    # merged into the window's ops and memory events before those are written.

    def _open_window(self) -> None:
        self._allocator.start()

    def _close_window(self) -> None:
        """Merge the allocator's events of the window into its rows and write them."""
        busy, self._busy = self._busy, True
        try:
            window = self._allocator.stop()
            if window is not None:
                self._merge_window(window)
            self._ops.flush()
            self._mem.flush()
            del self._op_stacks[:]
        finally:
            self._busy = busy

    def _merge_window(self, window: Any) -> None:
        mem, ops = self._mem, self._ops
        # Copies: a live numpy view of an array.array would keep it from growing. A free that
        # the garbage collector runs meanwhile is appended after the window's rows.
        taken = len(mem.data)
        events = np.frombuffer(mem.data, dtype=np.int64).reshape(-1, mem.width).copy()
        op_rows = np.frombuffer(ops.data, dtype=np.int64).reshape(-1, ops.width).copy()
        first_op = ops.rows - len(op_rows)
        # Gathered for the window's rows alone (fancy indexing copies): a cost per window that
        # does not grow with the run. No view outlives this line (``_add_workspaces`` appends).
        sids = events[:, 1]
        address = np.frombuffer(self._st_address, dtype=np.int64)[sids]
        nbytes = np.frombuffer(self._st_data, dtype=np.int64)[sids * _ST_WIDTH + _ST_NBYTES]

        def workspaces(blocks: list[Block], ops: np.ndarray) -> int:
            local = ops - first_op
            calls = np.full(len(ops), NO_INDEX, dtype=np.int64)
            calls[local >= 0] = op_rows[local[local >= 0], _OP_CALL]
            return self._add_workspaces(blocks, ops, calls)

        start = op_rows[:, _OP_START]
        merged = self._merge.merge(window, events, address, nbytes, start, first_op, workspaces)
        mem.data = array.array("q", merged.tobytes()) + mem.data[taken:]
        data = self._st_data
        for block in self._merge.touched:
            at = block.storage * _ST_WIDTH
            if block.alloc_ns >= 0 and data[at + _ST_ALLOC_NS] >= 0:  # an ALLOC's block
                data[at + _ST_NBYTES] = block.nbytes
                data[at + _ST_ALLOC_NS] = block.alloc_ns
            if block.free_ns >= 0:
                data[at + _ST_FREE_NS] = block.free_ns
        self._merge.touched.clear()

    def _keep_the_trace_open_on_closerange(self) -> Callable[[], None]:
        """A script that closes every file descriptor (``os.closerange(3, ...)``, as daemons
        do) closes all but the trace's, and the allocator's window closes first, the next
        one opening at the next step boundary: without either (or with the window reopened at
        once) torch's profiler crashed the process. NOTE [ A file closed under the writer ] in
        ckview/trace/writer.py covers a plain ``os.close``. Returns the undo."""
        real, owner = os.closerange, os.getpid()

        def closerange(low: int, high: int) -> None:
            writer = self._writer
            ours = writer.fileno() if writer is not None and os.getpid() == owner else -1
            if ours >= 0:
                self._close_window()
                self._allocator.give_up("the script closed every file descriptor")
            if low <= ours < high:
                real(low, ours)
                low = ours + 1
            real(low, high)

        os.closerange = closerange

        def undo() -> None:
            os.closerange = real

        return undo

    def _stack_of(self, op: int) -> int:
        """The stack row of buffered op ``op`` (-1 without --stacks or for an older op)."""
        at = op - (self._ops.rows - len(self._op_stacks))
        return self._op_stacks[at] if 0 <= at < len(self._op_stacks) else NO_INDEX

    def _add_workspaces(self, blocks: list[Block], ops: np.ndarray, calls: np.ndarray) -> int:
        """Storage rows for memory only the allocator saw (NOTE [ Matching blocks ]): temporaries
        of the op running when each block was allocated. Returns the first row."""
        first = len(self._st_data) // _ST_WIDTH
        call_module = np.frombuffer(self._calls.data, dtype=np.int64)[::_CALL_WIDTH]
        modules = np.full(len(calls), NO_INDEX, dtype=np.int64)
        in_call = calls >= 0
        modules[in_call] = call_module[calls[in_call]]
        devices = {
            name: self._cpu_id if name == "cpu" else self._intern(name)
            for name in {block.device for block in blocks}
        }
        unknown = self._intern("")
        rows = np.empty((len(blocks), _ST_WIDTH), dtype=np.int64)
        rows[:, _ST_NBYTES] = [block.nbytes for block in blocks]
        rows[:, _ST_DEVICE] = [devices[block.device] for block in blocks]
        rows[:, _ST_CATEGORY] = _TEMPORARY
        rows[:, _ST_DTYPE] = rows[:, _ST_SHAPE] = unknown
        rows[:, _ST_OP], rows[:, _ST_CALL], rows[:, _ST_MODULE] = ops, calls, modules
        rows[:, _ST_ALLOC_NS] = [block.alloc_ns for block in blocks]
        rows[:, _ST_FREE_NS] = [block.free_ns for block in blocks]
        rows[:, _ST_STACK] = [self._stack_of(int(op)) for op in ops] if self._stacks else NO_INDEX
        self._st_data.frombytes(rows.tobytes())
        self._st_address.frombytes(np.array([b.address for b in blocks], np.int64).tobytes())
        return first

    def _end_run(self, error: str) -> None:
        """Write the run's tables that stayed editable, close it and leave its context."""
        self._busy = True
        try:
            now = perf_counter_ns()
            last = len(self._steps) - 1
            if last >= 0 and self._steps.get(last, "end_ns") == -1:
                self._close_step_row(now, self._tracker.current(), complete=False)
            self._close_window()
            for buf in (self._ops, self._mem, self._saved, self._io):
                buf.flush()
            self._sink("device_samples", self._device_samples(now))
            for table in (self._storages, self._calls, self._steps, self._regions):
                self._sink(table.table, table.as_columns())
            spec = self.runs[self._run_index]
            self._write(
                self._run.set_attrs,
                steps_recorded=self._steps_in_run,
                checkpointing=spec.checkpointing,
                **self._oom.attrs(error, self._t0),
            )
            self._write(self._run.close, complete=not error)
        finally:
            self._busy = False
            self._state = State.BETWEEN_RUNS
            self._known.clear()  # dropping the weak refs also drops their callbacks
            context, self._run_context = self._run_context, None
            if context is not None:
                context.__exit__(None, None, None)

    def _finish(self, error: str) -> None:
        """End the current run if one is open, then write the modules and meta. The trace stays
        open for the timings (``_close_trace``)."""
        error = self._failure(error)
        if self._state is State.RECORDING:
            self._end_run(error)
        early, self._early_context = self._early_context, None
        if early is not None:  # the script ended before the run it was entered for
            early.__exit__(None, None, None)
        self._state = State.DONE
        self._known.clear()
        writer = self._writer
        if writer is None:
            return
        self._busy = True
        try:
            assert self._modules is not None
            self._write(writer.append_modules, self._modules.columns())
            if self._stacks is not None:
                self._write(self._stacks.write, writer)
            self._write(
                writer.update_meta,
                steps_recorded=self.steps_recorded,
                device="cuda" if self._saw_cuda else "cpu",
                step_rule=self._tracker.describe(self.warmup, modules=not self._no_modules),
                compiled=self._compiled(),
                device_total_bytes=self._device.total_bytes,
                allocator_events=self._allocator_events(),
            )
            self._write(writer.flush)
        finally:
            self._busy = False

    def _close_trace(self, error: str) -> None:
        """Write the plain timings (NOTE [ Plain timing steps ] in timing.py), with checkpoint's
        cost per call unless the script failed, close the trace and settle it (NOTE [ Writing
        beside the target ] in output.py). Call with every hook removed: the cost is measured
        on a model of its own."""
        writer = self._writer
        if writer is None:
            return
        error = self._failure(error)
        try:
            timed = [(name, t) for name, t in self._timer.runs.items() if t.steps_ns]
            for name, times in timed:
                self._write(lambda n=name, t=times: self._timings(writer.run(n), t))
            if timed and not error:
                cost = plan_call_cost_ns()
                self._write(
                    writer.update_meta,
                    checkpoint_call_ns=cost.median_ns,
                    checkpoint_call_low_ns=cost.low_ns,
                    checkpoint_call_high_ns=cost.high_ns,
                )
            if self.write_error is None:
                self._write(writer.close, complete=not error, error=error)
        finally:
            self._writer = None
            self._settle(writer, error)

    @staticmethod
    def _timings(run: Any, times: RunTimes) -> None:
        run.append("timing_steps", times.step_columns())
        run.append("timed_calls", times.call_columns())

    def _settle(self, writer: TraceWriter, error: str) -> None:
        """Put the closed trace where it belongs; after a write failure, the trace rebuilt from
        the journal (NOTE [ When the trace cannot be written ])."""
        self._journal = None
        if self.write_error is None:
            self.written = settle(self._staging, self.path, good=not error)
            self.journal.unlink(missing_ok=True)
            return
        writer.abandon()
        self._staging.unlink(missing_ok=True)  # frees the room the rebuilt trace needs
        why = f"{self.write_error}; the steps recorded before are kept"
        if not room_for(self.journal):
            return  # the journal stays, for ckview recover once there is room
        try:
            recovered = recover_journal(self.journal, self._staging, why)
        except (OSError, RuntimeError, TraceError):
            return  # the journal stays, for ckview recover once there is room
        self.steps_recorded = recovered.steps
        self.written = settle(self._staging, self.path, good=False)
        self.journal.unlink(missing_ok=True)

    def _failure(self, error: str) -> str:
        """``error``, or why no step was recorded: that is a failure too."""
        if error or self.steps_recorded:
            return error
        if self._warmup_done < self.warmup:
            done = f"{self._warmup_done} of {plural(self.warmup, 'warmup step')}"
            return f"no step was recorded: the code ended after {done}"
        rule = self._tracker.describe(self.warmup)
        return f"no step was recorded: the first recorded step never ended (steps: {rule})"

    # ----------------------------------------------------------------- install / uninstall

    def _install(self) -> None:
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_in_child(me))
        self._handles = [
            register_module_forward_pre_hook(self._pre_forward),
            register_module_forward_hook(self._post_forward, with_kwargs=True, always_call=True),
            register_optimizer_step_pre_hook(self._pre_optimizer),
            register_optimizer_step_post_hook(self._post_optimizer),
        ]
        self._hooks_cm = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks_cm.__enter__()
        self._wrap_saved_tensor_hooks()
        self._wrap_optimizer_init()
        self._wrap_torch_recompute()
        self._eager_compile.install()
        self._restore.append(self._eager_compile.uninstall)
        self._restore.append(self._allocator.yield_to_the_script())
        self._restore.append(self._keep_the_trace_open_on_closerange())
        self._listen_to_ckpt_runtime()
        self._observer = _OpObserver(self)
        self._observer.__enter__()
        self._no_modules = self._await_forward = self._registry.empty

    def _uninstall(self, keep_optimizer_hooks: bool = False) -> None:
        """Remove every hook; a hook that others stacked on top of stays, inert. Inside
        backward the thread-local ones (saved-tensor hooks, the op hook) stay for ``close``:
        autograd restores thread-local state when backward returns (NOTE [ A forward without
        modules ])."""
        keep = self._handles[2:] if keep_optimizer_hooks else []
        for handle in self._handles:
            if handle not in keep:
                handle.remove()
        self._handles = keep
        while self._restore:
            self._restore.pop()()
        self._allocator.stop()  # a window left open by a failure: the profiler is the user's
        if self._orig_hooks_init is not None:
            torch.autograd.graph.saved_tensors_hooks.__init__ = self._orig_hooks_init  # type: ignore[method-assign]
            self._orig_hooks_init = None
        if self._in_backward_callback:
            return
        if self._hooks_cm is not None:
            top = torch._C._autograd._top_saved_tensors_default_hooks(True)
            if top is not None and top[0] == self._pack:
                self._hooks_cm.__exit__()
                self._hooks_cm = None
        if self._observer is not None and _get_current_dispatch_mode() is self._observer:
            self._observer.__exit__(None, None, None)
            self._observer = None

    def _wrap_optimizer_init(self) -> None:
        """Know every optimizer built while recording, before its first step: a GAN's second
        optimizer must be waited for (NOTE [ Step = one optimizer iteration ])."""
        cls = torch.optim.Optimizer
        orig_init = cls.__init__
        me = weakref.ref(self)

        @functools.wraps(orig_init)  # keeps inspect.signature (libraries read it)
        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(optimizer, *args, **kwargs)
            rec = me()
            if rec is not None and rec._state is not State.DONE:
                rec._on_optimizer_created(optimizer)

        cls.__init__ = init  # type: ignore[method-assign, assignment]
        self._restore.append(lambda: setattr(cls, "__init__", orig_init))

    def _wrap_torch_recompute(self) -> None:
        """Bracket torch.utils.checkpoint's recompute (see NOTE [ Recompute regions ])."""
        hook_cls = getattr(torch.utils.checkpoint, "_recomputation_hook", None)
        if hook_cls is None:
            return  # a torch without it: module hooks still see module regions
        enter, exit_ = hook_cls.__enter__, hook_cls.__exit__
        rec = self

        def wrapped_enter(hooks: Any) -> Any:
            rec._recompute_enter(NO_INDEX, NO_INDEX)
            return enter(hooks)

        def wrapped_exit(hooks: Any, *exc: Any) -> Any:
            try:
                return exit_(hooks, *exc)
            finally:
                rec._recompute_exit()

        hook_cls.__enter__, hook_cls.__exit__ = wrapped_enter, wrapped_exit
        self._restore.append(lambda: _set_enter_exit(hook_cls, enter, exit_))
        self._wrap_reentrant_recompute()

    def _wrap_reentrant_recompute(self) -> None:
        """Bracket the re-run of a reentrant ``torch.utils.checkpoint`` region: its backward
        calls ``ctx.run_function`` again (then runs the region's own backward, which is not a
        recompute). A checkpointed module is seen by its forward hook anyway; a checkpointed
        plain function (``checkpoint(fn, x, use_reentrant=True)``) only here."""
        function_cls = getattr(torch.utils.checkpoint, "CheckpointFunction", None)
        if function_cls is None:
            return
        original = function_cls.backward
        rec = self

        def backward(ctx: Any, *grads: Any) -> Any:
            run = ctx.run_function
            row = rec._registry.row(run)
            name = None if row is not None else getattr(run, "__qualname__", None) or repr(run)

            def recompute(*args: Any) -> Any:
                rec._recompute_enter(NO_INDEX, NO_INDEX if row is None else row, name)
                try:
                    return run(*args)
                finally:
                    rec._recompute_exit()

            ctx.run_function = recompute
            try:
                return original(ctx, *grads)
            finally:
                ctx.run_function = run

        function_cls.backward = staticmethod(backward)
        self._restore.append(lambda: setattr(function_cls, "backward", staticmethod(original)))

    def _wrap_fsdp_resize(self) -> None:
        """Follow FSDP's storage resizes (NOTE [ FSDP's storages ]), once FSDP is in use: the
        script has built its model by the first recorded step."""
        fsdp_param = sys.modules.get(_FSDP_PARAM_MODULE)
        if self._fsdp_wrapped or fsdp_param is None:
            return
        self._fsdp_wrapped = True
        cls = fsdp_param.FSDPParam
        alloc, free = cls.alloc_all_gather_outputs, cls.free_unsharded_param
        rec = self

        def alloc_all_gather_outputs(param: Any) -> None:
            alloc(param)
            rec._on_resized(param)

        def free_unsharded_param(param: Any) -> None:
            free(param)
            rec._on_resized(param)

        cls.alloc_all_gather_outputs = alloc_all_gather_outputs
        cls.free_unsharded_param = free_unsharded_param
        self._restore.append(lambda: _set_alloc_free(cls, alloc, free))

    def _on_resized(self, fsdp_param: Any) -> None:
        """FSDP resized the storages of a parameter's all-gather outputs: to 0 is their FREE,
        back is an ALLOC of a new storage row, owned by the parameter's module (NOTE [ FSDP's
        storages ])."""
        if self._state is not State.RECORDING:
            return
        module = self._registry.row(fsdp_param._module_info.module)
        for tensor in fsdp_param.all_gather_outputs:
            st = tensor.untyped_storage()
            ref = self._known.get(st._cdata)
            if st.nbytes() == 0:
                if ref is not None:
                    self._on_free(ref)
                    ref.sid = ref.key = -1
                continue
            if ref is None:
                now = perf_counter_ns()
                call = self._stack[-1][1] if self._stack else NO_INDEX
                sid = self._add_storage(tensor, st, st.nbytes(), _UNSHARDED, NO_INDEX, call, now)
                self._mem.data.extend((_ALLOC, sid, self._last_op, now))
            else:
                sid = ref.sid
                self._promote(sid, _UNSHARDED)
            if module is not None:
                self._st_data[sid * _ST_WIDTH + _ST_MODULE] = module

    def _listen_to_ckpt_runtime(self) -> None:
        try:
            from ckpt_runtime import markers
        except ImportError:  # an older ckpt_runtime without markers
            return
        handle = markers.add_listener(self)
        self._restore.append(handle.remove)

    def _wrap_saved_tensor_hooks(self) -> None:
        """See NOTE [ Cooperating with other saved-tensor hooks ]."""
        hooks_cls = torch.autograd.graph.saved_tensors_hooks
        orig_init = hooks_cls.__init__
        rec = self

        def init(hooks: Any, pack_hook: Any, unpack_hook: Any) -> None:
            orig_init(hooks, rec._observe_pack(pack_hook), rec._observe_unpack(unpack_hook))

        self._orig_hooks_init = orig_init
        hooks_cls.__init__ = init  # type: ignore[method-assign, assignment]

    def _observe_pack(self, inner: Any) -> Any:
        def pack(x: torch.Tensor) -> Any:
            packed = inner(x)
            if self._state is State.RECORDING and isinstance(packed, _Tensor):
                self._on_saved(packed, SavedEventKind.PACK)
            return packed

        return pack

    def _observe_unpack(self, inner: Any) -> Any:
        def unpack(packed: Any) -> Any:
            x = inner(packed)
            if self._state is State.RECORDING and isinstance(x, _Tensor):
                self._on_saved(x, SavedEventKind.UNPACK)
            return x

        return unpack

    # ----------------------------------------------------------------- steps and phases

    def _start_recording(self) -> None:
        """Begin the next run at a step boundary: enter its context, note what exists."""
        if self._state is State.BETWEEN_RUNS:
            self._begin_run_tables()
        spec = self.runs[self._run_index]
        self._run_context, self._early_context = self._early_context, None
        if spec.context is not None and self._run_context is None:
            self._run_context = spec.context(self)
            self._run_context.__enter__()
        self._begin_recording()

    def _begin_recording(self) -> None:
        """The run's first recorded step begins: note what exists."""
        self._state = State.RECORDING
        self._t0 = self._last_file_flush = perf_counter_ns()
        self._wrap_fsdp_resize()
        for p in self._parameters():  # an optimizer's parameters that no module owns too
            self._mark(p, _PARAMETER)
        self._mark_gradients()
        self._mark_optimizer_tensors()
        self._open_step(self._t0)
        self._open_window()

    def _open_step(self, now: int) -> None:
        self._steps.append((self._step, now, -1, self._n_ops, self._mem.rows, -1, -1, -1, 0))
        self._device.step_begins(now)

    def _close_step_row(self, now: int, counts: StepCounts, complete: bool) -> None:
        row, steps = len(self._steps) - 1, self._steps
        steps.set(row, "end_ns", now)
        steps.set(row, "forwards", counts.forwards)
        steps.set(row, "backwards", counts.backwards)
        steps.set(row, "optimizer_steps", counts.optimizer_steps)
        steps.set(row, "complete", int(complete))
        self._device.step_ends(now)

    def _end_step(self) -> None:
        """A step boundary (NOTE [ Step = one optimizer iteration ])."""
        now = perf_counter_ns()
        counts = self._tracker.boundary()
        self._top_phase = _OTHER
        if self._state is State.WARMUP:
            self._tracker.learned = counts
            self._warmup_done += 1
            self._progress.step_done()
            if self._warmup_done >= self.warmup:
                self._start_recording()
        elif self._state is State.TIMING:
            self._timer.end_step()
            self._journal_timing()
            self._next_timing_step()
        elif self._state is State.RECORDING:
            self._close_step_row(now, counts, complete=True)
            self._close_window()
            self._step += 1
            self._steps_in_run += 1
            self.steps_recorded += 1
            self._journal_step()
            self._progress.step_done()
            if self._steps_in_run < self.steps:
                self._open_step(now)
                self._open_window()
                if now - self._last_file_flush > _FILE_FLUSH_NS:
                    self._flush_file(now)
                return
            self._end_run("")
            self._run_index += 1
            if self._run_index < len(self.runs):
                self._start_recording()
                return
            early, self._early_context = self._early_context, None  # the timing's, if any
            self._finish("")
            self._early_context = early
            if self._schedule:
                self._start_timing()  # the hooks stay for the timing steps
                return
            self._all_done()

    def _all_done(self) -> None:
        """Recording (and timing) done: close the trace; the script runs on unrecorded, or
        stops."""
        early, self._early_context = self._early_context, None
        if early is not None:  # never expected: no run follows
            early.__exit__(None, None, None)
        self._state = State.DONE
        # Optimizer hooks are being iterated right now: they stay, inert, until close().
        self._uninstall(keep_optimizer_hooks=True)
        self._close_trace("")
        self._progress.close()
        if self.stop_after:
            raise StopScript

    # NOTE [ Plain timing steps ] in timing.py: once every run is recorded, the runs are
    # entered again in turn for unrecorded timing steps, following ``self._schedule``.

    def _start_timing(self) -> None:
        self._state = State.TIMING
        # In backward's callback the op hook cannot be taken off (NOTE [ A forward without
        # modules ]): those timing steps run with it.
        self._timer.begin(None if self._in_backward_callback else self._observer)
        self._next_timing_step()

    def _next_timing_step(self) -> None:
        """Begin the schedule's next step, in its run's context; the last one done, close."""
        self._timing_pos += 1
        if self._timing_pos >= len(self._schedule):
            self._timer.stop()
            self._leave_run_context()
            self._timing_run = None
            self._all_done()
            return
        entry = self._schedule[self._timing_pos]
        if entry.run != self._timing_run:
            self._leave_run_context()
            spec = self.runs[entry.run]
            self._run_context, self._early_context = self._early_context, None
            if spec.context is not None and self._run_context is None:
                self._run_context = spec.context(self)
                self._run_context.__enter__()
            self._timing_run = entry.run
        self._timer.start_step(self.runs[entry.run].name, entry.keep, entry.round)

    def _stop_timing(self) -> None:
        """The script ended during the timing steps: keep what was timed."""
        self._timer.stop()
        self._leave_run_context()
        early, self._early_context = self._early_context, None
        if early is not None:
            early.__exit__(None, None, None)
        self._state = State.DONE

    def _leave_run_context(self) -> None:
        context, self._run_context = self._run_context, None
        if context is not None:
            context.__exit__(None, None, None)

    def _enter_backward(self) -> None:
        self._in_backward = True
        self._top_phase = _BACKWARD
        self._node_budget = _NODE_BUDGET
        torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    def _node_seq(self) -> int:
        """Sequence number of the autograd node running now; -1 if none, or -2 once this
        backward's node budget is spent (NOTE [ Autograd nodes stay unwrapped ])."""
        if self._node_budget <= 0:
            return -2
        node = _current_autograd_node()
        if node is None:
            return -1
        seq = _seq_nr(node)
        if seq != self._last_seq:
            self._node_budget -= 1
        return seq

    # NOTE [ Recompute regions ]
    # A region opens when the recompute depth goes 0 -> 1 and closes at 1 -> 0. Three sources
    # nest inside each other and all count: ckpt_runtime's markers (they know the region id and
    # target), torch.utils.checkpoint's recomputation hook (non-reentrant; no target), and
    # module forward calls inside backward (reentrant checkpoint, or the first module of a
    # region that no outer source named). Ops while the depth is above 0 are RECOMPUTE.

    def _recompute_enter(self, region: int, module: int, name: str | None = None) -> None:
        if self._recompute_depth == 0 and self._state is State.RECORDING:
            label = self._intern(name or (self._registry.display(module) if module >= 0 else ""))
            self._open_region = self._regions.append(
                (region, module, label, self._step, perf_counter_ns(), -1, self._n_ops, -1)
            )
            self._region_inferred = module == NO_INDEX and name is None
        elif self._region_inferred and module >= 0 and self._open_region != NO_INDEX:
            # A region opened without a target (torch's recompute of `layer.forward`, as HF
            # does) belongs to the common ancestor of the modules it runs.
            current = self._regions.get(self._open_region, "module")
            owner = (
                module if current == NO_INDEX else self._registry.common_ancestor(current, module)
            )
            if owner != current:
                self._regions.set(self._open_region, "module", owner)
                self._regions.set(
                    self._open_region, "name", self._intern(self._registry.display(owner))
                )
        self._recompute_depth += 1

    def _recompute_exit(self) -> None:
        self._recompute_depth = max(0, self._recompute_depth - 1)
        if self._recompute_depth == 0:
            self._close_region()

    def _close_region(self) -> None:
        if self._open_region != NO_INDEX and self._state is State.RECORDING:
            self._regions.set(self._open_region, "end_ns", perf_counter_ns())
            self._regions.set(self._open_region, "end_op", self._n_ops)
        self._open_region = NO_INDEX

    # Listener protocol of ckpt_runtime.markers.
    def on_recompute_begin(self, region_id: int, target: object) -> None:
        module = self._registry.row(target)
        name = None if module is not None else getattr(target, "__qualname__", repr(target))
        self._recompute_enter(region_id, NO_INDEX if module is None else module, name)

    def on_recompute_end(self, region_id: int, target: object) -> None:
        self._recompute_exit()

    def _allocator_events(self) -> str:
        """The trace's ``allocator_events`` (NOTE [ Allocator events ] in allocations.py)."""
        missing = self._allocator.unavailable
        return f"op hook: {missing}" if missing else "allocator"

    def _compiled(self) -> str:
        """The trace's ``compiled`` field: 'eager' if the script uses ``torch.compile`` (its
        compiled code ran eagerly while recording), else 'no'. NOTE [ torch.compile under the
        recorder ]."""
        used = self._eager_compile.compile_used or self._registry.saw_compiled()
        return "eager" if used else "no"

    def main_model(self) -> torch.nn.Module:
        """The root module with the most parameters seen so far: the script's model."""
        return self._registry.main_model()

    def _on_backward_end(self) -> None:
        self._in_backward = False
        self._recompute_depth = 0
        self._close_region()
        self._top_phase = _OTHER
        # A callback queued after ours (DDP's reducer copying buckets into .grad) runs ops in
        # the same graph task: backward "begins" again there, but it is one backward pass.
        task = _current_graph_task_id()
        if task < 0 or task != self._counted_task:
            self._tracker.on_backward()
        self._counted_task = task
        if self._state is State.RECORDING:
            self._mark_gradients()
        self._await_forward = self._no_modules
        if self._no_modules and self._tracker.boundary_at_next_forward():
            # No forward hook to wait for: NOTE [ A forward without modules ].
            self._in_backward_callback = True
            try:
                self._end_step()
            finally:
                self._in_backward_callback = False
        elif self._tracker.boundary_at_next_forward():
            self._enter_next_context_early()

    # NOTE [ Early run context ]
    # A loop without optimizer ends its step when the next forward begins: inside the root
    # module's forward pre-hook, after torch looked up the root's ``forward`` (and while its
    # ``_call_impl`` runs). A run context entered there (a plan with a segment of the root
    # nn.Sequential, or a region on the root) would miss that first call. So when such a step
    # boundary is due to begin a run, the run's context is entered already at the end of the
    # backward before it (the previous run's context is left then); the run itself still begins
    # at the boundary. What runs in between (a no_grad parameter update) is not checkpointed
    # either way.

    def _enter_next_context_early(self) -> None:
        if self._early_context is not None or not self._next_boundary_starts_run():
            return
        spec = self.runs[self._next_run_index()]
        if spec.context is None:
            return
        context, self._run_context = self._run_context, None
        if context is not None:
            context.__exit__(None, None, None)
        self._early_context = spec.context(self)
        self._early_context.__enter__()

    def _next_boundary_starts_run(self) -> bool:
        """Whether the next step boundary enters another run's context: the first run after
        warmup, the next run, the first run's timing steps after the last recorded step, or
        the next run's timing steps (NOTE [ Plain timing steps ] in timing.py)."""
        if self._state is State.WARMUP:
            return self._warmup_done + 1 >= self.warmup
        if self._state is State.TIMING:
            following = self._schedule[self._timing_pos + 1 : self._timing_pos + 2]
            return bool(following) and following[0].run != self._timing_run
        more = self._run_index + 1 < len(self.runs) or bool(self._schedule)
        return self._state is State.RECORDING and self._steps_in_run + 1 >= self.steps and more

    def _next_run_index(self) -> int:
        """The run whose context the next boundary enters (see _next_boundary_starts_run)."""
        if self._state is State.WARMUP:
            return self._run_index
        if self._state is State.TIMING:
            return self._schedule[self._timing_pos + 1].run
        return self._run_index + 1 if self._run_index + 1 < len(self.runs) else 0

    def _pre_optimizer(
        self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any
    ) -> tuple[Any, Any] | None:
        self._optimizers.add(optimizer)
        self._tracker.add_optimizer(optimizer)
        self._optimizer_depth += 1
        if self._state is State.RECORDING:
            self._mark_gradients()
        return self._wrap_closure(args, kwargs)

    def _wrap_closure(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """``step(closure)``: the closure's forward and backward are FORWARD and BACKWARD, not
        OPTIMIZER (Lightning's automatic optimization, LBFGS). Returns the new arguments;
        ``args[0]`` is the optimizer itself."""
        if len(args) > 1 and callable(args[1]):
            return (args[0], self._closure(args[1]), *args[2:]), kwargs
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._closure(kwargs["closure"])}
        return None

    def _closure(self, closure: Callable[..., Any]) -> Callable[..., Any]:
        def closure_outside_the_optimizer(*a: Any, **k: Any) -> Any:
            depth, phase = self._optimizer_depth, self._top_phase
            self._optimizer_depth, self._top_phase = 0, _OTHER
            try:
                return closure(*a, **k)
            finally:
                self._optimizer_depth, self._top_phase = depth, phase

        return closure_outside_the_optimizer

    def _post_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizer_depth = max(0, self._optimizer_depth - 1)
        if self._state is State.RECORDING:
            self._mark_optimizer_tensors()
        if self._tracker.on_optimizer_step(optimizer):
            self._end_step()

    def _on_optimizer_created(self, optimizer: torch.optim.Optimizer) -> None:
        self._tracker.add_optimizer(optimizer)

    # ----------------------------------------------------------------- modules

    # NOTE [ A forward without modules ]
    # A loop with no nn.Module at all (parameters as plain tensors, the model a function of
    # them) has no module pre-hook to say where its forward begins, nor a module to own its
    # parameters. While no module has run forward, every op outside backward that builds
    # autograd graph (grad mode on, a tensor argument that requires grad, not an op that never
    # does: ``.item()``, ``detach``, comparisons) is looked at: the first one after the
    # recorder is installed or a backward ended begins a forward (counted, its ops FORWARD),
    # and the leaf tensors that require grad among its arguments are parameters (no module
    # owns them). The op hook runs below autograd, where a step boundary cannot be taken (the
    # boundary may write the trace and time checkpoint calls, which need autograd): without
    # optimizer, such a loop's step ends at the end of its backward instead (the no_grad
    # update after it belongs to the next step; NOTE [ Step = one optimizer iteration ] in
    # steps.py), in autograd's final callback. Thread-local state (the op hook, saved-tensor
    # hooks) changed there is undone when backward returns, so there the op hook stays on for
    # timing steps, and when all is done both stay, inert, until ``close``. A script with
    # modules pays one attribute test per op.

    def _functional_op(self, func: Any, args: Any, kwargs: Any) -> None:
        """An op about to run in a loop without modules (NOTE [ A forward without modules ])."""
        if self._in_backward or _current_graph_task_id() >= 0 or not torch.is_grad_enabled():
            return
        graph = [t for t in _tensors_in(args, kwargs) if t.requires_grad]
        if not graph or getattr(func, "_opname", "") in _NO_GRAPH:
            return
        if self._await_forward:
            self._await_forward = False
            self._tracker.forward_begun()
            self._top_phase = _FORWARD
        for t in graph:
            if t.is_leaf and self._registry.add_loose(t) and self._state is State.RECORDING:
                self._mark(t, _PARAMETER)

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        row = self._registry.row(module)
        if row is None:
            if self._registry.passes_through(module):
                return
            if self._state in (State.TIMING, State.DONE):
                return  # timing steps: a module first seen now is not timed
            row = self._register_module(module)
        if not self._in_backward and _current_graph_task_id() >= 0:
            self._enter_backward()  # a recompute before backward's first op
        if not self._stack and not self._in_backward:
            if self._tracker.on_forward():
                self._end_step()  # e.g. a loop without optimizer: the next forward starts a step
            self._tracker.forward_begun()
            self._top_phase = _FORWARD
            if self._state is State.TIMING:
                self._timing_forward()
        call = NO_INDEX
        if self._state is State.RECORDING:
            call = self._open_call(row)
        elif self._state is State.TIMING and not self._in_backward:
            self._timer.call_begin(row)
        self._stack.append((row, call))

    def _timing_forward(self) -> None:
        """A top-level forward in a timing step; without optimizer it ends the step if the step
        had one already (NOTE [ Plain timing steps ] in timing.py)."""
        if not self._tracker.ends_at_forward() or not torch.is_grad_enabled():
            return
        if self._timer.forwards:
            self._end_step()
        if self._state is State.TIMING:
            self._timer.forwards += 1

    def _open_call(self, module_row: int) -> int:
        phase = _RECOMPUTE if self._in_backward else _FORWARD
        seq = _get_sequence_nr()
        parent = self._stack[-1][1] if self._stack else NO_INDEX
        call = self._calls.append(
            (module_row, parent, phase, self._step, perf_counter_ns(), -1, seq, -1)
        )
        if phase == _RECOMPUTE:
            self._recompute_enter(NO_INDEX, module_row)
        else:
            self._fw_seq_begin.append(seq)
            self._fw_calls.append(call)
        return call

    def _post_forward(self, module: torch.nn.Module, args: Any, *rest: Any) -> None:
        # (kwargs, output) normally; only (output,) when forward raised: torch then calls
        # always_call hooks without kwargs (checkpoint's early stop raises inside recompute).
        kwargs, output = rest if len(rest) == 2 else ({}, rest[0])
        if not self._stack or self._stack[-1][0] != self._registry.row(module):
            return  # the matching pre-hook ran before we were installed
        row, call = self._stack.pop()
        if self._state is State.TIMING:
            self._timer.call_end(row)
        if call != NO_INDEX and self._state is State.RECORDING:
            # Inputs are noted here, where keyword arguments are seen too; they are still alive.
            self._note_io(call, args, _INPUT_IO)
            self._note_io(call, kwargs, _INPUT_IO)
            self._note_io(call, output, _OUTPUT_IO)
            calls = self._calls
            calls.set(call, "end_ns", perf_counter_ns())
            calls.set(call, "seq_end", _get_sequence_nr())
            if calls.get(call, "phase") == _RECOMPUTE:
                self._recompute_exit()

    def _note_io(self, call: int, value: Any, kind: int) -> None:
        """Record the storages of the tensors going into or out of a module call."""
        now = perf_counter_ns()
        for t in _tensors_in(value):
            st = _storage_of(t)
            if st is None:
                continue
            ref = self._known.get(st._cdata)
            sid = self._register_existing(t, st, _OTHER, now) if ref is None else ref.sid
            if sid is not None:
                self._io.data.extend((call, sid, kind))

    def _register_module(self, module: torch.nn.Module) -> int:
        self._no_modules = self._await_forward = False
        caller = self._stack[-1][0] if self._stack else NO_INDEX
        row, new_params = self._registry.register(module, caller)
        if self._state is State.RECORDING:
            for p in new_params:
                self._mark(p, _PARAMETER)
        return row

    # ----------------------------------------------------------------- devices and OOMs

    def _device_samples(self, now: int) -> dict[str, np.ndarray]:
        """The run's ``device_samples`` (NOTE [ Device samples ] in recorder/device.py), the
        run's last boundary sampled now (at its last step's end); peaks placed on the recorded
        storages."""
        last = len(self._steps) - 1
        self._device.run_ends(self._steps.get(last, "end_ns") if last >= 0 else now)
        storages = self._storages.as_columns()

        def peak_time(device: str, start: int, end: int) -> int:
            return recorded_peak_time(storages, self._intern(device), start, end)

        return self._device.columns(peak_time)

    def _on_op_failed(self, func: Any, exc: BaseException, t0: int) -> None:
        """An op raised while recording: note it if it failed to allocate (NOTE [ OOM capture ]
        in recorder/oom.py), with the module it ran in."""
        if self._oom.failed(exc, str(func), self._module_running, t0):
            self._device.oom(t0)

    def _module_running(self) -> str:
        """Path of the module call the current op runs in (in backward: the forward call of the
        last attributed node), '' if none."""
        if self._in_backward and not self._recompute_depth:
            call = self._last_seq_call
            row = NO_INDEX if call == NO_INDEX else self._calls.data[call * _CALL_WIDTH]
        else:
            row = self._stack[-1][0] if self._stack else NO_INDEX
        return "" if row == NO_INDEX else self._registry.display(row)

    # ----------------------------------------------------------------- ops (hot path)

    def _on_op(self, func: Any, args: Any, kwargs: Any, out: Any, t0: int, t1: int) -> None:
        stack = self._stack
        seq = -1
        if self._in_backward or _current_graph_task_id() >= 0:
            if not self._in_backward:
                self._enter_backward()
            if self._recompute_depth:
                phase, call = _RECOMPUTE, stack[-1][1] if stack else NO_INDEX
            else:
                phase = _BACKWARD
                seq = self._node_seq()
                if seq == -2:
                    seq, call = -1, self._last_seq_call
                else:
                    call = self._backward_call(seq)
        elif self._optimizer_depth:
            phase, call = _OPTIMIZER, NO_INDEX
        elif stack:
            phase, call = _FORWARD, stack[-1][1]
        else:
            phase, call = self._top_phase, NO_INDEX

        name = self._op_names.get(id(func))  # OpOverload's own __hash__ is Python code
        if name is None:
            name = self._op_names[id(func)] = self._intern(str(func))
            self._op_funcs.append(func)  # keeps id(func) from being reused
            if str(func) in _FSDP_OPS:
                self._op_categories[name] = _FSDP_OPS[str(func)]
        row = self._n_ops
        self._n_ops = row + 1
        self._last_op = row
        self._ops.data.extend((name, phase, call, self._step, t0, t1, seq))
        if self._stacks is not None:  # NOTE [ User frames ] in stacks.py
            self._op_stacks.append(self._stacks.current())

        # NOTE [ New storage = unknown output storage ]: inputs first, then outputs.
        for arg in args:
            if isinstance(arg, _Tensor):
                self._see_input(arg, phase, t1)
            elif type(arg) is list or type(arg) is tuple:
                for item in arg:
                    if isinstance(item, _Tensor):
                        self._see_input(item, phase, t1)
        if kwargs:
            for arg in kwargs.values():
                if isinstance(arg, _Tensor):
                    self._see_input(arg, phase, t1)
        if isinstance(out, _Tensor):
            self._see_output(out, row, call, phase, t1)
        elif type(out) is tuple or type(out) is list:
            for item in out:
                if isinstance(item, _Tensor):
                    self._see_output(item, row, call, phase, t1)
        if phase == _OTHER:
            self._link_sources(args, kwargs, out)
        if self._op_categories and name in self._op_categories:
            category, which = self._op_categories[name]
            for t in _tensors_in(out if which == "result" else kwargs.get("out")):
                self._mark(t, category)
        if row & 4095 == 4095:
            self._flush()

    def _link_sources(self, args: Any, kwargs: Any, out: Any) -> None:
        """Outside the step's phases (data handling between steps): remember which storages an
        op's new outputs were made from (NOTE [ Inputs and their sources ])."""
        made = [s for s in map(self._sid_of, _tensors_in(out)) if s is not None]
        if not made:
            return
        sources = [s for s in map(self._sid_of, _tensors_in(args, kwargs)) if s is not None]
        for sid in made:
            if sid not in sources:
                self._sources.setdefault(sid, []).extend(sources)

    def _sid_of(self, t: torch.Tensor) -> int | None:
        st = _storage_of(t)
        ref = None if st is None else self._known.get(st._cdata)
        return None if ref is None else ref.sid

    def _promote_input(self, sid: int) -> None:
        """An OTHER storage used by the step's forward is an input, and so is every OTHER
        storage it was made from (NOTE [ Inputs and their sources ])."""
        data, todo = self._st_data, [sid]
        while todo:
            at = todo.pop() * _ST_WIDTH + _ST_CATEGORY
            if data[at] == _OTHER_CAT:
                data[at] = _INPUT
                todo += self._sources.pop(at // _ST_WIDTH, ())

    def _see_input(self, t: torch.Tensor, phase: int, now: int) -> None:
        try:
            plain = type(t) is _Tensor or type(t) is _Parameter
            st = (t if plain else _local(t)).untyped_storage()
        except (RuntimeError, NotImplementedError):
            return  # sparse, mkldnn: no storage to follow
        ref = self._known.get(st._cdata)
        if ref is None:
            self._register_existing(t, st, phase, now)
        elif phase == _FORWARD and self._st_data[ref.sid * _ST_WIDTH + _ST_CATEGORY] == _OTHER_CAT:
            self._promote_input(ref.sid)  # made outside the forward (a batch), used by it

    def _see_output(self, t: torch.Tensor, op: int, call: int, phase: int, now: int) -> None:
        if type(t) is not _Tensor and type(t) is not _Parameter:
            t = _local(t)  # NOTE [ FSDP's storages ]
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st._cdata in self._known:
            return
        nbytes = st.nbytes()
        if nbytes == 0 or t.is_meta:
            return
        category = _OTHER_CAT if phase == _OTHER else _TEMPORARY
        sid = self._add_storage(t, st, nbytes, category, op, call, now)
        self._mem.data.extend((_ALLOC, sid, op, now))

    def _register_existing(self, t: torch.Tensor, st: Any, phase: int, now: int) -> int | None:
        """First sight of a storage made before recording (or outside any op)."""
        nbytes = st.nbytes()
        if nbytes == 0 or t.is_meta:
            return None
        local = _local(t)
        if isinstance(t, _Parameter):
            category = _PARAMETER if local is t else _SHARDED  # NOTE [ FSDP's storages ]
        elif phase == _FORWARD or (t.is_cpu and st.is_shared()):
            category = _INPUT  # NOTE [ Inputs and their sources ]: also a worker's batch
        else:
            category = _OTHER_CAT
        sid = self._add_storage(local, st, nbytes, category, NO_INDEX, NO_INDEX, -1)
        self._mem.data.extend((_SEEN, sid, self._last_op, now))
        return sid

    def _add_storage(
        self, t: torch.Tensor, st: Any, nbytes: int, category: int, op: int, call: int, now: int
    ) -> int:
        dtype_id, shape_id = self._layout_ids(t)
        device_id = self._cpu_id if t.is_cpu else self._device_id(t)
        module = self._calls.data[call * _CALL_WIDTH] if call != NO_INDEX else NO_INDEX
        sid = len(self._st_data) // _ST_WIDTH
        row = (nbytes, device_id, category, dtype_id, shape_id, op, call, module, now)
        self._st_data.extend((*row, -1, self._stack_of(op)))
        self._st_address.append(st.data_ptr())
        ref = _StorageRef(st, self._on_free)
        ref.sid = sid
        ref.key = st._cdata
        self._known[ref.key] = ref
        return sid

    def _on_free(self, ref: _StorageRef) -> None:
        """Weak-reference callback: the storage's memory was just released."""
        self._known.pop(ref.key, None)
        if self._state is not State.RECORDING or ref.sid < 0:
            return  # sid -1: freed already by a resize (NOTE [ FSDP's storages ])
        now = perf_counter_ns()
        self._st_data[ref.sid * _ST_WIDTH + _ST_FREE_NS] = now
        self._mem.data.extend((_FREE, ref.sid, self._last_op, now))

    def _promote(self, sid: int, category: int) -> None:
        """Give storage ``sid`` ``category`` unless it already has a stronger one."""
        at = sid * _ST_WIDTH + _ST_CATEGORY
        if _RANK[category] < _RANK[self._st_data[at]]:
            self._st_data[at] = category

    def _backward_call(self, seq: int) -> int:
        """The forward module call whose ops created the autograd node numbered ``seq``."""
        if seq == self._last_seq:
            return self._last_seq_call
        i = bisect_right(self._fw_seq_begin, seq) - 1
        call = self._fw_calls[i] if i >= 0 else NO_INDEX
        calls = self._calls
        while call != NO_INDEX:
            end = calls.get(call, "seq_end")
            if end == -1 or seq < end:
                break
            call = calls.get(call, "parent")
        self._last_seq, self._last_seq_call = seq, call
        return call

    # ----------------------------------------------------------------- categories

    def _mark(self, t: torch.Tensor, category: int, owner: torch.Tensor | None = None) -> None:
        """Give the tensor's storage ``category`` unless it already has a stronger one.

        ``owner`` is the parameter a gradient or optimizer state belongs to (a parameter owns
        itself): its module becomes the storage's module.
        """
        st = _storage_of(t)
        if st is None:
            return
        ref = self._known.get(st._cdata)
        if ref is None:
            sid = self._register_existing(t, st, _OTHER, perf_counter_ns())
        else:
            sid = ref.sid
        if sid is None:
            return
        if category == _PARAMETER and _local(t) is not t:
            category = _SHARDED  # NOTE [ FSDP's storages ]
        self._promote(sid, category)
        at = sid * _ST_WIDTH + _ST_MODULE
        if self._st_data[at] == NO_INDEX:
            self._st_data[at] = self._registry.owner(owner if owner is not None else t)

    def _parameters(self) -> Iterator[torch.Tensor]:
        yield from self._registry.parameters()
        for opt in list(self._optimizers):
            for group in opt.param_groups:
                yield from group["params"]

    def _mark_gradients(self) -> None:
        for p in self._parameters():
            if p.grad is not None:
                self._mark(p.grad, int(Category.GRADIENT), owner=p)

    def _mark_optimizer_tensors(self) -> None:
        for opt in list(self._optimizers):
            for param, state in opt.state.items():
                # Values may be lists of tensors (L-BFGS's history: old_dirs, old_stps, ro).
                for value in state.values():
                    for tensor in _tensors_in(value):
                        self._mark(tensor, int(Category.OPTIMIZER_STATE), owner=param)

    # ----------------------------------------------------------------- saved tensors

    def _pack(self, x: torch.Tensor) -> torch.Tensor:
        if self._state is State.RECORDING:
            self._on_saved(x, SavedEventKind.PACK)
        # See NOTE [ Never hold a user tensor ]. detach is an op: keep it out of the trace, and
        # for plain tensors skip the Python dispatch round trip altogether.
        if type(x) is _Tensor or type(x) is _Parameter:
            with _DisableTorchDispatch():
                return x.detach()
        self._busy = True
        try:
            return x.detach()
        finally:
            self._busy = False

    def _unpack(self, x: torch.Tensor) -> torch.Tensor:
        if self._state is State.RECORDING:
            self._on_saved(x, SavedEventKind.UNPACK)
        elif self._state is State.TIMING and not self._in_backward:
            self._enter_backward()  # no op hook to see it: NOTE [ Early run context ]
        return x

    def _on_saved(self, x: torch.Tensor, kind: SavedEventKind) -> None:
        x = _local(x)
        st = _storage_of(x)
        if st is None:
            return
        ref = self._known.get(st._cdata)
        if ref is None:
            sid = self._register_existing(x, st, _OTHER, perf_counter_ns())
            if sid is None:
                return  # an empty storage
        else:
            sid = ref.sid
        # Made outside the step's forward (a batch from the data loader) and saved: an input.
        if self._st_data[sid * _ST_WIDTH + _ST_CATEGORY] == _OTHER_CAT:
            self._promote_input(sid)
        else:
            self._promote(sid, _ACTIVATION)
        if kind is SavedEventKind.PACK:
            call = self._stack[-1][1] if self._stack else NO_INDEX
        else:
            seq = self._node_seq()
            call = self._last_seq_call if seq == -2 else self._backward_call(seq)
        dtype_id, shape_id = self._layout_ids(x)
        self._saved.data.extend(
            (int(kind), sid, self._last_op, call, shape_id, dtype_id, x.nbytes, perf_counter_ns())
        )

    # ----------------------------------------------------------------- string ids

    def _intern(self, s: str) -> int:
        assert self._writer is not None
        return self._writer.intern(s)

    def _device_id(self, t: torch.Tensor) -> int:
        device = t.device
        key = ("device", device)
        sid = self._names.get(key)
        if sid is None:
            self._saw_cuda |= device.type == "cuda"
            sid = self._names[key] = self._intern(str(device))
        return sid

    def _layout_ids(self, t: torch.Tensor) -> tuple[int, int]:
        """String ids of the tensor's dtype and shape ('64x128')."""
        key = (t.dtype, t.shape)
        ids = self._layouts.get(key)
        if ids is None:
            dtype = str(t.dtype).removeprefix("torch.")
            shape = "x".join(map(str, t.shape)) or "scalar"
            ids = self._layouts[key] = (self._intern(dtype), self._intern(shape))
        return ids


_IO_DEPTH = 3
"""Container levels ``_tensors_in`` looks into: an LSTM returns ``(output, (h_n, c_n))``, and a
state it returns two levels deep lives on (NOTE [ What the projection leaves out ])."""


def _tensors_in(value: Any, *more: Any, depth: int = _IO_DEPTH) -> Iterator[torch.Tensor]:
    """Tensors in a module's arguments or result: plain, or up to ``depth`` levels into
    tuples, lists, dicts (HF ``ModelOutput`` is one) and dataclasses; then those in ``more``."""
    for other in more:
        yield from _tensors_in(other, depth=depth)
    if isinstance(value, _Tensor):
        yield value
        return
    if depth == 0:
        return
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (tuple, list)):
        items = value
    elif hasattr(value, "__dataclass_fields__"):
        items = (getattr(value, f) for f in value.__dataclass_fields__)
    else:
        return
    for item in items:
        if isinstance(item, _Tensor):
            yield item
        elif depth > 1:
            yield from _tensors_in(item, depth=depth - 1)


def _set_enter_exit(cls: Any, enter: Any, exit_: Any) -> None:
    cls.__enter__, cls.__exit__ = enter, exit_


def _set_alloc_free(cls: Any, alloc: Any, free: Any) -> None:
    cls.alloc_all_gather_outputs, cls.free_unsharded_param = alloc, free


def _forget_in_child(recorder: weakref.ref[Recorder]) -> None:
    """In a forked child (a DataLoader worker), go inert: the trace file is the parent's."""
    rec = recorder()
    if rec is not None:
        rec._state = State.DONE
        if rec._writer is not None:
            rec._writer.forget_in_child()
        rec._writer = None
        rec._journal = None  # the parent's
        rec._known.clear()


def _describe_write_error(exc: BaseException) -> str:
    """One line: why the trace could not be written."""
    if isinstance(exc, TraceError):
        return str(exc)
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.ENOSPC or "errno = 28" in text or "No space left" in text:
        return "the disk is full (no space left on device)"
    if code == errno.EBADF or "errno = 9" in text:
        return "the script closed the trace's file"
    return f"writing the trace failed ({' '.join(text.split())[:200]})"


def _length(columns: dict[str, np.ndarray]) -> int:
    return len(next(iter(columns.values())))


def _add_rows(
    blocks: dict[str, str],
    arrays: dict[str, np.ndarray],
    table: str,
    rows: np.ndarray,
    columns: dict[str, np.ndarray],
) -> None:
    """Add a changed-rows block of ``table`` to a journal record, if any row changed."""
    if len(rows):
        blocks[table] = "rows"
        arrays[f"{table}/{ROWS}"] = rows
        arrays.update({f"{table}/{name}": col for name, col in columns.items()})


def _changed(
    before: dict[str, np.ndarray], now: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows of ``now`` that are new or differ from ``before``, and their columns."""
    seen = len(next(iter(before.values()))) if before else 0
    count = len(next(iter(now.values())))
    differs = np.zeros(seen, bool)
    for name, col in now.items() if seen else ():
        differs |= col[:seen] != before[name]
    rows = np.concatenate((np.flatnonzero(differs), np.arange(seen, count)))
    return rows, {name: col[rows] for name, col in now.items()}


def _seq_nr(node: Any) -> int:
    """The node's autograd sequence number; -1 for AccumulateGrad, which has none (2**64-1)."""
    seq: int = node._sequence_nr()
    return seq if seq < 1 << 63 else -1


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds ``t``'s data: a DTensor's local shard (NOTE [ FSDP's storages ])."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, _Tensor) else t


def _storage_of(t: torch.Tensor) -> Any:
    """The untyped storage of ``t``'s data, or None for tensors without one (sparse, mkldnn)."""
    try:
        return _local(t).untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


skip_in_dynamo(sys.modules[__name__], buffers, modules, steps)
