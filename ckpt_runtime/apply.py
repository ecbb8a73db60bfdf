"""Resolve a checkpoint plan against a model, and apply it to (or remove it from) the model.

``apply_plan(model, "sqrt")`` makes every selected region of ``model`` run through
``ckpt_runtime.checkpoint``, in place and per instance (classes are never modified);
``remove_plan(model)`` undoes it exactly. The plan format itself lives in
:mod:`ckpt_runtime.plan` (docs/plan-format.md).

NOTE [ A module region is the whole module call ]
A module region checkpoints ``module(*args, **kwargs)`` as a whole, exactly like the idiom
``checkpoint(module, *args, **kwargs)``: the module's forward pre-hooks, forward and forward
hooks all run inside the checkpoint, so they fire in forward and again in the recompute. (Pre-
hooks always do; checkpoint stops a recompute as soon as every tensor saved in forward is back,
so the forward hooks of the region and of its last modules are skipped in the recompute unless
registered with ``always_call=True``.) We get there by setting ``_call_impl`` on the instance
(``nn.Module.__call__`` looks it up on ``self``), not ``forward``: patching ``forward`` would
leave the module's hooks outside the checkpoint. Why hooks inside: a ``plan:<name>`` run must
look like the ``checkpointed`` run of a script using the idiom (the recorder sees the region's
own module call again in the recompute, and an op of the block's own forward body is
attributed to the recompute, not to backward). The cost: a stateful hook (e.g. one that logs
activations) sees the region twice per step. Calls with gradients disabled (``torch.no_grad``,
inference) run plainly, without checkpoint. Keyword arguments are passed to the checkpointed
function positionally, so tensor keyword arguments are checkpoint inputs (needed by
``use_reentrant=True``) and can never collide with checkpoint's own keywords.

NOTE [ Nesting of regions ]
Regions may nest: a module region inside another module region or inside a segment, and a
segment of an ``nn.Sequential`` that lies inside a region, are all allowed. The inner region is
checkpointed inside the outer one: in forward only the outer region's inputs are kept; when
backward reaches the outer region, its recompute runs the inner region in checkpointed form
(keeping only the inner region's inputs), and the inner region is recomputed once more when
backward reaches it. The inner modules thus run three times per step instead of two, for a
lower peak while the outer region is being differentiated. Not allowed, because they cannot nest
or would only add compute: overlapping segments of one ``nn.Sequential`` (one checkpoint call
runs one contiguous range; checked by :class:`ckpt_runtime.plan.Plan`), and two regions that
checkpoint the same computation (a module region on the only child of a one-child segment, or
on an ``nn.Sequential`` that one segment covers entirely). Several patterns matching one module
are merged into one region. A module shared at several paths is patched once (all its calls are
checkpointed); patterns only see the path ``named_modules()`` lists for it.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from types import FrameType, MethodType
from typing import Any, TypeAlias

import torch
import torch.utils.checkpoint
from torch import nn

from ckpt_runtime import markers
from ckpt_runtime.bypass import plan_region, region_bypassed
from ckpt_runtime.checkpoint import (
    _cpu_rng_state,
    _device_rng_state,
    _set_cpu_rng_state,
    _set_device_rng_state,
    checkpoint,
    compiled_checkpoint,
    register_module_names,
)
from ckpt_runtime.oplevel import (
    Offloader,
    SavePolicy,
    check_op_names,
    check_selective_support,
    kept_statistics,
    module_paths,
    outside_addresses,
    track_modules,
)
from ckpt_runtime.plan import (
    ModuleRegion,
    Plan,
    PlanError,
    PlanOptions,
    SegmentRegion,
    escape_path,
    load_plan,
    one_line,
    op_auto_name,
)
from ckpt_runtime.presets import check_model, module_tree
from ckpt_runtime.resolve import join, resolve

__all__ = ["AppliedPlan", "PlanSource", "apply_plan", "remove_plan", "resolve_plan"]

PlanSource: TypeAlias = Plan | Mapping[str, Any] | str | os.PathLike[str]
"""What ``apply_plan`` and ``resolve_plan`` accept: a Plan, a plan document (dict), a plan file
path, or a preset string."""


_MODULE_FILE = nn.Module.__call__.__code__.co_filename


def _fail(message: str) -> PlanError:
    return PlanError(one_line(message))


def _as_plan(source: PlanSource) -> Plan:
    if isinstance(source, Plan):
        return source
    if isinstance(source, Mapping):
        return Plan.from_json(source)
    if isinstance(source, str | os.PathLike):
        return load_plan(source)
    raise TypeError(
        "a plan is a Plan, a plan document (dict), a plan file path or a preset string, "
        f"got {type(source).__name__}"
    )


def _as_sequential(module: nn.Module) -> nn.Sequential:
    assert isinstance(module, nn.Sequential)  # a segment's node is a Sequential (resolve.py)
    return module


def _resolve(model: nn.Module, plan: Plan) -> tuple[Plan, dict[str, nn.Module]]:
    """The concrete plan (exact module paths, model order) and its modules by path: the rules of
    :func:`ckpt_runtime.resolve.resolve` over the live model."""
    resolution = resolve(module_tree(model), plan)
    return resolution.plan, dict(model.named_modules())


def resolve_plan(model: nn.Module, plan: PlanSource) -> Plan:
    """Resolve ``plan`` against ``model`` without applying it.

    Returns a plan with concrete regions: presets expanded, patterns replaced by the exact
    path of every module they match (merged, in ``named_modules()`` order), and every region
    checked against the model. Raises :class:`PlanError` naming the problem.
    """
    return _resolve(check_model(model), _as_plan(plan))[0]


# ----------------------------------------------------------------------------- patches
# Patches are small callable objects stored on the module instances (no global registry), so
# that remove_plan finds them by walking the model, and copy.deepcopy / pickle of a planned model
# rebind them to the copy (a closure would keep pointing at the original module).


def _call_flat(module: nn.Module, names: tuple[str, ...], *flat: Any) -> Any:
    """``module``'s original call with the last ``len(names)`` of ``flat`` as keywords."""
    n = len(flat) - len(names)
    return type(module)._call_impl(module, *flat[:n], **dict(zip(names, flat[n:], strict=True)))


