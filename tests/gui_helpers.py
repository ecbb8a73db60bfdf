"""Helpers of the GUI tests (they import Qt: only files marked ``gui`` import this)."""

from __future__ import annotations

from PyQt6.QtCore import QPoint, QRectF
from PyQt6.QtGui import QTextDocument, QTextOption
from PyQt6.QtWidgets import QLabel, QWidget


def window_rect(widget: QWidget, top: QWidget) -> QRectF:
    """``widget``'s rectangle in ``top``'s coordinates."""
    corner = widget.mapTo(top, QPoint(0, 0))
    return QRectF(corner.x(), corner.y(), widget.width(), widget.height())


def cut_lines(label: QLabel) -> list[str]:
    """What of ``label``'s text would be cut as it is drawn: a line wider than the label, lines
    below its bottom, or the label itself past the window's edge."""
    window = label.window()
    corner = label.mapTo(window, QPoint(label.width(), label.height()))
    if corner.x() > window.width() or label.visibleRegion().boundingRect() != label.rect():
        return [f"the label ends at {corner.x()} px in a window {window.width()} px wide"]
    area = label.contentsRect()
    doc = QTextDocument()
    doc.setDefaultFont(label.font())
    doc.setDocumentMargin(0)
    option = doc.defaultTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)  # as a QLabel wraps: never in a word
    doc.setDefaultTextOption(option)
    doc.setHtml(label.text())
    doc.setTextWidth(area.width())
    cut = []
    if doc.idealWidth() > area.width():
        cut.append(f"a line {doc.idealWidth():.0f} px wide in {area.width()} px")
    if doc.size().height() > area.height() + 1:
        cut.append(f"{doc.size().height():.0f} px of lines in {area.height()} px")
    return cut
