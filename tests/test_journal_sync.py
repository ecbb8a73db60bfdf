"""The recording journal's records and its sync thread (NOTE [ The recording journal ], NOTE
[ Syncing the journal ] in ckview/trace/journal.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckview.trace import journal
from ckview.trace.journal import JournalWriter, read_journal


def _sync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ckview-journal-sync"]


def _until(condition: Any, seconds: float = 30.0) -> None:
    """Wait for ``condition()`` (the sync thread runs on its own)."""
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "the sync thread did not get there"
        time.sleep(0.005)


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (device, inode) of each file the sync thread fsyncs."""
    calls: list[tuple[int, int]] = []
    fsync = os.fsync

    def noted(fd: int) -> None:
        st = os.fstat(fd)
        calls.append((st.st_dev, st.st_ino))
        fsync(fd)

    monkeypatch.setattr(journal.os, "fsync", noted)
    return calls


def test_records_round_trip_whatever_their_arrays(tmp_path: Path) -> None:
    """Each array is written as it is (one writev of the parts), the CRC runs over them all."""
    path = tmp_path / "x.journal"
    writer = JournalWriter(path, {"command": ["x"]})
    arrays = {
        "a/b": np.arange(5),
        "a/empty": np.zeros(0, np.int64),
        "c/strided": np.arange(20, dtype=np.int32)[::3],
        "c/bytes": np.frombuffer(b"abc", np.uint8),
    }
    writer.append({"kind": "step", "n": 1}, arrays)
    writer.append({"kind": "step", "n": 2}, {})
    writer.remove()
    assert not path.exists()
    writer = JournalWriter(path, {"command": ["x"]})
    writer.append({"kind": "step", "n": 1}, arrays)
    writer.close()
    records = list(read_journal(path))
    assert [h.get("n") for h, _ in records] == [None, 1]
    assert records[1][1].keys() == arrays.keys()
    for name, a in arrays.items():
        np.testing.assert_array_equal(records[1][1][name], a, err_msg=name)
        assert records[1][1][name].dtype == a.dtype


def test_a_partial_write_goes_on_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writev that writes part of a record (a signal, a nearly full disk) is followed by
    writes of the rest, from the byte where it stopped."""
    writev = os.writev

    def short(fd: int, parts: list[Any]) -> int:
        return writev(fd, [memoryview(parts[0])[:3]])  # 3 bytes at a time

    path = tmp_path / "x.journal"
    writer = JournalWriter(path, {})
    monkeypatch.setattr(journal.os, "writev", short)
    writer.append({"kind": "step", "n": 1}, {"a/b": np.arange(4), "a/c": np.arange(3)})
    monkeypatch.undo()
    writer.close()
    [_, (header, arrays)] = read_journal(path)
    assert header["n"] == 1
    np.testing.assert_array_equal(arrays["a/c"], np.arange(3))


def test_the_sync_thread_syncs_the_journal_and_ends_with_its_writer(
    tmp_path: Path, synced: list[tuple[int, int]]
) -> None:
    path = tmp_path / "x.journal"
    before = _sync_threads()
    writer = JournalWriter(path, {})
    assert len(_sync_threads()) == len(before) + 1
    assert not synced  # nothing written since the journal was made: nothing to sync
    writer.append({"kind": "step"}, {"a/b": np.arange(3)})
    _until(lambda: synced)
    st = path.stat()
    assert set(synced) == {(st.st_dev, st.st_ino)}
    writer.close()
    assert _sync_threads() == before
    writer.remove()  # after close: only removes


def test_the_journal_is_synced_at_most_every_sync_ns(
    tmp_path: Path, synced: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal, "SYNC_NS", 3600 * 10**9)
    writer = JournalWriter(tmp_path / "x.journal", {})
    writer.append({"kind": "step"}, {})
    _until(lambda: synced)
    for _ in range(20):
        writer.append({"kind": "step"}, {})
    time.sleep(0.05)
    assert len(synced) == 1
    writer.close()  # does not wait for the hour


def test_a_collected_writer_stops_its_thread(tmp_path: Path) -> None:
    before = _sync_threads()
    writer = JournalWriter(tmp_path / "x.journal", {})
    writer.append({"kind": "step"}, {})
    del writer
    assert _sync_threads() == before


def test_a_removed_journal_is_not_synced_nor_made_again(
    tmp_path: Path, synced: list[tuple[int, int]]
) -> None:
    path = tmp_path / "x.journal"
    writer = JournalWriter(path, {})
    path.unlink()
    writer._syncer.written()  # as an append would
    writer.close()
    assert not synced and not path.exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_leaves_the_parents_thread_alone(tmp_path: Path) -> None:
    """A DataLoader worker drops the parent's journal writer (``TraceSink.forget_in_child``):
    closing or collecting it there neither waits for a thread the child lacks nor ends the
    parent's."""
    writer = JournalWriter(tmp_path / "x.journal", {})
    pid = os.fork()
    if pid == 0:  # the child: no assertion can report from here, the exit code does
        code = 1
        try:
            writer.close()
            del writer
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            pytest.fail("the child hung closing the journal")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert writer._syncer._thread.is_alive()
    writer.append({"kind": "step"}, {})
    writer.close()
    assert not writer._syncer._thread.is_alive()


