"""Build the native sources on first use, against the torch that runs, and load them.

NOTE [ Native build cache ]
Torch's C++ internals (RecordFunction's inlined accessors, ProfilerStateBase's vtable, the
profiler config's constructor) change between releases, and a layout change does not fail at
import: it fails silently. So a build serves exactly one torch version and one Python ABI:
``<cache>/native/<torch.__version__>-<cache_tag>/``, where ``<cache>`` is ``$CKVIEW_CACHE``,
else ``$XDG_CACHE_HOME/ckview``, else ``~/.cache/ckview``. A stamp beside the binary records the
torch version, the Python tag and a hash of the source. A binary whose stamp disagrees is never
imported: it is rebuilt. After import, the binary says which torch headers it was compiled
against (``built_for()``) and that must be the running torch too. The build (under a minute,
once) runs under a file lock, so concurrent processes (DDP ranks) build once and the others wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from recorder.native.rows import check_layout

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "ckrec.cpp",
        "ckrec_ops.cpp",
        "ckrec_hooks.cpp",
        "ckrec_marks.cpp",
        "ckattr.cpp",
        "ckattr_write.cpp",
    )
)
HEADERS = tuple(
    Path(__file__).with_name(name)
    for name in ("ckrec.h", "ckrec_internal.h", "ckattr.h", "ckattr_internal.h")
)
NAME = "ckview_native"
STAMP = "stamp.json"
CFLAGS = ("-O2", "-DNDEBUG")
"""NDEBUG as torch's own release builds: its headers' debug-only asserts read state that only a
debug build of torch sets (``RecordFunction::inputs()``). Part of the source hash."""
LOCK_TIMEOUT_S = 900
TORCH_BATON = "lock"
"""The file torch.utils.cpp_extension's FileBaton holds in the build directory while it builds."""
ENV_MODE = "CKVIEW_RECORDER"
MODES = ("auto", "native", "python")


class NativeRecorderError(RuntimeError):
    """The native recorder was asked for (``CKVIEW_RECORDER=native``) and cannot run; or the
    variable holds an unknown value. The message is one line."""


class Loaded(NamedTuple):
    """The extension, or None and a one-line reason why not."""

    ext: ModuleType | None
    reason: str


_memo: dict[tuple[str, ...], Loaded] = {}


