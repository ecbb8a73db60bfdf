"""Checkpoint plans (docs/plan-format.md) resolved against a trace's module tree, and back.

``regions_from_plan`` turns a plan document (or a preset string) into the module-row regions the
projection reads (``ckview.analysis.regions``), resolving it as ``ckpt_runtime`` resolves it
against the live model; ``plan_from_regions`` writes regions as a plan document that
``ckpt_runtime.apply_plan`` accepts. Pure Python over the ``modules`` table: no torch, no files
(``ckpt_runtime.plan`` cannot be imported here because importing the package imports torch, so
the document checks of docs/plan-format.md, section 7, are repeated below; the tests compare the
two on the same documents).

NOTE [ Resolving against a trace ]
    The trace knows each module's dotted path, class name, parent and parameter bytes, which is
    what resolving needs, with two limits that follow from knowing class *names* only:

    - a segment's ``sequential`` must be a module of class ``Sequential``, and a chain of blocks
      (detected or named with ``@``/``chain``) a ``ModuleList`` or ``Sequential``. A subclass
      with another name is rejected here although ``ckpt_runtime`` may accept it; an
      ``nn.Sequential`` whose ``forward`` was replaced on the instance is accepted here although
      ``ckpt_runtime`` rejects it.
    - the model is the main root of the module table (the root owning the most parameter
      bytes, as ``chain_of_blocks`` picks it); other roots (e.g. a loss module) are not part of
      the model a plan is applied to, so patterns never match them.

    Everything else follows ``ckpt_runtime/apply.py`` (``_resolve``) and
    ``ckpt_runtime/presets.py`` (``resolve_preset``, NOTE [ Block chain detection ],
    NOTE [ sqrt on a ModuleList ]): patterns match one component at a time, several patterns
    matching one module select it once, segments must not overlap or run past the Sequential,
    and a module region that checkpoints the same computation as a segment (the only child of
    a one-child segment, or a Sequential one segment covers entirely) is an error. Regions come
    back in ``resolve_plan``'s order: by module row (``named_modules()`` order), a module
    region before the segments of the same row, segments by start.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckview.analysis.regions import (
    ModuleRegion,
    Region,
    SegmentRegion,
    chain_of_blocks,
    path_components,
    path_matches,
    sequential_children,
)
from ckview.trace.schema import NO_INDEX

__all__ = ["PRESETS", "plan_from_regions", "plan_name", "regions_from_plan"]

Table = Mapping[str, np.ndarray]

FORMAT_NAME = "ckview-plan"
FORMAT_VERSION = 1
PRESETS = ("none", "all", "sqrt", "every:K")
"""The preset names, as shown in messages (``K`` is a positive integer)."""

_TOP_KEYS = frozenset(
    {"format", "version", "name", "regions", "preset", "chain", "options", "meta"}
)
_OPTIONS = ("use_reentrant", "preserve_rng_state")
_GLOB_CHARS = frozenset("*?[")
_PRESET_LIKE = re.compile(r"^(none|all|sqrt|every)(?=$|[:@])")
_PRESET = re.compile(r"^(none|all|sqrt|every:([0-9]+))(?:@(.*))?$", re.DOTALL)


def _fail(message: str) -> ValueError:
    """A one-line ``ValueError`` (user input quoted in it may hold newlines)."""
    return ValueError(" ".join(message.split()))


# ----------------------------------------------------------------------------- public API


def regions_from_plan(
    plan: Mapping[str, Any] | str, modules: Table, strings: Sequence[str]
) -> list[Region]:
    """The regions (by module row) a plan checkpoints in the model recorded in ``modules``.

    ``plan`` is a plan document (a dict as in docs/plan-format.md, or its JSON text) or a preset
    string (``none``, ``all``, ``every:K``, ``sqrt``, each optionally ``@chain.path``). It is
    resolved as ``ckpt_runtime.resolve_plan`` resolves it against the live model
    (NOTE [ Resolving against a trace ]). Raises ``ValueError`` with a one-line message for a
    malformed plan, a pattern that matches nothing, or regions the model cannot have.
    """
    tree = _Tree(modules, strings)
    if isinstance(plan, str) and _PRESET_LIKE.match(plan):
        kind, k, chain = _parse_preset(plan)
        return _resolve_preset(tree, kind, k, chain)
    doc = _as_document(plan)
    preset = doc.get("preset")
    if preset is not None:
        kind, k, chain = _parse_preset(preset)
        return _resolve_preset(tree, kind, k, chain if chain is not None else doc.get("chain"))
    return _resolve_regions(tree, [_parse_region(i, r) for i, r in enumerate(doc["regions"])])


def plan_from_regions(
    regions: Sequence[Region],
    modules: Table,
    strings: Sequence[str],
    name: str,
    *,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A plan document (as ``ckpt_runtime.save_plan`` writes it) checkpointing ``regions``.

    Module regions become exact (escaped) paths, segments ``{"sequential", "start", "stop"}``;
    duplicates are merged and the order is ``resolve_plan``'s, so ``regions_from_plan`` on the
    result gives back the same regions in canonical order. ``meta`` (JSON data) is stored as the
    plan's ``meta``. Raises ``ValueError`` for regions no plan can express (a row outside the
    model, a segment of a non-Sequential or past its children, overlapping segments).
    """
    tree = _Tree(modules, strings)
    _check_name(name)
    unique = list(dict.fromkeys(regions))
    concrete = _resolve_regions(tree, [_as_plan_region(tree, r) for r in unique])
    doc: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": name,
        "regions": [_region_json(tree, r) for r in concrete],
        "options": {"use_reentrant": False, "preserve_rng_state": True},
    }
    if meta:
        doc["meta"] = json.loads(json.dumps(dict(meta)))
    return doc


