"""Op-level candidates for the planner: per block, the saved-tensor groups worth keeping.

NOTE [ Op-level search space ]
    At ``level="op"`` each module-region candidate (a block of the chain) gets variants that
    save some of its ops instead of recomputing them all. A block's *saved-tensor groups* are
    its forward ops by overload packet (``aten.addmm``, ``aten.bmm``, ``aten._safe_softmax``)
    that leave an output (a storage the op made and did not free). Left out: ops that write
    in place (the runtime never saves them by name); factories such as ``empty_like`` whose
    output a later op fills in place (the runtime refuses to save those, ``FACTORIES``); and
    packets with a call that makes no storage of its own, such as views (saving ``aten.view``
    keeps the viewed storage alive through the cache, which the trace cannot tell: a GPT-2
    plan saving it measured 42% over its projection); and packets whose in-place form runs in
    the block (``aten.add`` where ``aten.add_`` runs), as NOTE [ Out-of-place under the
    policy's mode ] says. Each group has the bytes saving it
    keeps alive (its outputs, which the policy's cache holds to the recompute, saved by
    autograd or not) and the recorded time it spares the recompute. Groups are ranked by time
    spared per byte kept, and each variant saves a prefix of that order, one ending at every
    group of at least ``MIN_SHARE`` of the block's output bytes (at most ``MAX_VARIANTS``):
    the knapsack's greedy order, one save list per variant. Variants of a block conflict with
    the block's module region and with every segment covering it, so a plan picks at most one
    way per block.

    The projection judges every plan (no estimate decides); the variants only choose which
    plans exist. Since the module candidates stay in the space, and the op-level search is
    seeded with the best module plan for the budget (NOTE [ Op-level never costs more ]), an
    op-level answer never costs more projected extra compute than the module-level one.

NOTE [ Out-of-place under the policy's mode ]
    Torch's selective checkpoint runs the region under a dispatch mode, and while any dispatch
    mode is on, torch's composite ops take their "composite compliant" path
    (``isTensorSubclassLike`` is true): ``aten.linear`` on an input it cannot flatten (the
    transposed input of ``nn.MultiheadAttention``'s packed projection) adds its bias with
    ``aten.add`` into a new tensor, where the recorded step, which runs under no mode on the
    native path, ran ``aten.add_`` in place. A save list naming ``aten.add`` then also keeps
    that new tensor, which the baseline never made, until the recompute: on the
    TransformerEncoder of tests/test_planner_ops.py, 384 KiB (the q, k, v projection) over the
    projected peak, 3.2% (the CI failures blamed on an earlier compiled test: the variants are
    prefixes in time-per-byte order, so a slow ``aten.add`` in the recorded step put it in a
    variant). The trace cannot say which in-place call turns out-of-place under a mode, so a
    packet whose in-place form runs in the block is not a group: the planner never saves it,
    the explorer does not offer it, and a hand-written plan that saves it is warned of
    (NOTE [ Saves the projection cannot hold ]).

NOTE [ Saves the projection cannot hold ]
    Two kinds of call in a block make a save entry that catches them project low: a call that
    makes no storage of its own (a view: NOTE [ Op-level search space ]), and the out-of-place
    form of a call that runs in place in the recorded step (NOTE [ Out-of-place under the
    policy's mode ]). ``unsaveable_calls`` is that rule, once, read from the trace (the block's
    op names and storage rows): ``op_groups`` leaves their packets out, so the planner never
    writes such an entry, and ``save_warnings`` warns, one line per save entry, when a
    hand-written plan's save list catches one (``ckview project``, ``verify``, ``export``,
    ``fit``, ``record --compare --plan``, the explorer's readout). A warning, not an error: the plan
    still runs, and the projection may still be right (a mode turns only some in-place calls
    out of place).
    The out-of-place form of ``aten.add_.Tensor`` in ``layers.0.self_attn`` is caught by an
    entry matching ``aten.add``, ``aten.add.Tensor`` or one of the auto-names ``add_<k>`` it may
    take in that module's call (k below that call's count of ``add`` and ``add_`` calls).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

import numpy as np

from ckpt_runtime.plan import match_op, op_auto_name
from ckview.analysis.projection.oplevel import OpNames
from ckview.analysis.regions import ModuleRegion, Region, region_instances
from ckview.analysis.types import RunTables
from ckview.trace.schema import MemoryEventKind, Phase

__all__ = [
    "MAX_VARIANTS",
    "OpGroup",
    "SaveWarning",
    "Unsaveable",
    "op_groups",
    "op_variants",
    "save_warnings",
    "unsaveable_calls",
]

MAX_VARIANTS = 4
"""Most op-level variants per block (NOTE [ Op-level search space ])."""
MIN_SHARE = 0.01
"""A variant ends at a group holding at least this share of the block's output bytes: smaller
groups (a mask's ``tril``) ride along with the next one instead of making a variant."""


@dataclass(frozen=True)
class OpGroup:
    """The ops of one overload packet in a block: what saving them keeps and spares."""

    packet: str
    nbytes: int
    """Bytes of their outputs (kept alive when the group is saved)."""
    compute_ns: int
    """Their summed recorded forward time (spared in the recompute when saved)."""


def op_groups(
    tables: RunTables, region: ModuleRegion, names: OpNames | None = None
) -> list[OpGroup]:
    """The saved-tensor groups of the first forward call of ``region``'s module, best first
    (time spared per byte kept; NOTE [ Op-level search space ])."""
    inside = _first_call_ops(tables, region.module)
    if not len(inside):
        return []
    names = names if names is not None else OpNames(tables)
    ops, storages = tables["ops"], tables["storages"]
    per_op = np.zeros(len(ops["phase"]), dtype=np.int64)
    made_by = np.asarray(storages["op"], dtype=np.int64)
    outputs = np.flatnonzero(_outputs(tables, made_by))
    np.add.at(per_op, made_by[outputs], np.asarray(storages["nbytes"], dtype=np.int64)[outputs])
    duration = np.asarray(ops["end_ns"], dtype=np.int64) - np.asarray(ops["start_ns"])
    groups: dict[str, list[int]] = {}
    # NOTE [ Saves the projection cannot hold ]
    left_out = {call.packet for call in unsaveable_calls(tables, inside, names)}
    for op in inside.tolist():
        packet = names.names(op)[0]
        entry = groups.setdefault(packet, [0, 0])
        entry[0] += int(per_op[op])
        entry[1] += int(duration[op])
    found = [
        OpGroup(p, b, t)
        for p, (b, t) in groups.items()
        if b > 0 and p not in left_out and not p.endswith("_") and not _is_factory(p)
    ]
    return sorted(found, key=lambda g: (-g.compute_ns / g.nbytes, g.packet))


def _first_call_ops(tables: RunTables, module: int) -> np.ndarray:
    """The FORWARD op rows of the first forward call of module row ``module`` (its calls
    included); empty if it never ran forward."""
    inst = region_instances(
        tables["module_calls"], tables["modules"], tables["strings"], [ModuleRegion(module)]
    )
    if not len(inst):
        return np.zeros(0, dtype=np.int64)
    ops = tables["ops"]
    call = np.asarray(ops["module_call"], dtype=np.int64)
    return np.flatnonzero(
        (np.asarray(ops["phase"]) == Phase.FORWARD)
        & (call >= inst.first_call[0])
        & (call < inst.call_stop[0])
    )


Reason = Literal["view", "out_of_place"]


@dataclass(frozen=True)
class Unsaveable:
    """A call of a block that a save entry must not catch (NOTE [ Saves the projection cannot
    hold ]), with the names an entry would catch it by."""

    packet: str
    """The packet a save list names it by (``aten.view``; ``aten.add`` for ``aten.add_``)."""
    reason: Reason
    """``view``: it makes no storage of its own; ``out_of_place``: it runs in place in the
    recorded step, and may run out of place under the policy's mode."""
    names: tuple[str, ...]
    """Its packet, overload and auto-name; for ``out_of_place``, those its out-of-place form
    may have."""


def unsaveable_calls(tables: RunTables, inside: np.ndarray, names: OpNames) -> list[Unsaveable]:
    """The calls among forward op rows ``inside`` (one block's) that a save entry must not
    catch, in op order: the rule of NOTE [ Saves the projection cannot hold ]."""
    made_by = np.asarray(tables["storages"]["op"], dtype=np.int64)
    makes = np.zeros(len(tables["ops"]["phase"]), dtype=bool)
    makes[made_by[made_by >= 0]] = True
    call = np.asarray(tables["ops"]["module_call"], dtype=np.int64)
    rows = inside.tolist()
    named = [names.names(op) for op in rows]
    per_call = Counter((int(call[op]), n[0]) for op, n in zip(rows, named, strict=True))
    found = []
    for op, (packet, overload, auto) in zip(rows, named, strict=True):
        if not packet.endswith("_"):
            if not makes[op]:  # a view, or an op that returns a tensor it did not make
                found.append(Unsaveable(packet, "view", (packet, overload, auto)))
            continue
        base = packet[:-1]  # NOTE [ Out-of-place under the policy's mode ]
        k = per_call[int(call[op]), base] + per_call[int(call[op]), packet]
        autos = (op_auto_name(names.module_path(op), base, i) for i in range(k))
        found.append(
            Unsaveable(base, "out_of_place", (base, base + overload[len(packet) :], *autos))
        )
    return found


@dataclass(frozen=True)
class SaveWarning:
    """Save entries of an op-level plan that catch unsaveable ops of some blocks, so the
    projection can be low (NOTE [ Saves the projection cannot hold ])."""

    blocks: tuple[str, ...]
    """The module paths of the regions whose save lists catch them."""
    entries: tuple[str, ...]
    """The save entries that catch them."""
    reason: Reason
    packets: tuple[str, ...]
    """The ops caught, by packet (``aten.add``)."""

    def line(self) -> str:
        """One line: the blocks, the ops and the entries catching them, why the projection can
        be low, and what to do."""
        many = len(self.packets) > 1
        ops, it = ", ".join(self.packets), "them" if many else "it"
        one = len(self.blocks) == 1
        line = f"block{'' if one else 's'} {', '.join(self.blocks)} save{'s' if one else ''} {ops}"
        if self.entries != self.packets:
            line += f" (save entry {', '.join(self.entries)})"
        if self.reason == "view":
            line += (
                f", which {'are views' if many else 'is a view'} in the recorded step (no "
                f"storage of {'their' if many else 'its'} own): saving {it} keeps the viewed "
                f"tensor{'s' if many else ''} alive, which the projection does not count"
            )
        else:
            in_place = ", ".join(f"{p}_" for p in self.packets)
            line += (
                f", which run{'' if many else 's'} in place in the recorded step ({in_place}): "
                f"under selective checkpointing {'they' if many else 'it'} may run out of place "
                "into new tensors, which the projection does not count"
            )
        return (
            f"{line}, so the projection can be low; leave {it if many else ops} out of the save "
            f"list (ckview plan --level op never saves {it})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "blocks": list(self.blocks),
            "entries": list(self.entries),
            "reason": self.reason,
            "ops": list(self.packets),
            "message": self.line(),
        }


def save_warnings(
    tables: RunTables, regions: Sequence[Region], names: OpNames | None = None
) -> list[SaveWarning]:
    """What the save lists of ``regions`` catch that the projection cannot hold (NOTE [ Saves
    the projection cannot hold ]): one warning per save entry (or entries catching the same
    ops) and reason, naming the blocks whose save lists do, in region order. None for a plan
    the op-level planner wrote."""
    paths, strings = tables["modules"]["path"], tables["strings"]
    found: dict[tuple[tuple[str, ...], Reason, tuple[str, ...]], list[str]] = {}
    for region in regions:
        if not isinstance(region, ModuleRegion) or region.save is None or region.offload:
            continue
        names = names if names is not None else OpNames(tables)
        caught: dict[tuple[tuple[str, ...], Reason], set[str]] = {}
        for call in unsaveable_calls(tables, _first_call_ops(tables, region.module), names):
            entries = tuple(e for e in region.save if match_op(e, call.names))
            if entries:
                caught.setdefault((entries, call.reason), set()).add(call.packet)
        block = strings[int(paths[region.module])]
        for (entries, reason), packets in caught.items():
            found.setdefault((entries, reason, tuple(sorted(packets))), []).append(block)
    return [SaveWarning(tuple(b), e, r, p) for (e, r, p), b in found.items()]


FACTORIES = ("aten.empty*", "aten.*_like", "aten.new_*", "aten.zeros", "aten.ones", "aten.full")
"""Ops that make a buffer for a later op to fill in place (dropout's ``empty_like`` then
``bernoulli_``): the runtime refuses to save an output that is written later."""


def _is_factory(packet: str) -> bool:
    return any(fnmatchcase(packet, pattern) for pattern in FACTORIES)


def _outputs(tables: RunTables, made_by: np.ndarray) -> np.ndarray:
    """Per storage: made by an op and not freed by it (an output, which saving the op keeps;
    NOTE [ Op-level instances ] in ckview.analysis.projection)."""
    events = tables["memory_events"]
    kind = np.asarray(events["kind"])
    free_op = np.full(len(made_by), -1, dtype=np.int64)
    freed = kind == MemoryEventKind.FREE
    free_op[np.asarray(events["storage"], dtype=np.int64)[freed]] = np.asarray(
        events["op"], dtype=np.int64
    )[freed]
    return (made_by >= 0) & (free_op != made_by)


def op_variants(
    tables: RunTables, candidates: Sequence[Region], offload: bool = False
) -> list[tuple[int, ModuleRegion]]:
    """``(candidate index, variant)``: the op-level variants of each module-region candidate
    (NOTE [ Op-level search space ]); with ``offload``, also one that offloads everything the
    block saves (NOTE [ Offload in the planner ] in planner.py)."""
    names = OpNames(tables)
    out: list[tuple[int, ModuleRegion]] = []
    for i, region in enumerate(candidates):
        if not isinstance(region, ModuleRegion) or region.op_level:
            continue
        groups = op_groups(tables, region, names)
        total = sum(g.nbytes for g in groups)
        cuts = [k + 1 for k, g in enumerate(groups) if g.nbytes >= MIN_SHARE * total]
        for k in cuts[:MAX_VARIANTS]:
            save = tuple(sorted(g.packet for g in groups[:k]))
            out.append((i, ModuleRegion(region.module, save)))
        if offload:
            out.append((i, ModuleRegion(region.module, ("*",), True)))
    return out