@dataclass
class _OpLevelRuns:
    """The runs of one op-level region call: forward, then its recomputes."""

    preserve_rng: bool
    count: int = 0
    rng: tuple[bytes, Any] | None = None
    """The RNG states forward started from, as bytes (NOTE [ RNG states as bytes ])."""
    region_id: int = field(default_factory=lambda: markers.next_region_id())
    """The call's id for recompute listeners: a recorder tells the plan's recompute from a
    script's own by it."""


def _tracked_call(
    module: nn.Module, path: str, runs: _OpLevelRuns, names: tuple[str, ...], *flat: Any
) -> Any:
    """``_call_flat`` with module calls tracked (op auto-names, ckpt_runtime/oplevel.py). The
    first run is forward; later runs are recomputes, which keep forward's running statistics
    (NOTE [ Running statistics ] in checkpoint.py) and start from forward's RNG states."""
    runs.count += 1
    recompute = runs.count > 1
    if recompute and markers._listeners:
        markers._recompute_begin(runs.region_id, module)
    try:
        with (
            track_modules(module_paths(module, path)),
            kept_statistics(module, recompute),
            _forward_rng(runs, flat, recompute),
        ):
            return _call_flat(module, names, *flat)
    finally:
        if recompute and markers._listeners:
            markers._recompute_end(runs.region_id, module)


@contextmanager
def _forward_rng(runs: _OpLevelRuns, flat: tuple[Any, ...], recompute: bool) -> Iterator[None]:
    """Forward stashes its RNG states; a recompute runs from them and gives the interrupted
    states back, also when torch stops it early by raising. This is torch's
    ``preserve_rng_state``, kept as bytes: torch's own keeps a 5,056-byte CPU tensor per call
    until backward, memory the plan's projection does not see (NOTE [ RNG states as bytes ]
    in checkpoint.py; it put op-level plans 0.03-0.26% under their measured peaks)."""
    if not runs.preserve_rng:
        yield
        return
    if not recompute:
        runs.rng = (_cpu_rng_state(), _device_rng_state(flat))
        yield
        return
    assert runs.rng is not None
    outer = (_cpu_rng_state(), _device_rng_state(flat))
    _set_cpu_rng_state(runs.rng[0])
    if runs.rng[1] is not None:
        _set_device_rng_state(runs.rng[1])
    try:
        yield
    finally:
        _set_cpu_rng_state(outer[0])
        if outer[1] is not None:
            _set_device_rng_state(outer[1])


