"""Every private torch API and every patch of torch or ``os`` that the recorder makes.

Torch's internals change between minor versions; keeping them here makes that one file to read
when torch moves. Two exceptions keep their own, each next to the one mechanism that needs them:
the allocator's profiler windows (recorder/allocations.py: the profiler's result tree) and
dynamo's stance and skip flags (recorder/compiled.py: NOTE [ torch.compile under the recorder ]).

Every patch returns its undo; the recorder undoes them in reverse order when it is done.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from torch._C import _current_autograd_node, _current_graph_task_id, _DisableTorchDispatch
from torch._C._autograd import _get_sequence_nr, _top_saved_tensors_default_hooks
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ckview.trace.schema import NO_INDEX, SavedEventKind

__all__ = [
    "DisableTorchDispatch",
    "Parameter",
    "Tensor",
    "TorchDispatchMode",
    "current_graph_task_id",
    "current_node_seq",
    "dispatch_mode",
    "local",
    "sequence_nr",
    "storage_of",
    "tensors_in",
]

Undo = Callable[[], None]
Tensor = torch.Tensor
Parameter = torch.nn.Parameter
DisableTorchDispatch = _DisableTorchDispatch
current_graph_task_id = _current_graph_task_id
"""The autograd graph task running on this thread, -1 outside backward; creates nothing
(NOTE [ Autograd nodes stay unwrapped ] in recorder/phases.py)."""
sequence_nr = _get_sequence_nr
"""The sequence number the next autograd node made on this thread will get."""
dispatch_mode = _get_current_dispatch_mode
"""The innermost TorchDispatchMode on this thread, or None."""
_FSDP_PARAM_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param"
_FSDP_PARAM_GROUP_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_FSDP_COLLECTIVES_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_collectives"


def current_node_seq() -> int | None:
    """Sequence number of the autograd node running now, None if none; -1 for AccumulateGrad,
    which has none (2**64-1). Wraps the node in a Python object: NOTE [ Autograd nodes stay
    unwrapped ] in recorder/phases.py budgets the calls."""
    node = _current_autograd_node()
    if node is None:
        return None
    seq: int = node._sequence_nr()
    return seq if seq < 1 << 63 else -1


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Call ``callback`` when the backward pass running now ends."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def saved_tensors_hooks_on_top(pack: Any) -> bool:
    """Whether ``pack`` is the innermost saved-tensor pack hook of this thread."""
    top = _top_saved_tensors_default_hooks(True)
    return top is not None and top[0] == pack


_IO_DEPTH = 3
"""Container levels ``tensors_in`` looks into: an LSTM returns ``(output, (h_n, c_n))``, and a
state it returns two levels deep lives on (NOTE [ What the projection leaves out ])."""


def tensors_in(value: Any, *more: Any, depth: int = _IO_DEPTH) -> Iterator[torch.Tensor]:
    """Tensors in a module's arguments or result: plain, or up to ``depth`` levels into
    tuples, lists, dicts (HF ``ModelOutput`` is one) and dataclasses; then those in ``more``."""
    for other in more:
        yield from tensors_in(other, depth=depth)
    if isinstance(value, Tensor):
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
        if isinstance(item, Tensor):
            yield item
        elif depth > 1:
            yield from tensors_in(item, depth=depth - 1)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds ``t``'s data: a DTensor's local shard (NOTE [ FSDP's storages ] in
    recorder/ledger.py)."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, Tensor) else t


def storage_of(t: torch.Tensor) -> Any:
    """The untyped storage of ``t``'s data, or None for tensors without one (sparse, mkldnn)."""
    try:
        return local(t).untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def is_fake(t: torch.Tensor) -> bool:
    """A fake tensor dynamo traces with while it compiles: no memory of the step (only the
    native path records while code compiles; the Python path runs it eagerly)."""
    fake = sys.modules.get("torch._subclasses.fake_tensor")  # none exists before it is imported
    return fake is not None and isinstance(t, fake.FakeTensor)


# ----------------------------------------------------------------------------- patches


def keep_fd_on_closerange(ours: Callable[[], int], before: Callable[[], None]) -> Undo:
    """A script that closes every file descriptor (``os.closerange(3, ...)``, as daemons do)
    closes all but ``ours()`` (the trace's, -1 if none), calling ``before`` first when there is
    one. NOTE [ A file closed under the writer ] in ckview/trace/writer.py covers a plain
    ``os.close``."""
    real, owner = os.closerange, os.getpid()

    def closerange(low: int, high: int) -> None:
        fd = ours() if os.getpid() == owner else -1
        if fd >= 0:
            before()
        if low <= fd < high:
            real(low, fd)
            low = fd + 1
        real(low, high)

    os.closerange = closerange

    def undo() -> None:
        os.closerange = real

    return undo


