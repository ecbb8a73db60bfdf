"""Light and dark Qt palettes (Fusion style) matching ``ckview.app.style`` themes."""

from __future__ import annotations

from PyQt6.QtGui import QColor, QPalette
from PyQt6.QtWidgets import QApplication

from ckview.app.style import Theme

_DARK_ROLES = {
    QPalette.ColorRole.Window: "#2B2D30",
    QPalette.ColorRole.WindowText: "#E6E6E6",
    QPalette.ColorRole.Base: "#1E1F22",
    QPalette.ColorRole.AlternateBase: "#26282B",
    QPalette.ColorRole.ToolTipBase: "#3C3F41",
    QPalette.ColorRole.ToolTipText: "#E6E6E6",
    QPalette.ColorRole.Text: "#E6E6E6",
    QPalette.ColorRole.Button: "#3C3F41",
    QPalette.ColorRole.ButtonText: "#E6E6E6",
    QPalette.ColorRole.BrightText: "#FF6B6B",
    QPalette.ColorRole.Highlight: "#3574F0",
    QPalette.ColorRole.HighlightedText: "#FFFFFF",
    QPalette.ColorRole.Link: "#6FB1FF",
    QPalette.ColorRole.PlaceholderText: "#8C8C8C",
    QPalette.ColorRole.Light: "#5A5D61",
    QPalette.ColorRole.Midlight: "#46494D",
    QPalette.ColorRole.Mid: "#6E7276",
    QPalette.ColorRole.Dark: "#191A1C",
    QPalette.ColorRole.Shadow: "#0E0E0F",
}


_DARK_INDICATORS = """
QTreeView::indicator { width: 12px; height: 12px; border: 1px solid #9A9DA1;
                       border-radius: 2px; background: #1E1F22; }
QTreeView::indicator:checked { background: #D55E00; border-color: #F08A4B; }
"""


def apply_qt_theme(app: QApplication, theme: Theme) -> None:
    """Fusion style with a light (Qt's standard) or dark palette; readable base font size."""
    app.setStyle("Fusion")
    style = app.style()
    palette = style.standardPalette() if style is not None else QPalette()
    if theme.name == "dark":
        for role, value in _DARK_ROLES.items():
            palette.setColor(role, QColor(value))
        disabled = QColor("#7A7A7A")
        for role in (
            QPalette.ColorRole.Text,
            QPalette.ColorRole.ButtonText,
            QPalette.ColorRole.WindowText,
        ):
            palette.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    app.setPalette(palette)
    # Fusion outlines check boxes a shade darker than the window: invisible on a dark one.
    app.setStyleSheet(_DARK_INDICATORS if theme.name == "dark" else "")
    font = app.font()
    if font.pointSize() < 10:
        font.setPointSize(10)
        app.setFont(font)