def test_a_stop_on_the_sync_thread_itself_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cyclic collector may run on the sync thread and collect the writer there: its stop
    must not join the thread it runs on."""
    writer = JournalWriter(tmp_path / "x.journal", {})
    errors: list[BaseException] = []

    def stop_there(path: Path) -> None:
        try:
            writer._syncer.stop()
        except BaseException as exc:  # the thread would swallow it
            errors.append(exc)

    monkeypatch.setattr(journal, "_sync", stop_there)
    writer.append({"kind": "step"}, {})
    writer._syncer._thread.join(timeout=60)
    assert not errors and not writer._syncer._thread.is_alive()
    writer.close()


def test_a_discarded_journal_is_gone_at_once_and_spares_the_next(tmp_path: Path) -> None:
    """NOTE [ Discarding the journal ]: the path is free when discard returns (its blocks are
    freed on a thread), so a journal made at once at the same path survives that thread."""
    path = tmp_path / "t.journal"
    old = JournalWriter(path, {"run": "old"})
    old.append({"kind": "step"}, {"rows": np.arange(200_000)})
    old.remove()
    assert not path.exists()
    new = JournalWriter(path, {"run": "new"})
    new.append({"kind": "step"}, {"rows": np.arange(3)})
    _until(lambda: not any(t.name == "ckview-journal-discard" for t in threading.enumerate()))
    records = list(read_journal(path))
    assert [len(arrays["rows"]) for _, arrays in records[1:]] == [3]
    new.close()
    journal.discard_journal(path)
    journal.discard_journal(path)  # gone already: nothing to do
    assert not path.exists()


def test_a_journal_discarded_where_no_thread_can_start_is_closed_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the interpreter's exit no thread starts: the descriptor is closed at once instead."""
    path = tmp_path / "t.journal"
    path.write_bytes(b"x" * 4096)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    before = len(os.listdir("/proc/self/fd"))
    journal.discard_journal(path)
    assert not path.exists() and len(os.listdir("/proc/self/fd")) == before


class _Watched:
    """A lock that says when the sync thread asks for it."""

    def __init__(self, lock: Any) -> None:
        self.lock, self.by_sync = lock, threading.Event()

    def __enter__(self) -> Any:
        if threading.current_thread().name == "ckview-journal-sync":
            self.by_sync.set()
        return self.lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.lock.__exit__(*exc)


def test_a_record_keeps_its_descriptor_when_the_script_closed_the_sync_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [ The journal's descriptors ]: the script closes the descriptor the sync thread is
    fsyncing, the next record opens the journal at that number, and the sync ends while the
    record is written: the sync thread must not close the record's descriptor."""
    in_fsync, go, fsync = threading.Event(), threading.Event(), os.fsync
    syncing: list[int] = []

    def slow(fd: int) -> None:
        syncing.append(fd)
        in_fsync.set()
        go.wait(60)
        fsync(fd)

    path = tmp_path / "x.journal"
    writer = JournalWriter(path, {})
    lock = _Watched(journal._descriptors)
    monkeypatch.setattr(journal, "_descriptors", lock)
    monkeypatch.setattr(journal.os, "fsync", slow)
    writer.append({"kind": "step", "n": 1}, {})
    assert in_fsync.wait(60)
    os.close(syncing[0])  # the script closes every descriptor
    lock.by_sync.clear()
    write_all = journal._write_all

    def racing(fd: int, parts: list[Any]) -> None:
        assert fd == syncing[0]  # the record got the number back
        go.set()  # the sync ends now, while the record is written

        def closed() -> bool:
            try:
                os.fstat(fd)
            except OSError:
                return True
            return False

        _until(lambda: lock.by_sync.is_set() or closed())
        write_all(fd, parts)

    monkeypatch.setattr(journal, "_write_all", racing)
    writer.append({"kind": "step", "n": 2}, {"a/b": np.arange(3)})
    monkeypatch.setattr(journal, "_write_all", write_all)
    writer.close()
    assert [h.get("n") for h, _ in read_journal(path)] == [None, 1, 2]