def watch_optimizer_init(created: Callable[[torch.optim.Optimizer], None]) -> Undo:
    """Call ``created(optimizer)`` for every optimizer built from now on."""
    return _watch_init(torch.optim.Optimizer, created)


def watch_dataloader_iterators(created: Callable[[Any], None]) -> Undo:
    """Call ``created(iterator)`` for every multi-process DataLoader iterator made from now on
    (``iter()`` of a ``DataLoader(num_workers>0)``): NOTE [ A data pipeline that settles ] in
    recorder/steady.py."""
    from torch.utils.data import dataloader

    return _watch_init(dataloader._MultiProcessingDataLoaderIter, created)


def _watch_init(cls: type, created: Callable[[Any], None]) -> Undo:
    """Call ``created(obj)`` after ``cls.__init__`` made each ``obj`` (``created`` is a bound
    method, held by a weak reference: the patch keeps nothing alive)."""
    orig_init = cls.__init__  # type: ignore[misc]
    method = weakref.WeakMethod(created)

    @functools.wraps(orig_init)  # keeps inspect.signature (libraries read it)
    def init(obj: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(obj, *args, **kwargs)
        call = method()
        if call is not None:
            call(obj)

    cls.__init__ = init  # type: ignore[misc]
    return lambda: setattr(cls, "__init__", orig_init)


RecomputeEnter = Callable[[int, int, "str | None"], None]


def bracket_recompute(
    enter: RecomputeEnter, exit_: Callable[[], None], row_of: Callable[[Any], int | None]
) -> Undo:
    """Call ``enter(region, module_row, name)`` and ``exit_()`` around torch.utils.checkpoint's
    recompute (NOTE [ Recompute regions ] in recorder/phases.py): its non-reentrant
    ``_recomputation_hook``, and the re-run of a reentrant region (``CheckpointFunction``), whose
    function ``row_of`` may know as a module."""
    undos = []
    hook_cls = getattr(torch.utils.checkpoint, "_recomputation_hook", None)
    if hook_cls is not None:  # a torch without it: module hooks still see module regions
        undos.append(_bracket_recomputation_hook(hook_cls, enter, exit_))
        undos.append(_bracket_reentrant(enter, exit_, row_of))

    def undo() -> None:
        while undos:
            undos.pop()()

    return undo


def _bracket_recomputation_hook(hook_cls: Any, enter: RecomputeEnter, exit_: Any) -> Undo:
    orig_enter, orig_exit = hook_cls.__enter__, hook_cls.__exit__

    def wrapped_enter(hooks: Any) -> Any:
        enter(NO_INDEX, NO_INDEX, None)
        return orig_enter(hooks)

    def wrapped_exit(hooks: Any, *exc: Any) -> Any:
        try:
            return orig_exit(hooks, *exc)
        finally:
            exit_()

    hook_cls.__enter__, hook_cls.__exit__ = wrapped_enter, wrapped_exit

    def undo() -> None:
        hook_cls.__enter__, hook_cls.__exit__ = orig_enter, orig_exit

    return undo


def _bracket_reentrant(
    enter: RecomputeEnter, exit_: Callable[[], None], row_of: Callable[[Any], int | None]
) -> Undo:
    """Bracket the re-run of a reentrant ``torch.utils.checkpoint`` region: its backward
    calls ``ctx.run_function`` again (then runs the region's own backward, which is not a
    recompute). A checkpointed module is seen by its forward hook anyway; a checkpointed
    plain function (``checkpoint(fn, x, use_reentrant=True)``) only here."""
    function_cls = getattr(torch.utils.checkpoint, "CheckpointFunction", None)
    if function_cls is None:
        return lambda: None
    original = function_cls.backward

    def backward(ctx: Any, *grads: Any) -> Any:
        run = ctx.run_function
        row = row_of(run)
        name = None if row is not None else getattr(run, "__qualname__", None) or repr(run)

        def recompute(*args: Any) -> Any:
            enter(NO_INDEX, NO_INDEX if row is None else row, name)
            try:
                return run(*args)
            finally:
                exit_()

        ctx.run_function = recompute
        try:
            return original(ctx, *grads)
        finally:
            ctx.run_function = run

    function_cls.backward = staticmethod(backward)
    return lambda: setattr(function_cls, "backward", staticmethod(original))


def follow_fsdp_resizes(resized: Callable[[Any], None]) -> Undo | None:
    """Call ``resized(fsdp_param)`` after FSDP frees or re-allocates a parameter's all-gather
    outputs by resizing their storages (NOTE [ FSDP's storages ] in recorder/ledger.py); None
    if FSDP is not in use (not imported)."""
    fsdp_param = sys.modules.get(_FSDP_PARAM_MODULE)
    if fsdp_param is None:
        return None
    cls = fsdp_param.FSDPParam
    alloc, free = cls.alloc_all_gather_outputs, cls.free_unsharded_param

    def alloc_all_gather_outputs(param: Any) -> None:
        alloc(param)
        resized(param)

    def free_unsharded_param(param: Any) -> None:
        free(param)
        resized(param)

    cls.alloc_all_gather_outputs = alloc_all_gather_outputs
    cls.free_unsharded_param = free_unsharded_param

    def undo() -> None:
        cls.alloc_all_gather_outputs, cls.free_unsharded_param = alloc, free

    return undo


def follow_fsdp_buffers(comm: Callable[[torch.Tensor], None]) -> Undo | None:
    """Call ``comm(buffer)`` with FSDP's all-gather output once it is filled and with its
    reduce-scatter input once it is filled, the buffers FSDP's ops ``fsdp.all_gather_copy_in``
    and ``fsdp.chunk_cat`` write (NOTE [ FSDP's storages ] in recorder/ledger.py); None if FSDP
    is not in use (not imported)."""
    group: Any = sys.modules.get(_FSDP_PARAM_GROUP_MODULE)
    collectives: Any = sys.modules.get(_FSDP_COLLECTIVES_MODULE)
    if group is None or collectives is None:
        return None
    all_gather = group.foreach_all_gather
    copy_in = collectives.foreach_reduce_scatter_copy_in

    def foreach_all_gather(*args: Any, **kwargs: Any) -> Any:
        result = all_gather(*args, **kwargs)
        if result is not None:
            comm(result.all_gather_output)
        return result

    def foreach_reduce_scatter_copy_in(grads: Any, reduce_scatter_input: Any, *rest: Any) -> None:
        copy_in(grads, reduce_scatter_input, *rest)
        comm(reduce_scatter_input)

    group.foreach_all_gather = foreach_all_gather
    collectives.foreach_reduce_scatter_copy_in = foreach_reduce_scatter_copy_in

    def undo() -> None:
        group.foreach_all_gather = all_gather
        collectives.foreach_reduce_scatter_copy_in = copy_in

    return undo


def observe_saved_tensor_hooks(saw: Callable[[torch.Tensor, SavedEventKind], None]) -> Undo:
    """Every saved-tensor hook pair created from now on also reports to ``saw`` the tensors its
    pack keeps and its unpack hands back (NOTE [ Cooperating with other saved-tensor hooks ] in
    recorder/ledger.py)."""
    hooks_cls = torch.autograd.graph.saved_tensors_hooks
    orig_init = hooks_cls.__init__

    def pack_observed(inner: Any) -> Any:
        def pack(x: torch.Tensor) -> Any:
            packed = inner(x)
            if isinstance(packed, Tensor):
                saw(packed, SavedEventKind.PACK)
            return packed

        return pack

    def unpack_observed(inner: Any) -> Any:
        def unpack(packed: Any) -> Any:
            x = inner(packed)
            if isinstance(x, Tensor):
                saw(x, SavedEventKind.UNPACK)
            return x

        return unpack

    def init(hooks: Any, pack_hook: Any, unpack_hook: Any) -> None:
        orig_init(hooks, pack_observed(pack_hook), unpack_observed(unpack_hook))

    hooks_cls.__init__ = init  # type: ignore[method-assign, assignment]

    def undo() -> None:
        hooks_cls.__init__ = orig_init  # type: ignore[method-assign]

    return undo


OomListener = Callable[[int, int, int, int], None]
"""``(device, bytes asked for, device capacity or allowed fraction, bytes free)`` at a CUDA
allocation failure (c10's ``OutOfMemoryObserver``; the bytes asked for as the allocator rounded
them, which its message prints to two decimals)."""
_oom_listener: list[OomListener] = []
_oom_attached = [False]


def hear_cuda_oom(listener: OomListener) -> Undo | None:
    """Call ``listener`` when the CUDA caching allocator fails an allocation, with the exact
    bytes asked for (``torch._C._cuda_attach_out_of_memory_observer``); the undo, or None while
    the script has not initialised CUDA (attaching then would initialise it: ask again later).
    An observer cannot be detached, so one per process forwards to the current listener."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    if not _oom_attached[0]:
        attach(_forward_oom)
        _oom_attached[0] = True
    _oom_listener[:] = [listener]

    def undo() -> None:
        _oom_listener.clear()

    return undo


def _forward_oom(device: int, asked: int, total: int, free: int) -> None:
    for listener in _oom_listener:
        listener(device, asked, total, free)


# NOTE [ Backward traced by a compile ]
# Compiling a training graph, AOTAutograd traces its backward by calling ``torch.autograd.grad``
# on fake tensors, inside the compile of the first call (unless its cache on disk already holds
# the graph). That is no backward pass of the step: counted as one, it ended the iteration in
# the middle of the compile (a loop without module calls ends its step at each backward's end)
# and opened a backward span before the compiled forward ran. ``torch.compiler.is_compiling()``
# holds for the whole compile (torch 2.13: dynamo's ``_compile_session_context``), so such
# calls pass unbracketed.
def bracket_backward(enter: Callable[[Any], None], exit_: Callable[[], None]) -> Undo:
    """Call ``enter(roots)`` and ``exit_()`` around ``torch.autograd.backward`` and ``grad``
    (which ``Tensor.backward`` calls), ``roots`` the tensors backward starts from: the native
    path's backward boundaries, where no op hook sees the engine start (NOTE [ The native
    ledger ] in recorder/native_ledger.py). A nested backward (inside a backward) is part of
    the outer one. A backward that ``torch.compile`` traces is none (NOTE [ Backward traced
    by a compile ])."""
    originals: dict[str, Callable[..., Any]] = {
        "backward": torch.autograd.backward,
        "grad": torch.autograd.grad,
    }
    depth = [0]

    def bracket(run: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(run)
        def run_bracketed(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return run(*args, **kwargs)
            depth[0] += 1
            if depth[0] == 1:
                enter(args[0] if args else kwargs.get("tensors", kwargs.get("outputs")))
            try:
                return run(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    exit_()

        return run_bracketed

    for name, original in originals.items():
        setattr(torch.autograd, name, bracket(original))

    def undo() -> None:
        for name, original in originals.items():
            setattr(torch.autograd, name, original)

    return undo


class _TorchCalls(torch.overrides.TorchFunctionMode):
    """Tells ``on_call`` of each torch function, Tensor method or operator called from Python
    (``watch_torch_calls``)."""

    def __init__(self, on_call: Callable[[], None]) -> None:
        super().__init__()
        self.on_call: Callable[[], None] | None = on_call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.on_call is not None:
            self.on_call()
        return func(*args, **(kwargs or {}))


def watch_torch_calls(on_call: Callable[[], None]) -> Undo:
    """Call ``on_call()`` from each torch call the user's Python makes on this thread (a
    TorchFunctionMode; the calls torch makes inside one are not seen). The undo leaves the mode,
    or makes it inert where another mode was entered above it and is still there."""
    mode = _TorchCalls(on_call)
    mode.__enter__()

    def undo() -> None:
        mode.on_call = None
        if torch.overrides._get_current_function_mode() is mode:
            mode.__exit__(None, None, None)

    return undo


def watch_shared_tensors(arrived: Callable[[torch.Tensor], None]) -> Undo:
    """Call ``arrived(tensor)`` for each tensor this thread rebuilds from another process's
    shared memory (a DataLoader worker's batch: ``torch.multiprocessing`` pickles a tensor as a
    call of ``reductions.rebuild_tensor``, looked up by name when it is unpickled)."""
    from torch.multiprocessing import reductions

    original = reductions.rebuild_tensor
    thread = threading.get_ident()

    # A worker forked meanwhile pickles this function in place of the original: by the
    # original's name, which the unpickling process resolves to whichever it has.
    @functools.wraps(original)
    def rebuild_tensor(cls: Any, storage: Any, metadata: Any) -> torch.Tensor:
        t: torch.Tensor = original(cls, storage, metadata)
        if threading.get_ident() == thread and cls is not Parameter:
            arrived(t)
        return t

    reductions.rebuild_tensor = rebuild_tensor

    def undo() -> None:
        reductions.rebuild_tensor = original

    return undo
