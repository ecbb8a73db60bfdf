"""The module tree seen while recording: the rows of the trace's ``modules`` table."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np
import torch

from ckpt_runtime.presets import (
    container_kind,
    is_compiled_wrapper,
    runs_sequential_forward,
    user_model,
)
from ckview.trace.schema import NO_INDEX

K = TypeVar("K")


class ModuleRegistry:
    """Modules by row, with dotted paths relative to their root module.

    A module is registered the first time it runs forward: a root (nothing else running)
    brings its whole tree in at once, paths as ``named_modules()`` gives them; a module called
    from inside another is named after its attribute in that parent. Holds modules and
    parameters weakly only. ``torch.compile``'s wrapper is never registered: the model it
    wraps is the root (NOTE [ A compiled model is named as the user's model ] in
    ckpt_runtime/presets.py).
    """

    def __init__(self, intern: Callable[[str], int]) -> None:
        self._intern = intern
        self._rows: RowsByIdentity[torch.nn.Module] = RowsByIdentity()
        self._refs: list[weakref.ref[torch.nn.Module]] = []
        self._paths: list[str] = []
        self._types: list[str] = []
        self.parents: list[int] = []
        self._columns: dict[str, list[int]] = {
            "path": [],
            "type": [],
            "param_bytes": [],
            "container": [],
            "sequential_forward": [],
        }
        self._owner: RowsByIdentity[torch.Tensor] = RowsByIdentity()
        self._table: tuple[int, dict[str, np.ndarray]] = (0, {})  # rows, columns() of them
        self._saw_wrapper = False
        self._wrapped: list[weakref.ref[torch.nn.Module]] = []  # models torch.compile wraps

    def passes_through(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` is ``torch.compile``'s wrapper, whose calls the trace leaves out
        (its model's calls are recorded)."""
        if is_compiled_wrapper(module):
            self._saw_wrapper = True
            wrapped = user_model(module)
            if all(ref() is not wrapped for ref in self._wrapped):
                self._wrapped.append(weakref.ref(wrapped))
            return True
        return False

    @property
    def empty(self) -> bool:
        """Whether no module has run forward yet."""
        return not self._paths

    def row(self, module: object) -> int | None:
        row = self._rows.get(module) if isinstance(module, torch.nn.Module) else NO_INDEX
        return None if row == NO_INDEX else row

    def register(self, module: torch.nn.Module, caller: int) -> tuple[int, list[torch.Tensor]]:
        """Register ``module``, called from module row ``caller`` (or -1 at top level).

        Returns its row and the parameters that are new to the registry.
        """
        if caller != NO_INDEX:
            name = self._child_name(caller, module)
            if name is not None:
                prefix = self._paths[caller]
                return self._register_tree(module, f"{prefix}.{name}" if prefix else name, caller)
        return self._register_tree(module, "", NO_INDEX)

    def add_loose(self, parameter: torch.Tensor) -> bool:
        """Know ``parameter``, owned by no module (NOTE [ A forward without modules ] in
        hooks.py); False if it was known already."""
        if parameter in self._owner:
            return False
        self._owner[parameter] = NO_INDEX
        return True

    def parameters(self) -> list[torch.Tensor]:
        return self._owner.keys()

    def owner_table(self) -> dict[int, tuple[weakref.ref[torch.Tensor], int]]:
        """The parameters' owners as stored (``RowsByIdentity.by_id``), for the extension's
        walks (NOTE [ Marks in one call ] in recorder/native/ckrec_marks.cpp)."""
        return self._owner.by_id

    def buffers(self) -> list[torch.Tensor]:
        """The registered modules' own buffers (BatchNorm's running statistics...)."""
        return [
            b for ref in self._refs if (m := ref()) is not None for b in m.buffers(recurse=False)
        ]

    def owner(self, parameter: torch.Tensor) -> int:
        """Row of the module that owns ``parameter``, -1 if it is not a known parameter."""
        return self._owner.get(parameter)

    def display(self, row: int) -> str:
        """``'Root.path.below'``, as the analysis shows it."""
        root = row
        while self.parents[root] != NO_INDEX:
            root = self.parents[root]
        path = self._paths[row]
        return f"{self._types[root]}.{path}" if path else self._types[root]

    def common_ancestor(self, a: int, b: int) -> int:
        ancestors = set()
        while a != NO_INDEX:
            ancestors.add(a)
            a = self.parents[a]
        while b != NO_INDEX and b not in ancestors:
            b = self.parents[b]
        return b

    def main_model(self) -> torch.nn.Module:
        """The root module with the most parameters: the script's model. A model that
        ``torch.compile`` wraps counts too: compiled whole (an ``nn.Sequential``), none of its
        modules runs as a module call."""
        roots = [
            (sum(p.numel() for p in m.parameters()), -row, m)
            for row, ref in enumerate(self._refs)
            if self.parents[row] == NO_INDEX and (m := ref()) is not None
        ]
        roots += [
            (sum(p.numel() for p in m.parameters()), -len(self._refs) - i, m)
            for i, ref in enumerate(self._wrapped)
            if (m := ref()) is not None
        ]
        if not roots:
            raise RuntimeError(
                "no model found: no nn.Module ran forward before recording began, and a "
                "checkpoint plan names a model's modules (plan 'none' needs none)"
            )
        return max(roots, key=lambda r: r[:2])[2]

    def saw_compiled(self) -> bool:
        """Whether a module that ran is ``torch.compile``'d: an ``OptimizedModule`` wrapper
        (``torch.compile(model)``) or a module with a compiled call (``module.compile()``)."""
        return self._saw_wrapper or any(
            getattr(ref(), "_compiled_call_impl", None) is not None for ref in self._refs
        )

    def columns(self) -> dict[str, np.ndarray]:
        """The ``modules`` table (read-only). Rows are only appended, never changed, so while
        no module is registered the same table comes back (the journal asks at every step)."""
        rows, table = self._table
        if rows != len(self.parents) or not table:
            cols = {name: np.asarray(v, dtype=np.int64) for name, v in self._columns.items()}
            table = {**cols, "parent": np.asarray(self.parents, dtype=np.int64)}
            for col in table.values():
                col.flags.writeable = False
            self._table = (len(self.parents), table)
        return table

    def _child_name(self, parent_row: int, module: torch.nn.Module) -> str | None:
        parent = self._refs[parent_row]()
        for name, child in parent.named_children() if parent is not None else ():
            if child is module:
                return name
        return None

    def _register_tree(
        self, module: torch.nn.Module, path: str, parent: int
    ) -> tuple[int, list[torch.Tensor]]:
        new_params: list[torch.Tensor] = []
        for sub_path, sub in module.named_modules(prefix=path):
            if sub in self._rows:
                continue
            sub_parent = parent if sub is module else self._rows[_parent_of(module, sub_path, path)]
            row = self._rows[sub] = len(self._paths)
            self._refs.append(weakref.ref(sub))
            self._paths.append(sub_path)
            self._types.append(type(sub).__name__)
            self.parents.append(sub_parent)
            params = list(sub.parameters(recurse=False))
            self._columns["path"].append(self._intern(sub_path))
            self._columns["type"].append(self._intern(type(sub).__name__))
            self._columns["param_bytes"].append(sum(p.nbytes for p in params))
            # The live adapter's rules (ckpt_runtime/presets.py), so that a plan resolves the
            # same over the model and over this trace.
            self._columns["container"].append(int(container_kind(sub)))
            self._columns["sequential_forward"].append(int(runs_sequential_forward(sub)))
            for p in params:
                if p not in self._owner:
                    self._owner[p] = row
                    new_params.append(p)
        return self._rows[module], new_params


def _parent_of(root: torch.nn.Module, sub_path: str, root_path: str) -> torch.nn.Module:
    """The parent module of ``root``'s descendant at ``sub_path``."""
    relative = sub_path[len(root_path) + 1 :] if root_path else sub_path
    parent_rel = relative.rpartition(".")[0]
    return root.get_submodule(parent_rel) if parent_rel else root


class RowsByIdentity(Generic[K]):
    """Object -> row, holding the objects weakly and telling them apart by identity.

    The recorder looks up the row of every module call and the owner of every gradient and
    optimizer state at every step, so a lookup is one dict access by ``id`` and one identity
    test, where a weak-keyed dictionary builds a weak reference per lookup (1-3 µs). An id is
    reused only after its object died, and a dead object's entry goes when its weak reference
    fires.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[K], int]] = {}

    @property
    def by_id(self) -> dict[int, tuple[weakref.ref[K], int]]:
        """The table as stored: ``id(object)`` -> (weak reference to it, row); read-only."""
        return self._by_id

    def __contains__(self, key: K) -> bool:
        entry = self._by_id.get(id(key))
        return entry is not None and entry[0]() is key

    def __getitem__(self, key: K) -> int:
        entry = self._by_id.get(id(key))
        if entry is None or entry[0]() is not key:
            raise KeyError(key)
        return entry[1]

    def __setitem__(self, key: K, row: int) -> None:
        index, entries = id(key), self._by_id

        def forget(ref: weakref.ref[K]) -> None:
            if entries.get(index, (None,))[0] is ref:
                del entries[index]

        entries[index] = (weakref.ref(key, forget), row)

    def get(self, key: K, default: int = NO_INDEX) -> int:
        """The row of ``key``, ``default`` if it is not known."""
        entry = self._by_id.get(id(key))
        return entry[1] if entry is not None and entry[0]() is key else default

    def keys(self) -> list[K]:
        """The known objects still alive."""
        alive = (ref() for ref, _ in list(self._by_id.values()))
        return [k for k in alive if k is not None]


class WeakList(Generic[K]):
    """Objects held weakly, each once, in the order added: the optimizers, read three times a
    step (listing a ``WeakSet`` took 8 µs, its iteration guard and generator included)."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref[K]] = []

    def add(self, obj: K) -> None:
        alive = [ref for ref in self._refs if ref() is not None]
        if not any(ref() is obj for ref in alive):
            alive.append(weakref.ref(obj))
        self._refs = alive

    def alive(self) -> list[K]:
        """The objects still alive, in the order added."""
        return [obj for ref in self._refs if (obj := ref()) is not None]
