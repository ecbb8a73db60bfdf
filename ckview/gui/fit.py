"""Texts that fit the width they are given, so that a long file name (an experiment directory's,
120 characters and no space) never makes the window wider: a header of entries that wraps
between them (``EntriesLabel``), a line of plain text (``ElidedLabel``) and a combo box
(``ElidedComboBox``) elided where they do not fit, the whole text in their tooltip then.

NOTE [ Long names never widen the window ]
A Qt widget asks for the width of its text as its least width (a word-wrapped label for its
longest word), and the window takes the largest least width of what it holds, on every tab (a
stacked page counts hidden): one label showing a long trace name made the explorer at least
1400 px wide. A widget here that shows a run's label asks for no width it cannot give back: it
lays its text out again, or elides it, for the width the layout gives it.
tests/test_gui_long_names.py checks the window's least width with a short and a long name on
each tab, and that what is elided has the whole text in its tooltip.
"""

from __future__ import annotations

import html

from PyQt6.QtCore import QSize, Qt
from PyQt6.QtGui import (
    QFont,
    QFontMetricsF,
    QPainter,
    QPaintEvent,
    QPalette,
    QResizeEvent,
    QTextDocument,
    QTextOption,
)
from PyQt6.QtWidgets import (
    QComboBox,
    QLabel,
    QStyle,
    QStyleOptionComboBox,
    QStylePainter,
)

SEPARATOR = " &nbsp;·&nbsp; "
"""Between two entries of a line of a header (the Compare tab's)."""


class EntriesLabel(QLabel):
    """A header of entries (rich text: a run's peak, the plan's, the ranks' imbalance) that is
    never cut at the right edge: as many whole entries to a line as fit the width, separated by
    dots, so that no entry is split over two lines where it fits on one; an entry wider than a
    line wraps at its own spaces, and one that cannot (a word wider than the label: a long file
    name in a narrow window) is elided in its middle, the entry then wrapped at its spaces
    (what follows the name, a peak, stays), the whole header in the tooltip. ``packed=False``:
    one entry to a line (the Diff tab's run A, run B and their difference). Laid out again
    whenever the width changes; asks for no width of its own (NOTE [ Long names never widen
    the window ])."""

    MARGIN = 4.0
    """Pixels kept free at the right of a line: a measure rounds, a paint may not."""

    def __init__(self, packed: bool = True) -> None:
        super().__init__()
        self.setTextFormat(Qt.TextFormat.RichText)
        self.setWordWrap(True)  # the entries' own spaces, where one is wider than a line
        self.entries: list[str] = []
        self.packed = packed

    def set_entries(self, entries: list[str]) -> None:
        """Show ``entries`` (rich text each)."""
        self.entries = entries
        self._lay_out()

    def minimumSizeHint(self) -> QSize:
        """As narrow as the layout likes: the entries are laid out again for the width given
        (a long word, taken as the least width, would push the window wider than the screen)."""
        return QSize(0, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        super().resizeEvent(event)
        self._lay_out()

    def _lay_out(self) -> None:
        width = self.contentsRect().width() - self.MARGIN
        whole = (SEPARATOR if self.packed else "<br>").join(self.entries)
        if width <= 0:  # not laid out yet: wrapped by Qt
            lines, elided = [whole], False
        else:
            lines, elided = _lines(self.entries, width, self.font(), self.packed)
        text = "<br>".join(lines)
        if self.text() != text:  # a new text changes the height, and resizes the label again
            self.setText(text)
        tip = whole if elided else ""
        if self.toolTip() != tip:
            self.setToolTip(tip)


def _lines(
    entries: list[str], width: float, font: QFont, packed: bool = True
) -> tuple[list[str], bool]:
    """``entries`` packed whole into lines of ``width`` pixels (an entry alone on its line when
    it is wider; ``packed=False``: each alone), and whether one was elided (no space to wrap it
    at)."""
    lines: list[list[str]] = []
    used = width + 1.0  # a new line for the first entry
    gap = _text_width(SEPARATOR, font)
    elided = False
    for entry in entries:
        size = _text_width(entry, font)
        if size > width and _text_width(entry, font, wrap=width) > width:
            entry, elided = _elide(entry, width, font), True
            size = width
        if lines and packed and used + gap + size <= width:
            lines[-1].append(entry)
            used += gap + size
        else:
            lines.append([entry])
            used = size
    return [SEPARATOR.join(line) for line in lines], elided


def _text_width(rich: str, font: QFont, wrap: float = -1.0) -> float:
    """The width in pixels of rich text in ``font``: of its widest line when wrapped at
    ``wrap`` pixels (a word wider than that overflows), else on one line."""
    doc = QTextDocument()
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    option = doc.defaultTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)  # as a QLabel wraps: never in a word
    doc.setDefaultTextOption(option)
    doc.setHtml(rich)
    doc.setTextWidth(wrap)
    return doc.idealWidth()


