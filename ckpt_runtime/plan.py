"""Checkpoint plans: the data model and the JSON plan format (specified in docs/plan-format.md).

A plan names the regions of a model to checkpoint: single modules by dotted path or glob
pattern (:class:`ModuleRegion`), and contiguous ranges of an ``nn.Sequential``'s children run as
one region (:class:`SegmentRegion`); or it names a preset (``none``, ``all``, ``every:K``,
``sqrt``) that :mod:`ckpt_runtime.apply` resolves against a model.

This module only parses, validates and writes plans; it imports no torch, so a plan can be
read and written where torch is not installed. Checks that need the model (does a pattern match
a module, is a path an ``nn.Sequential``) happen when the plan is resolved or applied.

NOTE [ Module path patterns ]
A pattern is matched against the dotted paths of ``model.named_modules()`` one component at a
time: the pattern and the path are split on ``.``, and each pattern component matches one path
component with ``fnmatch.fnmatchcase`` (``*``, ``?``, ``[0-3]``, ``[!0]``). So ``*`` never
crosses a dot: ``transformer.h.*`` matches the blocks ``transformer.h.0``, ``transformer.h.1``,
... and not their submodules (whole-path fnmatch would match ``transformer.h.0.attn.c_attn``
too, checkpointing every submodule of every block). A component that is exactly ``**`` matches
zero or more components (``**.mlp`` matches every module named ``mlp``, at any depth). The
empty pattern is the model itself. Matching is case-sensitive on every platform.

NOTE [ Plans from untrusted files ]
A plan file may be anything: /dev/zero, a deeply nested or huge JSON document, integers of
thousands of digits, patterns made of many ``**``. Reading is bounded (at most
``MAX_PLAN_BYTES``, and a pattern at most ``MAX_PATTERN_COMPONENTS`` components), every failure
of the JSON decoder (syntax, nesting too deep for Python's recursion limit, integers too long to
convert) is a :class:`PlanError`, messages quoting the plan are cut to ``MAX_MESSAGE`` characters,
and matching runs a set of pattern positions along the path (``_match_parts``): time linear in
path length times pattern length, whatever the number of ``**``, and no recursion.

NOTE [ Op-level regions ]
Format version 2 lets a module region say which ops' outputs it saves (``save``) and whether
the tensors it keeps go to host memory (``offload``). A region without ``save`` recomputes
everything (version 1). With ``save``, each op call inside the region is named three ways, and
it is saved if any name matches any entry of ``save`` (``fnmatch.fnmatchcase`` on the whole
name, so here ``*`` does cross dots): its overload packet (``aten.mm``), its overload
(``aten.mm.default``), and its position-stable auto-name ``<module path>.<op>_<i>``
(``layers.0.self_attn.mm_0``): the innermost module running it, the op's name without its
namespace, and its index among that op's calls in that module call (:func:`op_auto_name`). The
entry ``*`` saves every op: the region recomputes nothing, which only makes sense with
``offload``. In this version ``offload`` requires ``save: ["*"]`` (offloading the tensors a
recompute keeps is not supported). Writers write version 1 for a plan that uses neither key, so
version-1 plans round-trip byte for byte.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TypeAlias

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "PRESETS",
    "ModuleRegion",
    "Plan",
    "PlanError",
    "PlanOptions",
    "PresetSpec",
    "Region",
    "SegmentRegion",
    "check_module_path",
    "escape_path",
    "is_preset_like",
    "load_plan",
    "match_op",
    "match_path",
    "match_paths",
    "op_auto_name",
    "parse_preset",
    "save_plan",
]

FORMAT_NAME = "ckview-plan"
FORMAT_VERSION = 2
"""The newest version this reader reads (NOTE [ Op-level regions ]); plans without op-level
regions are written as version 1."""
SAVE_ALL = "*"
"""The ``save`` entry that saves every op (nothing is recomputed)."""
MAX_SAVE_ENTRIES = 4096
"""Most entries in one region's ``save`` list."""
PRESETS = ("none", "all", "sqrt", "every:K")
"""The preset names, as shown in messages (``K`` is a positive integer)."""

