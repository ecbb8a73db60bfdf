"""Fault suite: mutated and hostile traces through every reading verb; counts per family.

Each case is a copy of a sample trace with one fault (a truncation, flipped bytes, zeroed
metadata, an HDF5 feature ckview refuses, a huge declared shape, a compressed bomb, a broken
reference, a cycle, a wrong dtype, a resized column, bad times, unsorted rows). Every verb
(validate, summary, project, plan, export, diff) runs on every case, in-process through
``ckview.cli.main.main`` inside a batch subprocess; a watchdog kills the batch when one case
runs past its time limit (counted as hung) and resumes with the next case. A case is handled
when every verb exited 0 or 2 with no traceback.

    python benchmarks/fault_suite.py [--per-family N] [--timeout S] [--verbs validate,summary]

``tests/test_hostile_traces.py`` runs a smaller sample of the same cases.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
SOURCES = ("mlp.h5", "transformer_checkpointed.h5", "gpt2_compare.h5")
VERBS = ("validate", "summary", "project", "plan", "export", "diff")
BOMB_ROWS = 20_000_000
"""Rows of a compressed bomb column: 20 MB of zeros in a few KB. The batch sets
CKVIEW_MEMORY_LIMIT below it, as a machine with little free memory would be."""
BATCH_MEMORY_LIMIT = str(16 * 2**20)


@dataclass(frozen=True)
class Case:
    family: str
    path: str
    verbs: tuple[str, ...] = VERBS


Mutator = Callable[[Path, random.Random], None]


# --- byte-level faults --------------------------------------------------------------------


def _raw_ranges(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every stored chunk: the rest of the file is HDF5 metadata."""
    ranges: list[tuple[int, int]] = []

    def visit(_: str, node: object) -> None:
        if isinstance(node, h5py.Dataset) and node.chunks is not None:
            for i in range(node.id.get_num_chunks()):
                info = node.id.get_chunk_info(i)
                ranges.append((info.byte_offset, info.size))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return sorted(ranges)


def _metadata_offsets(path: Path) -> list[int]:
    size = path.stat().st_size
    covered = np.zeros(size, dtype=bool)
    for offset, length in _raw_ranges(path):
        covered[offset : offset + length] = True
    return [int(i) for i in np.flatnonzero(~covered[: size - 32])]


def truncate(path: Path, rng: random.Random) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(rng.randrange(0, size))


def flip_bytes(path: Path, rng: random.Random) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        for _ in range(rng.choice((1, 4, 16))):
            offset = rng.randrange(size)
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))


def zero_metadata(path: Path, rng: random.Random) -> None:
    offset = rng.choice(_metadata_offsets(path))
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(32))


# --- hostile HDF5 features ------------------------------------------------------------------


def _run_group(f: h5py.File, rng: random.Random) -> h5py.Group:
    runs = f["runs"]
    return runs[rng.choice(sorted(runs))]


def _column(f: h5py.File, rng: random.Random, table: str | None = None) -> h5py.Dataset:
    if table is None:
        table = rng.choice(("ops", "storages", "memory_events", "module_calls"))
    group = f["modules"] if table == "modules" else _run_group(f, rng)[table]
    return group[rng.choice(sorted(group))]


def _replace(ds: h5py.Dataset, values: np.ndarray, **kwargs: object) -> None:
    parent, name = ds.parent, ds.name.rsplit("/", 1)[1]
    del parent[name]
    parent.create_dataset(name, data=values, **kwargs)


def external_link(path: Path, rng: random.Random) -> None:
    other = path.with_name(path.stem + "_other.h5")
    with h5py.File(other, "w") as o:
        o.create_dataset("x", data=np.arange(10, dtype=np.int32))
    with h5py.File(path, "r+") as f:
        ds = _column(f, rng)
        parent, name = ds.parent, ds.name.rsplit("/", 1)[1]
        del parent[name]
        parent[name] = h5py.ExternalLink(str(other), "/x")


def soft_link(path: Path, rng: random.Random) -> None:
    with h5py.File(path, "r+") as f:
        run = _run_group(f, rng)
        target = rng.choice(("/strings", "/modules/path", run["ops"]["name"].name))
        ds = _column(f, rng)
        parent, name = ds.parent, ds.name.rsplit("/", 1)[1]
        del parent[name]
        parent[name] = h5py.SoftLink(target)


