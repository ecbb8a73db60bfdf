"""``ckview import``: PyTorch memory snapshots into traces (ckview/snapshot, ckview/cli/import_.py).

The oracle is the snapshot's own replay (NOTE [ Snapshot replay ]): the imported run's memory
timeline must equal it, event by event, for the real fixture, for each layout torch has written
since 2.1, and for random histories.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from snapshot_helpers import fixture_path, random_history, today, torch_2_0, torch_2_1

from ckview.analysis import memory_timeline
from ckview.snapshot import (
    SnapshotError,
    load_snapshot,
    loads_plain,
    replay_allocated,
    replay_peak,
    snapshot_to_trace,
)
from ckview.snapshot.layout import ALLOC, FREES
from ckview.trace import open_trace, validate_trace
from ckview.trace.schema import Category, MemoryEventKind

pytestmark = [pytest.mark.torch, pytest.mark.gui]

FIXTURE = fixture_path()
needs_fixture = pytest.mark.skipif(
    FIXTURE is None,
    reason="the CUDA snapshot fixture (../shared/fixtures/cuda_snapshots) is absent",
)


def run_tables(path: Path, run: str) -> dict[str, Any]:
    with open_trace(path) as trace:
        tables = trace.read_run(run)
        tables["meta"] = trace.meta
    return tables


def assert_timeline_is_replay(snapshot: dict[str, Any], path: Path, device: int) -> None:
    """The imported timeline, after its SEEN events, is the replay at every alloc and free."""
    t = run_tables(path, f"snapshot:cuda:{device}")
    tl = memory_timeline(t["storages"], t["memory_events"])
    events = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
    replay = replay_allocated(snapshot, device)
    memory = [i + 1 for i, e in enumerate(events) if e["action"] == ALLOC or e["action"] in FREES]
    seen = int(np.sum(t["memory_events"]["kind"] == MemoryEventKind.SEEN))
    np.testing.assert_array_equal(tl.total[seen:], replay[[0, *memory]])
    assert tl.total.max() == replay.max() == replay_peak(snapshot, device)


def import_dict(snapshot: dict[str, Any], tmp_path: Path) -> Path:
    path = tmp_path / "imported.h5"
    snapshot_to_trace(snapshot, path)
    report = validate_trace(path)
    assert report.ok, report.problems
    return path


# --- the real fixture -------------------------------------------------------------------------


@needs_fixture
def test_fixture_imports_with_the_replayed_peak(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "cnn.h5"
    code, _, err = run_cli("import", str(FIXTURE), "-o", str(out))
    assert code == 0, err
    assert "next: ckview summary" in err and "peak 103 MiB" in err
    snapshot = load_snapshot(FIXTURE)
    assert_timeline_is_replay(snapshot, out, 0)
    assert validate_trace(out).ok
    t = run_tables(out, "snapshot:cuda:0")
    assert t["meta"].source == "snapshot"
    assert (t["storages"]["category"] == Category.UNKNOWN).all()  # never guessed
    assert len(t["frames"]["file"]) > 0 and (t["storages"]["stack"] >= 0).mean() > 0.9
    assert len(t["segments"]["nbytes"]) == 10  # 3 reserved before the history, 7 in it
    files = {t["strings"][i] for i in t["frames"]["file"]}
    assert "/oscar/home/jsolt/FourierNN/counterfactuals.py" in files
    steps = t["steps"]
    assert steps["step"].tolist() == [0] and steps["complete"].tolist() == [1]


@needs_fixture
def test_summary_and_export_on_an_imported_fixture(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "cnn.h5"
    assert run_cli("import", str(FIXTURE), "-o", str(out))[0] == 0
    code, text, err = run_cli("summary", str(out))
    assert code == 0, err
    assert "imported from a PyTorch memory snapshot" in text
    assert "unknown                 103 MiB  100.0%" in text
    assert "activations     unknown" in text and "activation " not in text
    assert "counterfactuals.py:102 (generate_counterfactuals)" in text
    png = tmp_path / "cnn.png"
    code, _, err = run_cli("export", str(out), "-o", str(png))
    assert code == 0 and png.stat().st_size > 10_000, err


@needs_fixture
def test_the_explorer_opens_an_imported_fixture(qtbot: Any, tmp_path: Path) -> None:
    from PyQt6.QtCore import QSettings
    from PyQt6.QtWidgets import QLabel

    from ckview.gui.main_window import MainWindow

    out = tmp_path / "cnn.h5"
    snapshot_to_trace(load_snapshot(FIXTURE), out)
    w = MainWindow(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    with qtbot.waitSignal(w.loaded, timeout=20000):
        w.open_paths([str(out)])
    run = w.current_run()
    assert run is not None and run.name == "snapshot:cuda:0" and run.peak.bytes == 108268548
    assert "nothing to plan" in w.plan.readout.text()
    sites = {t.module for t in run.live_tensors(run.peak.point)}
    assert "/oscar/home/jsolt/FourierNN/counterfactuals.py:102 (generate_counterfactuals)" in sites
    w.peak_action.trigger()
    assert "103 MiB" in w.inspector.findChildren(QLabel)[0].text()
    assert not w.grab().isNull()


def test_the_converter_takes_the_snapshot_dict(tmp_path: Path) -> None:
    """The recorder passes torch.cuda.memory._snapshot() (a dict) straight in."""
    path = tmp_path / "t.h5"
    assert snapshot_to_trace(today(devices=2), path) == ["snapshot:cuda:0", "snapshot:cuda:1"]
    with open_trace(path) as trace:
        assert trace.run_names == ["snapshot:cuda:0", "snapshot:cuda:1"]


# --- layouts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [today, torch_2_1, torch_2_0], ids=lambda f: f.__name__)
def test_each_layout_imports_as_its_replay(layout: Any, tmp_path: Path) -> None:
    snapshot = layout(2)
    path = import_dict(snapshot, tmp_path)
    for device in (0, 1):
        assert_timeline_is_replay(snapshot, path, device)
        t = run_tables(path, f"snapshot:cuda:{device}")
        st_ = t["storages"]
        # Live when the history began: the block freed first, the block never touched.
        assert (st_["alloc_ns"] == -1).sum() == 2
        assert sorted(st_["nbytes"][st_["alloc_ns"] == -1].tolist()) == [4096, 8192]
        assert t["strings"][int(st_["device"][0])] == f"cuda:{device}"


def test_segments_are_reserved_memory(tmp_path: Path) -> None:
    path = import_dict(today(1), tmp_path)
    seg = run_tables(path, "snapshot:cuda:0")["segments"]
    rows = sorted(
        zip(seg["nbytes"].tolist(), seg["alloc_ns"] >= 0, seg["free_ns"] >= 0, strict=True)
    )
    # One reserved before the history (never touched), one reserved in it and kept, one
    # expandable range mapped and unmapped.
    assert rows == [(2 << 20, False, False), (2 << 20, True, False), (2 << 20, True, True)]


def test_times_without_time_us_keep_the_order(tmp_path: Path) -> None:
    path = import_dict(torch_2_1(1), tmp_path)
    time = run_tables(path, "snapshot:cuda:0")["memory_events"]["time_ns"]
    assert (np.diff(time) >= 0).all()


def test_frames_and_stacks_form_a_prefix_tree(tmp_path: Path) -> None:
    path = import_dict(today(1), tmp_path)
    t = run_tables(path, "snapshot:cuda:0")
    from ckview.analysis.stacks import allocation_site, stack_frames

    sites = {
        allocation_site(t["frames"], t["stacks"], t["strings"], int(s))
        for s in t["storages"]["stack"]
    }
    assert "/src/forward.py:10 (forward)" in sites and "/src/model_init.py:10 (model_init)" in sites
    # forward and backward share the caller's frames: the stacks tree stores them once.
    parents = t["stacks"]["parent"]
    assert (parents < np.arange(len(parents))).all()
    stack = int(t["storages"]["stack"][-1])
    names = [t["strings"][t["frames"]["name"][f]] for f in stack_frames(t["stacks"], stack)]
    assert names[0].startswith("c10::") and names[-1] == "train"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(0, 60))
def test_random_histories_import_as_their_replay(
    seed: int, steps: int, tmp_path_factory: Any
) -> None:
    snapshot = random_history(np.random.default_rng(seed), steps)
    if not snapshot["segments"] and not snapshot["device_traces"][0]:
        return  # nothing at all: refused, tested below
    path = import_dict(snapshot, tmp_path_factory.mktemp("r"))
    assert_timeline_is_replay(snapshot, path, 0)


# --- hostile and broken input ----------------------------------------------------------------


class _Opens:
    """Pickles as a call of ``open(path, 'w')``: loading it would create ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