class _SaveGroup:
    """The op-level regions that share one ``save`` list (one pattern of the plan, usually):
    an entry that matches no op once each of them has run is a mistake in the plan."""

    def __init__(self, save: tuple[str, ...]) -> None:
        self.save, self.matched = save, set[str]()
        self.members = self.ran = 0

    def first_call_done(self, path: str) -> None:
        self.ran += 1
        unmatched = [e for e in self.save if e not in self.matched]
        if self.ran == self.members and unmatched:
            raise _fail(
                f"op-level region {path or '<model>'!r}: 'save' entry {unmatched[0]!r} matches "
                "no op its modules ran; list ops as aten.mm, aten.mm* or auto-names like "
                f"{op_auto_name(path, 'aten.mm', 0)}"
            )


class _RegionCall:
    """Set as ``module._call_impl``: NOTE [ A module region is the whole module call ]."""

    def __init__(
        self,
        module: nn.Module,
        path: str,
        options: PlanOptions,
        plan: str,
        region: ModuleRegion | None = None,
        group: _SaveGroup | None = None,
    ) -> None:
        self.module, self.path, self.options, self.plan = module, path, options, plan
        self.region = region if region is not None and region.op_level else None
        self.offloader = Offloader(path or "<model>")
        self.group = group
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        if not torch.is_grad_enabled():
            return type(module)._call_impl(module, *args, **kwargs)
        if torch.compiler.is_compiling() and self.region is None:
            fn = partial(_call_flat, module, tuple(kwargs))  # dynamo breaks its graph on MethodType
            return _compiled_region(module, fn, (*args, *kwargs.values()), self.options)
        self.calls += 1
        if self.region is not None:
            return self._op_level(self.region, args, kwargs)
        # A bound method of the module (in a partial), so that the recompute markers report
        # the module as the region's target (ckpt_runtime.markers.region_target).
        fn = partial(MethodType(_call_flat, module), tuple(kwargs))
        with plan_region(module):
            return checkpoint(
                fn,
                *args,
                *kwargs.values(),
                use_reentrant=self.options.use_reentrant,
                preserve_rng_state=self.options.preserve_rng_state,
            )

    def _op_level(self, region: ModuleRegion, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An op-level region's call: offloaded, or under a selective checkpoint policy."""
        module = self.module
        if region.offload:
            with self.offloader.hooks():
                return type(module)._call_impl(module, *args, **kwargs)
        assert region.save is not None and self.group is not None
        flat = (*args, *kwargs.values())
        policy = SavePolicy(
            self.path or "<model>", region.save, outside_addresses(module, flat), self.group.matched
        )
        runs = _OpLevelRuns(self.options.preserve_rng_state)
        fn = partial(MethodType(_tracked_call, module), self.path, runs, tuple(kwargs))
        with plan_region(module):
            out = torch.utils.checkpoint.checkpoint(
                fn,
                *flat,
                use_reentrant=False,
                preserve_rng_state=False,  # _forward_rng does it, without state tensors
                context_fn=policy.contexts,
            )
        if self.calls == 1:
            self.group.first_call_done(self.path)
        return out


def _compiled_region(
    module: nn.Module, fn: Any, args: tuple[Any, ...], options: PlanOptions
) -> Any:
    """A module-level region while dynamo traces it (NOTE [ Checkpoint inside a compiled
    graph ] in checkpoint.py): torch's checkpoint, with no call count or plan mark, whose reads
    and writes dynamo would guard on and recompile for at every call."""
    if region_bypassed(module):
        return fn(*args)
    return compiled_checkpoint(fn, args, {}, options.preserve_rng_state)


def _run_segment(seq: nn.Sequential, start: int, stop: int, input: Any) -> Any:
    """Run children ``start..stop-1`` of ``seq`` (the function a segment checkpoints)."""
    patch = vars(seq).get("forward")
    if not isinstance(patch, _SegmentForward):
        patch = None
    if patch is not None:
        patch.running += 1  # also during the recompute: see _BypassCheck
    try:
        for child in list(seq)[start:stop]:
            input = child(input)
        return input
    finally:
        if patch is not None:
            patch.running -= 1


class _SegmentForward:
    """Set as ``seq.forward``: nn.Sequential's forward, each segment under one checkpoint."""

    ckpt_runtime_segments = True  # see presets.has_sequential_forward

    def __init__(
        self,
        seq: nn.Sequential,
        path: str,
        segments: list[SegmentRegion],
        options: PlanOptions,
        plan: str,
    ) -> None:
        self.seq, self.path, self.options, self.plan = seq, path, options, plan
        self.segments = sorted(segments, key=lambda s: s.start)
        self.length = len(seq)
        self.calls = [0] * len(self.segments)
        self.running = 0
        self.warned = False

    def __call__(self, input: Any) -> Any:
        seq = self.seq
        children = list(seq)
        if len(children) != self.length:
            raise RuntimeError(
                f"ckpt_runtime: {self.path or '<model>'!r} had {self.length} children when plan "
                f"{self.plan!r} was applied and has {len(children)} now; re-apply the plan "
                "(remove_plan, then apply_plan)"
            )
        grad = torch.is_grad_enabled()
        self.running += 1
        try:
            done = 0
            for i, seg in enumerate(self.segments):
                for child in children[done : seg.start]:
                    input = child(input)
                if grad and torch.compiler.is_compiling():
                    segment = partial(_run_segment, seq, seg.start, seg.stop)
                    input = _compiled_region(seq, segment, (input,), self.options)
                elif grad:
                    self.calls[i] += 1
                    with plan_region(seq):
                        input = checkpoint(
                            partial(MethodType(_run_segment, seq), seg.start, seg.stop),
                            input,
                            use_reentrant=self.options.use_reentrant,
                            preserve_rng_state=self.options.preserve_rng_state,
                        )
                else:
                    input = _run_segment(seq, seg.start, seg.stop, input)
                done = seg.stop
            for child in children[done:]:
                input = child(input)
            return input
        finally:
            self.running -= 1


class _BypassCheck:
    """Forward pre-hook on the first child of each segment: warns once if the child runs while
    its nn.Sequential is not running it (the model iterates over the Sequential instead of
    calling it, so the segment silently does nothing)."""

    def __init__(self, patch: _SegmentForward, segment: SegmentRegion) -> None:
        self.patch, self.segment = patch, segment

    def __call__(self, module: nn.Module, args: Any) -> None:
        patch = self.patch
        if patch.running or patch.warned:
            return
        patch.warned = True
        pattern = join(escape_path(patch.path), "*")
        warnings.warn(
            f"ckpt_runtime: segment {self.segment} of plan {patch.plan!r} does not take effect: "
            f"a child of {patch.path or '<model>'!r} was called directly instead of through "
            "the nn.Sequential (does the model loop over it?); segments need the Sequential "
            f'itself to be called. Checkpoint its children as {{"module": "{pattern}"}} or '
            "with the presets all / every:K instead",
            UserWarning,
            stacklevel=_outside_torch_modules(),
        )


def _outside_torch_modules() -> int:
    """The ``stacklevel`` of the first caller outside torch's Module call machinery, so that a
    warning from a module hook points at the model code that called the module."""
    frame: FrameType | None = sys._getframe(2)  # level 1: the hook that warns, 2: its caller
    level = 2
    while frame is not None and frame.f_code.co_filename == _MODULE_FILE:
        frame, level = frame.f_back, level + 1
    return level


_Patch: TypeAlias = _RegionCall | _SegmentForward


def _patches(model: nn.Module) -> list[tuple[nn.Module, str, _Patch]]:
    found: list[tuple[nn.Module, str, _Patch]] = []
    for module in model.modules():
        for attr in ("_call_impl", "forward"):
            value = vars(module).get(attr)
            if isinstance(value, _RegionCall | _SegmentForward):
                found.append((module, attr, value))
    return found


def _uninstall(module: nn.Module, attr: str, patch: _Patch) -> None:
    if vars(module).get(attr) is patch:
        del vars(module)[attr]
    if isinstance(patch, _SegmentForward):
        for child in module.children():
            hooks = child._forward_pre_hooks
            mine = [k for k, h in hooks.items() if isinstance(h, _BypassCheck) and h.patch is patch]
            for key in mine:
                del hooks[key]
                child._forward_pre_hooks_with_kwargs.pop(key, None)


def remove_plan(model: nn.Module) -> None:
    """Remove every region ckpt_runtime applied to ``model`` (or its submodules), exactly.

    The patched attributes are deleted, so the modules behave, print and ``state_dict`` exactly
    as before ``apply_plan``. Does nothing if no plan is applied.
    """
    for module, attr, patch in _patches(check_model(model)):
        _uninstall(module, attr, patch)


# ----------------------------------------------------------------------------- apply


@dataclass(frozen=True, eq=False)
class AppliedPlan:
    """What :func:`apply_plan` did: the concrete plan and the resolved regions.

    ``str(applied)`` lists the regions (one per line). Usable as a context manager that removes
    the plan on exit.
    """

    plan: Plan
    """The concrete plan applied (presets expanded, patterns replaced by exact paths)."""
    source: Plan
    """The plan as given (a preset plan, patterns...)."""
    modules: tuple[str, ...]
    """Paths of the modules checkpointed as module regions, in model order."""
    segments: tuple[SegmentRegion, ...]
    """The segments, in model order."""
    _installed: tuple[tuple[nn.Module, str, _Patch], ...] = field(repr=False)

    def region_calls(self) -> dict[str, int]:
        """How many times each region ran checkpointed since the plan was applied.

        Keys are region labels (``"transformer.h.0"``, ``"blocks[0:3]"``). A region that stays
        at 0 after a training step did not take effect (e.g. the model never calls it). Calls
        inside a ``torch.compile``'d graph are not counted: Python does not run them.
        """
        counts: dict[str, int] = {}
        for _, _, patch in self._installed:
            if isinstance(patch, _RegionCall):
                counts[str(ModuleRegion(escape_path(patch.path)))] = patch.calls
            else:
                for seg, calls in zip(patch.segments, patch.calls, strict=True):
                    counts[str(seg)] = calls
        return {str(r): counts[str(r)] for r in self.plan.regions}

    def remove(self) -> None:
        """Remove this plan's regions from the model (only those, if others were applied since)."""
        for module, attr, patch in self._installed:
            _uninstall(module, attr, patch)

    def describe(self) -> str:
        """A multi-line description: the plan, then one resolved region per line."""
        preset = self.plan.meta.get("preset")
        head = f"plan {self.plan.name!r}"
        if isinstance(preset, Mapping):
            head += f" (preset {preset['name']} on {preset['chain'] or '<model>'!r}, "
            head += f"{preset['blocks']} blocks)"
        n = len(self.plan.regions)
        lines = [f"{head}: {n} region{'s' if n != 1 else ''}"]
        lines += [
            f"  {region}{_op_level_note(region)}"
            if isinstance(region, ModuleRegion)
            else f"  segment {region}"
            for region in self.plan.regions
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def __enter__(self) -> AppliedPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _op_level_note(region: ModuleRegion) -> str:
    """`` (offload)``, `` (save aten.mm*, ...)`` or nothing, for ``describe``."""
    if region.offload:
        return " (offload)"
    return "" if region.save is None else f" (save {', '.join(region.save)})"


def _check_op_level(plan: Plan, regions: list[ModuleRegion]) -> None:
    """PlanError for op-level regions this torch or these options cannot run."""
    for region in regions:
        if region.save is None or region.saves_all:
            continue
        check_selective_support(str(region))
        check_op_names(str(region), region.save)
        if plan.options.use_reentrant:
            raise _fail(
                f"op-level region {str(region)!r} needs non-reentrant checkpoint; set the "
                "option use_reentrant to false"
            )


def apply_plan(model: nn.Module, plan: PlanSource, *, replace: bool = False) -> AppliedPlan:
    """Checkpoint the regions of ``plan`` in ``model``, in place; returns what was applied.

    ``plan`` is a :class:`Plan`, a plan document (dict), a plan file path or a preset string
    (``"sqrt"``, ``"every:2"``, ``"all@encoder.layers"``). Module regions checkpoint the whole
    module call (NOTE [ A module region is the whole module call ]); each segment runs its
    children under one checkpoint call when the ``nn.Sequential`` is called. A model that already
    has a plan raises :class:`PlanError` unless ``replace=True`` (then the old plan is removed
    first, once the new one has resolved). Undo with :func:`remove_plan` or
    ``AppliedPlan.remove()``.

    ``torch.compile(model)``'s wrapper stands for the model it wraps: paths are the model's
    (NOTE [ A compiled model is named as the user's model ]).

    Limitations: apply the plan before ``module.compile()`` (a compiled module ignores it), and
    not under ``nn.DataParallel`` (its replicas would run the original modules).
    """
    source = _as_plan(plan)
    model = check_model(model)  # NOTE [ A compiled model is named as the user's model ]
    concrete, by_path = _resolve(model, source)
    existing = _patches(model)
    if existing and not replace:
        names = sorted({patch.plan for _, _, patch in existing})
        raise _fail(
            f"{type(model).__name__} already has plan {', '.join(map(repr, names))} applied; "
            "call remove_plan(model) first, or apply_plan(model, plan, replace=True)"
        )
    module_regions = [r for r in concrete.regions if isinstance(r, ModuleRegion)]
    # Patterns in the concrete plan are escaped exact paths; map them back to real paths.
    real = {escape_path(p): p for p in by_path}
    targets = [(real[r.pattern], by_path[real[r.pattern]]) for r in module_regions]
    _check_op_level(concrete, module_regions)
    segments = [r for r in concrete.regions if isinstance(r, SegmentRegion)]
    for path, module in targets + [(s.sequential, by_path[s.sequential]) for s in segments]:
        if getattr(module, "_compiled_call_impl", None) is not None:
            raise _fail(
                f"{path or '<model>'!r} was compiled with module.compile(), which would bypass "
                "the plan; apply the plan first, then compile"
            )
    for path, module in targets:
        own = vars(module).get("_call_impl")
        if own is not None and not isinstance(own, _RegionCall):
            raise _fail(
                f"{path or '<model>'!r} has its call replaced on the instance (by another "
                "library?); ckpt_runtime cannot checkpoint it as a module region"
            )
    if existing:
        remove_plan(model)
    register_module_names(model)  # lets checkpoint's messages name regions by path

    installed: list[tuple[nn.Module, str, _Patch]] = []
    groups: dict[tuple[str, ...], _SaveGroup] = {}
    for (path, module), region in zip(targets, module_regions, strict=True):
        group = None
        if region.save is not None and not region.saves_all:
            group = groups.setdefault(region.save, _SaveGroup(region.save))
            group.members += 1
        region_patch = _RegionCall(module, path, concrete.options, concrete.name, region, group)
        vars(module)["_call_impl"] = region_patch
        installed.append((module, "_call_impl", region_patch))
    by_seq: dict[str, list[SegmentRegion]] = {}
    for seg in segments:
        by_seq.setdefault(seg.sequential, []).append(seg)
    for path, segs in by_seq.items():
        seq = _as_sequential(by_path[path])
        seg_patch = _SegmentForward(seq, path, segs, concrete.options, concrete.name)
        vars(seq)["forward"] = seg_patch
        installed.append((seq, "forward", seg_patch))
        children = list(seq)
        for seg in seg_patch.segments:
            children[seg.start].register_forward_pre_hook(_BypassCheck(seg_patch, seg))
    return AppliedPlan(
        plan=concrete,
        source=source,
        modules=tuple(targets_path for targets_path, _ in targets),
        segments=tuple(segments),
        _installed=tuple(installed),
    )
