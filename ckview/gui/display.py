"""Can `ckview view` open a window here? Checked before Qt is imported (stdlib only).

On Linux, Qt's xcb platform plugin aborts the whole process (SIGABRT, "Could not load the Qt
platform plugin xcb") when one of the system libraries it links is missing; the PyQt6 wheel
bundles Qt but not these. Without a display there is no window at all. `display_problem` tells
both cases apart from a working desktop, so the command can say in one line what to do instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable, Mapping

FindLibrary = Callable[[str], str | None]

# The shared libraries Qt 6's xcb platform (libqxcb.so and libQt6XcbQpa.so.6, as shipped in the
# PyQt6-Qt6 wheel) and QtGui link: (name for find_library, soname, Debian/Ubuntu, Fedora).
_LIBRARIES: tuple[tuple[str, str, str, str], ...] = (
    ("xcb-cursor", "libxcb-cursor.so.0", "libxcb-cursor0", "xcb-util-cursor"),
    ("xcb-icccm", "libxcb-icccm.so.4", "libxcb-icccm4", "xcb-util-wm"),
    ("xcb-image", "libxcb-image.so.0", "libxcb-image0", "xcb-util-image"),
    ("xcb-keysyms", "libxcb-keysyms.so.1", "libxcb-keysyms1", "xcb-util-keysyms"),
    ("xcb-render-util", "libxcb-render-util.so.0", "libxcb-render-util0", "xcb-util-renderutil"),
    ("xcb-util", "libxcb-util.so.1", "libxcb-util1", "xcb-util"),
    ("xcb-randr", "libxcb-randr.so.0", "libxcb-randr0", "libxcb"),
    ("xcb-render", "libxcb-render.so.0", "libxcb-render0", "libxcb"),
    ("xcb-shape", "libxcb-shape.so.0", "libxcb-shape0", "libxcb"),
    ("xcb-shm", "libxcb-shm.so.0", "libxcb-shm0", "libxcb"),
    ("xcb-sync", "libxcb-sync.so.1", "libxcb-sync1", "libxcb"),
    ("xcb-xfixes", "libxcb-xfixes.so.0", "libxcb-xfixes0", "libxcb"),
    ("xcb-xkb", "libxcb-xkb.so.1", "libxcb-xkb1", "libxcb"),
    ("xcb", "libxcb.so.1", "libxcb1", "libxcb"),
    ("xkbcommon", "libxkbcommon.so.0", "libxkbcommon0", "libxkbcommon"),
    ("xkbcommon-x11", "libxkbcommon-x11.so.0", "libxkbcommon-x11-0", "libxkbcommon-x11"),
    ("X11-xcb", "libX11-xcb.so.1", "libx11-xcb1", "libX11-xcb"),
    ("X11", "libX11.so.6", "libx11-6", "libX11"),
    ("GL", "libGL.so.1", "libgl1", "libglvnd-glx"),
    ("EGL", "libEGL.so.1", "libegl1", "libglvnd-egl"),
    ("fontconfig", "libfontconfig.so.1", "libfontconfig1", "fontconfig"),
)

XCB_LIBRARIES: dict[str, str] = {name: debian for name, _, debian, _ in _LIBRARIES}
"""Library name (as `ctypes.util.find_library` takes it) → Debian/Ubuntu package."""

_SONAMES: dict[str, str] = {name: soname for name, soname, _, _ in _LIBRARIES}
_FEDORA: dict[str, str] = {name: fedora for name, _, _, fedora in _LIBRARIES}

_HEADLESS = "or write a report without a window: ckview export TRACE -o report.png"


def default_find_library(name: str) -> str | None:
    """Where the loader would find library `name` ("xcb-cursor"), or None if it would not.

    `ctypes.util.find_library` reads the ldconfig cache; when it finds nothing, the library's
    soname is tried with dlopen, which also honours LD_LIBRARY_PATH (and so avoids reporting a
    library missing on systems without an ldconfig cache).
    """
    found = ctypes.util.find_library(name)
    if found is not None or name not in _SONAMES:
        return found
    try:
        ctypes.CDLL(_SONAMES[name])
    except OSError:
        return None
    return _SONAMES[name]


def display_problem(
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    find_library: FindLibrary | None = None,
) -> str | None:
    """None when Qt can open a window; else one line saying what is wrong and what to do.

    `env`, `platform` and `find_library` default to `os.environ`, `sys.platform` and
    `default_find_library`. Only Linux is checked; `QT_QPA_PLATFORM` is honoured as Qt does,
    including a `;`-separated fallback list and `:options` suffixes.
    """
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    find = default_find_library if find_library is None else find_library
    if not platform.startswith("linux"):
        return None
    requested = env.get("QT_QPA_PLATFORM", "")
    if not requested:
        return None if env.get("WAYLAND_DISPLAY") else _xcb_problem(env, find)
    problem: str | None = None
    for candidate in requested.split(";"):
        problem = _platform_problem(candidate.split(":")[0].strip(), env, find)
        if problem is None:
            return None
    return problem


def _platform_problem(name: str, env: Mapping[str, str], find: FindLibrary) -> str | None:
    """The problem with the one platform plugin `name` (without options), if any."""
    if name.startswith("wayland"):
        if env.get("WAYLAND_DISPLAY"):
            return None
        return (
            f"QT_QPA_PLATFORM={name} but WAYLAND_DISPLAY is unset, so there is no Wayland "
            f"display; unset QT_QPA_PLATFORM or run it in a Wayland session, {_HEADLESS}"
        )
    if name == "xcb":
        return _xcb_problem(env, find)
    return None  # offscreen, minimal, vnc, eglfs, ...: the user asked for it


def _xcb_problem(env: Mapping[str, str], find: FindLibrary) -> str | None:
    """The problem with opening a window through Qt's xcb (X11) platform, if any."""
    if not env.get("DISPLAY") and env.get("WAYLAND_DISPLAY"):
        return (
            "QT_QPA_PLATFORM asks for xcb (X11) but DISPLAY is unset; unset QT_QPA_PLATFORM to "
            f"use Wayland, {_HEADLESS}"
        )
    if not env.get("DISPLAY"):
        return (
            "no display to open a window on (DISPLAY and WAYLAND_DISPLAY are unset); run it on "
            f"a desktop, with ssh -X, or under xvfb-run, {_HEADLESS}"
        )
    missing = missing_libraries(find)
    return _missing_message(missing) if missing else None


def missing_libraries(find: FindLibrary | None = None) -> list[str]:
    """The names in `XCB_LIBRARIES` that `find` (default: `default_find_library`) cannot find."""
    find = default_find_library if find is None else find
    return [name for name in XCB_LIBRARIES if find(name) is None]


def _missing_message(missing: list[str]) -> str:
    """One line naming the missing libraries and the commands that install them."""
    sonames = ", ".join(_SONAMES[name] for name in missing)
    debian = " ".join(XCB_LIBRARIES[name] for name in missing)
    fedora = " ".join(dict.fromkeys(_FEDORA[name] for name in missing))
    return (
        f"Qt's xcb platform needs system libraries that are missing ({sonames}); install them: "
        f"sudo apt install {debian} (Fedora: sudo dnf install {fedora}), {_HEADLESS}"
    )
