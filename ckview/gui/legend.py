"""A legend beside a plot, never on it: filled swatches for stacked categories and line samples
for curves, painted as a plain widget so that it takes layout space next to the plot area."""

from __future__ import annotations

from dataclasses import dataclass

from PyQt6.QtCore import QLineF, QRectF, QSize, Qt
from PyQt6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PyQt6.QtWidgets import QSizePolicy, QWidget

SWATCH_W = 22
"""Width of a sample, in pixels (a dash pattern needs ~20 to read as dashed)."""


@dataclass(frozen=True)
class LegendEntry:
    """One row: a filled swatch (``dashed`` None) or a line sample (solid or dashed)."""

    text: str
    color: str
    dashed: bool | None = None
    """None: a filled swatch; False: a solid line; True: a dashed line."""
    halo: str | None = None
    """A wider line drawn under a line sample (NOTE [ Projected curve halo ] in style)."""


class SideLegend(QWidget):
    """The legend of one plot, laid out beside it (top-aligned, as wide as its longest row)."""

    PAD = 6

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entries: list[LegendEntry] = []
        self.reserve = ""
        """Text the legend is always wide enough for: a row that comes and goes, or changes,
        with each toggle (the projected peak) does not resize the plot beside it."""
        self.foreground = QColor("#202020")
        self.background = QColor("#FFFFFF")
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Preferred)

    def set_entries(self, entries: list[LegendEntry]) -> None:
        hint = self.sizeHint()
        self.entries = list(entries)
        if self.sizeHint() != hint:
            self.updateGeometry()
        self.update()

    def set_colors(self, foreground: str, background: str) -> None:
        """Text colour, and the background (the plot's, so that the two read as one)."""
        self.foreground = QColor(foreground)
        self.background = QColor(background)
        self.update()

    def texts(self) -> list[str]:
        """The rows' texts, top first."""
        return [entry.text for entry in self.entries]

    def _row_height(self) -> int:
        return self.fontMetrics().height() + 4

    def sizeHint(self) -> QSize:
        metrics = self.fontMetrics()
        texts = [e.text for e in self.entries] + [self.reserve]
        widest = max(metrics.horizontalAdvance(text) for text in texts)
        width = 2 * self.PAD + SWATCH_W + 6 + widest if self.entries else 0
        return QSize(width, self.PAD * 2 + self._row_height() * len(self.entries))

    def minimumSizeHint(self) -> QSize:
        return QSize(self.sizeHint().width(), 0)

    def paintEvent(self, event: QPaintEvent | None) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), self.background)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        h = self._row_height()
        for i, entry in enumerate(self.entries):
            top = self.PAD + i * h
            sample = QRectF(self.PAD, top + 3, SWATCH_W, h - 6)
            self._paint_sample(painter, entry, sample)
            painter.setPen(self.foreground)
            text = QRectF(sample.right() + 6, top, self.width() - sample.right() - 6, h)
            painter.drawText(text, Qt.AlignmentFlag.AlignVCenter, entry.text)
        painter.end()

    def _paint_sample(self, painter: QPainter, entry: LegendEntry, rect: QRectF) -> None:
        color = QColor(entry.color)
        if entry.dashed is None:
            painter.setPen(QPen(color.darker(130), 1))
            painter.setBrush(color)
            painter.drawRect(rect)
            return
        line = QLineF(rect.left(), rect.center().y(), rect.right(), rect.center().y())
        if entry.halo is not None:
            painter.setPen(QPen(QColor(entry.halo), 5))
            painter.drawLine(line)
        pen = QPen(color, 2.5)
        if entry.dashed:
            pen.setStyle(Qt.PenStyle.DashLine)
        painter.setPen(pen)
        painter.drawLine(line)
