"""Reading a PyTorch memory snapshot pickle without running any code in it.

NOTE [ A pickle is code ]
    ``pickle.load`` calls whatever callables a pickle names (``os.system`` via ``__reduce__``),
    so a downloaded snapshot could run anything. ``torch.cuda.memory._dump_snapshot`` pickles
    only dicts, lists, tuples, str, int, float, bool and None, which pickle encodes with opcodes
    of their own; no class is ever looked up. ``_PlainUnpickler.find_class`` therefore refuses
    every class, so a pickle that names one fails before anything is called, and out-of-band
    buffers (protocol 5) and persistent ids are refused too. Nothing but plain data is built.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from collections.abc import Callable
from typing import Any, NoReturn

from .errors import SnapshotError

IMPORT_HINT = "pass a file written by torch.cuda.memory._dump_snapshot()"


class _RefusedClass(pickle.UnpicklingError):
    """The pickle names a class or function (NOTE [ A pickle is code ])."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain containers, numbers, strings, bytes, None and bools only."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise _RefusedClass(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise _RefusedClass("a persistent id")


def loads_plain(data: bytes, label: str = "the snapshot") -> Any:
    """Unpickle ``data`` with the restricted unpickler (NOTE [ A pickle is code ])."""
    return _load(io.BytesIO(data), label)


def load_snapshot(
    path: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Read a snapshot pickle; SnapshotError (one line) if it is unreadable, refused, or not a
    snapshot. ``progress(bytes read, bytes in all)`` is called as the file is read."""
    label = os.fspath(path)
    if os.path.isdir(label):
        raise SnapshotError(f"{label} is a directory; {IMPORT_HINT}")
    try:
        with open(label, "rb") as f:
            reader = f if progress is None else _Counting(f, os.fstat(f.fileno()).st_size, progress)
            data = _load(reader, label)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SnapshotError(f"cannot read {label} ({reason}); check the path") from None
    check_snapshot(data, label)
    return data


class _Counting:
    """A binary file that tells ``progress`` how much of it the unpickler has read."""

    def __init__(self, f: Any, size: int, progress: Callable[[int, int], None]) -> None:
        self._f, self._size, self._progress, self._done = f, size, progress, 0

    def _count(self, n: int) -> None:
        self._done += n
        self._progress(self._done, self._size)

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._f.read(n)
        self._count(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        n: int = self._f.readinto(buffer)
        self._count(n)
        return n

    def readline(self) -> bytes:
        data: bytes = self._f.readline()
        self._count(len(data))
        return data


def _load(f: Any, label: str) -> Any:
    # NOTE [ No cyclic GC while unpickling ]: a snapshot is millions of dicts and lists, and
    # each thousand new containers start a collection that walks the older ones: 2.5x the
    # time of the load itself. Plain data holds no cycles to collect, so the collector waits.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _PlainUnpickler(f, buffers=None).load()
    except _RefusedClass as exc:
        raise SnapshotError(refused(label, str(exc))) from None
    except RecursionError:
        raise SnapshotError(
            f"{label} is nested too deeply to be a snapshot; {IMPORT_HINT}"
        ) from None
    except MemoryError:
        raise SnapshotError(f"{label} does not fit in memory; {IMPORT_HINT}") from None
    except OSError:
        raise
    except Exception as exc:  # pickle raises many types on damaged input
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise SnapshotError(unreadable(label, reason)) from None
    finally:
        if enabled:
            gc.enable()


def refused(label: str, what: str) -> str:
    """The message for a pickle that asks to load ``what`` (NOTE [ A pickle is code ])."""
    return (
        f"{label} is refused: it asks to load {what} (a pickle can run code, and a snapshot "
        f"holds only plain data); {IMPORT_HINT}"
    )


def unreadable(label: str, reason: str) -> str:
    """The message for a file that is not a pickle that can be read, and why."""
    return f"{label} is not a readable pickle ({reason}: truncated or damaged?); {IMPORT_HINT}"


def check_snapshot(data: Any, label: str = "the snapshot") -> None:
    """The top level of a snapshot: a dict with a list of ``segments`` and/or a list of
    ``device_traces`` (one list of events per device). SnapshotError otherwise."""
    if not isinstance(data, dict):
        raise SnapshotError(
            f"{label} is not a memory snapshot (it holds a {type(data).__name__}, not a dict "
            f"with 'segments' and 'device_traces'); {IMPORT_HINT}"
        )
    if "segments" not in data and "device_traces" not in data:
        keys = ", ".join(sorted(repr(k) for k in data)[:5]) or "none"
        raise SnapshotError(
            f"{label} is not a memory snapshot (no 'segments' or 'device_traces'; keys: "
            f"{keys}); {IMPORT_HINT}"
        )
    for key in ("segments", "device_traces"):
        if not isinstance(data.get(key, []), list):
            raise SnapshotError(f"{label}: '{key}' is not a list; {IMPORT_HINT}")
    for i, events in enumerate(data.get("device_traces", [])):
        if not isinstance(events, list):
            raise SnapshotError(f"{label}: device_traces[{i}] is not a list; {IMPORT_HINT}")