def external_storage(path: Path, rng: random.Random) -> None:
    """The string table stored in /etc/passwd (the attack that printed its lines)."""
    with h5py.File(path, "r+") as f:
        strings = f["strings"]
        attrs = dict(strings.attrs)
        count = strings.shape[0]
        del f["strings"]
        ds = f.create_dataset(
            "strings",
            shape=(count,),
            dtype="S16",
            external=[("/etc/passwd", 0, h5py.h5f.UNLIMITED)],
        )
        for key, value in attrs.items():
            ds.attrs[key] = value
        if rng.random() < 0.5:
            col = _column(f, rng, "ops")
            _replace(
                col,
                None,
                shape=col.shape,
                dtype=col.dtype,
                external=[("/etc/hostname", 0, 1 << 20)],
            )


def virtual_dataset(path: Path, rng: random.Random) -> None:
    with h5py.File(path, "r+") as f:
        ds = _column(f, rng)
        layout = h5py.VirtualLayout(shape=ds.shape, dtype=ds.dtype)
        layout[:] = h5py.VirtualSource(".", ds.name + "_src", shape=ds.shape)
        values = ds[...]
        parent, name = ds.parent, ds.name.rsplit("/", 1)[1]
        parent.create_dataset(name + "_src", data=values)
        del parent[name]
        parent.create_virtual_dataset(name, layout)


def huge_shape(path: Path, rng: random.Random) -> None:
    """Every column of a table declared 2^31 (or 2^40) rows: a small file, a huge table."""
    rows = rng.choice((2**31 - 1, 2**31, 2**40))
    with h5py.File(path, "r+") as f:
        table = rng.choice(("ops", "storages", "memory_events", "module_calls", "steps"))
        group = f["modules"] if rng.random() < 0.2 else _run_group(f, rng)[table]
        for ds in group.values():
            ds.resize((min(rows, 2**31 - 1) if ds.dtype.itemsize > 4 else rows,))


def compressed_bomb(path: Path, rng: random.Random) -> None:
    """A table of BOMB_ROWS rows of zeros, compressed to a few KB."""
    with h5py.File(path, "r+") as f:
        group = _run_group(f, rng)[rng.choice(("ops", "memory_events", "saved_events"))]
        for ds in list(group.values()):
            _replace(
                ds,
                np.zeros(BOMB_ROWS, ds.dtype),
                chunks=(1 << 20,),
                maxshape=(None,),
                compression="gzip",
                compression_opts=9,
            )


# --- semantic faults ----------------------------------------------------------------------


def _rewrite(ds: h5py.Dataset, change: Callable[[np.ndarray], np.ndarray]) -> None:
    values = change(ds[...].copy())
    if values.shape == ds.shape:
        ds[...] = values
    else:
        ds.resize(values.shape)
        ds[...] = values


def _index_column(f: h5py.File, rng: random.Random) -> h5py.Dataset:
    choices = [
        ("modules", "parent"),
        ("modules", "path"),
        ("module_calls", "module"),
        ("module_calls", "parent"),
        ("ops", "module_call"),
        ("ops", "name"),
        ("memory_events", "storage"),
        ("memory_events", "op"),
        ("storages", "op"),
        ("storages", "module"),
        ("storages", "device"),
        ("saved_events", "storage"),
        ("module_io", "call"),
        ("steps", "first_op"),
        ("steps", "first_memory_event"),
        ("recompute_regions", "first_op"),
        ("recompute_regions", "end_op"),
        ("timed_calls", "module"),
    ]
    table, column = rng.choice(choices)
    if table == "modules":
        return f["modules"][column]
    return _run_group(f, rng)[table][column]


def out_of_range(path: Path, rng: random.Random) -> None:
    with h5py.File(path, "r+") as f:
        ds = _index_column(f, rng)
        if ds.shape[0] == 0:
            ds = _run_group(f, rng)["ops"]["module_call"]
        bad = rng.choice((-2, -(2**31), 2**31 - 1, ds.shape[0] + 7, 10**6))

        def change(values: np.ndarray) -> np.ndarray:
            values[rng.randrange(len(values))] = bad
            return values

        _rewrite(ds, change)