def mode() -> str:
    """The path ``CKVIEW_RECORDER`` asks for: ``auto`` (default), ``native`` or ``python``."""
    value = os.environ.get(ENV_MODE, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise NativeRecorderError(f"{ENV_MODE}={value!r} is not one of native, python, auto")
    return value


def for_recording() -> ModuleType | None:
    """The extension a recording uses: with ``auto`` (the default) and ``native``; None for
    ``python``, and for ``auto`` where it cannot load: the Python recorder then runs, and this
    says why in one line. With ``native`` that is a NativeRecorderError (one line)."""
    wanted = mode()
    if wanted == "python":
        return None
    loaded = load()
    if loaded.ext is None:
        print(
            f"ckview: the native recorder is not available ({loaded.reason}); recording with "
            f"the Python recorder (slower; {ENV_MODE}=python chooses it without this line)",
            file=sys.stderr,
            flush=True,
        )
    return loaded.ext


def cache_dir() -> Path:
    """Where the build for the running torch and Python lives (NOTE [ Native build cache ])."""
    import torch

    root = os.environ.get("CKVIEW_CACHE")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "ckview"
    return base / "native" / f"{torch.__version__}-{sys.implementation.cache_tag}"


def load() -> Loaded:
    """The native extension for the running torch, built first if need be.

    Returns ``Loaded(None, reason)`` when ``CKVIEW_RECORDER=python``, or when no compiler is
    found, the build fails or the version check fails; the recorder then falls back to the
    Python path. With ``CKVIEW_RECORDER=native`` those failures raise NativeRecorderError.
    """
    wanted = mode()
    if wanted == "python":
        return Loaded(None, f"{ENV_MODE}=python")
    directory = cache_dir()
    key = (str(directory), os.environ.get("CXX", ""))
    if key not in _memo:
        _memo[key] = _load(directory)
    loaded = _memo[key]
    if loaded.ext is None and wanted == "native":
        raise NativeRecorderError(f"{ENV_MODE}=native, but {loaded.reason}")
    return loaded


def _load(directory: Path) -> Loaded:
    try:
        import torch

        expected = _expected_stamp()
        if refused(directory, expected) is None:
            return _checked(_import(directory), torch.__version__)
        directory.mkdir(parents=True, exist_ok=True)
        with _lock(directory):
            if refused(directory, expected) is not None:  # another process may have built it
                reason = _build(directory, expected)
                if reason:
                    return Loaded(None, reason)
            return _checked(_import(directory), torch.__version__)
    except _LockTimeout as exc:
        return Loaded(None, str(exc))
    except (ImportError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Loaded(None, f"the native recorder in {directory} could not be loaded ({first})")


def _expected_stamp() -> dict[str, str]:
    import torch

    return {
        "torch": torch.__version__,
        "python": sys.implementation.cache_tag or "",
        "source": _source_hash(),
    }


def _source_hash() -> str:
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    return digest.hexdigest()


def refused(directory: Path, expected: dict[str, str]) -> str | None:
    """Why the build in ``directory`` must not be imported, or None if it may be."""
    stamp = directory / STAMP
    if not stamp.is_file():
        return "not built yet"
    try:
        found = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return "its stamp is unreadable"
    if not isinstance(found, dict):
        return "its stamp is unreadable"
    if found.get("torch") != expected["torch"]:
        return f"it was built for torch {found.get('torch')}, not {expected['torch']}"
    if found.get("python") != expected["python"]:
        return f"it was built for {found.get('python')}, not {expected['python']}"
    if found.get("source") != expected["source"]:
        return "its source changed since"
    if not _binary(directory).is_file():
        return "its binary is missing"
    return None


def _binary(directory: Path) -> Path:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[-1]  # '.so': what cpp_extension writes
    return directory / f"{NAME}{suffix}"


def _import(directory: Path) -> ModuleType:
    path = _binary(directory)
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checked(ext: ModuleType, torch_version: str) -> Loaded:
    built = ext.built_for()
    if built != torch_version.split("+")[0]:
        return Loaded(
            None,
            f"the native recorder was compiled against torch {built}, "
            f"but torch {torch_version} runs",
        )
    layout = check_layout(ext)
    if layout:
        return Loaded(None, f"the native recorder's {layout}: this is a ckview bug")
    return Loaded(ext, f"native recorder for torch {torch_version}")


class _LockTimeout(Exception):
    pass


@contextlib.contextmanager
def _lock(directory: Path) -> Iterator[None]:
    from filelock import FileLock, Timeout  # a dependency of torch

    lock = FileLock(str(directory / "build.lock"))
    try:
        lock.acquire(timeout=LOCK_TIMEOUT_S)
    except Timeout:
        raise _LockTimeout(
            f"another process has been building the native recorder in {directory} for "
            f"{LOCK_TIMEOUT_S} s (lock {lock.lock_file}); remove the lock if it is stale"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _build(directory: Path, stamp: dict[str, str]) -> str | None:
    """Compiles the extension into ``directory``; returns why it failed, or None."""
    import torch

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler} not found; install g++ or set CXX)"
    (directory / STAMP).unlink(missing_ok=True)
    print(
        f"ckview: building the native recorder for torch {torch.__version__} "
        f"(once, under a minute) in {directory}",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    log = directory / "build.log"
    try:
        with _ninja_on_path(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from torch.utils import cpp_extension

            # A second build in one process (another cache directory) would otherwise be
            # renamed ckview_native_v1, a binary the stamp check then cannot find.
            cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(NAME, None)
            # torch's own baton: a build killed mid-way (Ctrl-C, a timeout) leaves it, and
            # every later build waits on it forever. Under our lock no other build runs, so
            # one found here is stale.
            (directory / TORCH_BATON).unlink(missing_ok=True)
            cpp_extension.load(
                name=NAME,
                sources=[str(path) for path in SOURCES],
                build_directory=str(directory),
                extra_cflags=list(CFLAGS),
                verbose=False,
            )
    except Exception as exc:  # the compiler's own words go to the log, one line to the user
        log.write_text(f"{type(exc).__name__}: {exc}\n" + _warnings_text(caught))
        return f"building the native recorder failed ({_first_line(exc)}); see {log}"
    log.write_text(f"built in {time.perf_counter() - started:.1f} s\n" + _warnings_text(caught))
    (directory / STAMP).write_text(json.dumps(stamp, indent=1))
    return None


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """The ``ninja`` wheel's binary, also when the venv's bin/ is not on PATH."""
    try:
        import ninja
    except ImportError:
        yield
        return
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(ninja.BIN_DIR), old])
    try:
        yield
    finally:
        os.environ["PATH"] = old


def _warnings_text(caught: list[warnings.WarningMessage] | None) -> str:
    return "".join(f"warning: {w.message}\n" for w in caught or [])


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() and line != lines[0]:
            return f"{lines[0].rstrip(':.')}: {line}"[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]