def plan_name(plan: Mapping[str, Any] | str) -> str:
    """The name a re-recording with ``plan`` is stored under, after ``plan:``.

    A preset string names itself in canonical form (``every:02@blocks`` -> ``every:2@blocks``);
    a plan document its ``name``, else ``"plan"`` (a file's stem is the caller's to supply).
    """
    if isinstance(plan, str) and _PRESET_LIKE.match(plan):
        kind, k, chain = _parse_preset(plan)
        return _preset_text(kind, k) + (f"@{chain}" if chain is not None else "")
    return str(_as_document(plan).get("name", "plan"))


# ----------------------------------------------------------------------------- the module tree


class _Tree:
    """The main model's modules: paths, class names and children, by row."""

    def __init__(self, modules: Table, strings: Sequence[str]) -> None:
        self.modules, self.strings = modules, strings
        self.parent = np.asarray(modules["parent"], dtype=np.int64)
        self.paths = [strings[int(p)] for p in np.asarray(modules["path"])]
        self.types = [strings[int(t)] for t in np.asarray(modules["type"])]
        self.in_model = self._main_subtree(np.asarray(modules["param_bytes"], dtype=np.int64))
        self.model_rows = [row for row in range(len(self.paths)) if self.in_model[row]]
        self.row_of = {self.paths[row]: row for row in self.model_rows}
        self.model_type = self.types[self.model_rows[0]] if self.model_rows else "model"

    def _main_subtree(self, param_bytes: np.ndarray) -> np.ndarray:
        """Mask of the rows under the root owning the most parameter bytes (the first on ties)."""
        root = np.arange(len(self.parent))
        for _ in range(len(self.parent)):
            up = self.parent[root]
            if not (up != NO_INDEX).any():
                break
            root = np.where(up != NO_INDEX, up, root)
        roots = np.flatnonzero(self.parent == NO_INDEX)
        if roots.size == 0:
            return np.zeros(len(self.parent), dtype=bool)
        owned = np.bincount(np.searchsorted(roots, root), weights=param_bytes, minlength=len(roots))
        return np.asarray(root == roots[int(np.argmax(owned))], dtype=bool)

    def children(self, row: int) -> list[int]:
        """Rows of ``row``'s children in container order."""
        return sequential_children(self.modules, self.strings, row)

    def lookup(self, path: str, what: str) -> int:
        """Row of the module at exact ``path``; ``ValueError`` suggesting paths if none."""
        row = self.row_of.get(path)
        if row is None:
            raise _fail(
                f"{what} {path!r} is not a module of {self.model_type}; {self.suggest(path)}"
            )
        return row

    def suggest(self, wanted: str) -> str:
        """A hint for a path that does not exist (as ``ckpt_runtime.presets.suggest``)."""
        paths = [self.paths[r] for r in self.model_rows if self.paths[r]]
        close = difflib.get_close_matches(wanted, paths, n=3, cutoff=0.6)
        if close:
            return "did you mean " + " or ".join(repr(p) for p in close) + "?"
        top = [p for p in paths if "." not in p][:8]
        return f"its top-level modules are {top}; list all paths with `ckview summary`"

    def matching(self, pattern: str) -> list[int]:
        """Rows of the model's modules whose path matches ``pattern`` (docs/plan-format.md 3.1)."""
        if not _GLOB_CHARS & set(pattern):
            row = self.row_of.get(pattern)
            return [] if row is None else [row]
        wanted = path_components(pattern)
        return [r for r in self.model_rows if path_matches(path_components(self.paths[r]), wanted)]


