"""File -> Export View: the visible tab as PNG or SVG under a title line that says what it
shows (trace, run, plan). What follows the mouse is never exported (``TimelineView.
without_transients``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from PyQt6.QtCore import QRectF, Qt
from PyQt6.QtGui import QColor, QFont, QFontMetricsF, QImage, QPainter
from PyQt6.QtWidgets import QWidget

from ckview.analysis import format_bytes
from ckview.app.planning import PlanOutcome
from ckview.app.run import Run
from ckview.app.style import Theme

MAX_TITLE_REGIONS = 4
"""Regions named in a title; more are counted (``… +5 more``)."""


def export_title(
    shown: Sequence[Run], outcome: PlanOutcome | None = None, regions: Sequence[str] = ()
) -> str:
    """``gpt2.h5 · baseline (peak 53.4 MiB) · plan → projected 36.0 MiB: h.0, h.1``: the runs
    shown (one on the timeline, all on the comparison) and the plan over them, if any; regions
    by the last two parts of their path, the first ``MAX_TITLE_REGIONS`` of them."""
    sources = {run.source for run in shown}
    if len(sources) == 1 and len(shown) > 1:  # one trace: its name once
        names = " vs ".join(f"{run.name} (peak {format_bytes(run.peak.bytes)})" for run in shown)
        runs = f"{os.path.basename(shown[0].source)} · {names}"
    else:
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


def title_height(title: str, width: int) -> int:
    """Height in pixels of ``title`` over an exported view ``width`` pixels wide: one line, or
    as many as it needs (never elided: what the view shows is in its last words)."""
    return _title_rect(title, width).toAlignedRect().height() + 12


def _title_rect(title: str, width: int) -> QRectF:
    flags = Qt.TextFlag.TextWordWrap.value
    return QFontMetricsF(_title_font()).boundingRect(
        QRectF(0, 0, max(width - 16, 1), 10_000), flags, title
    )


def _paint_title(painter: QPainter, title: str, width: int, theme: Theme) -> None:
    height = title_height(title, width)
    painter.fillRect(QRectF(0, 0, width, height), QColor(theme.background))
    painter.setFont(_title_font())
    painter.setPen(QColor(theme.foreground))
    painter.drawText(
        QRectF(8, 6, width - 16, height - 12),
        Qt.AlignmentFlag.AlignLeft.value | Qt.TextFlag.TextWordWrap.value,
        title,
    )


def titled_image(widget: QWidget, title: str, theme: Theme) -> QImage:
    """``widget`` as it is drawn, under a title line."""
    shot = widget.grab()
    top = title_height(title, shot.width())
    image = QImage(shot.width(), shot.height() + top, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(QColor(theme.background))
    painter = QPainter(image)
    _paint_title(painter, title, shot.width(), theme)
    painter.drawPixmap(0, top, shot)
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

    top = title_height(title, widget.width())
    size = QSize(widget.width(), widget.height() + top)
    generator = QSvgGenerator()
    generator.setFileName(path)
    generator.setSize(size)
    generator.setViewBox(QRect(QPoint(0, 0), size))
    generator.setTitle(title)
    painter = QPainter(generator)
    _paint_title(painter, title, widget.width(), theme)
    painter.translate(0, top)
    widget.render(painter)
    painter.end()
    if not os.path.exists(path):
        raise OSError(f"cannot write {path}")