def cycle(path: Path, rng: random.Random) -> None:
    """A parent column that loops: modules.parent or module_calls.parent."""
    with h5py.File(path, "r+") as f:
        if rng.random() < 0.5:
            ds = f["modules"]["parent"]
        else:
            ds = _run_group(f, rng)["module_calls"]["parent"]
        n = ds.shape[0]
        if n < 2:
            ds = f["modules"]["parent"]
            n = ds.shape[0]

        def change(values: np.ndarray) -> np.ndarray:
            i = rng.randrange(n)
            if rng.random() < 0.3:
                values[i] = i  # its own parent
            else:
                j = rng.randrange(n)
                values[i], values[j] = j, i
            return values

        _rewrite(ds, change)


def wrong_dtype(path: Path, rng: random.Random) -> None:
    with h5py.File(path, "r+") as f:
        ds = _column(f, rng)
        dtype = rng.choice(("<f8", "<i2", "<u8", ">i4", "S4"))
        _replace(ds, ds[...].astype(dtype), maxshape=(None,), chunks=True)


def resized_column(path: Path, rng: random.Random) -> None:
    with h5py.File(path, "r+") as f:
        ds = _column(f, rng)
        n = ds.shape[0]
        ds.resize((rng.choice((0, max(n - 1, 0), n + 1, n * 3 + 5)),))


def bad_times(path: Path, rng: random.Random) -> None:
    """Negative times, end before start, huge times (NaN has no int64; the extremes stand in)."""
    with h5py.File(path, "r+") as f:
        run = _run_group(f, rng)
        table = rng.choice(("ops", "memory_events", "steps", "storages", "module_calls"))
        columns = [c for c in run[table] if c.endswith("_ns")]
        ds = run[table][rng.choice(columns)]
        if ds.shape[0] == 0:
            return
        bad = rng.choice((-5, -(2**62), 2**63 - 1, -(2**63)))

        def change(values: np.ndarray) -> np.ndarray:
            rows = rng.sample(range(len(values)), min(len(values), rng.choice((1, 3, 50))))
            values[rows] = bad
            return values

        _rewrite(ds, change)


def unsorted_rows(path: Path, rng: random.Random) -> None:
    with h5py.File(path, "r+") as f:
        run = _run_group(f, rng)
        table = run[rng.choice(("ops", "memory_events", "steps", "module_calls", "storages"))]
        order = np.random.default_rng(rng.randrange(2**32)).permutation(
            table["start_ns" if "start_ns" in table else next(iter(table))].shape[0]
        )
        for ds in table.values():
            if ds.shape[0] == len(order):
                ds[...] = ds[...][order]


def nonsense_steps(path: Path, rng: random.Random) -> None:
    with h5py.File(path, "r+") as f:
        steps = _run_group(f, rng)["steps"]
        column = rng.choice(sorted(steps))
        ds = steps[column]
        if ds.shape[0] == 0:
            return

        def change(values: np.ndarray) -> np.ndarray:
            bad = rng.choice((-1, 0, 2**31 - 1 if values.dtype.itemsize == 4 else 2**62))
            values[:] = np.asarray(bad, dtype=np.int64).astype(values.dtype)
            return values

        _rewrite(ds, change)


def bad_meta(path: Path, rng: random.Random) -> None:
    """Meta and string attributes of the wrong kind, huge or hostile strings."""
    with h5py.File(path, "r+") as f:
        choice = rng.randrange(5)
        if choice == 0:
            f["meta"].attrs["command"] = "\x1b[2J\x1b]0;owned\x07" + "{" * 5000
        elif choice == 1:
            f["meta"].attrs["steps_recorded"] = np.float64("nan")
        elif choice == 2:
            f["meta"].attrs["error"] = "\x1b[31mred\r\u202eevil\b"
        elif choice == 3:
            f.attrs["format_version"] = rng.choice((-1, 2**62, "3"))
        else:
            run = _run_group(f, rng)
            run.attrs["name"] = "\x1b[2Jrun\u202e" * rng.choice((1, 1000))


def hostile_strings(path: Path, rng: random.Random) -> None:
    """Control characters in module paths and op names."""
    with h5py.File(path, "r+") as f:
        strings = f["strings"]
        values = strings.asstr()[...]
        evil = ["\x1b[2J\x1b[H", "\r\b\b\b", "\u202e", "\x1b]8;;http://x\x07link", "\x7f\x9b", "\n"]
        for i in rng.sample(range(len(values)), min(len(values), 20)):
            values[i] = str(values[i]) + rng.choice(evil)
        strings[...] = values