def _escape(path: str) -> str:
    """A pattern matching exactly ``path`` (glob characters bracketed)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


# ----------------------------------------------------------------------------- parsing
# The checks of docs/plan-format.md, section 7, as ckpt_runtime/plan.py makes them.


def _as_document(plan: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """The validated plan document (JSON text is decoded first)."""
    if isinstance(plan, str):
        text = plan
        try:
            plan = json.loads(text)
        except json.JSONDecodeError:
            raise _fail(
                f"{text[:60]!r} is neither a preset ({', '.join(PRESETS)}) nor a plan document; "
                "pass a preset or the plan file's JSON (read the file first)"
            ) from None
    if not isinstance(plan, Mapping):
        raise _fail(f"a plan is a JSON object or a preset string, got {type(plan).__name__}")
    _check_header(plan)
    _check_members(plan)
    return plan


def _check_header(doc: Mapping[str, Any]) -> None:
    fmt = doc.get("format")
    if fmt != FORMAT_NAME:
        what = "has no 'format'" if fmt is None else f"has format {fmt!r}"
        raise _fail(
            f"not a ckview plan: it {what}; a plan starts with "
            f'{{"format": "{FORMAT_NAME}", "version": {FORMAT_VERSION}, ...}}'
        )
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _fail(f"plan 'version' must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise _fail(
            f"plan format version {version} is newer than this ckview supports "
            f"({FORMAT_VERSION}); upgrade ckview to read it"
        )
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise _fail(
            f"unknown key(s) {unknown} in plan; the keys are {sorted(_TOP_KEYS)} "
            "(put tool data under 'meta')"
        )


def _check_members(doc: Mapping[str, Any]) -> None:
    has_regions, has_preset = "regions" in doc, "preset" in doc
    if has_regions == has_preset:
        raise _fail(
            "a plan needs exactly one of 'regions' (a list of regions) or 'preset' "
            f"(one of {', '.join(PRESETS)}); it has " + ("both" if has_regions else "neither")
        )
    if has_regions and not isinstance(doc["regions"], list):
        raise _fail(f"plan 'regions' must be a JSON array, got {doc['regions']!r}")
    if has_preset:
        if not isinstance(doc["preset"], str):
            raise _fail(f"plan 'preset' must be a string, got {doc['preset']!r}")
        if "chain" in doc and _parse_preset(doc["preset"])[2] is not None:
            raise _fail("the chain is given twice ('preset' ends in @chain and 'chain')")
    if "chain" in doc:
        if not has_preset:
            raise _fail(
                "'chain' only applies to a preset plan; a plan with regions names its "
                "modules directly"
            )
        _check_path(doc["chain"], "chain", glob=False)
    if "name" in doc:
        _check_name(doc["name"])
    if "meta" in doc and not isinstance(doc["meta"], Mapping):
        raise _fail(f"plan 'meta' must be a JSON object, got {doc['meta']!r}")
    _check_options(doc.get("options", {}))


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name.strip():
        raise _fail(f"plan name must be a non-empty string, got {name!r}")
    if not name.isprintable():
        raise _fail(f"plan name {name!r} must be one line of printable characters")


def _check_options(options: Any) -> None:
    if not isinstance(options, Mapping):
        raise _fail(f"'options' must be a JSON object, got {options!r}")
    for key, value in options.items():
        if key not in _OPTIONS:
            raise _fail(f"unknown option {key!r}; the options are {', '.join(_OPTIONS)}")
        if not isinstance(value, bool):
            raise _fail(f"option {key} must be true or false, got {value!r}")


def _check_path(path: Any, what: str, *, glob: bool) -> str:
    """Validate the syntax of a dotted module path (a pattern if ``glob``); return it."""
    if not isinstance(path, str):
        raise _fail(f"{what} must be a string, got {type(path).__name__} {path!r}")
    for part in path_components(path):
        if part == "":
            raise _fail(
                f"{what} {path!r} has an empty component; write dotted paths as in "
                "model.named_modules(), e.g. 'transformer.h.0' ('' is the model itself)"
            )
        if not glob and _GLOB_CHARS & set(part):
            raise _fail(
                f"{what} {path!r} must be an exact module path, not a pattern; "
                "glob patterns are only allowed in module regions"
            )
        if glob and "**" in part and part != "**":
            raise _fail(
                f"{what} {path!r}: '**' must be a whole component ('a.**.b'); "
                "use '*' to match within one component"
            )
    return path


def _check_index(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(f"{what} must be an integer, got {value!r}")
    return value


def _parse_preset(text: Any) -> tuple[str, int | None, str | None]:
    """``(kind, K, chain)`` of ``none``/``all``/``sqrt``/``every:K``, optionally ``@chain``."""
    match = _PRESET.match(text) if isinstance(text, str) else None
    if match is None:
        raise _fail(
            f"unknown preset {text!r}; presets are {', '.join(PRESETS)} (K >= 1), "
            "optionally followed by @chain.path"
        )
    whole, k_text, chain = match.groups()
    k = int(k_text) if k_text is not None else None
    if k is not None and k < 1:
        raise _fail(f"preset {text!r}: K must be >= 1 (every:1 checkpoints every block)")
    if chain is not None:
        _check_path(chain, f"chain in preset {text!r}", glob=False)
    return ("every" if k is not None else whole), k, chain


def _preset_text(kind: str, k: int | None) -> str:
    return f"every:{k}" if kind == "every" else kind


_PlanRegion = tuple[str, str, int, int]
"""A region as the document names it: ``("module", pattern, 0, 0)`` or
``("sequential", path, start, stop)``."""


def _parse_region(index: int, data: Any) -> _PlanRegion:
    """One element of ``regions``, validated (messages name ``regions[index]``)."""
    where = f"regions[{index}]"
    if not isinstance(data, Mapping):
        raise _fail(f"{where}: a region must be a JSON object, got {data!r}")
    if ("module" in data) == ("sequential" in data):
        raise _fail(
            f"{where}: a region has exactly one of 'module' (a module region) or 'sequential' "
            '(a segment): {"module": "path.or.pattern"} or {"sequential": "path", "start": 0, '
            '"stop": 2}'
        )
    if "module" in data:
        if set(data) != {"module"}:
            raise _fail(
                f"{where}: unknown key(s) {sorted(set(data) - {'module'})} in module region"
            )
        return ("module", _check_path(data["module"], f"{where}: module pattern", glob=True), 0, 0)
    extra = set(data) - {"sequential", "start", "stop"}
    missing = [key for key in ("start", "stop") if key not in data]
    if extra or missing:
        raise _fail(
            f"{where}: a segment has exactly 'sequential', 'start', 'stop'"
            + (f"; unknown {sorted(extra)}" if extra else f"; missing {missing}")
        )
    path = _check_path(data["sequential"], f"{where}: sequential path", glob=False)
    start = _check_index(data["start"], f"{where}: segment start")
    stop = _check_index(data["stop"], f"{where}: segment stop")
    if start < 0 or start >= stop:
        raise _fail(
            f"{where}: segment [{start}:{stop}] needs 0 <= start < stop; a segment covers "
            "children start..stop-1, like a Python slice"
        )
    return ("sequential", path, start, stop)


# ----------------------------------------------------------------------------- resolving


def _resolve_regions(tree: _Tree, wanted: Sequence[_PlanRegion]) -> list[Region]:
    """Module rows of the patterns and checked segments, in ``resolve_plan``'s order."""
    rows: set[int] = set()
    segments: list[SegmentRegion] = []
    for kind, path, start, stop in wanted:
        if kind == "module":
            hits = tree.matching(path)
            if not hits:
                raise _fail(
                    f"module pattern {path!r} matches no module of {tree.model_type}; "
                    f"{tree.suggest(path)}"
                )
            rows.update(hits)
        else:
            segments.append(_segment(tree, path, start, stop))
    _check_segments(tree, rows, segments)
    regions: list[Region] = [ModuleRegion(r) for r in rows]
    regions += segments
    return sorted(set(regions), key=_order_key)


