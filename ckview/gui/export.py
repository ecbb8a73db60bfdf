"""File -> Export View: the visible tab as PNG or SVG under a title line that says what it
shows (trace, run, plan). What follows the mouse is never exported (``TimelineView.
without_transients``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from PyQt6.QtCore import QRectF, Qt
from PyQt6.QtGui import QColor, QFont, QFontMetrics, QImage, QPainter
from PyQt6.QtWidgets import QWidget

from ckview.analysis import format_bytes
from ckview.gui.planning import PlanOutcome
from ckview.gui.rundata import RunData
from ckview.gui.style import Theme

MAX_TITLE_REGIONS = 4
"""Regions named in a title; more are counted (``… +5 more``)."""


def export_title(
    shown: Sequence[RunData], outcome: PlanOutcome | None = None, regions: Sequence[str] = ()
) -> str:
    """``gpt2.h5 · baseline (peak 53.4 MiB) · plan → projected 36.0 MiB: h.0, h.1``: the runs
    shown (one on the timeline, all on the comparison) and the plan over them, if any; regions
    by the last two parts of their path, the first ``MAX_TITLE_REGIONS`` of them."""
    runs = " vs ".join(f"{run.label} (peak {format_bytes(run.peak.bytes)})" for run in shown)
    if outcome is None:
        return runs
    named = ", ".join(".".join(r.split(".")[-2:]) for r in regions[:MAX_TITLE_REGIONS])
    if len(regions) > MAX_TITLE_REGIONS:
        named += f" … +{len(regions) - MAX_TITLE_REGIONS} more"
    return f"{runs} · plan → projected {format_bytes(outcome.peak_bytes)}: {named}"


def _title_font() -> QFont:
    font = QFont()
    font.setPointSize(11)
    font.setBold(True)
    return font


def title_height() -> int:
    """Height in pixels of the title line over an exported view."""
    return QFontMetrics(_title_font()).height() + 12


def _paint_title(painter: QPainter, title: str, width: int, theme: Theme) -> None:
    painter.fillRect(QRectF(0, 0, width, title_height()), QColor(theme.background))
    painter.setFont(_title_font())
    painter.setPen(QColor(theme.foreground))
    metrics = QFontMetrics(_title_font())
    text = metrics.elidedText(title, Qt.TextElideMode.ElideRight, width - 16)
    painter.drawText(QRectF(8, 0, width - 16, title_height()), Qt.AlignmentFlag.AlignVCenter, text)


def titled_image(widget: QWidget, title: str, theme: Theme) -> QImage:
    """``widget`` as it is drawn, under a title line."""
    shot = widget.grab()
    image = QImage(
        shot.width(), shot.height() + title_height(), QImage.Format.Format_ARGB32_Premultiplied
    )
    image.fill(QColor(theme.background))
    painter = QPainter(image)
    _paint_title(painter, title, shot.width(), theme)
    painter.drawPixmap(0, title_height(), shot)
    painter.end()
    return image


def save_view(widget: QWidget, path: str, title: str, theme: Theme) -> None:
    """Write ``widget`` under ``title`` to ``path`` (.png or .svg); raises ``OSError`` when it
    cannot be written and ``ValueError`` for another extension."""
    if path.lower().endswith(".svg"):
        _save_svg(widget, path, title, theme)
    elif path.lower().endswith(".png"):
        if not titled_image(widget, title, theme).save(path, "PNG"):
            raise OSError(f"cannot write {path}")
    else:
        raise ValueError(f"cannot export to {path!r}: use a .png or .svg file name")


def _save_svg(widget: QWidget, path: str, title: str, theme: Theme) -> None:
    from PyQt6.QtCore import QPoint, QRect, QSize
    from PyQt6.QtSvg import QSvgGenerator

    size = QSize(widget.width(), widget.height() + title_height())
    generator = QSvgGenerator()
    generator.setFileName(path)
    generator.setSize(size)
    generator.setViewBox(QRect(QPoint(0, 0), size))
    generator.setTitle(title)
    painter = QPainter(generator)
    _paint_title(painter, title, widget.width(), theme)
    painter.translate(0, title_height())
    widget.render(painter)
    painter.end()
    if not os.path.exists(path):
        raise OSError(f"cannot write {path}")