class _Shell:
    """Pickles as ``os.system('touch path')``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("payload", [_Opens, _Shell], ids=["open", "os.system"])
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_malicious_pickle_is_refused_and_runs_nothing(
    payload: Any, protocol: int, run_cli: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    snapshot = {"segments": [], "device_traces": [[{"action": "alloc", "x": payload(marker)}]]}
    evil.write_bytes(pickle.dumps(snapshot, protocol=protocol))
    code, out, err = run_cli("import", str(evil), "-o", str(tmp_path / "t.h5"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "refused" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "t.h5").exists()


def test_out_of_band_buffers_are_refused() -> None:
    buffers: list[Any] = []
    data = pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5, buffer_callback=buffers.append)
    with pytest.raises(SnapshotError, match="not a readable pickle"):
        loads_plain(data)


def test_protocol_5_pickles_import(run_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "p5.pickle"
    path.write_bytes(pickle.dumps(today(1), protocol=5))
    code, _, err = run_cli("import", str(path))
    assert code == 0, err
    assert (tmp_path / "p5.h5").exists()


def _fixture_bytes() -> bytes:
    return FIXTURE.read_bytes() if FIXTURE is not None else pickle.dumps(today(2), protocol=4)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda: _fixture_bytes()[: len(_fixture_bytes()) // 2], "not a readable pickle"),
        (lambda: b"", "not a readable pickle"),
        (lambda: b"\x80\x04garbage" * 10, "not a readable pickle"),
        (lambda: pickle.dumps([1, 2, 3]), r"not a memory snapshot \(it holds a list"),
        (lambda: pickle.dumps({"a": 1}), "no 'segments' or 'device_traces'"),
        (lambda: pickle.dumps({"segments": [], "device_traces": []}), "holds no memory history"),
        (lambda: pickle.dumps({"segments": 3}), "'segments' is not a list"),
        (
            lambda: pickle.dumps(
                {"device_traces": [[{"action": "alloc", "addr": "x", "size": 1}]]}
            ),
            r"device_traces\[0\]\[0\].addr is not an integer",
        ),
        (
            lambda: pickle.dumps(
                {"device_traces": [[{"action": "alloc", "addr": 2**70, "size": 1}]]}
            ),
            "out of range",
        ),
        (lambda: pickle.dumps({"segments": [{"device": 0}]}), r"segments\[0\] has no 'address'"),
        (lambda: b"\x80\x02" + b"]" * 200_000 + b".", "not a memory snapshot"),
        (
            lambda: pickle.dumps({"segments": [{"device": -1, "address": 0, "blocks": []}]}),
            r"segments\[0\].device is not a device ordinal",
        ),
        (
            lambda: pickle.dumps(
                {"device_traces": [[{"action": "alloc", "addr": 1, "size": 1, "frames": [3]}]]}
            ),
            r"bad.pickle is not a valid snapshot \(a frame is not a dict",
        ),
    ],
    ids=[
        "truncated",
        "empty",
        "garbage",
        "a list",
        "other dict",
        "empty snapshot",
        "segments not a list",
        "bad addr",
        "huge addr",
        "segment without address",
        "a deep stack",
        "negative device",
        "bad frame",
    ],
)
def test_broken_input_is_one_line_exit_2(
    content: Any, message: str, run_cli: Any, tmp_path: Path
) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content())
    existing = tmp_path / "bad.h5"
    existing.write_bytes(b"keep me")
    code, _, err = run_cli("import", str(path))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("ckview: error: ")
    import re

    assert re.search(message, err), err
    assert existing.read_bytes() == b"keep me"  # a failed import never replaces a file
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.pickle"], "cannot read"),
        (["."], "is a directory"),
        (["x.pickle", "-o", "x.txt"], "must end in .h5"),
        (["x.pickle", "-o", "nodir/x.h5"], "no directory"),
    ],
)
def test_bad_paths_are_one_line(
    args: list[str], message: str, run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.pickle").write_bytes(pickle.dumps(today(1)))
    code, _, err = run_cli("import", *args)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_output_that_is_the_snapshot_itself_is_refused(run_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "snap.h5"
    path.write_bytes(pickle.dumps(today(1)))
    code, _, err = run_cli("import", str(path), "-o", str(path))
    assert code == 2 and "is the snapshot itself" in err
    assert pickle.loads(path.read_bytes()) == today(1)


def test_importing_never_imports_torch(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(today(1)))
    code = (
        "import sys; from ckview.cli.main import main; "
        f"assert main(['import', {str(path)!r}]) == 0; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_snapshot_without_history_is_its_final_state(tmp_path: Path) -> None:
    """``_record_memory_history`` off: segments only; the blocks are live all along."""
    snapshot = today(1)
    del snapshot["device_traces"]
    path = import_dict(snapshot, tmp_path)
    t = run_tables(path, "snapshot:cuda:0")
    assert sorted(t["storages"]["nbytes"].tolist()) == [8192, 256 << 10]
    assert (t["memory_events"]["kind"] == MemoryEventKind.SEEN).all()
    assert memory_timeline(t["storages"], t["memory_events"]).total.max() == 8192 + (256 << 10)
    assert len(t["segments"]["nbytes"]) == 2


def test_a_profiler_snapshot_keeps_torchs_own_categories(tmp_path: Path) -> None:
    """``torch.cuda._memory_viz._profile_to_snapshot`` (the CPU profiler's memory timeline as a
    snapshot: blocks without addresses, no ``time_us``, a ``category`` on each event)."""
    torch = pytest.importorskip("torch")
    from torch.cuda._memory_viz import _profile_to_snapshot

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(32, 64)
    with torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    snapshot = loads_plain(pickle.dumps(_profile_to_snapshot(prof)))  # plain data only
    path = import_dict(snapshot, tmp_path)
    assert_timeline_is_replay(snapshot, path, 0)
    categories = set(run_tables(path, "snapshot:cuda:0")["storages"]["category"].tolist())
    assert {Category.ACTIVATION, Category.GRADIENT, Category.OPTIMIZER_STATE} <= categories


@pytest.mark.parametrize(
    ("verb", "message"),
    [
        (["plan", "--budget", "50%"], "nothing to checkpoint"),
        (["project", "--plan", "sqrt"], "no nn.Module ran"),
    ],
)
def test_planning_an_imported_snapshot_says_why_not(
    verb: list[str], message: str, run_cli: Any, tmp_path: Path
) -> None:
    path = import_dict(today(1), tmp_path)
    code, _, err = run_cli(verb[0], str(path), *verb[1:], "--run", "snapshot:cuda:0")
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_snapshot_joins_a_trace_being_written(tmp_path: Path) -> None:
    """The recorder's path: its own frames and stacks first, the snapshot's after them."""
    from ckview.snapshot import write_snapshot
    from ckview.trace import TraceWriter

    path = tmp_path / "t.h5"
    with TraceWriter(path) as writer:
        f = writer.intern("own.py")
        writer.append_root("frames", {"file": [f], "line": [1], "name": [f]})
        writer.append_root("stacks", {"frame": [0], "parent": [-1]})
        assert write_snapshot(writer, today(1)) == ["snapshot:cuda:0"]
    assert validate_trace(path).ok
    t = run_tables(path, "snapshot:cuda:0")
    assert t["stacks"]["frame"][0] == 0 and (t["stacks"]["frame"][1:] > 0).all()
    assert (t["storages"]["stack"] != 0).all()  # never the trace's own stack
    from ckview.analysis.stacks import allocation_site

    sites = {
        allocation_site(t["frames"], t["stacks"], t["strings"], int(s))
        for s in t["storages"]["stack"]
    }
    assert "/src/forward.py:10 (forward)" in sites


def test_a_bad_snapshot_creates_no_file(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="holds no memory history"):
        snapshot_to_trace({"segments": [], "device_traces": []}, tmp_path / "t.h5")
    assert not (tmp_path / "t.h5").exists()


def test_progress_shows_reading_then_converting(run_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(today(2)))
    code, out, err = run_cli("import", str(path), "--progress")
    assert code == 0 and out == ""
    lines = [line.split("\r")[-1] for line in err.split("\n")]
    assert lines[0].startswith("ckview: reading    [##############################]")
    assert lines[1].endswith("] 32/32 events")
    assert lines[2].startswith(f"ckview: wrote {tmp_path / 's.h5'}")
    assert run_cli("import", str(path))[2].count("\n") == 1  # not a terminal: no progress


def test_reserved_memory_is_the_segments_at_their_most(run_cli: Any, tmp_path: Path) -> None:
    from ckview.analysis.stacks import reserved_peak

    path = import_dict(today(1), tmp_path)
    seg = run_tables(path, "snapshot:cuda:0")["segments"]
    # 2 MiB reserved from the start, 2 MiB reserved and kept, then 2 MiB mapped and unmapped.
    assert reserved_peak(seg) == 6 << 20
    code, text, _ = run_cli("summary", str(path))
    assert code == 0 and "reserved       6.00 MiB  at most" in text
    back_to_back = {
        "nbytes": np.array([5, 7]),
        "alloc_ns": np.array([0, 10]),
        "free_ns": np.array([10, -1]),
    }
    assert reserved_peak(back_to_back) == 7  # a release and a reservation at one time
    assert reserved_peak({k: v[:0] for k, v in back_to_back.items()}) == 0
