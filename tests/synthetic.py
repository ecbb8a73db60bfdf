"""Synthetic training steps for the projection and planner tests, written op by op by
``StepBuilder`` the way the recorder writes a real one; ``training_step`` turns a list of
``Block`` specs into a whole step (forward, loss, backward in reverse, optimizer)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckview.trace.schema import (
    MODULES,
    RUN_TABLES,
    Category,
    IOKind,
    MemoryEventKind,
    Phase,
    SavedEventKind,
)

ALLOC, FREE, SEEN = MemoryEventKind.ALLOC, MemoryEventKind.FREE, MemoryEventKind.SEEN
Tables = dict[str, Any]


class StepBuilder:
    """Writes the tables of a synthetic run op by op: 10 ns per op, 1 ns per event in it."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.rows: dict[str, list[tuple[Any, ...]]] = {name: [] for name in RUN_TABLES}
        self.modules: list[tuple[int, int, int, int, int, int]] = []
        self.storage_rows: list[list[int]] = []  # nbytes, category, op, call, module, alloc, free
        self.stack: list[int] = []
        self.clock = 0

    def tick(self, ns: int = 1) -> int:
        self.clock += ns
        return self.clock

    def _intern(self, text: str) -> int:
        if text not in self.strings:
            self.strings.append(text)
        return self.strings.index(text)

    def module(self, path: str, type_: str, parent: int = -1, param_bytes: int = 0) -> int:
        container = {"Sequential": 1, "ModuleList": 2, "ModuleDict": 3}.get(type_, 0)
        row = (self._intern(path), self._intern(type_), parent, param_bytes)
        self.modules.append((*row, container, int(type_ == "Sequential")))
        return len(self.modules) - 1

    def existing(self, nbytes: int, category: Category) -> int:
        """A storage made before recording (SEEN now)."""
        sid = self._storage(nbytes, category, -1, -1, -1)
        self.rows["memory_events"].append((SEEN, sid, -1, self.tick()))
        return sid

    def _storage(self, nbytes: int, category: int, op: int, call: int, alloc: int) -> int:
        module = self.rows["module_calls"][call][0] if call >= 0 else -1
        self.storage_rows.append([nbytes, category, op, call, module, alloc, -1])
        return len(self.storage_rows) - 1

    @contextmanager
    def call(self, module: int, inputs: Iterable[int] = ()) -> Iterator[int]:
        """A FORWARD module call around the ops run inside the ``with``."""
        calls = self.rows["module_calls"]
        parent = self.stack[-1] if self.stack else -1
        calls.append((module, parent, Phase.FORWARD, 0, self.tick(3), -1, 0, 0))
        call = len(calls) - 1
        self.rows["module_io"] += [(call, s, IOKind.INPUT) for s in inputs]
        self.stack.append(call)
        yield call
        self.stack.pop()
        calls[call] = (*calls[call][:5], self.tick(3), 0, 0)

    def output(self, call: int, *storages: int) -> None:
        self.rows["module_io"] += [(call, s, IOKind.OUTPUT) for s in storages]

    def op(
        self,
        phase: Phase = Phase.FORWARD,
        call: int | None = None,
        alloc: Sequence[int] = (),
        free: Iterable[int] = (),
        pack: Iterable[int] = (),
        unpack: Iterable[int] = (),
        category: Category = Category.TEMPORARY,
    ) -> list[int]:
        """One op: unpacks, then ``alloc`` new storages (their sizes), frees, then packs.
        Returns the new storage rows. ``call`` defaults to the innermost open call."""
        call = (self.stack[-1] if self.stack else -1) if call is None else call
        op = len(self.rows["ops"])
        start = self.tick(5)
        for s in unpack:
            self._saved(SavedEventKind.UNPACK, s, op, call)
        new = []
        for nbytes in alloc:
            t = self.tick()
            new.append(self._storage(nbytes, category, op, call, t))
            self.rows["memory_events"].append((ALLOC, new[-1], op, t))
        for s in free:
            t = self.tick()
            self.storage_rows[s][6] = t
            self.rows["memory_events"].append((FREE, s, op, t))
        self.rows["ops"].append((0, phase, call, 0, start, self.tick(), -1))
        for s in pack:
            self.save(s)
        return new

    def save(self, storage: int) -> None:
        """The last op saves ``storage`` for backward (PACK by its call)."""
        op = len(self.rows["ops"]) - 1
        self._saved(SavedEventKind.PACK, storage, op, self.rows["ops"][op][2])
        if self.storage_rows[storage][1] == Category.TEMPORARY:
            self.storage_rows[storage][1] = Category.ACTIVATION

    def _saved(self, kind: SavedEventKind, storage: int, op: int, call: int) -> None:
        nbytes = self.storage_rows[storage][0]
        self.rows["saved_events"].append((kind, storage, op, call, 0, 0, nbytes, self.tick()))

    def tables(self) -> Tables:
        out: Tables = {name: _columns(name, rows) for name, rows in self.rows.items()}
        storages = [
            (r[0], 0, r[1], 0, 0, r[2], r[3], r[4], r[5], r[6], -1) for r in self.storage_rows
        ]
        out["storages"] = _columns("storages", storages)
        out["steps"] = _columns("steps", [(0, 0, self.clock, 0, 0, 1, 1, 1, 1)])
        out["modules"] = {
            c.name: np.asarray([m[i] for m in self.modules], dtype=c.dtype)
            for i, c in enumerate(MODULES)
        }
        out["strings"] = list(self.strings)
        return out


