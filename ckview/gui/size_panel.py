"""The size field beside the plan panel: open a second recording of the step at another size,
then show the step at any size (``ckview.app.sizing``) with the current plan, and whether it
fits the plan panel's budget. A thin widget: the window does the work on what it asks."""

from __future__ import annotations

import html

from PyQt6.QtCore import Qt, pyqtSignal
from PyQt6.QtWidgets import (
    QGridLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from ckview.app.style import PEAK_COLOR
from ckview.gui.fit import ElidedLabel

MAX_SIZE = 1 << 20
"""The largest size the fields take (``ckview.analysis.fit.MAX_SIZE``)."""

HINT = (
    "Open a recording of the same step at another size (ckview record --sizes batch=4,8 "
    "script.py --batch {}) to show the step at any size."
)


class SizePanel(QWidget):
    """Second recording, the two recorded sizes, the size to show and what it comes to."""

    openRequested = pyqtSignal()
    """The user asked to open the second recording (the window shows a file dialog)."""
    sizeChosen = pyqtSignal(int)
    """The user asked for the step at this size."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.open_button = QPushButton("Other size…")
        self.open_button.setToolTip(
            "Open a recording of the same step at another size (batch, sequence length)"
        )
        self.open_button.clicked.connect(self.openRequested.emit)
        self.second = ElidedLabel()
        """The second recording's file name."""
        self.size_a, self.size_b = _size_box(), _size_box()
        self.size_a.setToolTip("The size the shown run was recorded at")
        self.size_b.setToolTip("The size the other recording was recorded at")
        self.field = QLineEdit()
        self.field.setPlaceholderText("size to show, e.g. 16")
        self.field.setToolTip(
            "Show the step at this size, projected from the two recordings, with the current "
            "plan; Enter to show"
        )
        self.field.returnPressed.connect(self._chosen)
        self.show_button = QPushButton("Show")
        self.show_button.clicked.connect(self._chosen)
        self.note = QLabel(HINT)
        """What the size comes to: its peak, and whether it fits the budget."""
        self.note.setWordWrap(True)
        self.note.setTextFormat(Qt.TextFormat.RichText)

        grid = QGridLayout(self)
        grid.setContentsMargins(4, 4, 4, 4)
        grid.addWidget(self.open_button, 0, 0, 1, 2)
        grid.addWidget(self.second, 0, 2, 1, 3)
        grid.addWidget(QLabel("recorded at"), 1, 0)
        grid.addWidget(self.size_a, 1, 1)
        grid.addWidget(QLabel("and"), 1, 2)
        grid.addWidget(self.size_b, 1, 3)
        grid.addWidget(QLabel("show at"), 2, 0)
        grid.addWidget(self.field, 2, 1, 1, 3)
        grid.addWidget(self.show_button, 2, 4)
        grid.addWidget(self.note, 3, 0, 1, 5)
        grid.setColumnStretch(2, 1)
        self.set_second(None)

    def set_second(self, name: str | None, sizes: tuple[int, int] | None = None) -> None:
        """The second recording (None: none yet) and the sizes the two were recorded at, if
        their names say them."""
        self.second.show_text(name or "")
        for w in (self.size_a, self.size_b, self.field, self.show_button):
            w.setEnabled(name is not None)
        if sizes is not None:
            self.size_a.setValue(sizes[0])
            self.size_b.setValue(sizes[1])
        self.note.setText(HINT if name is None else "Give the two sizes, then a size to show.")

    def sizes(self) -> tuple[int, int]:
        return self.size_a.value(), self.size_b.value()

    def show_answer(self, text: str, fits: bool | None) -> None:
        """What a size comes to; in the peak colour, bold, when it does not fit."""
        shown = html.escape(text)
        if fits is False:
            shown = f"<span style='color:{PEAK_COLOR}'><b>{shown}</b></span>"
        self.note.setText(shown)

    def show_error(self, text: str) -> None:
        self.show_answer(text, False)

    def _chosen(self) -> None:
        text = self.field.text().strip()
        if not text.isdigit() or not 1 <= int(text) <= MAX_SIZE:
            self.show_error(f"a size is a whole number from 1 to {MAX_SIZE}, not {text!r}")
            return
        self.sizeChosen.emit(int(text))


def _size_box() -> QSpinBox:
    box = QSpinBox()
    box.setRange(1, MAX_SIZE)
    return box
