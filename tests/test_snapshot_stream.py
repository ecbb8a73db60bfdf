"""The streaming snapshot reader (ckview/snapshot/stream.py, NOTE [ Streaming a snapshot ]).

The oracle is the restricted C unpickler: a streamed file must give the very same trace,
table by table, and be refused exactly when it asks for code. Memory is checked by counting
(the reader's memo, Python allocations per event), never by timing.
"""

from __future__ import annotations

import os
import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from snapshot_helpers import fixture_path, long_history, random_history, today, torch_2_0, torch_2_1

from ckview.snapshot import SnapshotConverter, SnapshotError
from ckview.snapshot import stream as stream_module
from ckview.snapshot.stream import read_snapshot
from ckview.trace import open_trace, validate_trace

FIXTURE = fixture_path()
STREAM, UNPICKLE = 0, 1 << 62  # stream_above: always, never


def import_file(path: Path, out: Path, stream_above: int) -> list[str]:
    converter = SnapshotConverter(str(path))
    rest = read_snapshot(path, converter, stream_above=stream_above)
    return converter.to_trace(rest, out, source=str(path))


def tables(path: Path) -> dict[str, Any]:
    """Every table of every run, and the root tables, as numpy arrays."""
    out: dict[str, Any] = {}
    with open_trace(path) as trace:
        for name in trace.run_names:
            run = trace.read_run(name)
            out["strings"] = list(run.pop("strings"))
            out[name] = run
    return out