def _columns(name: str, rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
    return {
        c.name: np.asarray([r[i] for r in rows], dtype=c.dtype).reshape(len(rows))
        for i, c in enumerate(RUN_TABLES[name])
    }


# ----------------------------------------------------------------------------- synthetic steps


@dataclass(frozen=True)
class Layer:
    """A forward op of a block: allocates ``nbytes``, saved for backward or freed ``life`` ops
    later (possibly after the block ended)."""

    nbytes: int
    saved: bool
    life: int


@dataclass(frozen=True)
class Block:
    """A block: its first layer runs in the block's call, the others in a child call ('mlp');
    then an op makes its output. ``input_saved``: the first layer saves the block's input."""

    layers: tuple[Layer, ...]
    out_bytes: int
    input_saved: bool


@dataclass
class _Forward:
    """Forward bookkeeping of ``training_step``."""

    builder: StepBuilder
    pending: list[tuple[int, int]]  # (op count after which it is freed, storage)
    ops: int = 0

    def op(self, **kwargs: Any) -> list[int]:
        self.ops += 1
        due = [s for t, s in self.pending if t < self.ops]
        self.pending = [(t, s) for t, s in self.pending if t >= self.ops]
        return self.builder.op(free=[*kwargs.pop("free", ()), *due], **kwargs)


def training_step(blocks: Sequence[Block]) -> Tables:
    """One step of a model ``Net`` with a Sequential ``blocks`` of ``Block``s (each with a child
    ``mlp``): forward, a loss saving the last output, backward in reverse, an optimizer op."""
    b = StepBuilder()
    net = b.module("", "Net")
    seq = b.module("blocks", "Sequential", net)
    rows = [b.module(f"blocks.{i}", "Block", seq, 64) for i in range(len(blocks))]
    inner = [b.module(f"blocks.{i}.mlp", "MLP", rows[i]) for i in range(len(blocks))]
    b.existing(64 * len(blocks), Category.PARAMETER)
    x = b.existing(16, Category.INPUT)
    fw = _Forward(b, [])
    saved: list[tuple[int, int, list[int], list[int]]] = []  # block call, mlp call, its, mlp's
    with b.call(net) as root:
        with b.call(seq, inputs=[x]):
            for i, block in enumerate(blocks):
                x, record = _block_forward(fw, block, rows[i], inner[i], x, first=i == 0)
                saved.append(record)
        fw.op(alloc=[8], pack=[x])  # the loss saves the last output
    for s in [s for _, s in fw.pending]:
        b.op(call=root, free=[s])
    b.op(Phase.BACKWARD, call=root, unpack=[x], free=[x])
    for call, mlp_call, own, mlp in reversed(saved):
        (grad_x,) = b.op(Phase.BACKWARD, call=mlp_call, alloc=[32], unpack=mlp, free=mlp)
        b.op(Phase.BACKWARD, call=call, alloc=[64], unpack=own, category=Category.GRADIENT)
        b.op(Phase.BACKWARD, call=call, free=[grad_x, *own])
    b.op(Phase.OPTIMIZER, call=-1, alloc=[128], category=Category.OPTIMIZER_STATE)
    return b.tables()


def _block_forward(
    fw: _Forward, block: Block, row: int, mlp_row: int, x: int, first: bool
) -> tuple[int, tuple[int, int, list[int], list[int]]]:
    """Runs one block; returns its output and (call, mlp call, saved by it, saved by mlp)."""
    b = fw.builder
    own: list[int] = [x] if block.input_saved and not first else []
    with b.call(row, inputs=[x]) as call:
        h = _layer(fw, block.layers[0], pack=[x] if block.input_saved else [], saved=own)
        mlp: list[int] = []
        with b.call(mlp_row, inputs=[h]) as mlp_call:
            for layer in block.layers[1:]:
                h = _layer(fw, layer, pack=[], saved=mlp)
            b.output(mlp_call, h)
        (out,) = fw.op(alloc=[block.out_bytes])
        b.output(call, out)
    if not block.input_saved and not first:
        fw.pending.append((fw.ops, x))  # dead once the block returned
    return out, (call, mlp_call, own, mlp)


def _layer(fw: _Forward, layer: Layer, pack: list[int], saved: list[int]) -> int:
    (s,) = fw.op(alloc=[layer.nbytes], pack=pack)
    if layer.saved:
        fw.builder.save(s)
        saved.append(s)
    else:
        fw.pending.append((fw.ops + layer.life, s))
    return s


def on_cuda(tables: Tables) -> Tables:
    """A run's tables as if recorded on CUDA: every storage on device 'cuda:0' (the offload
    projection reads nothing else of the device)."""
    strings = [*tables["strings"], "cuda:0"]
    storages = dict(tables["storages"])
    storages["device"] = np.full(len(storages["device"]), len(strings) - 1)
    return {**tables, "strings": strings, "storages": storages}
