"""Which ops an op-level region saves in a recorded run: each forward op inside an instance of
a region with ``save``, named as the runtime names it (NOTE [ Op-level regions ] in
ckpt_runtime/plan.py), matched against the region's ``save`` list."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckpt_runtime.plan import match_op, op_auto_name
from ckview.analysis.regions import ModuleRegion, Region, RegionInstances
from ckview.analysis.types import RunTables
from ckview.trace.schema import Phase

__all__ = ["OpNames", "offloading", "op_names", "saved_ops"]


class OpNames:
    """The three names of each forward op of a run (``aten.mm``, ``aten.mm.default``,
    ``layers.0.linear1.mm_0``), computed once per run and named lazily per op."""

    def __init__(self, tables: RunTables) -> None:
        ops, strings = tables["ops"], tables["strings"]
        self.strings = strings
        self.name = np.asarray(ops["name"], dtype=np.int64)
        self.call = np.asarray(ops["module_call"], dtype=np.int64)
        calls_module = np.asarray(tables["module_calls"]["module"], dtype=np.int64)
        self.path = np.asarray(tables["modules"]["path"], dtype=np.int64)
        self.module = np.where(self.call >= 0, calls_module[np.maximum(self.call, 0)], -1)
        forward = np.asarray(ops["phase"]) == Phase.FORWARD
        self.index = _call_index(self.call, self._packet_ids(), forward)

    def _packet_ids(self) -> np.ndarray:
        unique = np.unique(self.name)
        packets = {self.packet_of(self.strings[int(n)]) for n in unique}
        ids = {p: i for i, p in enumerate(sorted(packets))}
        lookup = np.array([ids[self.packet_of(self.strings[int(n)])] for n in unique])
        return lookup[np.searchsorted(unique, self.name)] if unique.size else self.name

    @staticmethod
    def packet_of(overload: str) -> str:
        """``aten.mm`` of ``aten.mm.default`` (the overload packet, as torch prints it)."""
        parts = overload.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else overload

    def names(self, op: int) -> tuple[str, str, str]:
        """The overload packet, the overload and the auto-name of forward op row ``op``."""
        full = self.strings[int(self.name[op])]
        packet = self.packet_of(full)
        return packet, full, op_auto_name(self.module_path(op), packet, int(self.index[op]))

    def module_path(self, op: int) -> str:
        """The path of the innermost module running op row ``op`` ("" outside any)."""
        module = int(self.module[op])
        return self.strings[int(self.path[module])] if module >= 0 else ""


def _call_index(call: np.ndarray, packet: np.ndarray, forward: np.ndarray) -> np.ndarray:
    """Per op: how many ops of its packet its module call ran before it in forward (the
    auto-name's index; -1 outside forward)."""
    rows = np.flatnonzero(forward)
    key = call[rows] * (int(packet.max(initial=0)) + 1) + packet[rows]
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    first = np.searchsorted(sorted_key, sorted_key, side="left")
    out = np.full(len(call), -1, dtype=np.int64)
    out[rows[order]] = np.arange(len(rows)) - first
    return out


def op_names(tables: RunTables) -> OpNames:
    """The names of the run's forward ops (``OpNames``)."""
    return OpNames(tables)


def saved_ops(
    tables: RunTables, inst: RegionInstances, regions: Sequence[Region]
) -> tuple[np.ndarray, np.ndarray]:
    """``(instance, op row)``: the forward ops each instance of a region with ``save`` keeps
    (an op is saved if one of its names matches an entry of ``save``), by instance, then row.
    Offload regions save every op; they are not listed here (NOTE [ Offloaded instances ])."""
    with_save = np.array(
        [isinstance(r, ModuleRegion) and r.save is not None and not r.offload for r in regions],
        dtype=bool,
    )
    empty = np.zeros(0, dtype=np.int64)
    if not with_save.any() or len(inst) == 0:
        return empty, empty
    ops = tables["ops"]
    forward = np.asarray(ops["phase"]) == Phase.FORWARD
    call = np.asarray(ops["module_call"], dtype=np.int64)
    names = op_names(tables)
    owners, rows = [], []
    for i in np.flatnonzero(with_save[inst.region]):
        region = regions[int(inst.region[i])]
        assert isinstance(region, ModuleRegion) and region.save is not None
        inside = np.flatnonzero(forward & (call >= inst.first_call[i]) & (call < inst.call_stop[i]))
        hits = [op for op in inside.tolist() if _saved(region.save, names.names(op))]
        owners.append(np.full(len(hits), i, dtype=np.int64))
        rows.append(np.asarray(hits, dtype=np.int64))
    return np.concatenate(owners), np.concatenate(rows)


def offloading(inst: RegionInstances, regions: Sequence[Region]) -> np.ndarray:
    """(k,) bool: the instances of regions that offload (NOTE [ Offloaded instances ])."""
    flags = np.array([isinstance(r, ModuleRegion) and r.offload for r in regions], dtype=bool)
    return flags[inst.region] if len(inst) else np.zeros(0, dtype=bool)


def _saved(save: tuple[str, ...], names: tuple[str, str, str]) -> bool:
    return any(match_op(entry, names) for entry in save)