def assert_same_tables(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tables(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
        assert a.dtype == b.dtype, where
    else:
        assert a == b, where


def assert_streams_as_unpickled(path: Path, tmp_path: Path) -> None:
    streamed, unpickled = tmp_path / "streamed.h5", tmp_path / "unpickled.h5"
    assert import_file(path, streamed, STREAM) == import_file(path, unpickled, UNPICKLE)
    assert validate_trace(streamed).ok
    assert_same_tables(tables(streamed), tables(unpickled))


def streamed_builder(path: Path) -> stream_module._Builder:
    """Run both passes by hand: the builder, for its counts (no fallback allowed)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        plan = stream_module._scan(f, size, None)
        builder = stream_module._Builder(f, size, plan, SnapshotConverter(), None)
        builder.rest(builder.run())
    return builder


# --- the same trace as the C unpickler ---------------------------------------------------------


@pytest.mark.skipif(FIXTURE is None, reason="the CUDA snapshot fixture is absent")
def test_the_real_fixture_streams_as_unpickled(tmp_path: Path) -> None:
    assert FIXTURE is not None
    assert_streams_as_unpickled(FIXTURE, tmp_path)
    assert streamed_builder(FIXTURE).histories  # streamed, not fallen back


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize(
    "make",
    [
        lambda: today(2),
        lambda: torch_2_1(2),
        lambda: torch_2_0(1),
        lambda: long_history(3000),
        lambda: random_history(np.random.default_rng(7), 60),
    ],
    ids=["today", "torch_2_1", "torch_2_0", "long", "random"],
)
def test_synthetic_snapshots_stream_as_unpickled(make: Any, protocol: int, tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(make(), protocol=protocol))
    assert_streams_as_unpickled(path, tmp_path)
    assert streamed_builder(path).histories


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_plain_value_reads_as_unpickled(protocol: int, tmp_path: Path) -> None:
    extra = [1.5, None, True, False, (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), -5, 70000]
    extra += [2**40, -(2**70), 2**2100, "z" * 300, "é\ud800", {"k": [{}]}, [[[]]]]
    if protocol >= 3:
        extra += [b"x", b"y" * 300]
    if protocol >= 5:
        extra.append(bytearray(b"ab"))
    snapshot = {**today(1), "extra": extra}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
    rest = read_snapshot(path, SnapshotConverter(), stream_above=STREAM)
    assert rest["extra"] == extra
    assert [type(v) for v in rest["extra"]] == [type(v) for v in extra]


# --- bounded memory, by counting -------------------------------------------------------------


def test_the_memo_keeps_what_is_fetched_later_not_the_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memo holds the shared frames and strings and the frames lists whose second event
    is still to come, however long the history (NOTE [ Streaming a snapshot ])."""
    monkeypatch.setattr(stream_module, "BLOCK", 4096)
    peaks = []
    for blocks in (2000, 20000):
        path = tmp_path / f"{blocks}.pickle"
        path.write_bytes(pickle.dumps(long_history(blocks), protocol=4))
        builder = streamed_builder(path)
        assert builder.histories[0].count == len(long_history(blocks)["device_traces"][0])
        peaks.append(builder.memo_peak)
    assert peaks[1] <= peaks[0] + 10 < 200  # 20 frames, 7 strings, the frames lists in flight


def _python_peak(path: Path, stream_above: int) -> int:
    converter = SnapshotConverter()
    tracemalloc.start()
    try:
        read_snapshot(path, converter, stream_above=stream_above)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_per_event_is_the_converters_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming: tens of bytes per event (numpy columns); unpickling: hundreds (the dicts)."""
    monkeypatch.setattr(stream_module, "BLOCK", 1 << 16)
    small, big = tmp_path / "small.pickle", tmp_path / "big.pickle"
    small.write_bytes(pickle.dumps(long_history(1000), protocol=4))
    big.write_bytes(pickle.dumps(long_history(16000), protocol=4))
    events = 3 * 15000
    per_event = {
        mode: (_python_peak(big, mode) - _python_peak(small, mode)) / events
        for mode in (STREAM, UNPICKLE)
    }
    assert per_event[STREAM] < 120 and per_event[UNPICKLE] > 300, per_event


# --- hostile and broken input ------------------------------------------------------------------


class _Shell:
    """Pickles as ``os.system('touch path')``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_malicious_pickle_is_refused_before_anything_is_built(
    protocol: int, tmp_path: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_module, "STREAM_ABOVE", 0)
    marker, evil = tmp_path / "pwned", tmp_path / "evil.pickle"
    snapshot = today(1)
    snapshot["device_traces"][0][3]["frames"] = _Shell(marker)
    evil.write_bytes(pickle.dumps(snapshot, protocol=protocol))
    built = []
    monkeypatch.setattr(stream_module._Builder, "run", lambda self: built.append(self))
    code, out, err = run_cli("import", str(evil), "-o", str(tmp_path / "t.h5"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "is refused: it asks to load" in err and "Traceback" not in err
    if protocol < 4:
        assert "posix.system" in err  # GLOBAL names it
    assert not marker.exists() and not built and not (tmp_path / "t.h5").exists()


def _p4(body: bytes) -> bytes:
    return b"\x80\x04" + body


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            lambda: _fixture_bytes()[: len(_fixture_bytes()) // 2],
            "ends (before its STOP|in the middle)",
        ),
        (lambda: _p4(b"h\x05."), "fetches memo entry 5 before storing it"),
        (lambda: _p4(b"j\x00\x00\x01\x00."), "fetches memo entry 65536 before storing it"),
        (lambda: _p4(b"X\x00\x00\x00\x80abc."), "declares 2147483648 bytes, more than"),
        (
            lambda: _p4(b"\x8d" + (2**62).to_bytes(8, "little") + b"."),
            "declares 4611686018427387904",
        ),
        (lambda: _p4(b"\x8b\xff\xff\xff\x00."), "declares 16777215 bytes"),
        (lambda: _p4(b"\xff."), "unknown opcode 0xff"),
        (lambda: _p4(b"\x94."), "IndexError"),  # MEMOIZE of nothing
        (lambda: _p4(b"K\x01K\x02u."), "IndexError"),  # SETITEMS without a mark
        (lambda: _p4(b"]K\x01K\x02s."), "SETITEMS on a list"),
        (lambda: _p4(b"}(K\x01u."), "odd number"),
        (lambda: _p4(b"}(]K\x01u."), "TypeError"),  # an unhashable key
        (lambda: _p4(b"K\x01\x87."), "more items than the stack holds"),
        (
            lambda: _p4(b"]" * 100_000 + b"a" * 99_999 + b"."),
            r"not a memory snapshot \(it holds a list",
        ),
        (lambda: _deep_event(100_000), r"device_traces\[0\]\[0\] is not an event"),
    ],
    ids=[
        "truncated",
        "unknown memo",
        "unknown long memo",
        "huge string",
        "huge string8",
        "huge long",
        "unknown opcode",
        "memoize nothing",
        "no mark",
        "setitems on a list",
        "odd setitems",
        "unhashable key",
        "short tuple",
        "nested lists",
        "nested event",
    ],
)
def test_broken_pickles_are_one_line(
    content: Any, message: str, tmp_path: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_module, "STREAM_ABOVE", 0)
    path = tmp_path / "bad.pickle"
    path.write_bytes(content())
    code, _, err = run_cli("import", str(path))
    assert code == 2 and err.count("\n") == 1 and err.startswith("ckview: error: "), err
    import re

    assert re.search(message, err), err
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".h5", ".partial")]