FAMILIES: dict[str, Mutator] = {
    "truncate": truncate,
    "flip_bytes": flip_bytes,
    "zero_metadata": zero_metadata,
    "external_link": external_link,
    "soft_link": soft_link,
    "external_storage": external_storage,
    "virtual_dataset": virtual_dataset,
    "huge_shape": huge_shape,
    "compressed_bomb": compressed_bomb,
    "out_of_range": out_of_range,
    "cycle": cycle,
    "wrong_dtype": wrong_dtype,
    "resized_column": resized_column,
    "bad_times": bad_times,
    "unsorted_rows": unsorted_rows,
    "nonsense_steps": nonsense_steps,
    "bad_meta": bad_meta,
    "hostile_strings": hostile_strings,
}


def make_cases(
    out: Path,
    per_family: int,
    families: tuple[str, ...] = tuple(FAMILIES),
    seed: int = 12,
    sources: tuple[str, ...] = SOURCES,
    members: Container[int] | None = None,
) -> list[Case]:
    """``per_family`` mutated copies of the sample traces per family, under ``out``; with
    ``members``, only those members of each family (the same files as with all of them)."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for family in families:
        mutate = FAMILIES[family]
        for i in range(per_family):
            member_seed = rng.randrange(2**32)  # drawn for every member: the same cases
            if members is not None and i not in members:
                continue
            source = SAMPLES / sources[i % len(sources)]
            target = out / f"{family}_{i}.h5"
            shutil.copyfile(source, target)
            mutate(target, random.Random(member_seed))
            cases.append(Case(family, str(target)))
    return cases


# --- running --------------------------------------------------------------------------------


def verb_argv(verb: str, trace: str, scratch: str) -> list[str]:
    """The command line that runs ``verb`` on ``trace`` (outputs go under ``scratch``)."""
    if verb == "project":
        return ["project", "--plan", "all", "--plan", "sqrt", trace]
    if verb == "plan":
        return ["plan", "--budget", "60%", "-o", os.path.join(scratch, "plan.json"), trace]
    if verb == "export":
        return ["export", "--plan", "sqrt", "-o", os.path.join(scratch, "curves.csv"), trace]
    if verb == "diff":
        return ["diff", trace, str(SAMPLES / "mlp.h5")]
    return [verb, trace]


_CONTROL = re.compile(
    "[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069]"
)
"""Characters a terminal acts on (ESC, \\r, \\b...) or that reorder text (bidi controls)."""

MUST_REFUSE = frozenset(
    {
        "external_link",
        "soft_link",
        "external_storage",
        "virtual_dataset",
        "huge_shape",
        "compressed_bomb",
    }
)
"""Families that no verb may read: each must exit 2."""


def run_one(verb: str, trace: str, scratch: str) -> str:
    """'ok' (exit 0/1), 'refused' (exit 2, one line), or 'traceback: ...'."""
    from ckview.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(verb_argv(verb, trace, scratch))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    except BaseException as e:  # what escapes main is the finding
        return f"traceback: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    text = err.getvalue()
    if "Traceback" in text or "Traceback" in out.getvalue():
        return "traceback: printed"
    if code not in (0, 1, 2):
        return f"traceback: exit {code}"
    if code == 2 and len(text.strip().splitlines()) != 1:
        return f"traceback: {len(text.strip().splitlines())} lines on stderr"
    leaked = _CONTROL.search(out.getvalue() + text)
    if leaked:
        return f"leaked: printed {leaked.group()!r}"
    return "refused" if code == 2 else "ok"


def _batch(cases_file: str, start: int) -> None:
    """Child process: run cases from ``start``, one JSON line per case on stdout."""
    os.environ.setdefault("CKVIEW_MEMORY_LIMIT", BATCH_MEMORY_LIMIT)
    os.environ.setdefault("CKVIEW_OPEN_TIMEOUT", "2")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    cases = json.loads(Path(cases_file).read_text())
    real_stdout = sys.stdout
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(start, len(cases)):
            results = {}
            for verb in cases[index]["verbs"]:
                print(json.dumps({"start": index, "verb": verb}), file=real_stdout, flush=True)
                results[verb] = run_one(verb, cases[index]["path"], scratch)
            print(json.dumps({"done": index, "results": results}), file=real_stdout, flush=True)


def run_cases(cases: list[Case], timeout: float) -> dict[int, dict[str, str]]:
    """Results by case index and verb: 'ok', 'refused', 'traceback: ...' or 'hung'."""
    results: dict[int, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases_file = Path(tmp) / "cases.json"
        cases_file.write_text(json.dumps([c.__dict__ for c in cases]))
        start = 0
        while start < len(cases):
            start = _run_batch(cases_file, start, timeout, results)
    return results


def _run_batch(cases_file: Path, start: int, timeout: float, results: dict) -> int:
    """Run from case ``start`` until the end or a hang; return the next case to run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--batch", str(cases_file), str(start)]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True
    )
    assert child.stdout is not None
    lines: list[str] = []
    current = {"index": start, "verb": "?"}
    event = threading.Event()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)
            event.set()
        event.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen = 0
    while True:
        event.clear()
        if not event.wait(timeout) and child.poll() is None and seen == len(lines):
            child.kill()
            child.wait()
            reader.join()
            child.stdout.close()
            index = current["index"]
            results.setdefault(index, {})[current["verb"]] = "hung"
            return index + 1
        while seen < len(lines):
            message = json.loads(lines[seen])
            seen += 1
            if "start" in message:
                current = {"index": message["start"], "verb": message["verb"]}
            else:
                results[message["done"]] = message["results"]
        if not reader.is_alive() and seen == len(lines):
            child.wait()
            child.stdout.close()
            if current["index"] not in results:  # the child died mid-case (a crash)
                results[current["index"]] = {current["verb"]: f"traceback: exit {child.returncode}"}
                return current["index"] + 1
            return len(json.loads(cases_file.read_text()))


