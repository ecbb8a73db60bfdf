"""Projection: the memory timeline of a recorded run as if some regions were checkpointed.

One recorded baseline step answers "what would checkpointing these regions do to my peak, and
what would it cost?" without re-running: ``project`` replays the memory events under the model
below, exactly; ``ProjectionModel`` precomputes each candidate region's effect so that the GUI
gets the projected peak of any selection in well under a millisecond.

The package follows the model's seams: ``results`` (what a projection answers), ``effects``
(the baseline and each instance's effect on it, once per set of candidates), ``exact``
(``project``: one selection replayed), ``host`` (the host curve of offload plans, NOTE
[ Host curve ]) and ``incremental`` (``ProjectionModel``, with NOTE [ Incremental peak ] and
NOTE [ Projected curve ]). The NOTEs below hold for all of them.

A region instance is one forward call of a checkpointed module, or the calls of one segment
(``ckview.analysis.regions``). "Created inside" means allocated by a FORWARD op attributed to
a call inside the instance. The model, as NOTE blocks the code and tests cite:

NOTE [ Checkpointed forward ]
    A checkpointed instance keeps only its inputs. Every storage created inside it that is not
    among its OUTPUTs (``module_io``) is freed by the end of the instance at the latest: its FREE
    moves to the instance's end if the baseline freed it later (or never). Temporaries the
    baseline already freed inside the instance keep their recorded free. An activation the
    baseline kept for backward would, under checkpointing, be freed after its last forward use,
    which is never later than the end of the instance (nothing outside references it: it is no
    output, and checkpoint's pack hook drops the saved reference): NOTE [ Locals die with their
    frame ] says when, where it can be known; elsewhere it is freed at the end, which
    over-estimates memory inside the instance, never under-estimates it. A storage that
    nothing saved and that still outlived the instance is held from outside and keeps its
    free (NOTE [ Held from outside ]).

NOTE [ Locals die with their frame ]
    Inside a checkpointed instance only Python references hold an activation in forward. One
    created in a call that does not return it is a local of that call's forward and dies when
    the call ends at the latest; one returned (up through the callers that return it too) is a
    local of the caller that receives it, the *holder*, and dies when the holder's forward
    ends, or, where the holder runs ``nn.Sequential.forward`` (``sequential_forward``), once the
    next child, which takes it as its input, has returned: the loop rebinds its only
    reference then. Any forward call that takes it as an input keeps it until that call ends.
    It is freed at that moment where that is before the instance's end. (Freed at the end, the
    inner activations of a segment of three residual blocks stayed live together: a Lightning
    MLP's sqrt plan was projected 9.2% above its measured peak.)

NOTE [ Held from outside ]
    A storage created inside an instance that the baseline kept beyond the instance's end,
    although it is no OUTPUT and autograd never saved it (no PACK anywhere in the run), was
    kept by a reference that checkpointing does not take away: a hand-written
    ``autograd.Function`` that keeps its inputs on ``ctx`` (``ctx.input_tensors = ...``, as
    the efficient DenseNet's ``CheckpointFunction`` does; saved-tensor hooks never see those),
    a cache on a module, a tensor nested too deep in an output for the recorder to list it.
    Its free stays where the baseline has it. (Freed at the instance's end, the efficient
    DenseNet's features that each layer's Function keeps put sqrt 9.6% and all 4.7% below the
    measured peak; kept, both are exact.) Its recomputed copy, if the replay makes one, dies
    with the replay: the recompute's own Function nodes are dropped when it ends.

NOTE [ Released outputs ]
    An OUTPUT of an instance stays alive, but checkpointing takes away one of its holders: an op
    inside the instance that saved it for backward (Tanh, ReLU, GELU, sigmoid and softmax save
    their own result; BatchNorm and cat results are saved by what follows). Checkpoint's pack
    hook keeps nothing, so the storage lives only as long as its other holders: Python
    references in the forward, ops outside the instance that saved it, and checkpointed
    instances that keep it as an input (NOTE [ Kept inputs ]). When the baseline freed it
    inside the instance's backward (its FREE ran in a BACKWARD op of a call inside the
    instance: the instance's hold was the last), it is released at the latest of
        - its forward life: the end of the outermost call that returns it (counting up from the
          instance's last call through the callers that return it too) and of every forward
          call that takes it as an input (a Python local dies when its forward returns; an
          output of a top-level call is the script's, whose references are unknown: those keep
          their baseline free), and
        - after the last BACKWARD op of every call outside the instance that saved it (its
          autograd node lets go once it has run; a save outside any module call, or by a call
          that never runs backward, keeps the baseline free),
    if that is earlier than its baseline free, and checkpointed consumers keep it later still
    (NOTE [ Kept inputs ]). Without this, the projection kept one block output per recompute
    too many: the tensor that the next block kept, then freed, before this block's recompute.

NOTE [ Kept inputs ]
    The checkpoint holds the instance's INPUT storages (arguments of its top-level calls that
    existed before it) until the instance's backward is done: their free becomes the later of
    the baseline free and the end of the last BACKWARD op attributed to a call inside the
    instance. An input kept by several instances is freed after the last of them. This is the
    only way checkpointing can raise memory before backward: a baseline that freed an input
    during the forward (it was not saved for backward) now keeps it.

NOTE [ Recompute in backward ]
    When backward first needs the instance (its first UNPACK attributed to a call inside it;
    without one, its first BACKWARD op), its forward is recomputed: the ALLOC and FREE events of
    the storages created inside it are replayed in recorded order as *copies* of those
    storages, up to its last PACK (NOTE [ Early stop ]). A copy of a storage the instance saved
    for backward (a PACK inside it) lives until the later of the original's baseline free and
    the end of the replay; any other copy the replay did not free is freed at the end of the
    replay. An instance that backward never reaches is not recomputed. The extra compute of a
    recompute is the summed duration of the forward ops it replays.

NOTE [ Early stop ]
    Non-reentrant checkpoint (ckpt_runtime's, which plans use, and torch's by default) stops a
    recompute as soon as the last tensor saved in forward is back: the ops after the
    instance's last PACK never run again, and the recompute's other locals die with it. An
    op's inputs are saved before it runs and its outputs after, and the recorder stamps a PACK
    with the last op that ran, so the replay takes the events of the ops up to that one. (A
    DenseNet layer's final concatenation, or the last op of a block whose result nobody inside
    saves, is never recomputed.) An instance without a PACK inside (its saves are hidden, as in
    a run that checkpoints it already) is replayed whole: an upper bound.

NOTE [ Early stop, in time ]
    The replay above takes the events up to the op stamped on the last PACK, which is right for
    memory but not for time: autograd saves an op's inputs before the op runs, so where the
    last PACK holds inputs only (a Linear block: addmm's input and weight), the recompute stops
    before that op, and its time is that of the ops before it. The op ran where one of its
    PACKs holds a storage it made (tanh's output) or comes in the later half of its span (an
    in-place op saving its result: relu_). Extra compute (``_last_op_run`` in effects.py)
    takes the ops up to the last one that ran; memory keeps the rule above, whose figures are
    exact. Measured on examples/loops/manual_sgd.py under plan all: a Linear's recompute took
    140 us where its plain forward with the matmul took 440-1000 us, the same as the
    recompute of nothing but checkpoint's own work.

NOTE [ Op-level instances ]
    An instance of a region with ``save`` (an op-level region, NOTE [ Op-level regions ] in
    ckpt_runtime/plan.py) runs under torch's selective checkpoint: each forward op inside it
    whose names match ``save`` (``ckview.analysis.projection.oplevel``: overload packet,
    overload, auto-name, as the runtime names them) is *saved*, the others are recomputed.
    Everything above holds, with these differences for the outputs of saved ops (storages a
    saved op made and did not free itself; its scratch is freed as recorded):
        - they are never freed early in forward: the policy's cache holds them (no NOTE
          [ Checkpointed forward ] shortening, no NOTE [ Released outputs ] release);
        - the recompute does not copy them: when it reaches the op it takes the cached
          original, and the original's free moves to where the copy's would have been (the
          recompute's key, at its baseline row among the replay's events), if that is later
          than its baseline free; an output the recompute never reaches (after the last PACK,
          NOTE [ Early stop ]) is held until the end of the instance's backward. This holds
          for the instance's own outputs too (a block ending in a saved layer norm keeps its
          output past the next block's backward: 1.2% under the measured peak without it);
        - the extra compute is the summed recorded time of the replayed ops that are not saved
          (with plain times, the plain instance time scaled by their share of its forward).
    (Projected as a whole-module recompute, a TransformerEncoder plan saving its matmuls was
    26% under its measured peak; as above, within 0.003%, on 20 random op-level plans. Holding
    a saved op's scratch too put a plan 2.3% over; torch's RNG state tensors, 0.03-0.26%
    under, until the runtime kept them as bytes.)

NOTE [ Offloaded instances ]
    An instance of an offload region (``save: ["*"], offload: true``) is not checkpointed:
    its saved tensors go to host memory in forward and come back in backward (ckpt_runtime's
    ``Offloader``). CPU tensors are in host memory already and stay: on a CPU trace an offload
    region changes nothing. On a CUDA device, a storage created inside the instance that
    autograd saved there (a PACK inside it) leaves the device as NOTE [ Checkpointed forward ]
    frees it (at the instance's end, or earlier as NOTE [ Locals die with their frame ] says;
    outputs and storages held from outside stay), and comes back as a copy when backward first
    needs the instance (NOTE [ Recompute in backward ]'s moment: every saved tensor of the
    instance is back before its backward), living to its baseline free. Nothing else changes:
    no recompute (no extra compute, no scratch), no kept inputs, no released outputs. The host
    holds each tensor from the moment it leaves the device (an output: the instance's end) to
    its baseline free (NOTE [ Host curve ] in ``host``: ``Projection.host``,
    ``host_peak_bytes``), and the transfer takes twice the offloaded bytes over the link's
    bandwidth (``Projection.transfer_ns``; ``DEFAULT_LINK_BANDWIDTH`` unless given). Saved
    inputs of the instance are left out: the runtime copies them to host and back too, but
    their device storage stays alive, so the device curve gains a second copy in backward
    that this model does not add (an under-estimate while the instance's backward runs).
    The runtime brings each tensor back when a backward node unpacks it, and the copy dies
    once that node has run, not at the baseline free: where those copies are what backward's
    peak holds, the projection is above what runs (an upper bound). Measured on an H200
    (examples/transformer.py --device cuda, every layer offloaded): projected 8.5% (Python
    recorder) and 12.0% (native) above the measured peak. A tighter model needs each node's
    unpack-to-release span, which the trace does not keep.

NOTE [ Fixed categories ]
    Parameters, gradients and optimizer state never move: they are never shortened, copied or
    kept, so the projection cannot lower them (a property the tests check).

NOTE [ Event keys ]
    Projected events are ordered by an int64 key. Baseline event row ``e`` has key
    ``e * W + W - 1``; an event inserted before baseline row ``p`` gets ``p * W + slot``, where
    ``W = 3 * n_instances + n_released + 2`` leaves a slot for each instance's three moments:
    its end (the frees of NOTE [ Checkpointed forward ]), its recompute, the end of its backward
    (the frees of NOTE [ Kept inputs ]), and one for each released output (NOTE [ Released
    outputs ]). Moments at one point are ordered by time, then by that kind, then by first
    call row (then by storage): an order that does not depend on the selection, so ``project``
    and ``ProjectionModel`` agree. Events at one key keep their baseline order (a replay's frees of
    copies it did not free come last). Inserted events take the time of their moment (the
    instance's end, the first need in backward, the end of its backward), which lies between
    the times of the baseline events around them, so times never go back. The replay takes no
    time: its ops' duration is reported as extra compute, the timeline is not stretched.

NOTE [ What the projection leaves out ]
    It replays live bytes of storages (what the recorder sees), not the allocator: caching,
    fragmentation and rounding are not modelled. A storage created inside an instance that
    autograd saved and that is reachable from outside too (other than through the instance's
    outputs) is freed at the instance's end although it lives on; unsaved ones keep their
    free (NOTE [ Held from outside ]).
    Reentrant checkpoint runs the whole forward again; the replay stops early as
    non-reentrant checkpoint does (NOTE [ Early stop ]), a lower bound for reentrant plans.
    An op-level region that saves an op whose output aliases a storage it did not make (a view:
    ``aten.view``, ``aten.t``) keeps that storage alive through the policy's cache; the trace
    does not say which storage a view aliases, so the projection does not hold it (an
    under-estimate; the planner never saves such ops, NOTE [ Op-level search space ]).
    The replay runs the baseline's ops; under the selective checkpoint's dispatch mode torch's
    composite ops may run others (``aten.add`` for ``aten.add_``), which a save entry can catch
    (NOTE [ Out-of-place under the policy's mode ] in ``ckview/analysis/planner_ops.py``).
"""

from ckview.analysis.projection.effects import InstanceEffects
from ckview.analysis.projection.exact import peak_from_state, project
from ckview.analysis.projection.incremental import ProjectionModel, Selection
from ckview.analysis.projection.results import (
    LiveStorages,
    ProjectedCurve,
    ProjectedEvents,
    ProjectedPeak,
    Projection,
    Recompute,
)

__all__ = [
    "InstanceEffects",
    "LiveStorages",
    "ProjectedCurve",
    "ProjectedEvents",
    "ProjectedPeak",
    "Projection",
    "ProjectionModel",
    "Recompute",
    "Selection",
    "peak_from_state",
    "project",
]
