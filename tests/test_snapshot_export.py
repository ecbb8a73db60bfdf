"""``ckview export --snapshot``: a run of a trace as a PyTorch memory snapshot pickle
(NOTE [ Exported snapshots ] in ckview/snapshot/export.py)."""

from __future__ import annotations

import pickle
import pickletools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from snapshot_helpers import fixture_path, today

from ckview.analysis import memory_timeline
from ckview.snapshot import load_snapshot, replay_allocated, replay_peak, snapshot_to_trace
from ckview.snapshot.export import fake_addresses, trace_to_snapshot
from ckview.trace import open_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
FIXTURE = fixture_path()


def export(run_cli: Any, trace: Path, out: Path, *extra: str) -> dict[str, Any]:
    code, text, err = run_cli("export", "--snapshot", str(out), str(trace), *extra)
    assert code == 0, err
    assert f"wrote {out}" in text and "memory_viz" in text
    return load_snapshot(out)  # our own restricted unpickler reads it: plain data only


def allocs(snapshot: dict[str, Any], device: int = 0) -> Counter[Any]:
    """The allocations of a history, by size and frames (addresses differ after a round trip)."""
    return Counter(
        (e["size"], tuple((f["filename"], f["line"], f["name"]) for f in e["frames"]))
        for e in snapshot["device_traces"][device]
        if e["action"] == "alloc"
    )


@pytest.mark.skipif(FIXTURE is None, reason="the CUDA snapshot fixture is absent")
def test_fixture_round_trip_keeps_the_peak_and_the_frames(run_cli: Any, tmp_path: Path) -> None:
    assert FIXTURE is not None
    trace = tmp_path / "cnn.h5"
    assert run_cli("import", str(FIXTURE), "-o", str(trace))[0] == 0
    exported = export(run_cli, trace, tmp_path / "cnn.pickle")
    original = load_snapshot(FIXTURE)
    assert replay_peak(exported, 0) == replay_peak(original, 0) == 108268548
    assert allocs(exported) == allocs(original)


@pytest.mark.parametrize(
    ("name", "run"),
    [
        ("mlp.h5", "main"),
        ("transformer_compare.h5", "baseline"),
        ("transformer_compare.h5", "checkpointed"),
        ("cnn.h5", "main"),
    ],
)
def test_a_recorded_cpu_trace_exports_with_its_own_timeline(
    name: str, run: str, run_cli: Any, tmp_path: Path
) -> None:
    """NOTE [ Exported snapshots ]: the replay is the run's memory timeline, point by point."""
    exported = export(run_cli, SAMPLES / name, tmp_path / "out.pickle", "--run", run)
    with open_trace(SAMPLES / name) as trace:
        tables = trace.read_run(run)
    tl = memory_timeline(tables["storages"], tables["memory_events"])
    replay = replay_allocated(exported, 0)
    assert replay.max() == tl.total.max()
    assert replay[0] == tl.total[0]
    assert set(np.unique(replay)) <= set(np.unique(tl.total))
    assert len(exported["device_traces"]) == 1  # CPU storages go to device 0


def test_export_then_import_keeps_the_peak(run_cli: Any, tmp_path: Path) -> None:
    exported = export(run_cli, SAMPLES / "mlp.h5", tmp_path / "mlp.pickle")
    code, _, err = run_cli("import", str(tmp_path / "mlp.pickle"))
    assert code == 0, err
    with open_trace(tmp_path / "mlp.h5") as trace:
        t = trace.read_run("snapshot:cuda:0")
    tl = memory_timeline(t["storages"], t["memory_events"])
    assert tl.total.max() == replay_peak(exported, 0)
    with open_trace(SAMPLES / "mlp.h5") as trace:
        t = trace.read_run("main")
    assert tl.total.max() == memory_timeline(t["storages"], t["memory_events"]).total.max()


def test_import_then_export_of_every_device(tmp_path: Path) -> None:
    snapshot = today(devices=2)
    path = tmp_path / "t.h5"
    snapshot_to_trace(snapshot, path)
    with open_trace(path) as trace:
        for device in (0, 1):
            tables = trace.read_run(f"snapshot:cuda:{device}")
            exported = trace_to_snapshot(tables, tables["strings"])
            assert len(exported["device_traces"]) == device + 1
            assert replay_peak(exported, device) == replay_peak(snapshot, device)
            np.testing.assert_array_equal(
                np.unique(replay_allocated(exported, device)),
                np.unique(replay_allocated(snapshot, device)),
            )
            assert allocs(exported, device) == allocs(snapshot, device)


def test_the_pickle_is_torchs_own_protocol_and_plain_data(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "mlp.pickle"
    export(run_cli, SAMPLES / "mlp.h5", out)
    data = out.read_bytes()
    assert data[:2] == b"\x80\x04"  # protocol 4, as torch.cuda.memory._dump_snapshot
    opcodes = {op.name for op, _, _ in pickletools.genops(data)}
    assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "BUILD"}
    snapshot = pickle.loads(data)
    entry = snapshot["device_traces"][0][0]
    assert set(entry) == {"action", "addr", "size", "stream", "time_us", "frames"}
    assert {e["action"] for e in snapshot["device_traces"][0]} == {
        "alloc",
        "free_requested",
        "free_completed",
    }
    blocks = [b for s in snapshot["segments"] for b in s["blocks"]]
    assert blocks and all(b["state"] == "active_allocated" for b in blocks)


def test_fake_addresses_are_stable_distinct_and_aligned() -> None:
    sizes = np.array([1, 512, 513, 0, 4096])
    addresses = fake_addresses(sizes)
    np.testing.assert_array_equal(addresses, fake_addresses(sizes))
    assert (np.diff(addresses) >= np.maximum(sizes[:-1], 1)).all()
    assert (addresses % 512 == 0).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["transformer_compare.h5"], "has 2 runs; pick one with --run NAME"),
        (["mlp.h5", "--run", "nope"], "has no run 'nope'"),
        (["mlp.h5", "mlp.h5"], "pass a single TRACE"),
    ],
)
def test_snapshot_errors_are_one_line(
    args: list[str], message: str, run_cli: Any, tmp_path: Path
) -> None:
    argv = [str(SAMPLES / a) if a.endswith(".h5") else a for a in args]
    code, _, err = run_cli("export", "--snapshot", str(tmp_path / "x.pickle"), *argv)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("out", "message"), [("x.h5", "name it NAME.pickle"), ("nodir/x.pickle", "no directory")]
)
def test_bad_snapshot_paths(out: str, message: str, run_cli: Any, tmp_path: Path) -> None:
    code, _, err = run_cli("export", "--snapshot", str(tmp_path / out), str(SAMPLES / "mlp.h5"))
    assert code == 2 and message in err, err
