"""One trace per rank of a distributed run: how rank files are named and found again.

NOTE [ One file per rank ]
Under ``torchrun`` every rank records on its own into ``NAME.rank{R}.h5`` (``R`` from the
``RANK`` variable the launcher sets), so that no two processes ever write one HDF5 file and no
rank waits for another while writing. The recorder picks the name (for ``ckview record`` and a
``Recorder`` used by hand alike); readers find all ranks of a run from the common stem
``NAME.h5`` or from the rank files themselves. Each trace's meta says its ``rank`` and
``world_size``: a rank file beyond the world size of the newest recording is left over from an
earlier run with more ranks, and is not shown with this one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

_RANK_SUFFIX = re.compile(r"\.rank(\d+)$")


def launcher_world(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(rank, world size)`` when a distributed launcher started this process with more than
    one rank, else ``(-1, 1)``: the trace's meta fields ``rank`` and ``world_size``."""
    env = os.environ if environ is None else environ
    rank = launcher_rank(env)
    return (-1, 1) if rank is None else (rank, int(env["WORLD_SIZE"]))


def launcher_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank when a distributed launcher started it with more than one rank
    (``RANK`` and ``WORLD_SIZE`` set, as torchrun does), else None."""
    env = os.environ if environ is None else environ
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return rank if world > 1 else None


def rank_path(path: str | Path, rank: int) -> Path:
    """``run.h5`` -> ``run.rank{rank}.h5``; a path already naming this rank is kept."""
    path = Path(path)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    if rank_of(path) == rank:
        return path
    return path.with_name(f"{stem}.rank{rank}{path.suffix}")


def this_rank_path(path: str | Path) -> Path:
    """``path`` for this process: its rank file under a launcher with several ranks."""
    rank = launcher_rank()
    return Path(path) if rank is None else rank_path(path, rank)


def rank_of(path: str | Path) -> int | None:
    """The rank a file name carries (``run.rank3.h5`` -> 3), or None."""
    path = Path(path)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    match = _RANK_SUFFIX.search(stem)
    return int(match.group(1)) if match else None


def common_stem(path: str | Path) -> Path:
    """``run.rank1.h5`` -> ``run.h5`` (the name every rank file of the run derives from)."""
    path = Path(path)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return path.with_name(_RANK_SUFFIX.sub("", stem) + path.suffix)


def rank_files(stem: str | Path) -> list[Path]:
    """The rank files of the run named ``stem`` (``run.h5``), by rank; empty if there are none."""
    stem = Path(stem)
    name = stem.name[: -len(stem.suffix)] if stem.suffix else stem.name
    folder = stem.parent
    if not folder.is_dir():
        return []
    found = {}
    for entry in folder.glob(f"{_glob_escape(name)}.rank*{stem.suffix}"):
        rank = rank_of(entry)
        if rank is not None and common_stem(entry).name == stem.name:
            found[rank] = entry
    world = _newest_world_size(list(found.values()))
    return [found[r] for r in sorted(found) if world is None or r < world]


def _newest_world_size(paths: Sequence[Path]) -> int | None:
    """The ``world_size`` of the most recently started of ``paths`` (None if none can be read):
    rank files beyond it are left over from an earlier run with more ranks."""
    from ckview.trace import TraceError, open_trace

    newest: tuple[str, int] | None = None
    for path in paths:
        try:
            with open_trace(path) as trace:
                meta = trace.meta
        except (TraceError, OSError):
            continue
        if meta.world_size > 1 and (newest is None or meta.start_time > newest[0]):
            newest = (meta.start_time, meta.world_size)
    return None if newest is None else newest[1]


def expand_rank_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Each path as given, except a missing ``run.h5`` whose rank files exist: those, by rank.

    ``ckview summary run.h5`` then reads every rank of a distributed recording; a shell glob
    (``run.rank*.h5``) arrives as the rank files already.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        ranks = [] if p.exists() else rank_files(p)
        out += ranks or [p]
    return out


def _glob_escape(text: str) -> str:
    """``text`` with glob's special characters matched literally."""
    return re.sub(r"([*?\[])", r"[\1]", text)
