"""Start the explorer: ``ckview view TRACE…`` (and plain ``ckview TRACE``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def run(paths: Sequence[str], theme: str | None = None, axis: str | None = None) -> int:
    """Open a window on ``paths`` and run the Qt event loop; returns its exit code."""
    import pyqtgraph as pg
    from PyQt6.QtWidgets import QApplication

    from ckview.gui.main_window import MainWindow
    from ckview.gui.rundata import Axis
    from ckview.gui.style import LIGHT, THEMES

    pg.setConfigOptions(antialias=False, useNumba=False)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("ckview")
    app.setOrganizationName("ckview")
    window = MainWindow()
    saved = str(window.settings.value("theme", LIGHT.name))
    window.set_theme(THEMES.get(theme or saved, LIGHT))
    if axis is not None:
        window.set_axis(Axis(axis))
    window.show()
    window.open_paths(paths)
    return int(app.exec())
