"""A legend beside a plot, never on it: filled swatches for stacked categories and line samples
for curves, painted as a plain widget so that it takes layout space next to the plot area."""

from __future__ import annotations

from dataclasses import dataclass

from PyQt6.QtCore import QEvent, QLineF, QObject, QRectF, QSize, Qt
from PyQt6.QtGui import QColor, QPainter, QPaintEvent, QPen, QResizeEvent
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
    """The legend of one plot, laid out beside it (top-aligned, as wide as its longest row).
    ``share``: the largest part of its parent's width it takes (the plot beside it keeps the
    rest), and it may be narrowed to a few characters: a row that does not fit (a long file
    name) is elided in its middle, the rows' whole texts then in the tooltip
    (NOTE [ Long names never widen the window ] in ckview/gui/fit.py)."""

    PAD = 6
    FEW = 12
    """The characters a legend with a ``share`` keeps for a row's text, however narrow."""

    def __init__(self, parent: QWidget | None = None, share: float = 0.0) -> None:
        super().__init__(parent)
        self.share = share
        self.entries: list[LegendEntry] = []
        self.reserve = ""
        """Text the legend is always wide enough for: a row that comes and goes, or changes,
        with each toggle (the projected peak) does not resize the plot beside it."""
        self.foreground = QColor("#202020")
        self.background = QColor("#FFFFFF")
        across = QSizePolicy.Policy.Maximum if share else QSizePolicy.Policy.Fixed
        self.setSizePolicy(across, QSizePolicy.Policy.Preferred)

    def set_entries(self, entries: list[LegendEntry]) -> None:
        hint = self.sizeHint()
        self.entries = list(entries)
        if self.sizeHint() != hint:
            self.updateGeometry()
        self._update_tip()
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

    def shown_texts(self) -> list[str]:
        """The rows' texts as painted: whole, or elided to the legend's width."""
        width = self._text_width()
        metrics = self.fontMetrics()
        return [
            metrics.elidedText(e.text, Qt.TextElideMode.ElideMiddle, width) for e in self.entries
        ]

    def _text_width(self) -> int:
        """Pixels for a row's text: from its sample's right to the legend's right edge."""
        return self.width() - self.PAD - SWATCH_W - 6

    def _widest(self, most: int = 0) -> int:
        metrics = self.fontMetrics()
        texts = [e.text for e in self.entries] + [self.reserve]
        widest = max(metrics.horizontalAdvance(text) for text in texts)
        return min(widest, metrics.horizontalAdvance("x" * most)) if most else widest

    def sizeHint(self) -> QSize:
        width = 2 * self.PAD + SWATCH_W + 6 + self._widest() if self.entries else 0
        return QSize(width, self.PAD * 2 + self._row_height() * len(self.entries))

    def minimumSizeHint(self) -> QSize:
        if not self.share or not self.entries:
            return QSize(self.sizeHint().width(), 0)
        return QSize(2 * self.PAD + SWATCH_W + 6 + self._widest(self.FEW), 0)

    def changeEvent(self, event: QEvent | None) -> None:
        """With a ``share``: follow the parent's width (``eventFilter``)."""
        super().changeEvent(event)
        parent = self.parentWidget()
        moved = event is not None and event.type() == QEvent.Type.ParentChange
        if self.share and moved and parent is not None:
            parent.installEventFilter(self)

    def eventFilter(self, watched: QObject | None, event: QEvent | None) -> bool:
        parent = self.parentWidget()
        resized = event is not None and event.type() == QEvent.Type.Resize
        if resized and watched is parent and parent is not None:
            most = int(parent.width() * self.share)
            self.setMaximumWidth(max(self.minimumSizeHint().width(), most))
        return False

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        super().resizeEvent(event)
        self._update_tip()

    def _update_tip(self) -> None:
        texts = self.texts()
        tip = "\n".join(texts) if self.shown_texts() != texts else ""
        if self.toolTip() != tip:
            self.setToolTip(tip)

    def paintEvent(self, event: QPaintEvent | None) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), self.background)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        h = self._row_height()
        shown = self.shown_texts()
        for i, entry in enumerate(self.entries):
            top = self.PAD + i * h
            sample = QRectF(self.PAD, top + 3, SWATCH_W, h - 6)
            self._paint_sample(painter, entry, sample)
            painter.setPen(self.foreground)
            text = QRectF(sample.right() + 6, top, self.width() - sample.right() - 6, h)
            painter.drawText(text, Qt.AlignmentFlag.AlignVCenter, shown[i])
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
