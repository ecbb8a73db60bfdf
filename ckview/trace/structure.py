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
itself is then checked by value (``checks.py``) as each table is read. A file that passed is not
walked again by this process while its identity, size and modification time stay the same (the
explorer and a test reopen one trace many times; each walk costs a fork and about 50 ms); only a
file last modified ``SETTLED_S`` before its walk is remembered, because file times tick coarsely
(a jiffy): a file rewritten within one tick, or a new file at a reused inode, can show the same
time and size.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
import warnings

import h5py
import numpy as np

from .errors import corrupt, one_line

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


READ_FACTOR = 4
"""Memory reading a run takes, per byte its tables declare: ``validate`` and ``summary`` peak at
3.4x (measured on a 340 MB table of compressed zeros, ``benchmarks/fault_suite.py``'s bomb)."""


def memory_limit() -> int:
    """Bytes of tables one run may declare: CKVIEW_MEMORY_LIMIT, else the memory this process
    may still use (NOTE [ Memory this process may use ]) over READ_FACTOR."""
    text = os.environ.get("CKVIEW_MEMORY_LIMIT")
    if text:
        try:
            return int(text)
        except ValueError:
            pass
    return usable_memory() // READ_FACTOR


def usable_memory() -> int:
    """NOTE [ Memory this process may use ]
    The least of: the machine's available memory, what the address-space and data limits
    (``ulimit -v``, ``prlimit --as``) leave beside what the process already maps, and what its
    cgroup (a container, a systemd unit) leaves. The machine's free memory alone says nothing
    of a process started under a 3 GB limit on a 24 GB machine."""
    room = [_available_memory()]
    mapped = _status_kib("VmSize")
    for limit in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and mapped is not None:
            room.append(max(0, soft - mapped))
    room.append(_cgroup_room())
    return min(room)


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (None where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int:
    """Bytes the process's cgroup (v2, else v1) still allows; very large where none is set."""
    pairs = (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    )
    for limit_file, usage_file in pairs:
        try:
            with open(limit_file) as f:
                text = f.read().strip()
            if text == "max":
                return 1 << 62
            with open(usage_file) as f:
                return max(0, int(text) - int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return 1 << 62


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


Walked = tuple[str | None, int]
"""What a walk found: the first problem (None if none), and the most bytes one run declares."""

SETTLED_S = 2.0
"""How long before its walk a file must have last changed for its pass to be remembered."""
_passed: dict[tuple[int, ...], int] = {}
"""Files whose walk passed, (device, inode, size, mtime_ns), with the most memory one of their
runs declares: a limit at least that high passes them again."""


def written_here(path: str) -> None:
    """A trace this process has just written and closed (``TraceWriter.close``): its structure
    is h5py's own, so it passes without the walk in a child process (which costs a fork of a
    process that holds torch: a quarter of a second at the end of every recording, when the
    recorder validates what it wrote before it replaces the target)."""
    stat = os.stat(path)
    _passed[(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)] = 0


def check_structure(path: str) -> None:
    """Raise CorruptTraceError if ``path``'s HDF5 structure is damaged, hostile or too large,
    or cannot be walked within ``timeout_s()`` (NOTE [ Reading damaged and hostile files ])."""
    limit, seconds = memory_limit(), timeout_s()
    stat = os.stat(path)
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if limit >= _passed.get(key, 1 << 63):
        return
    if hasattr(os, "fork"):
        problem, declared = _in_fork(path, limit, seconds)
    else:
        problem, declared = _in_subprocess(path, limit, seconds)
    if problem:
        raise corrupt(path, problem)
    if time.time_ns() - stat.st_mtime_ns > SETTLED_S * 1e9:
        _passed[key] = declared


def _in_fork(path: str, limit: int, seconds: float) -> Walked:
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


def _wait_for(pid: int, fd: int, seconds: float) -> Walked:
    deadline = time.monotonic() + seconds
    data = b""
    while True:
        left = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return _timed_out(seconds), 0
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    _, status = os.waitpid(pid, 0)
    if not data:
        return f"reading its HDF5 structure crashed (status {status})", 0
    problem, declared = json.loads(data)
    return problem, declared


def _timed_out(seconds: float) -> str:
    return (
        f"its HDF5 structure could not be read within {seconds:g} s: damaged metadata makes "
        "HDF5 loop (CKVIEW_OPEN_TIMEOUT sets the limit)"
    )


def _in_subprocess(path: str, limit: int, seconds: float) -> Walked:
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
        return _timed_out(seconds), 0
    if done.returncode != 0 or not done.stdout.strip():
        return f"reading its HDF5 structure failed: {one_line(done.stderr)[-200:]}", 0
    problem, declared = json.loads(done.stdout)
    return problem, declared


def walk(path: str, limit: int) -> Walked:
    """Walk every link, object, attribute and chunk index of ``path``: the first problem (or
    None), and the most bytes of tables one run declares. Runs in the child of
    ``check_structure``; h5py's low-level API, for speed."""
    try:
        fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY)
        try:
            problem = _links(fid)
            return (problem, 0) if problem else _objects(fid, limit)
        finally:
            fid.close()
    except Exception as e:
        return one_line(e), 0


def _links(fid: h5py.h5f.FileID) -> str | None:
    """The first link that is not a hard link (soft links, external links), if any."""
    found: list[str] = []

    def visit(name: bytes, info: h5py.h5l.LinkInfo) -> int | None:
        if info.type != h5py.h5l.TYPE_HARD:
            kind = "an external link" if info.type == h5py.h5l.TYPE_EXTERNAL else "a soft link"
            found.append(f"/{name.decode(errors='replace')} is {kind}; a trace holds its own data")
            return 1
        return None

    fid.links.visit(visit, info=True)
    return found[0] if found else None


def _objects(fid: h5py.h5f.FileID, limit: int) -> Walked:
    objects: list[tuple[str, int, int]] = []

    def visit(name: bytes, info: h5py.h5o.ObjInfo) -> int | None:
        objects.append((name.decode(errors="replace"), info.type, info.num_attrs))
        return 1 if len(objects) > MAX_OBJECTS else None

    h5py.h5o.visit(fid, visit, info=True)
    if len(objects) > MAX_OBJECTS:
        return f"it holds more than {MAX_OBJECTS} HDF5 objects", 0
    declared: dict[str, int] = {}
    for name, kind, attributes in objects:
        where = "/" + name.lstrip("./")
        if where.count("/") > MAX_DEPTH:
            return f"{where} is nested deeper than a trace goes", 0
        node = h5py.h5o.open(fid, name.encode())
        problem = _attributes(node, attributes, where)
        if not problem and kind == h5py.h5o.TYPE_DATASET:
            problem = _dataset(node, where, limit)
            size = _declared_bytes(node)
            parts = where.split("/")
            for depth in range(2, len(parts)):
                group = "/".join(parts[:depth])
                declared[group] = declared.get(group, 0) + size
        if problem:
            return problem, 0
    runs = {group: size for group, size in declared.items() if group != "/runs"}
    for group, size in runs.items():
        if size > limit:
            return _too_large(group, size, limit), 0
    return None, max(runs.values(), default=0)


def _attributes(node: h5py.h5o.ObjectID, count: int, where: str) -> str | None:
    for index in range(count):
        attr = h5py.h5a.open(node, index=index)
        shape = attr.shape
        if int(np.prod(shape or (1,), dtype=object)) > MAX_ATTR_ELEMENTS:
            return f"an attribute of {where} is too large"
        value = np.empty(shape, dtype=attr.dtype)
        attr.read(value)
    return None


def _dataset(ds: h5py.h5d.DatasetID, where: str, limit: int) -> str | None:
    plist = ds.get_create_plist()
    layout = plist.get_layout()
    if layout == h5py.h5d.VIRTUAL:
        return f"{where} is a virtual dataset; a trace holds its own data"
    if plist.get_external_count():
        return f"{where} stores its data in another file; a trace holds its own data"
    if ds.shape is None or len(ds.shape) > 1:
        return f"{where} is not a 1-D dataset"
    if _declared_bytes(ds) > limit:
        return _too_large(where, _declared_bytes(ds), limit)
    if layout == h5py.h5d.CHUNKED:
        for i in range(ds.get_num_chunks()):
            ds.get_chunk_info(i)
    return None


def _declared_bytes(ds: h5py.h5d.DatasetID) -> int:
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
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"
