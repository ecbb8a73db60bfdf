"""The inspector: the tensors live at the clicked moment, largest first, one per row or grouped
by the source line that made them (traces recorded with ``--stacks``)."""

from __future__ import annotations

from typing import Any

from PyQt6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PyQt6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from ckview.analysis import format_bytes
from ckview.app.run import LiveTensor, Run, SiteGroup, group_by_site

PROMPT = "Click the timeline to list the tensors live at that moment."
COLUMNS = ("bytes", "category", "shape", "dtype", "device", "storage", "op", "module")
SITE_COLUMNS = ("bytes", "tensors", "source line", "categories")
GROUPINGS = ("each tensor", "source line")
"""The inspector's groupings: one row per tensor, or per source line (sums of bytes)."""


class _RowsModel(QAbstractTableModel):
    """A read-only table of ``rows`` under the headers ``columns`` (subclasses give ``data``)."""

    columns: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Any] = []

    def set_rows(self, rows: list[Any]) -> None:
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | None = None) -> int:
        return len(self.rows)

    def columnCount(self, parent: QModelIndex | None = None) -> int:
        return len(self.columns)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = 0) -> Any:
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.columns[section]
        return None


class LiveTensorModel(_RowsModel):
    """Rows of ``LiveTensor``; sorting by bytes sorts by the number, not its text."""

    columns = COLUMNS
    rows: list[LiveTensor]

    def data(self, index: QModelIndex, role: int = 0) -> Any:
        row = self.rows[index.row()]
        name = self.columns[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return format_bytes(row.nbytes) if name == "bytes" else str(getattr(row, name))
        if role == Qt.ItemDataRole.UserRole:  # sort key
            return getattr(row, "nbytes" if name == "bytes" else name)
        if role == Qt.ItemDataRole.TextAlignmentRole and name in ("bytes", "storage"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            tip = f"{row.category} {row.shape} {row.dtype}, made by {row.op} in {row.module}"
            return tip + (f"\nat {row.site}" if row.site else "")
        return None


class SiteGroupModel(_RowsModel):
    """Rows of ``SiteGroup``: the live tensors summed per source line."""

    columns = SITE_COLUMNS
    rows: list[SiteGroup]

    def data(self, index: QModelIndex, role: int = 0) -> Any:
        row = self.rows[index.row()]
        value = (row.nbytes, row.count, row.site, row.categories)[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return format_bytes(row.nbytes) if index.column() == 0 else str(value)
        if role == Qt.ItemDataRole.UserRole:  # sort key
            return value
        if role == Qt.ItemDataRole.TextAlignmentRole and index.column() in (0, 1):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{row.count} live tensor(s), {format_bytes(row.nbytes)}, made at {row.site}"
        return None


class Inspector(QWidget):
    """A header line, a filter box and the table of live tensors."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header = QLabel(PROMPT)
        self.header.setWordWrap(True)
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("filter by module, op, shape, category…")
        self.filter.setToolTip("Show only the rows whose text contains this (any column)")
        self.filter.setClearButtonEnabled(True)
        self.grouping = QComboBox()
        self.grouping.addItems([f"group: {g}" for g in GROUPINGS])
        self.grouping.setToolTip(
            "One row per tensor, or one per source line that made them, with their bytes "
            "summed (traces recorded with --stacks)"
        )
        self.grouping.currentIndexChanged.connect(self._regroup)
        self.model = LiveTensorModel()
        self.sites = SiteGroupModel()
        self._shown: tuple[Run, int] | None = None
        self.proxy = QSortFilterProxyModel()
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(Qt.ItemDataRole.UserRole)
        self.proxy.setFilterKeyColumn(-1)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.filter.textChanged.connect(self.proxy.setFilterFixedString)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.setAlternatingRowColors(True)
        rows, columns = self.table.verticalHeader(), self.table.horizontalHeader()
        assert rows is not None and columns is not None
        rows.setVisible(False)
        columns.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        columns.setStretchLastSection(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.header)
        tools = QHBoxLayout()
        tools.addWidget(self.filter, stretch=1)
        tools.addWidget(self.grouping)
        layout.addLayout(tools)
        layout.addWidget(self.table)

    def clear(self) -> None:
        self._shown = None
        self.model.set_rows([])
        self.sites.set_rows([])
        self.header.setText(PROMPT)

    def by_site(self) -> bool:
        """True when the rows are grouped by source line."""
        return GROUPINGS[self.grouping.currentIndex()] == "source line"

    def _regroup(self) -> None:
        self.proxy.setSourceModel(self.sites if self.by_site() else self.model)
        if self._shown is not None:
            self.show_point(*self._shown)

    def show_point(self, run: Run, point: int) -> None:
        """List what is live at timeline ``point`` of ``run``."""
        self._shown = (run, point)
        rows = run.live_tensors(point)
        self.model.set_rows(rows)
        self.sites.set_rows(group_by_site(rows, run.no_site) if self.by_site() else [])
        self.table.sortByColumn(0, Qt.SortOrder.DescendingOrder)
        widths = (90, 70, 520) if self.by_site() else (90, 110, 120, 80, 60, 70, 260)
        for column, width in enumerate(widths):
            self.table.setColumnWidth(column, width)
        total = sum(r.nbytes for r in rows)
        peak = " (the peak)" if point == run.peak.point else ""
        self.header.setText(
            f"<b>{len(rows)} tensors, {format_bytes(total)}</b> live at "
            f"{run.x_time[point]:.3f} ms, op {int(run.x_op[point])}{peak}: "
            f"{run.op_name(run.op_at(point))} in {run.module_of_op(run.op_at(point))}"
        )
