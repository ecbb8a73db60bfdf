"""Corrupted and hostile traces (issue 12, items 4 and 5): every verb reads them or refuses them
with one line (exit 2), in bounded time, printing no traceback and no terminal control.

The cases come from ``benchmarks/fault_suite.py`` (which runs every verb on every case, with
more cases): here each case runs one verb, the verbs in turn, in a batch subprocess whose
watchdog counts a case past its time limit as hung.

``CKVIEW_FULL_FAULTS=1`` runs all ``PER_FAMILY`` (17) members of each of the 18 families (306
cases). By default every third member runs (members 1, 4, ..., 16: 108 cases, the same files
the full run makes): six per family, so that each family meets each verb once, and each family
still has members that must be refused (of 17 ``zero_metadata`` members, which zero 32 bytes
of HDF5 metadata that is often never read, only members 1, 2 and 14 break the file).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest

from ckview.trace import open_trace, validate_trace
from ckview.trace.errors import CorruptTraceError
from ckview.trace.text import printable

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_traces" / "mlp.h5"
FULL = os.environ.get("CKVIEW_FULL_FAULTS", "") not in ("", "0")
PER_FAMILY = 17
SAMPLED = range(1, PER_FAMILY, 3)
"""The members of each family run by default (every third)."""


def fault_suite() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fault_suite", ROOT / "benchmarks" / "fault_suite.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_mutated_trace_is_read_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = fault_suite()
    monkeypatch.setattr(fs, "BOMB_ROWS", 2_000_000)  # above the batch's 16 MiB memory limit
    sources = ("mlp.h5", "transformer_checkpointed.h5")
    members = None if FULL else SAMPLED
    cases = fs.make_cases(tmp_path, PER_FAMILY, sources=sources, members=members)
    cases = [fs.Case(c.family, c.path, (fs.VERBS[i % len(fs.VERBS)],)) for i, c in enumerate(cases)]
    results = fs.run_cases(cases, timeout=60.0)
    table = fs.tally(cases, results)
    total = sum(table.values(), Counter())
    assert total["tried"] == len(fs.FAMILIES) * (PER_FAMILY if FULL else len(SAMPLED))
    # Cases take the verbs in turn, so each family meets every verb even in the sample.
    assert len({(c.family, c.verbs[0]) for c in cases}) == len(fs.FAMILIES) * len(fs.VERBS)
    bad = {
        f"{case.family}/{Path(case.path).name}": results.get(i, {})
        for i, case in enumerate(cases)
        if not fs.handled(case, results.get(i, {}))
    }
    assert not bad, fs.format_table(table) + "\n" + "\n".join(f"{k}: {v}" for k, v in bad.items())
    refused = Counter(
        case.family for i, case in enumerate(cases) if "refused" in results[i].values()
    )
    # Every family of faults produced faults that were caught, not only harmless mutations.
    assert set(refused) == set(fs.FAMILIES) - {"hostile_strings"}, refused


# --- single faults, in-process -----------------------------------------------------------------


def copy(tmp_path: Path) -> Path:
    path = tmp_path / "t.h5"
    shutil.copyfile(SAMPLE, path)
    return path


def test_external_storage_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    path = copy(tmp_path)
    with h5py.File(path, "r+") as f:
        attrs = dict(f["strings"].attrs)
        count = f["strings"].shape[0]
        del f["strings"]
        ds = f.create_dataset(
            "strings", shape=(count,), dtype="S16", external=[("/etc/passwd", 0, 1 << 20)]
        )
        ds.attrs.update(attrs)
    with pytest.raises(CorruptTraceError, match="stores its data in another file"):
        open_trace(path)


def test_a_declared_size_over_the_memory_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = copy(tmp_path)
    with h5py.File(path, "r+") as f:
        for ds in f["runs/main/ops"].values():
            ds.resize((2**31 - 1,))
    with pytest.raises(CorruptTraceError, match="of memory it may use"):
        open_trace(path)
    monkeypatch.setenv("CKVIEW_MEMORY_LIMIT", str(2**16))  # its run holds 281 KiB
    with pytest.raises(CorruptTraceError, match="/runs/main declares"):
        open_trace(SAMPLE)


def test_a_structure_walk_past_the_limit_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit stands in for a loop in HDF5 (sample file zeroed at 2080 loops for ever)."""
    monkeypatch.setenv("CKVIEW_OPEN_TIMEOUT", "0.1")
    import ckview.trace.structure as structure

    monkeypatch.setattr(structure, "walk", lambda path, limit: __import__("time").sleep(60))
    monkeypatch.setattr(structure, "_passed", {})  # walked again even if it passed before
    with pytest.raises(CorruptTraceError, match=r"could not be read within 0\.1 s"):
        open_trace(SAMPLE)


def test_a_module_parent_cycle_is_refused_by_every_read(tmp_path: Path) -> None:
    path = copy(tmp_path)
    with h5py.File(path, "r+") as f:
        parent = f["modules/parent"][...]
        parent[1], parent[2] = 2, 1
        f["modules/parent"][...] = parent
    with open_trace(path) as trace:
        with pytest.raises(
            CorruptTraceError, match=r"modules.parent has \d+ rows in or under a cycle"
        ):
            trace.modules.read()
        assert len(trace.modules.read(check=False)["parent"]) == len(parent)
    report = validate_trace(path)
    assert any("modules.parent" in p and "cycle" in p for p in report.problems)


def test_strings_from_a_trace_are_escaped(tmp_path: Path) -> None:
    path = copy(tmp_path)
    with h5py.File(path, "r+") as f:
        values = f["strings"].asstr()[...]
        values[0] = "\x1b[2Jevil\r\u202e"
        f["strings"][...] = values
        f["meta"].attrs["error"] = "\x1b]0;title\x07"
    with open_trace(path) as trace:
        assert trace.strings[0] == "\\x1b[2Jevil\\x0d\\u202e"
        assert trace.meta.error == "\\x1b]0;title\\x07"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain.path", "plain.path"),
        ("a\tb\nc", "a\\x09b\\x0ac"),
        ("\u2066x\u2069", "\\u2066x\\u2069"),
        ("caf\u00e9 \u4e2d", "caf\u00e9 \u4e2d"),
        ("\x9b31m", "\\x9b31m"),
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(shown) == shown


def test_cycle_check_agrees_with_walking_up() -> None:
    from ckview.trace.checks import value_problems

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        parent = rng.integers(-1, n, n).astype(np.int32)
        has_cycle = False
        for row in range(n):
            seen, node = set(), row
            while node != -1 and node not in seen:
                seen.add(node)
                node = int(parent[node])
            has_cycle |= node != -1
        problems = value_problems("modules", {"parent": parent}, {"modules": n})
        assert any("cycle" in p for p in problems) == has_cycle
