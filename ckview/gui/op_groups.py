"""The op-level choices of one checkpointed module: its saved-tensor groups with checkboxes
(ticked: saved, else recomputed) and "offload saved tensors" (NOTE [ One region per module ]
in ``ckview.app.planning``). A thin view: the ``PlanSession`` holds the selection."""

from __future__ import annotations

from PyQt6.QtCore import Qt, pyqtSignal
from PyQt6.QtWidgets import (
    QCheckBox,
    QHeaderView,
    QLabel,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ckview.analysis import format_bytes
from ckview.app.planning import PlanSession

GROUP_COLUMNS = ("saved op", "bytes kept", "recompute spared")


class OpGroupsView(QWidget):
    """The saved-tensor groups of the module row shown (``show_row``)."""

    savedChanged = pyqtSignal(int, object)
    """(module row, packets ticked): the user ticked or unticked a group."""
    offloadChanged = pyqtSignal(int, bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session: PlanSession | None = None
        self.row: int | None = None
        self.title = QLabel()
        self.title.setWordWrap(True)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.groups = QTreeWidget()
        self.groups.setHeaderLabels(list(GROUP_COLUMNS))
        self.groups.setRootIsDecorated(False)
        self.groups.setToolTip(
            "Tick a group to save its ops' outputs instead of recomputing them in backward "
            "(an op-level region); untick every group to recompute the whole module"
        )
        header = self.groups.header()
        assert header is not None
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.groups.itemChanged.connect(self._on_group_changed)
        self.offload = QCheckBox("offload saved tensors")
        self.offload.toggled.connect(self._on_offload)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.groups)
        layout.addWidget(self.offload)
        self.set_session(None)

    def set_session(self, session: PlanSession | None) -> None:
        self.session = session
        self.show_row(None)

    def show_row(self, row: int | None) -> None:
        """Show the choices of module ``row`` (None: none)."""
        self.row = row
        self.groups.blockSignals(True)
        self.groups.clear()
        session = self.session
        if session is not None and row is not None and session.modules[row].calls:
            for group in session.op_groups(row):
                item = QTreeWidgetItem(self.groups)
                item.setText(0, group.packet)
                item.setText(1, format_bytes(group.nbytes))
                item.setText(2, f"{group.compute_ns / 1e6:.1f} ms")
                item.setTextAlignment(1, Qt.AlignmentFlag.AlignRight)
                item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight)
                item.setData(0, Qt.ItemDataRole.UserRole, group.packet)
                item.setCheckState(0, Qt.CheckState.Unchecked)
        self.groups.blockSignals(False)
        self.sync()

    def sync(self) -> None:
        """Show the selection's state for the module shown: ticks, offload, and what is
        enabled (a module not checkpointed has no op-level choice)."""
        session, row = self.session, self.row
        region = session.region_of(row) if session is not None and row is not None else None
        self.setVisible(session is not None and row is not None)
        if session is None or row is None:
            return
        path = session.run.paths[row]
        self.groups.setEnabled(region is not None and not region.offload)
        blocked = session.offload_blocked()
        self.offload.setEnabled(region is not None and blocked is None)
        self.offload.setToolTip(
            f"Offload is off here: {blocked}"
            if blocked
            else "Keep every tensor the module saves, moved to host memory until backward"
        )
        self.offload.blockSignals(True)
        self.offload.setChecked(region is not None and region.offload)
        self.offload.blockSignals(False)
        save = set(region.save or ()) if region is not None and not region.offload else set()
        self.groups.blockSignals(True)
        for i in range(self.groups.topLevelItemCount()):
            item = self.groups.topLevelItem(i)
            assert item is not None
            on = item.data(0, Qt.ItemDataRole.UserRole) in save
            state = Qt.CheckState.Checked if on else Qt.CheckState.Unchecked
            if item.checkState(0) != state:
                item.setCheckState(0, state)
        self.groups.blockSignals(False)
        if region is None:
            what = "tick it to checkpoint it, then choose the ops it saves"
        elif region.offload:
            what = "offloads what it saves to host memory"
        elif region.save:
            what = f"saves {', '.join(region.save)}; recomputes the rest"
        else:
            what = "recomputes every op; tick groups to save their outputs instead"
        self.title.setText(f"{path}: {what}")

    def ticked(self) -> list[str]:
        """The packets of the ticked groups."""
        out = []
        for i in range(self.groups.topLevelItemCount()):
            item = self.groups.topLevelItem(i)
            assert item is not None
            if item.checkState(0) == Qt.CheckState.Checked:
                out.append(str(item.data(0, Qt.ItemDataRole.UserRole)))
        return out

    def _on_group_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if column == 0 and self.row is not None:
            self.savedChanged.emit(self.row, self.ticked())

    def _on_offload(self, on: bool) -> None:
        if self.row is not None:
            self.offloadChanged.emit(self.row, on)