_TOP_KEYS = frozenset(
    {"format", "version", "name", "regions", "preset", "chain", "options", "meta"}
)
_GLOB_CHARS = frozenset("*?[")
# A string that starts like a preset is parsed as one (and rejected if malformed), never looked
# up as a file: "every:0" should say what is wrong with the preset, not "no such file".
_PRESET_LIKE = re.compile(r"^(none|all|sqrt|every)(?=$|[:@])")
_PRESET = re.compile(r"^(none|all|sqrt|every:([0-9]+))(?:@(.*))?$", re.DOTALL)


MAX_PLAN_BYTES = 16 * 2**20
"""Largest plan file read (a plan naming every module of a huge model is far smaller)."""
MAX_PATTERN_COMPONENTS = 256
"""Most components of a module path or pattern (no model nests modules that deep)."""
MAX_MESSAGE = 500
"""Longest PlanError message: longer ones (quoting a huge plan) keep their start and end."""


class PlanError(ValueError):
    """A plan that cannot be read, validated, resolved or applied.

    The message is one line: what is wrong, then what to do about it.
    """


def _fail(message: str) -> PlanError:
    # Keep messages one line and short even when they quote user input.
    return PlanError(one_line(message))


def one_line(message: str) -> str:
    """``message`` on one line, at most MAX_MESSAGE characters (the middle of a longer one
    is cut, keeping what is wrong and what to do)."""
    text = " ".join(message.split())
    if len(text) <= MAX_MESSAGE:
        return text
    half = (MAX_MESSAGE - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def check_module_path(path: Any, what: str, *, glob: bool) -> str:
    """Validate the syntax of a dotted module path (or pattern, if ``glob``); return it."""
    if not isinstance(path, str):
        raise _fail(f"{what} must be a string, got {type(path).__name__} {path!r}")
    if path == "":
        return path  # the model itself
    if path.count(".") >= MAX_PATTERN_COMPONENTS:
        raise _fail(
            f"{what} {path[:80]!r}... has more than {MAX_PATTERN_COMPONENTS} components; "
            "no model nests modules that deep"
        )
    for part in path.split("."):
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


def _match_parts(parts: list[str], pattern: list[str]) -> bool:
    """Whether path components ``parts`` match ``pattern`` (NOTE [ Plans from untrusted
    files ]): the positions of the pattern reached after each component, as a set."""
    states = _skip_globstars({0}, pattern)
    for part in parts:
        reached = set()
        for i in states:
            if i == len(pattern):
                continue
            if pattern[i] == "**":
                reached.add(i)  # '**' takes this component and may take more
            elif fnmatchcase(part, pattern[i]):
                reached.add(i + 1)
        states = _skip_globstars(reached, pattern)
        if not states:
            return False
    return len(pattern) in states


def _skip_globstars(states: set[int], pattern: list[str]) -> set[int]:
    """``states`` and the positions after any run of '**' at them ('**' matches nothing)."""
    out = set(states)
    for i in sorted(states):
        while i < len(pattern) and pattern[i] == "**":
            i += 1
            out.add(i)
    return out


def _components(path: str) -> list[str]:
    return path.split(".") if path else []  # "" is the model itself: no components


def escape_path(path: str) -> str:
    """A pattern that matches exactly ``path`` (glob characters in module names bracketed)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def match_path(pattern: str, path: str) -> bool:
    """True if module path ``path`` matches ``pattern`` (see NOTE [ Module path patterns ])."""
    return _match_parts(_components(path), _components(pattern))


def match_paths(pattern: str, paths: list[str]) -> list[int]:
    """Indices of the ``paths`` that match ``pattern`` (NOTE [ Module path patterns ]); a
    pattern without glob characters matches its own path only, which is found by equality."""
    if not _GLOB_CHARS & set(pattern):
        return [i for i, path in enumerate(paths) if path == pattern]
    wanted = _components(pattern)
    return [i for i, path in enumerate(paths) if _match_parts(_components(path), wanted)]


def _check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(f"{what} must be true or false, got {value!r}")
    return value


def _check_index(value: Any, what: str) -> int:
    # bool is an int subclass; True as an index is certainly a mistake.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(f"{what} must be an integer, got {value!r}")
    if value.bit_length() > 31:  # before printing it: repr() refuses ints of 4300+ digits
        raise _fail(f"{what} must be an index, got an integer of {value.bit_length()} bits")
    return value


@dataclass(frozen=True)
class PlanOptions:
    """How every region of a plan is checkpointed (passed to ``ckpt_runtime.checkpoint``)."""

    use_reentrant: bool = False
    preserve_rng_state: bool = True

    def __post_init__(self) -> None:
        _check_bool(self.use_reentrant, "option use_reentrant")
        _check_bool(self.preserve_rng_state, "option preserve_rng_state")

    @classmethod
    def from_json(cls, data: Any) -> PlanOptions:
        """Parse the ``options`` object of a plan document (missing keys take the defaults)."""
        if not isinstance(data, Mapping):
            raise _fail(f"'options' must be a JSON object, got {data!r}")
        known = ("use_reentrant", "preserve_rng_state")
        for key in data:
            if key not in known:
                raise _fail(f"unknown option {key!r}; the options are {', '.join(known)}")
        return cls(**data)

    def to_json(self) -> dict[str, bool]:
        """The ``options`` object of a plan document (every option, explicitly)."""
        return {"use_reentrant": self.use_reentrant, "preserve_rng_state": self.preserve_rng_state}


def op_auto_name(module_path: str, op: str, index: int) -> str:
    """The position-stable name of the ``index``-th call of ``op`` (``aten.mm``, namespace
    dropped) in one call of the module at ``module_path`` (NOTE [ Op-level regions ])."""
    short = op.split(".")[1] if "." in op else op
    return f"{module_path}.{short}_{index}" if module_path else f"{short}_{index}"


def match_op(entry: str, names: tuple[str, ...]) -> bool:
    """True if the ``save`` entry matches one of an op call's ``names`` (NOTE [ Op-level
    regions ])."""
    return any(fnmatchcase(name, entry) for name in names)


def _check_save(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise _fail(
            f"'save' must be a non-empty list of op names or patterns (e.g. [\"aten.mm*\"]), "
            f"got {value!r}"
        )
    if len(value) > MAX_SAVE_ENTRIES:
        raise _fail(f"'save' has {len(value)} entries; at most {MAX_SAVE_ENTRIES}")
    for entry in value:
        if not isinstance(entry, str) or not entry or not entry.isprintable() or " " in entry:
            raise _fail(
                f"'save' entry {entry!r} must be an op name or pattern without spaces "
                "(aten.mm, aten.mm*, layers.0.attn.mm_0)"
            )
    return tuple(value)


@dataclass(frozen=True)
class ModuleRegion:
    """Checkpoint every module whose path matches ``pattern``, each call as its own region.

    ``pattern`` is a dotted path from ``model.named_modules()`` or a glob pattern
    (NOTE [ Module path patterns ]). ``save`` (format 2) lists the ops whose outputs the region
    keeps, recomputing the others (None: recompute everything); ``offload`` sends the tensors
    it keeps to host memory (NOTE [ Op-level regions ]).
    """

    pattern: str
    save: tuple[str, ...] | None = None
    offload: bool = False

    def __post_init__(self) -> None:
        check_module_path(self.pattern, "module pattern", glob=True)
        if self.save is not None:
            object.__setattr__(self, "save", _check_save(self.save))
        _check_bool(self.offload, "'offload'")
        if self.offload and not self.saves_all:
            raise _fail(
                f"module region {self}: 'offload' needs 'save': [\"*\"] (offloading the tensors a "
                "recompute keeps is not supported); save every op, or drop 'offload'"
            )
        if self.saves_all and not self.offload:
            raise _fail(
                f"module region {self} saves every op and does not offload, so it changes "
                'nothing; add "offload": true, or list the ops to save'
            )

    @property
    def op_level(self) -> bool:
        """True if the region uses format-2 keys (``save`` or ``offload``)."""
        return self.save is not None or self.offload

    @property
    def saves_all(self) -> bool:
        """True if the region recomputes nothing (``save`` holds ``*``)."""
        return self.save is not None and SAVE_ALL in self.save

    def matches(self, path: str) -> bool:
        """True if the module at ``path`` belongs to this region."""
        return match_path(self.pattern, path)

    def to_json(self) -> dict[str, Any]:
        """This region as a plan-document object."""
        doc: dict[str, Any] = {"module": self.pattern}
        if self.save is not None:
            doc["save"] = list(self.save)
        if self.offload:
            doc["offload"] = True
        return doc

    def __str__(self) -> str:
        return self.pattern or "<model>"


@dataclass(frozen=True)
class SegmentRegion:
    """Checkpoint children ``start .. stop-1`` of the ``nn.Sequential`` at ``sequential``.

    The children run in order under one checkpoint call: only the segment's input is kept in
    forward, and the whole segment is recomputed at once in backward.
    """

    sequential: str
    start: int
    stop: int

    def __post_init__(self) -> None:
        check_module_path(self.sequential, "sequential path", glob=False)
        _check_index(self.start, "segment start")
        _check_index(self.stop, "segment stop")
        if self.start < 0:
            raise _fail(f"segment {self}: start must be >= 0, got {self.start}")
        if self.start >= self.stop:
            raise _fail(
                f"segment {self}: start ({self.start}) must be less than stop ({self.stop}); "
                "a segment covers children start..stop-1, like a Python slice"
            )

    def overlaps(self, other: SegmentRegion) -> bool:
        """True if both segments are on the same Sequential and share a child."""
        return (
            self.sequential == other.sequential
            and self.start < other.stop
            and other.start < self.stop
        )

    def to_json(self) -> dict[str, Any]:
        """This region as a plan-document object."""
        return {"sequential": self.sequential, "start": self.start, "stop": self.stop}

    def __str__(self) -> str:
        return f"{self.sequential or '<model>'}[{self.start}:{self.stop}]"


Region: TypeAlias = ModuleRegion | SegmentRegion


def _region_from_json(data: Any, version: int) -> Region:
    if not isinstance(data, Mapping):
        raise _fail(f"a region must be a JSON object, got {data!r}")
    if "module" in data and "sequential" in data:
        raise _fail(
            "a region has either 'module' (a module region) or 'sequential' (a segment), not both"
        )
    if "module" in data:
        extra = set(data) - {"module", "save", "offload"}
        if extra:
            raise _fail(
                f"unknown key(s) {sorted(extra)} in module region; a module region has "
                "'module', 'save' and 'offload' (to checkpoint children of an nn.Sequential as "
                "one region, use 'sequential', 'start', 'stop')"
            )
        if version < 2 and set(data) != {"module"}:
            raise _fail("'save' and 'offload' need plan format version 2; set \"version\": 2")
        return ModuleRegion(data["module"], data.get("save"), data.get("offload", False))
    if "sequential" in data:
        extra = set(data) - {"sequential", "start", "stop"}
        if extra:
            raise _fail(
                f"unknown key(s) {sorted(extra)} in segment; a segment has 'sequential', "
                "'start', 'stop'"
            )
        missing = [key for key in ("start", "stop") if key not in data]
        if missing:
            raise _fail(f"segment {dict(data)!r} is missing {' and '.join(map(repr, missing))}")
        return SegmentRegion(data["sequential"], data["start"], data["stop"])
    raise _fail(
        f"region {dict(data)!r} has neither 'module' nor 'sequential'; write "
        '{"module": "path.or.pattern"} or {"sequential": "path", "start": 0, "stop": 2}'
    )


@dataclass(frozen=True)
class PresetSpec:
    """A parsed preset string: ``kind`` (``none``/``all``/``sqrt``/``every``), ``k`` for
    ``every:K``, and the block chain named after ``@`` (or ``None``: detect it)."""

    kind: str
    k: int | None = None
    chain: str | None = None

    @property
    def name(self) -> str:
        """The preset without the chain (``every:2``)."""
        return f"every:{self.k}" if self.kind == "every" else self.kind

    def __str__(self) -> str:
        return self.name if self.chain is None else f"{self.name}@{self.chain}"


def is_preset_like(text: str) -> bool:
    """True if ``text`` is (or tries to be) a preset string rather than a file path."""
    return bool(_PRESET_LIKE.match(text))


def parse_preset(text: str) -> PresetSpec:
    """Parse ``none``, ``all``, ``sqrt``, ``every:K``, each optionally followed by ``@chain``.

    ``@chain`` names the model's chain of blocks explicitly (``sqrt@encoder.layers``) instead of
    detecting it (NOTE [ Block chain detection ] in ckpt_runtime/resolve.py).
    """
    match = _PRESET.match(text) if isinstance(text, str) else None
    if match is None:
        raise _fail(
            f"unknown preset {text!r}; presets are {', '.join(PRESETS)} (K >= 1), "
            "optionally followed by @chain.path"
        )
    whole, k_text, chain = match.groups()
    k = None
    if k_text is not None:
        k = int(k_text)
        if k < 1:
            raise _fail(f"preset {text!r}: K must be >= 1 (every:1 checkpoints every block)")
    if chain is not None:
        check_module_path(chain, f"chain in preset {text!r}", glob=False)
    return PresetSpec("every" if k is not None else whole, k, chain)


@dataclass(frozen=True)
class Plan:
    """A checkpoint plan: a name, the regions to checkpoint, and how to checkpoint them.

    Either ``regions`` lists concrete regions, or ``preset`` names a preset (``"sqrt"``...) to be
    resolved against a model, optionally on the block chain at ``chain``. ``meta`` holds free
    JSON data for tools (e.g. the planner's budget); ckpt_runtime ignores it.
    Constructing a plan validates it; mistakes raise :class:`PlanError`.
    """

    name: str
    regions: tuple[Region, ...] = ()
    options: PlanOptions = field(default_factory=PlanOptions)
    preset: str | None = None
    chain: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise _fail(f"plan name must be a non-empty string, got {self.name!r}")
        if not self.name.isprintable():
            raise _fail(f"plan name {self.name!r} must be one line of printable characters")
        # Frozen: normalise through object.__setattr__ (lists from callers become tuples).
        object.__setattr__(self, "regions", tuple(self.regions))
        for region in self.regions:
            if not isinstance(region, ModuleRegion | SegmentRegion):
                raise _fail(f"plan regions must be ModuleRegion or SegmentRegion, got {region!r}")
        if isinstance(self.options, Mapping):
            object.__setattr__(self, "options", PlanOptions.from_json(self.options))
        elif not isinstance(self.options, PlanOptions):
            raise _fail(f"plan options must be PlanOptions, got {self.options!r}")
        if not isinstance(self.meta, Mapping):
            raise _fail(f"plan 'meta' must be a JSON object, got {self.meta!r}")
        try:
            meta = json.loads(json.dumps(dict(self.meta)))
        except (TypeError, ValueError, RecursionError) as exc:
            raise _fail(f"plan 'meta' must hold JSON data only ({exc})") from None
        object.__setattr__(self, "meta", meta)
        if self.preset is not None:
            spec = parse_preset(self.preset)
            if spec.chain is not None:
                raise _fail(
                    f"preset {self.preset!r}: give the chain separately (chain={spec.chain!r})"
                )
            object.__setattr__(self, "preset", spec.name)  # canonical: every:02 -> every:2
            if self.regions:
                raise _fail(
                    "a plan has either 'regions' or 'preset', not both; resolve the preset "
                    "(ckpt_runtime.resolve_preset) and edit its regions instead"
                )
        if self.chain is not None:
            if self.preset is None:
                raise _fail(
                    "'chain' only applies to a preset plan; a plan with regions names its "
                    "modules directly"
                )
            check_module_path(self.chain, "chain", glob=False)
        _check_disjoint([r for r in self.regions if isinstance(r, SegmentRegion)])

    @property
    def version(self) -> int:
        """The format version this plan needs: 2 if a region is op-level, else 1."""
        return 2 if any(isinstance(r, ModuleRegion) and r.op_level for r in self.regions) else 1

    @property
    def is_preset(self) -> bool:
        """True if this plan names a preset still to be resolved against a model."""
        return self.preset is not None

    @property
    def checks_nothing(self) -> bool:
        """True if the plan checkpoints nothing on any model (preset ``none``, or no regions):
        it needs no model to resolve (a loop without modules has none)."""
        return self.preset == "none" or (self.preset is None and not self.regions)

    @classmethod
    def from_json(
        cls, data: str | bytes | Mapping[str, Any], *, default_name: str = "plan"
    ) -> Plan:
        """Parse and validate a plan document (JSON text, or the already-decoded object).

        ``default_name`` is used when the document has no ``name``.
        """
        try:
            return cls._from_json(data, default_name)
        except RecursionError:  # printing or checking a deeply nested part of the document
            raise _fail("plan JSON is nested too deeply; a plan is a few levels deep") from None

    @classmethod
    def _from_json(cls, data: str | bytes | Mapping[str, Any], default_name: str) -> Plan:
        if isinstance(data, str | bytes):
            data = _decode(data)
        if not isinstance(data, Mapping):
            raise _fail(f"a plan is a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != FORMAT_NAME:
            what = "has no 'format'" if fmt is None else f"has format {fmt!r}"
            raise _fail(
                f"not a ckview plan: it {what}; a plan starts with "
                f'{{"format": "{FORMAT_NAME}", "version": {FORMAT_VERSION}, ...}}'
            )
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise _fail(f"plan 'version' must be a positive integer, got {version!r}")
        if version > FORMAT_VERSION:
            raise _fail(
                f"plan format version {version} is newer than this ckpt_runtime supports "
                f"({FORMAT_VERSION}); upgrade ckview to read it"
            )
        unknown = sorted(set(data) - _TOP_KEYS)
        if unknown:
            raise _fail(
                f"unknown key(s) {unknown} in plan; the keys are {sorted(_TOP_KEYS)} "
                "(put tool data under 'meta')"
            )
        has_regions, has_preset = "regions" in data, "preset" in data
        if has_regions == has_preset:
            raise _fail(
                "a plan needs exactly one of 'regions' (a list of regions) or 'preset' "
                f"(one of {', '.join(PRESETS)}); it has " + ("both" if has_regions else "neither")
            )
        regions: list[Region] = []
        preset = chain = None
        if has_regions:
            raw = data["regions"]
            if not isinstance(raw, list):
                raise _fail(f"plan 'regions' must be a JSON array, got {raw!r}")
            for i, item in enumerate(raw):
                try:
                    regions.append(_region_from_json(item, version))
                except PlanError as exc:
                    raise _fail(f"regions[{i}]: {exc}") from None
        else:
            if not isinstance(data["preset"], str):
                raise _fail(f"plan 'preset' must be a string, got {data['preset']!r}")
            spec = parse_preset(data["preset"])
            preset, chain = spec.name, spec.chain
        if "chain" in data:
            if chain is not None:
                raise _fail("the chain is given twice ('preset' ends in @chain and 'chain')")
            chain = data["chain"]
        return cls(
            name=data.get("name", default_name),
            regions=tuple(regions),
            options=PlanOptions.from_json(data.get("options", {})),
            preset=preset,
            chain=chain,
            meta=data.get("meta", {}),
        )

    def to_json(self) -> dict[str, Any]:
        """This plan as a plan document (a JSON-serialisable dict; ``Plan.from_json`` reads it)."""
        doc: dict[str, Any] = {"format": FORMAT_NAME, "version": self.version, "name": self.name}
        if self.preset is not None:
            doc["preset"] = self.preset
            if self.chain is not None:
                doc["chain"] = self.chain
        else:
            doc["regions"] = [region.to_json() for region in self.regions]
        doc["options"] = self.options.to_json()
        if self.meta:
            doc["meta"] = dict(self.meta)
        return doc

    def __str__(self) -> str:
        if self.preset is not None:
            what = self.preset if self.chain is None else f"{self.preset}@{self.chain}"
            return f"plan {self.name!r}: preset {what}"
        regions = ", ".join(map(str, self.regions)) or "no regions"
        return f"plan {self.name!r}: {regions}"


def _decode(text: str | bytes) -> Any:
    """The JSON document ``text``; PlanError for anything the decoder cannot take (NOTE
    [ Plans from untrusted files ])."""
    if len(text) > MAX_PLAN_BYTES:
        raise _fail(f"plan is larger than {MAX_PLAN_BYTES // 2**20} MiB; a plan is a small file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"plan is not valid JSON ({exc}); fix the syntax") from None
    except RecursionError:
        raise _fail("plan JSON is nested too deeply; a plan is a few levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:  # e.g. an integer of 5000 digits
        raise _fail(f"plan JSON cannot be read ({exc})") from None


def _read_bounded(path: Path) -> str:
    """At most MAX_PLAN_BYTES of ``path`` as UTF-8 (/dev/zero and endless pipes included)."""
    with open(path, "rb") as f:
        data = f.read(MAX_PLAN_BYTES + 1)
    if len(data) > MAX_PLAN_BYTES:
        raise _fail(f"it is larger than {MAX_PLAN_BYTES // 2**20} MiB; a plan is a small JSON file")
    return data.decode("utf-8")


def _check_disjoint(segments: list[SegmentRegion]) -> None:
    """PlanError if two segments overlap: one pass in order of (Sequential, start), keeping
    the segment that reaches furthest (n log n, for plans with many segments)."""
    order = sorted(range(len(segments)), key=lambda k: (segments[k].sequential, segments[k].start))
    furthest: int | None = None
    for k in order:
        if furthest is not None and segments[furthest].overlaps(segments[k]):
            a, b = (segments[i] for i in sorted((furthest, k)))
            raise _fail(
                f"segments {a} and {b} overlap; segments of one nn.Sequential must be "
                "disjoint (merge them, or to nest, checkpoint a child as a module "
                "region inside the segment)"
            )
        current = None if furthest is None else segments[furthest]
        if current is None or current.sequential != segments[k].sequential:
            furthest = k  # the first segment of its Sequential
        elif segments[k].stop > current.stop:
            furthest = k


def load_plan(source: str | os.PathLike[str]) -> Plan:
    """Load a plan from a plan file, or from a preset string (``"sqrt"``, ``"every:2@blocks"``).

    A ``str`` that starts like a preset (``none``, ``all``, ``sqrt``, ``every``, followed by
    nothing, ``:`` or ``@``) is a preset; anything else (and every ``os.PathLike``) is a file
    path, so a file named ``sqrt`` is loaded with ``load_plan("./sqrt")``. A preset plan is
    resolved against the model when applied. A plan file without a ``name`` is named after the
    file (its stem).
    """
    if isinstance(source, str) and is_preset_like(source):
        spec = parse_preset(source)
        return Plan(name=str(spec), preset=spec.name, chain=spec.chain)
    path, shown = Path(source), os.fspath(source)  # messages quote the path as given
    try:
        text = _read_bounded(path)
    except PlanError as exc:
        raise _fail(f"plan file {shown!r}: {exc}") from None
    except FileNotFoundError:
        raise _fail(
            f"no plan file {shown!r}; pass a plan file (JSON) or a preset: {', '.join(PRESETS)}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read plan file {shown!r}: {exc}") from None
    try:
        return Plan.from_json(text, default_name=path.stem or "plan")
    except PlanError as exc:
        raise _fail(f"plan file {shown!r}: {exc}") from None


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write ``plan`` to ``path`` as a plan document (UTF-8 JSON, indented, newline-terminated)."""
    text = json.dumps(plan.to_json(), indent=2, ensure_ascii=False)
    Path(path).write_text(text + "\n", encoding="utf-8")
