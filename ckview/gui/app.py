"""Start the explorer: ``ckview view TRACE…`` (and plain ``ckview TRACE``)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt_runtime.plan import Plan
    from ckview.gui.main_window import MainWindow

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], None]


def run(
    paths: Sequence[str],
    theme: str | None = None,
    axis: str | None = None,
    compare: bool = False,
    plan: tuple[Plan, str] | None = None,
) -> int:
    """Open a window on ``paths`` and run the Qt event loop; returns its exit code. With
    ``compare`` (the ranks of a distributed run) the Compare tab shows them side by side;
    ``plan`` (a plan and where it was read from) is applied to the run shown first."""
    import pyqtgraph as pg
    from PyQt6.QtWidgets import QApplication

    from ckview.app.run import Axis
    from ckview.app.style import LIGHT, THEMES
    from ckview.gui.main_window import MainWindow

    pg.setConfigOptions(antialias=False, useNumba=False)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("ckview")
    app.setOrganizationName("ckview")
    window = MainWindow()
    sys.excepthook = error_hook(window)
    saved = str(window.settings.value("theme", LIGHT.name))
    window.set_theme(THEMES.get(theme or saved, LIGHT))
    if axis is not None:
        window.set_axis(Axis(axis))
    window.show()
    if compare:
        window.show_compare(side_by_side=True)
    if plan is not None:
        window.apply_plan_on_open(*plan)
    window.open_paths(paths)
    return int(app.exec())


def error_hook(window: MainWindow) -> ExceptHook:
    """An excepthook for the event loop: a bug in a slot prints its traceback and opens an
    error dialog instead of aborting the app (PyQt6's default for unhandled exceptions)."""

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        traceback.print_exception(kind, value, tb)
        window.show_error(
            f"unexpected error: {kind.__name__}: {value} (the traceback is on the terminal; "
            "please report it)"
        )

    return hook