def _fixture_bytes() -> bytes:
    return FIXTURE.read_bytes() if FIXTURE is not None else pickle.dumps(today(2), protocol=4)


def _deep_event(depth: int) -> bytes:
    """``{"device_traces": [[[[...]]]]}``: an event that is a list nested ``depth`` deep."""
    return _p4(b"}\x8c\x0ddevice_traces]]" + b"]" * depth + b"a" * (depth - 1) + b"aas.")


# --- what the streaming builder leaves to the C unpickler -----------------------------------


def _shared_event() -> dict[str, Any]:
    snapshot = today(1)
    events = snapshot["device_traces"][0]
    events.append(events[3])  # the same event dict twice: the pickle fetches it back
    return snapshot


def _shared_history() -> dict[str, Any]:
    snapshot = today(1)
    snapshot["again"] = snapshot["device_traces"][0]  # a history fetched back elsewhere
    return snapshot


@pytest.mark.parametrize(
    ("make", "protocol"),
    [(lambda: today(1), 0), (lambda: today(1), 1), (_shared_event, 4), (_shared_history, 4)],
    ids=["protocol 0", "protocol 1", "an event fetched back", "a history fetched back"],
)
def test_layouts_it_cannot_stream_fall_back_to_the_same_trace(
    make: Any, protocol: int, tmp_path: Path
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(make(), protocol=protocol))
    assert_streams_as_unpickled(path, tmp_path)
    with pytest.raises(stream_module._Fallback):
        streamed_builder(path)


def test_a_refused_pickle_is_refused_by_the_fallback_too(tmp_path: Path) -> None:
    """Protocol 1 goes to the C unpickler, whose find_class refuses every class."""
    marker, evil = tmp_path / "pwned", tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"device_traces": [[_Shell(marker)]]}, protocol=1))
    with pytest.raises(SnapshotError, match="is refused"):
        read_snapshot(evil, SnapshotConverter(str(evil)), stream_above=STREAM)
    assert not marker.exists()


# --- the command ------------------------------------------------------------------------------


def test_progress_shows_scanning_then_reading(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_module, "STREAM_ABOVE", 0)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(long_history(2000), protocol=4))
    code, out, err = run_cli("import", str(path), "--progress")
    assert code == 0 and out == "", err
    lines = [line.split("\r")[-1] for line in err.split("\n")]
    assert lines[0].startswith("ckview: scanning   [##############################]")
    assert lines[1].startswith("ckview: reading    [##############################]")
    assert lines[1].endswith(" MiB") and lines[2].startswith(f"ckview: wrote {tmp_path / 's.h5'}")