def _order_key(region: Region) -> tuple[int, int, int]:
    if isinstance(region, ModuleRegion):
        return (region.module, 0, 0)
    return (region.module, 1, region.start)


def _segment(tree: _Tree, path: str, start: int, stop: int) -> SegmentRegion:
    row = tree.lookup(path, "sequential")
    shown = f"{path or '<model>'}[{start}:{stop}]"
    if tree.types[row] != "Sequential":
        raise _fail(
            f"segment {shown}: {path!r} is a {tree.types[row]}, not an nn.Sequential; its "
            "children are called by its parent's code and cannot be grouped, so checkpoint "
            f'them one by one with {{"module": "{_join(_escape(path), "*")}"}}'
        )
    n = len(tree.children(row))
    if stop > n:
        raise _fail(
            f"segment {shown}: stop {stop} is past the end of {path!r}, which has {n} children"
        )
    return SegmentRegion(row, start, stop)


def _check_segments(tree: _Tree, rows: set[int], segments: Sequence[SegmentRegion]) -> None:
    """Overlapping segments, and module regions that repeat a segment (plan-format 3.3)."""
    for i, a in enumerate(segments):
        for b in segments[i + 1 :]:
            if a.module == b.module and a.start < b.stop and b.start < a.stop:
                raise _fail(
                    f"segments {_seg_text(tree, a)} and {_seg_text(tree, b)} overlap; segments "
                    "of one nn.Sequential must be disjoint (merge them, or to nest, checkpoint "
                    "a child as a module region inside the segment)"
                )
    for seg in segments:
        children = tree.children(seg.module)
        same = None
        if seg.stop - seg.start == 1 and children[seg.start] in rows:
            same = children[seg.start]
        if seg.start == 0 and seg.stop == len(children) and seg.module in rows:
            same = seg.module
        if same is not None:
            raise _fail(
                f"module region {tree.paths[same] or '<model>'!r} and segment "
                f"{_seg_text(tree, seg)} checkpoint the same computation; keep one of them "
                "(docs/plan-format.md, 3.3)"
            )