def _elide(rich: str, width: float, font: QFont) -> str:
    """``rich`` as plain text, each word wider than ``width`` pixels (no space to wrap it at: a
    long file name) elided in its middle, so that the entry wraps at its spaces and keeps
    what follows the name (its peak); measured in bold, as part of it may be."""
    doc = QTextDocument()
    doc.setHtml(rich)
    bold = QFont(font)
    bold.setBold(True)
    metrics = QFontMetricsF(bold)
    words = [
        metrics.elidedText(word, Qt.TextElideMode.ElideMiddle, width)
        if metrics.horizontalAdvance(word) > width
        else word
        for word in doc.toPlainText().split(" ")
    ]
    return html.escape(" ".join(words))


class ElidedLabel(QLabel):
    """One line of plain text painted elided in its middle to the width it is given, a long
    file name keeping its start and its end and what follows it (a run's peak); the whole text
    (``text()``) then in the tooltip. Asks for the whole text's width, needs none of it."""

    def __init__(self) -> None:
        super().__init__()
        self.setTextFormat(Qt.TextFormat.PlainText)

    def show_text(self, text: str) -> None:
        self.setText(text)
        self._update_tip()

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """The text as painted: whole, or elided to the label's width."""
        width = self.contentsRect().width() - 2 * self.margin()
        mode = Qt.TextElideMode.ElideMiddle
        return QFontMetricsF(self.font()).elidedText(self.text(), mode, max(width, 0))

    def paintEvent(self, event: QPaintEvent | None) -> None:
        style = self.style()
        assert style is not None
        margin = self.margin()
        area = self.contentsRect().adjusted(margin, margin, -margin, -margin)
        painter = QPainter(self)
        style.drawItemText(
            painter,
            area,
            int(self.alignment().value),
            self.palette(),
            self.isEnabled(),
            self.shown_text(),
            self.foregroundRole(),
        )
        painter.end()

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        super().resizeEvent(event)
        self._update_tip()

    def _update_tip(self) -> None:
        tip = self.text() if self.shown_text() != self.text() else ""
        if self.toolTip() != tip:
            self.setToolTip(tip)


class ElidedComboBox(QComboBox):
    """A combo box whose current text, wider than the box, is elided in the middle (a long file
    name keeps its start, its end and the run and peak after it; Qt cuts it mid-letter), the
    whole text then in the tooltip under ``tip``. ``most``: the widest it asks to be, in
    characters (0: as its size policy says), for a box that sizes itself to its items."""

    def __init__(self, tip: str, most: int = 0) -> None:
        super().__init__()
        self.tip = tip
        self.most = most
        self.setToolTip(tip)
        self.currentTextChanged.connect(lambda _: self._update_tip())

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        if self.most:
            most = QFontMetricsF(self.font()).horizontalAdvance("x" * self.most)
            hint.setWidth(min(hint.width(), int(most)))
        return hint

    def shown_text(self) -> str:
        """The current text as painted: whole, or elided to the box's text field."""
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        return self._elided(option)

    def _elided(self, option: QStyleOptionComboBox) -> str:
        style = self.style()
        assert style is not None
        field = style.subControlRect(
            QStyle.ComplexControl.CC_ComboBox,
            option,
            QStyle.SubControl.SC_ComboBoxEditField,
            self,
        )
        width = field.width() - 2  # Qt draws the label 1 px inside the field on each side
        if not option.currentIcon.isNull():
            width -= option.iconSize.width() + 4
        return QFontMetricsF(self.font()).elidedText(
            option.currentText, Qt.TextElideMode.ElideMiddle, max(width, 0)
        )

    def paintEvent(self, event: QPaintEvent | None) -> None:
        """As QComboBox paints itself, the current text elided to fit."""
        painter = QStylePainter(self)
        painter.setPen(self.palette().color(QPalette.ColorRole.Text))
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        option.currentText = self._elided(option)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        super().resizeEvent(event)
        self._update_tip()

    def _update_tip(self) -> None:
        text = self.currentText()
        tip = f"{self.tip}:\n{text}" if self.shown_text() != text else self.tip
        if self.toolTip() != tip:
            self.setToolTip(tip)


__all__ = ["SEPARATOR", "ElidedComboBox", "ElidedLabel", "EntriesLabel"]
