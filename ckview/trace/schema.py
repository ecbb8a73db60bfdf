"""The ckview trace schema: the one place that says what a trace file holds.

Every table is columnar: an HDF5 group with one 1-D dataset per column, all of equal length.
Times are nanoseconds since the recording started (``perf_counter_ns`` based). Strings are
stored once in the root string table and referenced by index. ``docs/trace-format.md`` is the
normative spec; this module is its executable form and the two must agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

FORMAT_NAME = "ckview-trace"
FORMAT_VERSION = 5

#: Value of the ``ckview_type`` attribute on each kind of group, with its own version.
GROUP_TYPES: dict[str, tuple[str, int]] = {
    "meta": ("ckview.meta", 1),
    "strings": ("ckview.strings", 1),
    "modules": ("ckview.table", 1),
    "run": ("ckview.run", 1),
    "table": ("ckview.table", 1),
}

NO_INDEX = -1
"""Value of an index column that points nowhere (no op, no module call, still alive...)."""


class Phase(IntEnum):
    """Which part of a training step an op or module call belongs to."""

    FORWARD = 0
    BACKWARD = 1
    RECOMPUTE = 2
    OPTIMIZER = 3
    OTHER = 4


class Category(IntEnum):
    """What a storage is for. One category per storage; see ``CATEGORY_PRIORITY``."""

    PARAMETER = 0
    GRADIENT = 1
    OPTIMIZER_STATE = 2
    ACTIVATION = 3  # saved for backward
    TEMPORARY = 4
    INPUT = 5
    OTHER = 6
    SHARDED_PARAMETER = 7  # FSDP: this rank's shard of a parameter (persistent)
    UNSHARDED_PARAMETER = 8  # FSDP: a parameter all-gathered for a module's forward/backward
    COMM_BUFFER = 9  # FSDP: all-gather and reduce-scatter buffers (data in transit)
    UNKNOWN = 10  # the source cannot tell (a storage imported from a CUDA snapshot) (since v4)


#: When a storage plays several roles (a parameter saved for backward, an input saved by the first
#: layer), the earliest role in this tuple names it.
CATEGORY_PRIORITY: tuple[Category, ...] = (
    Category.SHARDED_PARAMETER,
    Category.UNSHARDED_PARAMETER,  # an nn.Parameter too, and saved for backward
    Category.PARAMETER,
    Category.GRADIENT,
    Category.OPTIMIZER_STATE,
    Category.COMM_BUFFER,
    Category.INPUT,
    Category.ACTIVATION,
    Category.TEMPORARY,
    Category.OTHER,
    Category.UNKNOWN,
)


class ContainerKind(IntEnum):
    """What kind of ``torch.nn`` container a module is (``isinstance``: subclasses count)."""

    MODULE = 0  # not a container
    SEQUENTIAL = 1
    MODULE_LIST = 2
    MODULE_DICT = 3


class MemoryEventKind(IntEnum):
    ALLOC = 0  # the storage was allocated while recording
    FREE = 1  # the storage was freed
    SEEN = 2  # first sight of a storage that existed before recording began (it is not an alloc)


class SampleReason(IntEnum):
    """Why a row of ``device_samples`` was taken (since v4)."""

    STEP_BOUNDARY = 0  # a recorded step began, or the run's last step ended
    PEAK = 1  # the allocator's peak over a step, placed at the step's recorded peak
    OOM = 2  # an allocation failed (the run's OOM)


class IOKind(IntEnum):
    INPUT = 0  # a tensor passed to the module call (positional or keyword)
    OUTPUT = 1  # a tensor in what the call returned (tuples, lists, dicts, dataclasses)


class SavedEventKind(IntEnum):
    PACK = 0  # autograd saved the tensor for backward
    UNPACK = 1  # backward read it back


@dataclass(frozen=True)
class Column:
    name: str
    dtype: np.dtype
    doc: str


def _c(name: str, dtype: str, doc: str) -> Column:
    return Column(name, np.dtype(dtype), doc)


#: Root-level table of modules (shared by all runs of a trace).
MODULES: tuple[Column, ...] = (
    _c("path", "<i4", "string id of the dotted path below its root module ('' for a root)"),
    _c("type", "<i4", "string id of the module's class name"),
    _c("parent", "<i4", "row of the parent module, -1 for a root"),
    _c("param_bytes", "<i8", "bytes of the parameters the module owns directly"),
    _c("container", "<u1", "ContainerKind of the module (since v2)"),
    _c(
        "sequential_forward",
        "<u1",
        "1 if calling the module runs nn.Sequential.forward (its children in order): forward is "
        "not replaced on the class or the instance (since v2)",
    ),
)

#: Root-level table of source code locations (since v4): one row per distinct frame.
FRAMES: tuple[Column, ...] = (
    _c("file", "<i4", "string id of the file name (since v4)"),
    _c("line", "<i4", "line number, 0 if unknown (since v4)"),
    _c("name", "<i4", "string id of the function name (since v4)"),
)

#: Root-level prefix tree of call stacks (since v4): one row per distinct (frame, parent).
STACKS: tuple[Column, ...] = (
    _c("frame", "<i4", "row in 'frames' of this stack's innermost frame (since v4)"),
    _c(
        "parent",
        "<i4",
        "row in 'stacks' of the stack of the caller, -1 at the outermost frame (since v4)",
    ),
)

#: Tables at the root of the file (shared by all runs), by name.
ROOT_TABLES: dict[str, tuple[Column, ...]] = {
    "modules": MODULES,
    "frames": FRAMES,
    "stacks": STACKS,
}

#: Tables of each run, by name.
RUN_TABLES: dict[str, tuple[Column, ...]] = {
    "steps": (
        _c("step", "<i4", "step number within the run, from 0"),
        _c("start_ns", "<i8", "time the step began"),
        _c("end_ns", "<i8", "time the step ended"),
        _c("first_op", "<i4", "row of the first op of the step in 'ops'"),
        _c("first_memory_event", "<i4", "row of the first event of the step in 'memory_events'"),
        _c("forwards", "<i4", "top-level forward passes begun in it, -1 if unknown (since v2)"),
        _c("backwards", "<i4", "backward passes run in the step, -1 if unknown (since v2)"),
        _c("optimizer_steps", "<i4", "optimizer.step() calls in it, -1 if unknown (since v2)"),
        _c("complete", "<u1", "1 if the step ended at a step boundary, 0 if it was cut (since v2)"),
    ),
    "module_calls": (
        _c("module", "<i4", "row in the root 'modules' table"),
        _c("parent", "<i4", "row of the enclosing call, -1 at top level"),
        _c("phase", "<u1", "Phase of the call (FORWARD, or RECOMPUTE inside backward)"),
        _c("step", "<i4", "step number"),
        _c("start_ns", "<i8", "time of the forward pre-hook"),
        _c("end_ns", "<i8", "time of the forward hook, -1 if the call never returned"),
        _c("seq_begin", "<i8", "autograd sequence number when the call began"),
        _c("seq_end", "<i8", "autograd sequence number when the call ended"),
    ),
    "module_io": (
        _c("call", "<i4", "row in 'module_calls'"),
        _c("storage", "<i4", "row in 'storages' of a tensor argument or result of the call"),
        _c("kind", "<u1", "IOKind: INPUT (an argument) or OUTPUT (in the result)"),
    ),
    "ops": (
        _c("name", "<i4", "string id of the aten op, e.g. 'aten.mm.default'"),
        _c("phase", "<u1", "Phase"),
        _c("module_call", "<i4", "row in 'module_calls' the op is attributed to, or -1"),
        _c("step", "<i4", "step number"),
        _c("start_ns", "<i8", "time the op began"),
        _c("end_ns", "<i8", "time the op returned"),
        _c("seq_nr", "<i8", "backward ops: sequence number of the autograd node that ran it; -1"),
    ),
    "memory_events": (
        _c("kind", "<u1", "MemoryEventKind"),
        _c("storage", "<i4", "row in 'storages'"),
        _c("op", "<i4", "row in 'ops' of the op that created or was running at the free, or -1"),
        _c("time_ns", "<i8", "time of the event"),
    ),
    "storages": (
        _c("nbytes", "<i8", "size of the storage in bytes"),
        _c("device", "<i4", "string id of the device, e.g. 'cpu', 'cuda:0'"),
        _c("category", "<u1", "Category"),
        _c("dtype", "<i4", "string id of the dtype of the first tensor seen on it"),
        _c("shape", "<i4", "string id of the shape of the first tensor seen on it, e.g. '64x128'"),
        _c("op", "<i4", "row in 'ops' of the op that created it, -1 if it pre-existed"),
        _c("module_call", "<i4", "row in 'module_calls' active when it was created, or -1"),
        _c(
            "module",
            "<i4",
            "row in 'modules' it belongs to: the owner of a parameter (also of its gradient and "
            "optimizer state), else the module of the creating call; -1 if none",
        ),
        _c("alloc_ns", "<i8", "time of allocation, -1 if it existed before recording"),
        _c("free_ns", "<i8", "time it was freed, -1 if still alive when recording stopped"),
        _c(
            "stack",
            "<i4",
            "row in the root 'stacks' table of the innermost frame that allocated it, -1 if "
            "unknown (since v4)",
        ),
    ),
    "recompute_regions": (
        _c("region", "<i8", "id of the checkpoint call (ckpt_runtime markers), -1 if unknown"),
        _c("module", "<i4", "row in 'modules' of the region's module, -1 for a plain function"),
        _c("name", "<i4", "string id: the module path or the function's qualified name"),
        _c("step", "<i4", "step number"),
        _c("start_ns", "<i8", "time the recompute began (inside backward)"),
        _c("end_ns", "<i8", "time the recompute ended, -1 if it never did"),
        _c("first_op", "<i4", "row in 'ops' of the first op of the recompute"),
        _c("end_op", "<i4", "row in 'ops' after the last op of the recompute"),
    ),
    "saved_events": (
        _c("kind", "<u1", "SavedEventKind"),
        _c("storage", "<i4", "row in 'storages' of the saved tensor's storage"),
        _c("op", "<i4", "PACK: row of the op whose output or input is saved; UNPACK: last op"),
        _c("module_call", "<i4", "row in 'module_calls' of the call that saved it, or -1"),
        _c("shape", "<i4", "string id of the saved tensor's shape"),
        _c("dtype", "<i4", "string id of the saved tensor's dtype"),
        _c("nbytes", "<i8", "bytes of the saved tensor view (numel * element size)"),
        _c("time_ns", "<i8", "time of the event"),
    ),
    "timing_steps": (
        _c(
            "round",
            "<i4",
            "timing round of the step: runs are timed in turn, a warm-up and a kept step each per "
            "round (since v3)",
        ),
        _c("duration_ns", "<i8", "wall time of the plain (unrecorded) step (since v3)"),
    ),
    "timed_calls": (
        _c("timing_step", "<i4", "row in 'timing_steps' (since v3)"),
        _c("module", "<i4", "row in 'modules' (since v3)"),
        _c(
            "order",
            "<i4",
            "index of the call among the calls of its module in the plain step (since v3)",
        ),
        _c("duration_ns", "<i8", "wall time of the call, forward pre-hook to hook (since v3)"),
    ),
    "segments": (
        _c(
            "device",
            "<i4",
            "string id of the device, e.g. 'cuda:0' (reserved memory of the CUDA caching "
            "allocator) (since v4)",
        ),
        _c("address", "<i8", "device address of the segment (since v4)"),
        _c("nbytes", "<i8", "size of the segment in bytes (since v4)"),
        _c(
            "alloc_ns",
            "<i8",
            "time it was reserved, -1 if it existed before the history (since v4)",
        ),
        _c("free_ns", "<i8", "time it was released, -1 if still reserved at the end (since v4)"),
        _c("stream", "<i8", "CUDA stream the segment belongs to (since v4)"),
    ),
    "device_samples": (
        _c("time_ns", "<i8", "time of the sample (since v4)"),
        _c("device", "<i4", "string id of the CUDA device, e.g. 'cuda:0' (since v4)"),
        _c("reason", "<u1", "SampleReason: STEP_BOUNDARY, PEAK or OOM (since v4)"),
        _c("allocated", "<i8", "bytes the caching allocator had handed out (since v4)"),
        _c("reserved", "<i8", "bytes the caching allocator held from the device (since v4)"),
        _c(
            "largest_free",
            "<i8",
            "largest free (inactive) block inside reserved segments, -1 unknown (since v4)",
        ),
        _c("nvml_total", "<i8", "device memory, from NVML, -1 unknown (since v4)"),
        _c(
            "nvml_process",
            "<i8",
            "device memory NVML counts for the recording process, -1 unknown (since v4)",
        ),
        _c(
            "nvml_others",
            "<i8",
            "device memory NVML counts for the other processes, -1 unknown (since v4)",
        ),
    ),
}

#: Run tables that hold plain timing steps, not the recorded steps (NOTE [ Plain timing steps ]
#: in recorder/timing.py): written once every run is recorded, possibly empty.
TIMING_TABLES = ("timing_steps", "timed_calls")

#: Attributes of the root ``meta`` group. ``complete`` is false until the writer closes cleanly.
META_FIELDS: dict[str, str] = {
    "ckview_version": "version of ckview that wrote the trace",
    "torch_version": "version of torch that ran the step",
    "python_version": "version of Python that ran the step",
    "device": "main device of the step, e.g. 'cpu' or 'cuda:0'",
    "command": "JSON list: the command line that was recorded",
    "start_time": "ISO 8601 wall-clock time the recording started",
    "steps_requested": "number of steps the recorder was asked to record",
    "steps_recorded": "number of steps recorded (in the first run)",
    "warmup": "number of steps skipped before recording",
    "step_rule": "how steps were delimited, e.g. '1 optimizer step (learned in warmup)' (since v2)",
    "compiled": "'eager' if the script uses torch.compile (its compiled code was run eagerly "
    "while recording), 'no' if not (since v2)",
    "checkpoint_call_ns": "median extra time of one checkpointed call (forward and backward) "
    "measured on this machine, -1 if not measured (since v3)",
    "checkpoint_call_low_ns": "lowest of those measurements, -1 if not measured (since v3)",
    "checkpoint_call_high_ns": "highest of those measurements, -1 if not measured (since v3)",
    "rank": "rank of the recording process in a distributed run (RANK), -1 if not distributed "
    "(since v3)",
    "world_size": "number of ranks of the distributed run (WORLD_SIZE), 1 if not distributed "
    "(since v3)",
    "device_total_bytes": "memory of the main device (NVML's total, else torch's "
    "total_memory), -1 unknown or a CPU run (since v4)",
    "allocator_events": "where allocations and frees come from: 'allocator' (the allocator's own "
    "events merged with the op hook's), 'op hook: <why>' where the allocator's events are missing "
    "from some window, '' if unknown (since v4)",
    "recorder": "which recorder ran: 'python' (the dispatch mode) or 'native' (the native "
    "extension, CKVIEW_RECORDER=native); '' in traces written before it was recorded "
    "(since v5)",
    "source": "where the trace comes from: 'record' (the recorder) or 'snapshot' (imported from "
    "a PyTorch memory snapshot by 'ckview import') (since v4)",
    "allocator_settings": "JSON object: the CUDA caching allocator's settings as torch reports "
    "them (a snapshot's 'allocator_settings': 'PYTORCH_CUDA_ALLOC_CONF', 'max_split_size', "
    "'expandable_segments', 'roundup_power2_divisions', ...), '' if unknown (since v5)",
    "complete": "true once the recorder finished and closed the file cleanly",
    "error": "why the recording is incomplete ('' if complete)",
}

#: Attributes of each run group.
RUN_FIELDS: dict[str, str] = {
    "name": "run name: 'main', 'baseline', 'checkpointed' or 'plan:<name>'",
    "complete": "true once the run was closed cleanly",
    "steps_recorded": "number of complete steps in the run",
    "checkpointing": "what the run did with checkpointing: 'script' (the script's own, as it "
    "runs), 'bypassed' (the script's own bypassed), 'plan' (the script's own bypassed and a "
    "plan applied); '' if unknown (since v2)",
    "oom_op": "the aten op whose allocation failed and ended the run, '' if none or unknown "
    "(since v4)",
    "oom_module": "dotted path of the module call the failing op ran in, '' if none or unknown "
    "(since v4)",
    "oom_bytes": "bytes the failing allocation asked for, -1 if unknown or no OOM (since v4)",
    "oom_time_ns": "time the allocation failed, -1 if the run did not end in an OOM (since v4)",
    "oom_message": "the allocation error's message, '' if the run did not end in an OOM (since v4)",
}

#: Run attributes holding integers, with the value they take when unset (RUN_FIELDS).
RUN_INT_FIELDS: dict[str, int] = {"steps_recorded": 0, "oom_bytes": -1, "oom_time_ns": -1}

#: Run attributes holding strings (RUN_FIELDS), '' when unset.
RUN_STR_FIELDS = ("checkpointing", "oom_op", "oom_module", "oom_message")


#: Values of the meta field ``source``.
SOURCES = ("record", "snapshot")

#: Values of the run attribute ``checkpointing`` (RUN_FIELDS), '' aside.
CHECKPOINTING = ("script", "bypassed", "plan")


def table_dtype(columns: tuple[Column, ...]) -> np.dtype:
    """The structured dtype of one row of a table (handy for buffers and tests)."""
    return np.dtype([(c.name, c.dtype) for c in columns])


#: Index columns, ``(table, column) -> (target table, NO_INDEX allowed)``. The target ``modules``
#: and the other ROOT_TABLES are root tables; every other target is a table of the same run.
REFERENCES: dict[tuple[str, str], tuple[str, bool]] = {
    ("modules", "parent"): ("modules", True),
    ("module_calls", "module"): ("modules", False),
    ("module_calls", "parent"): ("module_calls", True),
    ("ops", "module_call"): ("module_calls", True),
    ("memory_events", "storage"): ("storages", False),
    ("memory_events", "op"): ("ops", True),
    ("storages", "op"): ("ops", True),
    ("storages", "module_call"): ("module_calls", True),
    ("storages", "module"): ("modules", True),
    ("recompute_regions", "module"): ("modules", True),
    ("module_io", "call"): ("module_calls", False),
    ("module_io", "storage"): ("storages", False),
    ("saved_events", "storage"): ("storages", False),
    ("saved_events", "op"): ("ops", True),
    ("saved_events", "module_call"): ("module_calls", True),
    ("timed_calls", "timing_step"): ("timing_steps", False),
    ("timed_calls", "module"): ("modules", False),
    ("stacks", "frame"): ("frames", False),
    ("stacks", "parent"): ("stacks", True),
    ("storages", "stack"): ("stacks", True),
}

#: Columns holding string ids (rows of the root string table), by table.
STRING_COLUMNS: dict[str, tuple[str, ...]] = {
    "modules": ("path", "type"),
    "ops": ("name",),
    "storages": ("device", "dtype", "shape"),
    "saved_events": ("shape", "dtype"),
    "recompute_regions": ("name",),
    "frames": ("file", "name"),
    "segments": ("device",),
    "device_samples": ("device",),
}

#: Columns holding enum values, ``(table, column) -> enum``.
ENUM_COLUMNS: dict[tuple[str, str], type[IntEnum]] = {
    ("modules", "container"): ContainerKind,
    ("module_calls", "phase"): Phase,
    ("ops", "phase"): Phase,
    ("memory_events", "kind"): MemoryEventKind,
    ("module_io", "kind"): IOKind,
    ("storages", "category"): Category,
    ("saved_events", "kind"): SavedEventKind,
    ("device_samples", "reason"): SampleReason,
}

#: Columns holding 0 or 1, ``(table, column)``.
FLAG_COLUMNS: frozenset[tuple[str, str]] = frozenset(
    {("modules", "sequential_forward"), ("steps", "complete")}
)
