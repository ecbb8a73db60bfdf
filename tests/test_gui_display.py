"""The "can a window open here?" check run by `ckview view` before Qt is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckview.gui.display import (
    XCB_LIBRARIES,
    FindLibrary,
    default_find_library,
    display_problem,
    missing_libraries,
)


def _all_found(name: str) -> str | None:
    return f"lib{name}.so"


def _missing(*absent: str) -> FindLibrary:
    def find(name: str) -> str | None:
        return None if name in absent else f"lib{name}.so"

    return find


def _problem(
    env: dict[str, str], platform: str = "linux", find: FindLibrary = _all_found
) -> str | None:
    return display_problem(env=env, platform=platform, find_library=find)


def _assert_one_line(message: str | None) -> str:
    assert message is not None
    assert "\n" not in message and message.strip() == message
    return message


@pytest.mark.parametrize("value", ["offscreen", "minimal", "vnc", "offscreen:size=800x600"])
def test_headless_platform_requested_is_fine(value: str) -> None:
    assert _problem({"QT_QPA_PLATFORM": value}, find=_missing("xcb-cursor")) is None


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_not_linux_is_not_checked(platform: str) -> None:
    assert _problem({}, platform=platform, find=_missing(*XCB_LIBRARIES)) is None


def test_no_display_says_so_in_one_line() -> None:
    message = _assert_one_line(_problem({}))
    assert "DISPLAY" in message and "WAYLAND_DISPLAY" in message
    assert "ckview export" in message


def test_wayland_session_is_fine() -> None:
    assert _problem({"WAYLAND_DISPLAY": "wayland-0"}, find=_missing("xcb-cursor")) is None


def test_display_with_all_libraries_is_fine() -> None:
    assert _problem({"DISPLAY": ":0"}) is None


def test_display_with_xcb_cursor_missing_names_the_package() -> None:
    message = _assert_one_line(_problem({"DISPLAY": ":0"}, find=_missing("xcb-cursor")))
    assert "libxcb-cursor0" in message and "apt install" in message
    assert "xcb-util-cursor" in message  # the Fedora package
    assert "ckview export" in message
    assert "libxcb-icccm4" not in message  # only what is missing


def test_several_missing_libraries_are_all_named_once() -> None:
    find = _missing("xcb-icccm", "xcb-keysyms", "xcb-shm", "xcb-sync")
    message = _assert_one_line(_problem({"DISPLAY": ":0"}, find=find))
    assert "sudo apt install libxcb-icccm4 libxcb-keysyms1 libxcb-shm0 libxcb-sync1" in message
    assert "(Fedora: sudo dnf install xcb-util-wm xcb-util-keysyms libxcb)" in message


def test_wayland_requested_without_wayland_display() -> None:
    message = _assert_one_line(_problem({"QT_QPA_PLATFORM": "wayland", "DISPLAY": ":0"}))
    assert "WAYLAND_DISPLAY" in message
    assert _problem({"QT_QPA_PLATFORM": "wayland-egl", "WAYLAND_DISPLAY": "w"}) is None


def test_xcb_requested_runs_the_xcb_checks() -> None:
    assert "WAYLAND_DISPLAY are unset" in _assert_one_line(_problem({"QT_QPA_PLATFORM": "xcb"}))
    env = {"QT_QPA_PLATFORM": "xcb", "WAYLAND_DISPLAY": "wayland-0"}
    assert "unset QT_QPA_PLATFORM" in _assert_one_line(_problem(env))
    env["DISPLAY"] = ":0"
    assert _problem(env) is None
    assert "libxcb-cursor0" in _assert_one_line(_problem(env, find=_missing("xcb-cursor")))


def test_fallback_list_is_fine_if_any_platform_is() -> None:
    find = _missing("xcb-cursor")
    assert _problem({"QT_QPA_PLATFORM": "wayland;xcb", "DISPLAY": ":0"}) is None
    message = _problem({"QT_QPA_PLATFORM": "wayland;xcb", "DISPLAY": ":0"}, find=find)
    assert "libxcb-cursor0" in _assert_one_line(message)


def test_other_requested_platform_is_trusted() -> None:
    assert _problem({"QT_QPA_PLATFORM": "eglfs"}) is None


def test_missing_libraries_uses_the_finder() -> None:
    assert missing_libraries(_missing("EGL", "GL")) == ["GL", "EGL"]
    assert missing_libraries(_all_found) == []


def test_default_finder_runs_here() -> None:
    assert default_find_library("c") is not None  # libc is always there
    assert default_find_library("ckview-no-such-library") is None
    result = display_problem(env={"DISPLAY": ":0"}, platform="linux")
    assert result is None or "apt install" in _assert_one_line(result)
    assert display_problem() is None or isinstance(display_problem(), str)


def test_import_does_not_load_qt() -> None:
    code = "import sys, ckview.gui.display; assert 'PyQt6' not in sys.modules, 'PyQt6 imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_readme_lists_every_debian_package() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Linux desktop: system packages", 1)[1]
    missing = [package for package in XCB_LIBRARIES.values() if package not in section.split()]
    assert missing == []