def _seg_text(tree: _Tree, seg: SegmentRegion) -> str:
    return f"{tree.paths[seg.module] or '<model>'}[{seg.start}:{seg.stop}]"


def _resolve_preset(tree: _Tree, kind: str, k: int | None, chain: str | None) -> list[Region]:
    """``ckpt_runtime.resolve_preset`` on the trace's model (NOTE [ sqrt on a ModuleList ])."""
    if kind == "none":
        return []
    row = _chain_row(tree, chain)
    blocks = tree.children(row)
    n = len(blocks)
    if kind == "sqrt" and tree.types[row] == "Sequential":
        parts = math.ceil(math.sqrt(n))
        bounds = [(i * n) // parts for i in range(parts + 1)]
        return [SegmentRegion(row, a, b) for a, b in itertools.pairwise(bounds)]
    if kind == "all":
        chosen = range(n)
    elif kind == "every":
        assert k is not None
        chosen = range(0, n, k)
    else:
        chosen = range(n - math.floor(math.sqrt(n) + 0.5))
    return [ModuleRegion(blocks[i]) for i in chosen]


def _chain_row(tree: _Tree, chain: str | None) -> int:
    """Row of the chain of blocks: the named one, else detected (``chain_of_blocks``)."""
    if chain is not None:
        row = tree.lookup(chain, "chain")
        if tree.types[row] not in ("ModuleList", "Sequential") or not tree.children(row):
            raise _fail(
                f"chain {chain!r} is a {tree.types[row]}"
                + (" with no children" if tree.types[row] in ("ModuleList", "Sequential") else "")
                + "; a chain of blocks is a non-empty nn.ModuleList or nn.Sequential"
            )
        return row
    found = chain_of_blocks(tree.modules, tree.strings)
    if found is None or not tree.in_model[found]:
        raise _fail(
            f"found no chain of blocks in {tree.model_type} (no nn.ModuleList or nn.Sequential "
            "with 2+ children); name one: 'sqrt@path.to.blocks', or \"chain\" in the plan"
        )
    return found


# ----------------------------------------------------------------------------- writing


def _as_plan_region(tree: _Tree, region: Region) -> _PlanRegion:
    """``region`` as the document would name it (exact, escaped module path)."""
    if not 0 <= region.module < len(tree.paths) or not tree.in_model[region.module]:
        raise _fail(
            f"region {region} names module row {region.module}, which is not part of the "
            f"model ({tree.model_type}); a plan can only name the model's modules"
        )
    path = tree.paths[region.module]
    if isinstance(region, ModuleRegion):
        return ("module", _escape(path), 0, 0)
    if _GLOB_CHARS & set(path):
        raise _fail(
            f"segment of {path!r}: the plan format cannot name a Sequential whose path holds "
            "glob characters; checkpoint its children as module regions instead"
        )
    return ("sequential", path, region.start, region.stop)


def _region_json(tree: _Tree, region: Region) -> dict[str, Any]:
    path = tree.paths[region.module]
    if isinstance(region, ModuleRegion):
        return {"module": _escape(path)}
    return {"sequential": path, "start": region.start, "stop": region.stop}