def handled(case: Case, outcome: dict[str, str]) -> bool:
    """Whether every verb read the case or refused it as it should."""
    if len(outcome) != len(case.verbs):
        return False
    if case.family in MUST_REFUSE:
        return all(r == "refused" for r in outcome.values())
    return all(r in ("ok", "refused") for r in outcome.values())


def tally(cases: list[Case], results: dict[int, dict[str, str]]) -> dict[str, Counter]:
    """Per family: cases tried, handled (every verb ok or refused), hung, traceback, leaked (a
    control character printed, or a hostile file read instead of refused)."""
    table: dict[str, Counter] = {}
    for index, case in enumerate(cases):
        row = table.setdefault(case.family, Counter())
        row["tried"] += 1
        outcome = results.get(index, {})
        if any(v == "hung" for v in outcome.values()):
            row["hung"] += 1
        elif any(v.startswith("traceback") for v in outcome.values()):
            row["traceback"] += 1
        elif any(v.startswith("leaked") for v in outcome.values()) or (
            case.family in MUST_REFUSE and "ok" in outcome.values()
        ):
            row["leaked"] += 1
        else:
            row["handled"] += 1
    return table


COUNTS = ("tried", "handled", "hung", "traceback", "leaked")


def format_table(table: dict[str, Counter]) -> str:
    """The per-family counts as a text table, with a total row."""
    rows = [f"{'family':<18}" + "".join(f"{c:>10}" for c in COUNTS)]
    total = sum(table.values(), Counter())
    for family, row in [*table.items(), ("total", total)]:
        rows.append(f"{family:<18}" + "".join(f"{row[c]:>10}" for c in COUNTS))
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-family", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case and verb")
    parser.add_argument("--verbs", default=",".join(VERBS))
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--show", action="store_true", help="print each failing case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = make_cases(Path(tmp), args.per_family, tuple(args.families.split(",")))
        verbs = tuple(args.verbs.split(","))
        cases = [Case(c.family, c.path, verbs) for c in cases]
        results = run_cases(cases, args.timeout)
        table = tally(cases, results)
        print(format_table(table))
        if args.show:
            for index, case in enumerate(cases):
                bad = results.get(index, {})
                if case.family not in MUST_REFUSE:
                    bad = {v: r for v, r in bad.items() if r not in ("ok", "refused")}
                elif all(r == "refused" for r in bad.values()):
                    continue
                if bad:
                    print(case.family, Path(case.path).name, bad)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--batch":
        _batch(sys.argv[2], int(sys.argv[3]))
    else:
        main()
