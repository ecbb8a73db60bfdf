"""check_structure: a bounded look at a file's HDF5 structure before ckview reads it.

NOTE [ Reading damaged and hostile files ]
HDF5 trusts its own metadata. A damaged object header, heap or B-tree (32 zeroed bytes are
enough) can make HDF5 loop forever inside one call that holds the GIL, so no Python timer can
stop it; a crafted file can point outside itself (external links, external raw storage, virtual
datasets: one printed lines of /etc/passwd through its string table) or declare tables far
larger than the file (2^31 rows in 250 KB, compressed zeros). So before a trace is opened,
``check_structure`` walks all of its metadata (every link, object header, attribute and chunk
index; no raw data) in a forked child that the parent kills after ``CKVIEW_OPEN_TIMEOUT``
seconds (default 30). The walk refuses links other than hard links, external storage, virtual
datasets, deep or huge hierarchies and tables whose declared size exceeds the memory limit.
Once the walk has ended, reading the same metadata again in the parent ends too; the data
itself is then checked by value (``checks.py``) as each table is read.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import warnings

import h5py
import numpy as np

from .errors import CorruptTraceError, corrupt, one_line

DEFAULT_TIMEOUT_S = 30.0
MAX_DEPTH = 4
"""/runs/<run>/<table>/<column> is the deepest a trace goes."""
MAX_OBJECTS = 100_000
MAX_ATTR_ELEMENTS = 1 << 20
STRING_BYTES = 64
"""Memory one entry of the string table is counted for (a Python str and its slot)."""


def timeout_s() -> float:
    """Seconds the structure walk may take: CKVIEW_OPEN_TIMEOUT, else DEFAULT_TIMEOUT_S."""
    try:
        return max(0.1, float(os.environ.get("CKVIEW_OPEN_TIMEOUT", DEFAULT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def memory_limit() -> int:
    """Bytes of tables one run may declare: CKVIEW_MEMORY_LIMIT, else half the available
    memory (the analysis holds the run and about as much again)."""
    text = os.environ.get("CKVIEW_MEMORY_LIMIT")
    if text:
        try:
            return int(text)
        except ValueError:
            pass
    return _available_memory() // 2


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            continue
    return 1 << 62  # unknown: no limit


def check_structure(path: str) -> None:
    """Raise CorruptTraceError if ``path``'s HDF5 structure is damaged, hostile or too large,
    or cannot be walked within ``timeout_s()`` (NOTE [ Reading damaged and hostile files ])."""
    limit, seconds = memory_limit(), timeout_s()
    if hasattr(os, "fork"):
        problem = _in_fork(path, limit, seconds)
    else:
        problem = _in_subprocess(path, limit, seconds)
    if problem:
        raise corrupt(path, problem)


def _in_fork(path: str, limit: int, seconds: float) -> str | None:
    read_end, write_end = os.pipe()
    # Hold h5py's lock across fork() so that no other thread is inside HDF5 at that moment.
    with h5py._objects.phil, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: walk, report, leave without running any cleanup of the parent
        os.close(read_end)
        try:
            os.write(write_end, json.dumps(walk(path, limit)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        return _wait_for(pid, read_end, seconds)
    finally:
        os.close(read_end)


def _wait_for(pid: int, fd: int, seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    data = b""
    while True:
        left = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return _timed_out(seconds)
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    _, status = os.waitpid(pid, 0)
    if not data:
        return f"reading its HDF5 structure crashed (status {status})"
    result: str | None = json.loads(data)
    return result


def _timed_out(seconds: float) -> str:
    return (
        f"its HDF5 structure could not be read within {seconds:g} s: damaged metadata makes "
        "HDF5 loop (CKVIEW_OPEN_TIMEOUT sets the limit)"
    )


def _in_subprocess(path: str, limit: int, seconds: float) -> str | None:
    code = "import json,sys; from ckview.trace.structure import walk; "
    code += "print(json.dumps(walk(sys.argv[1], int(sys.argv[2]))))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, path, str(limit)],
            capture_output=True,
            text=True,
            timeout=seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _timed_out(seconds)
    if done.returncode != 0 or not done.stdout.strip():
        return f"reading its HDF5 structure failed: {one_line(done.stderr)[-200:]}"
    result: str | None = json.loads(done.stdout)
    return result


def walk(path: str, limit: int) -> str | None:
    """Walk every link, object, attribute and chunk index of ``path``; the first problem, or
    None. Runs in the child of ``check_structure``."""
    try:
        with h5py.File(path, "r") as f:
            return _Walker(limit).group(f, 0)[0]
    except CorruptTraceError as e:
        return e.detail
    except Exception as e:
        return one_line(e)


class _Walker:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.objects = 0

    def group(self, group: h5py.Group, depth: int) -> tuple[str | None, int]:
        """The first problem below ``group``, and the bytes its datasets declare."""
        problem = self.attributes(group)
        if problem:
            return problem, 0
        if depth > MAX_DEPTH:
            return f"{group.name} is nested deeper than a trace goes", 0
        declared = 0
        for name in group:
            self.objects += 1
            if self.objects > MAX_OBJECTS:
                return f"it holds more than {MAX_OBJECTS} HDF5 objects", 0
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
                return f"{group.name.rstrip('/')}/{name} is {kind}; a trace holds its own data", 0
            node = group[name]
            if isinstance(node, h5py.Group):
                problem, size = self.group(node, depth + 1)
            else:
                problem, size = self.dataset(node), _declared_bytes(node)
            if problem:
                return problem, 0
            declared += size
        # A run (or the root modules table) is read whole; the runs together never are.
        if group.name not in ("/", "/runs") and declared > self.limit:
            return _too_large(group.name, declared, self.limit), 0
        return None, declared

    def dataset(self, ds: h5py.Dataset) -> str | None:
        problem = self.attributes(ds)
        if problem:
            return problem
        if ds.is_virtual:
            return f"{ds.name} is a virtual dataset; a trace holds its own data"
        if ds.external:
            return f"{ds.name} stores its data in another file; a trace holds its own data"
        if ds.shape is None or len(ds.shape) > 1:
            return f"{ds.name} is not a 1-D dataset"
        if _declared_bytes(ds) > self.limit:
            return _too_large(ds.name, _declared_bytes(ds), self.limit)
        if ds.chunks is not None:
            for i in range(ds.id.get_num_chunks()):
                ds.id.get_chunk_info(i)
        return None

    def attributes(self, node: h5py.HLObject) -> str | None:
        for name in node.attrs:
            shape = node.attrs.get_id(name).shape
            if int(np.prod(shape or (1,))) > MAX_ATTR_ELEMENTS:
                return f"attribute {name!r} of {node.name} is too large"
            node.attrs[name]
        return None


def _declared_bytes(ds: h5py.Dataset) -> int:
    rows = int(np.prod(ds.shape or (1,), dtype=object))
    if h5py.check_string_dtype(ds.dtype) is not None or ds.dtype.kind == "O":
        return rows * STRING_BYTES
    return rows * ds.dtype.itemsize


def _too_large(name: str, declared: int, limit: int) -> str:
    return (
        f"{name} declares {_size(declared)} of data, more than the {_size(limit)} of memory "
        "it may use (CKVIEW_MEMORY_LIMIT sets the limit)"
    )


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
