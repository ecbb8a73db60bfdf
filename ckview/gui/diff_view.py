"""The Diff view: two runs on one screen, and where their peak difference comes from.

Run A and run B are picked among every open run (the runs of one trace, or of several traces).
The numbers are ``ckview.analysis.diff.diff_runs``' (the same as ``ckview diff``): both peaks and
when, the difference by category, by module and by kind of tensor, and for a checkpointed run
what kept its peak up. The two curves are drawn aligned at their start; clicking a row draws the
live bytes of what the row names under each run's curve (``storage_mask``, ``live_bytes_of``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PyQt6.QtCore import Qt, pyqtSignal
from PyQt6.QtGui import QBrush
from PyQt6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ckview.analysis import format_bytes
from ckview.analysis.diff import (
    HELD_CLASSES,
    RunDiff,
    TensorKind,
    describe_kind,
    describe_moment,
    diff_runs,
    held_mask,
    live_bytes_of,
    storage_mask,
)
from ckview.analysis.units import MINUS, format_change, format_signed_bytes
from ckview.app.envelope import Envelope
from ckview.app.run import Axis, Run
from ckview.app.style import LIGHT, RUN_COLORS, Theme
from ckview.gui.axes import BytesAxis
from ckview.gui.curves import EnvelopeCurves, color, visible_pixels
from ckview.gui.fit import ElidedComboBox, EntriesLabel
from ckview.gui.legend import LegendEntry, SideLegend

TOP = 50
"""Modules and kinds of tensor listed (the largest changes)."""
Cell = str | int | tuple[str, int]
"""A table cell: a text, bytes, or a text with its sort key."""
PROMPT = "Open a trace with two runs (or two traces) to compare their peaks."


@dataclass(frozen=True)
class Selection:
    """What a clicked row names, found again in each run (``storage_mask``'s arguments)."""

    label: str
    module: str | None = None
    category: str | None = None
    kind: TensorKind | None = None
    held: str | None = None
    """A class of NOTE [ What kept a checkpointed peak up ]: its storages at each run's peak."""

    def mask(self, run: Run) -> np.ndarray:
        if self.held is not None:
            return held_mask(run.tables, self.held)
        return storage_mask(run.tables, module=self.module, category=self.category, kind=self.kind)


class _Item(QTableWidgetItem):
    """A cell that sorts by its ``UserRole`` value (bytes as numbers, not text)."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.data(Qt.ItemDataRole.UserRole), other.data(Qt.ItemDataRole.UserRole)
        if isinstance(mine, int | float) and isinstance(theirs, int | float):
            return mine < theirs
        return super().__lt__(other)


class DiffTable(QTableWidget):
    """A sortable, read-only table whose rows carry a ``Selection``."""

    def __init__(self, columns: tuple[str, ...], tip: str, signed: tuple[int, ...] = ()) -> None:
        super().__init__(0, len(columns))
        self.signed = signed
        """Columns of differences (shown with their sign)."""
        self.setHorizontalHeaderLabels(list(columns))
        self.setToolTip(tip)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setAlternatingRowColors(True)
        header, rows = self.horizontalHeader(), self.verticalHeader()
        assert header is not None and rows is not None
        rows.setVisible(False)
        header.setStretchLastSection(True)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.selections: dict[int, Selection] = {}

    def fill(self, rows: list[tuple[Selection | None, list[Cell]]], sort_by: int) -> None:
        """Rows of cells (an int is bytes: shown formatted, sorted as a number; a pair is a
        text and its sort key), sorted by column ``sort_by``, ascending (the largest decrease
        of a difference first)."""
        self.setSortingEnabled(False)
        self.clearContents()
        self.setRowCount(len(rows))
        self.selections = {}
        for r, (selection, cells) in enumerate(rows):
            for c, value in enumerate(cells):
                if isinstance(value, tuple):
                    value, key = value
                    item = _Item(value)
                    item.setData(Qt.ItemDataRole.UserRole, key)
                else:
                    item = _Item(_bytes_text(value, c in self.signed))
                if isinstance(value, str) and value:
                    item.setToolTip(value)
                if isinstance(value, int):
                    item.setData(Qt.ItemDataRole.UserRole, value)
                    align = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                    item.setTextAlignment(int(align))
                item.setData(Qt.ItemDataRole.UserRole + 1, r)
                self.setItem(r, c, item)
            if selection is not None:
                self.selections[r] = selection
        self.setSortingEnabled(True)
        self.sortItems(sort_by, Qt.SortOrder.AscendingOrder)
        self.resizeColumnsToContents()
        bytes_width = self.fontMetrics().horizontalAdvance("−88.8 MiB") + 16
        for c in range(self.columnCount()):
            if rows and isinstance(rows[0][1][c], int):
                self.setColumnWidth(c, max(self.columnWidth(c), bytes_width))

    def selection_at(self, row: int) -> Selection | None:
        """The ``Selection`` of the row shown at ``row`` (after sorting)."""
        item = self.item(row, 0)
        return (
            None if item is None else self.selections.get(item.data(Qt.ItemDataRole.UserRole + 1))
        )


class DiffView(QWidget):
    """Pick run A and run B; see their peaks, curves and the tables of ``RunDiff``."""

    diffChanged = pyqtSignal(object)  # RunDiff or None

    def __init__(self, parent: QWidget | None = None, theme: Theme = LIGHT) -> None:
        super().__init__(parent)
        self.theme = theme
        self.runs: list[Run] = []
        self.axis = Axis.TIME
        self.diff: RunDiff | None = None
        self.selection: Selection | None = None
        # NOTE [ Long names never widen the window ] in ckview/gui/fit.py
        self.box_a = ElidedComboBox("Run A: the difference is B − A")
        self.box_b = ElidedComboBox("Run B: the difference is B − A")
        for box in (self.box_a, self.box_b):
            box.setMinimumContentsLength(24)
            box.currentIndexChanged.connect(self._rebuild)
        self.swap = QPushButton("Swap")
        self.swap.setToolTip("Swap runs A and B")
        self.swap.clicked.connect(self.swap_runs)
        self.header = EntriesLabel(packed=False)
        self.header.set_entries([PROMPT])
        self.plot = pg.PlotWidget(axisItems={"left": BytesAxis("left")})
        self.legend = SideLegend(share=0.4)
        """Names the two curves beside the plot (a legend on it hid them); a long file name in
        a narrow window elided."""
        self._curves: list[EnvelopeCurves] = []
        self.plot.getPlotItem().getViewBox().sigXRangeChanged.connect(self._redraw)
        self.categories = DiffTable(
            ("category", "A", "B", "B − A"),
            "Live bytes at each run's peak, by category",
            signed=(3,),
        )
        self.modules = DiffTable(
            ("module", "A", "B", "B − A"),
            "Live bytes at each run's peak by module (a parameter, its gradient and state count "
            "with it), largest changes first",
            signed=(3,),
        )
        self.tensors = DiffTable(
            ("B − A", "module", "op", "category", "dtype", "shape", "count A → B", "A", "B"),
            "Kinds of tensor (module, op, category, dtype, shape) whose live bytes differ at "
            "the peaks, largest changes first",
            signed=(0,),
        )
        self.held = DiffTable(
            ("what held the peak", "A", "B"),
            "For a run with checkpointed regions: what it holds at its peak, by class (region "
            "inputs checkpoint keeps, outputs for the next block, tensors kept inside a region "
            "by a reference, activations saved outside every region, gradients, the recompute)",
        )
        self.tables = (self.categories, self.modules, self.tensors, self.held)
        for table in self.tables:
            table.itemSelectionChanged.connect(lambda t=table: self._on_row(t))
        self._layout()

    def _layout(self) -> None:
        pick = QHBoxLayout()
        pick.addWidget(QLabel("A:"))
        pick.addWidget(self.box_a, stretch=1)
        pick.addWidget(QLabel("B:"))
        pick.addWidget(self.box_b, stretch=1)
        pick.addWidget(self.swap)
        side = QSplitter(Qt.Orientation.Vertical)
        side.addWidget(self.categories)
        side.addWidget(self.held)
        curves = QWidget()
        beside = QHBoxLayout(curves)
        beside.setContentsMargins(0, 0, 0, 0)
        beside.setSpacing(0)
        beside.addWidget(self.plot, stretch=1)
        beside.addWidget(self.legend)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(curves)
        top.addWidget(side)
        top.setSizes([900, 440])
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.modules)
        bottom.addWidget(self.tensors)
        bottom.setStretchFactor(0, 2)
        bottom.setStretchFactor(1, 3)
        main = QSplitter(Qt.Orientation.Vertical)
        main.addWidget(top)
        main.addWidget(bottom)
        main.setSizes([460, 300])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(pick)
        layout.addWidget(self.header)
        layout.addWidget(main, stretch=1)

    # -- inputs

    def set_runs(self, runs: list[Run], axis: Axis | None = None) -> None:
        """Offer ``runs``; keep the picked pair if still open, else A = the first run and
        B = the second (the baseline and checkpointed runs of a ``--compare`` trace, or the
        first runs of two traces)."""
        picked = [self._picked(self.box_a), self._picked(self.box_b)]
        if picked[0] == picked[1]:  # fewer than two runs were open: take the defaults
            picked = [None, None]
        self.runs = runs
        self.axis = axis or self.axis
        labels = [run.label for run in runs]
        for i, box in enumerate((self.box_a, self.box_b)):
            box.blockSignals(True)
            box.clear()
            box.addItems([f"{run.label}  ({format_bytes(run.peak.bytes)})" for run in runs])
            kept = picked[i]
            default = min(i, len(runs) - 1)
            box.setCurrentIndex(labels.index(kept) if kept in labels else default)
            box.blockSignals(False)
        self._rebuild()

    def _picked(self, box: QComboBox) -> str | None:
        i = box.currentIndex()
        return self.runs[i].label if 0 <= i < len(self.runs) else None

    def set_pair(self, a: int, b: int) -> None:
        """Compare run ``b`` with run ``a`` (indices into the offered runs)."""
        for box, i in ((self.box_a, a), (self.box_b, b)):
            box.blockSignals(True)
            box.setCurrentIndex(i)
            box.blockSignals(False)
        self._rebuild()

    def swap_runs(self) -> None:
        self.set_pair(self.box_b.currentIndex(), self.box_a.currentIndex())

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self._draw()

    def set_axis(self, axis: Axis) -> None:
        self.axis = axis
        self._draw()

    def pair(self) -> tuple[Run, Run] | None:
        """The runs compared (A, B), or None when fewer than two runs are open."""
        a, b = self.box_a.currentIndex(), self.box_b.currentIndex()
        if len(self.runs) < 2 or not (0 <= a < len(self.runs) and 0 <= b < len(self.runs)):
            return None
        return self.runs[a], self.runs[b]

    # -- the diff

    def _rebuild(self) -> None:
        pair = self.pair()
        self.selection = None
        self.diff = None if pair is None else diff_runs(pair[0].tables, pair[1].tables, TOP)
        self.swap.setEnabled(pair is not None)
        self._fill_tables()
        self._draw()
        self.diffChanged.emit(self.diff)

    def _fill_tables(self) -> None:
        diff = self.diff
        if diff is None:
            for table in self.tables:
                table.fill([], 0)
            self.header.set_entries([PROMPT])
            return
        self.header.set_entries(self._header_entries(diff))
        self.categories.fill(
            [
                (Selection(name, category=name), [name, a, b, b - a])
                for name, a, b in diff.by_category
                if a or b
            ],
            sort_by=3,
        )
        self.modules.fill(
            [(Selection(path, module=path), [path, a, b, b - a]) for path, a, b in diff.by_module],
            sort_by=3,
        )
        self.tensors.fill(
            [
                (
                    Selection(describe_kind(t), kind=t),
                    [
                        t.delta,
                        t.module,
                        t.op,
                        t.category,
                        t.dtype,
                        t.shape,
                        f"{t.a_count} → {t.b_count}",
                        t.a_bytes,
                        t.b_bytes,
                    ],
                )
                for t in diff.tensors
            ],
            sort_by=0,
        )
        self.held.fill(self._held_rows(diff), sort_by=0)

    def _held_rows(self, diff: RunDiff) -> list[tuple[Selection | None, list[Cell]]]:
        if diff.held_a is None and diff.held_b is None:
            return [(None, ["neither run has checkpointed regions", "", ""])]
        rows: list[tuple[Selection | None, list[Cell]]] = []
        for i, name in enumerate(HELD_CLASSES):
            a = diff.held_a.bytes_by_class[name] if diff.held_a else None
            b = diff.held_b.bytes_by_class[name] if diff.held_b else None
            if a or b:
                selection = Selection(f"held at the peak: {name}", held=name)
                rows.append((selection, [(name, i), _or_dash(a), _or_dash(b)]))
        for side, held in (("A", diff.held_a), ("B", diff.held_b)):
            for t in held.kept_inside if held else []:
                label = f"{side} kept inside: {describe_kind(t)}"
                cells: list[Cell] = [(label, len(HELD_CLASSES)), "", ""]
                cells[1 if side == "A" else 2] = t.b_bytes
                rows.append((Selection(describe_kind(t), kind=t), cells))
        return rows

    def _header_entries(self, diff: RunDiff) -> list[str]:
        """Run A's peak and when, run B's, and their difference: a line each."""
        pair = self.pair()
        assert pair is not None
        share = f" ({format_change(diff.delta / diff.a.bytes, MINUS)})" if diff.a.bytes else ""
        lines = []
        for side, run, peak, tone in (
            ("A", pair[0], diff.a, RUN_COLORS[0]),
            ("B", pair[1], diff.b, RUN_COLORS[1]),
        ):
            lines.append(
                f"<span style='color:{tone}'>■</span> <b>{side}</b> {html.escape(run.label)}: "
                f"peak <b>{format_bytes(peak.bytes)}</b> {html.escape(describe_moment(peak))}"
            )
        lines.append(f"<b>B − A: {format_signed_bytes(diff.delta, MINUS)}{share}</b> at the peaks")
        return lines

    # -- the curves

    def _on_row(self, table: DiffTable) -> None:
        rows = table.selectionModel()
        chosen = rows.selectedRows() if rows is not None else []
        if not chosen:
            return
        for other in self.tables:
            if other is not table:
                other.blockSignals(True)
                other.clearSelection()
                other.blockSignals(False)
        self.select(table.selection_at(chosen[0].row()))

    def select(self, selection: Selection | None) -> None:
        """Draw the live bytes of what ``selection`` names under each run's curve."""
        self.selection = selection
        self._draw()

    def highlighted(self) -> list[np.ndarray]:
        """The live bytes of the selection in run A and run B (empty without one)."""
        pair = self.pair()
        if pair is None or self.selection is None:
            return []
        return [live_bytes_of(run.tables, self.selection.mask(run)) for run in pair]

    def _draw(self) -> None:
        plot = self.plot.getPlotItem()
        assert plot is not None
        plot.clear()
        self._curves = []
        self.plot.setBackground(self.theme.background)
        for name in ("left", "bottom"):
            plot.getAxis(name).setPen(pg.mkPen(self.theme.foreground))
            plot.getAxis(name).setTextPen(pg.mkPen(self.theme.foreground))
        plot.showGrid(x=True, y=True, alpha=self.theme.grid_alpha)
        plot.setLabel("bottom", self.axis.label + ", each run from its start")
        plot.setMouseEnabled(x=True, y=False)
        plot.hideButtons()
        plot.setMenuEnabled(False)
        self.legend.set_colors(self.theme.foreground, self.theme.background)
        pair = self.pair()
        if pair is None:
            plot.setTitle("")
            self.legend.set_entries([])
            return
        entries = []
        parts = self.highlighted()
        for i, run in enumerate(pair):
            tone = RUN_COLORS[i]
            x = run.x(self.axis)
            name = f"{'AB'[i]}: {run.label} ({format_bytes(run.peak.bytes)})"
            line = [pg.mkPen(tone, width=2)]
            self._curves.append(
                EnvelopeCurves(plot, Envelope(x, run.timeline.total), line, z=10 + i)
            )
            entries.append(LegendEntry(name, tone, dashed=False))
            if parts:
                fill = [QBrush(color(tone, 110))]
                self._curves.append(
                    EnvelopeCurves(plot, Envelope(x, parts[i]), [pg.mkPen(tone)], fill, z=5 + i)
                )
            self._mark_peak(plot, float(x[run.peak.point]), run.peak.bytes, tone)
        self.legend.set_entries(entries)
        title = ""
        if self.selection is not None and parts:
            at = [int(p[run.peak.point]) for p, run in zip(parts, pair, strict=True)]
            title = (
                f"{html.escape(self.selection.label)}: {format_bytes(at[0])} at A's peak, "
                f"{format_bytes(at[1])} at B's peak (shaded)"
            )
        plot.setTitle(title, color=self.theme.foreground, size="10pt")
        high = max(run.peak.bytes for run in pair)
        plot.setYRange(0, high * 1.12, padding=0)
        plot.setXRange(0, max(float(run.x(self.axis)[-1]) for run in pair), padding=0.01)
        self._redraw()

    def _mark_peak(self, plot: pg.PlotItem, x: float, y: int, tone: str) -> None:
        dot = pg.ScatterPlotItem([x], [y], size=10, brush=pg.mkBrush(tone), pen=pg.mkPen("w"))
        label = pg.TextItem(format_bytes(y), color=tone, anchor=(0.5, 1.2))
        label.setPos(x, y)
        for item in (dot, label):
            item.setZValue(60)
            plot.addItem(item, ignoreBounds=True)

    def _redraw(self) -> None:
        plot = self.plot.getPlotItem()
        assert plot is not None
        (x0, x1), _ = plot.getViewBox().viewRange()
        for curves in self._curves:
            curves.update(x0, x1, visible_pixels(plot))


def _bytes_text(value: str | int, signed: bool) -> str:
    if isinstance(value, str):
        return value
    return format_signed_bytes(value, MINUS) if signed else format_bytes(value)


def _or_dash(value: int | None) -> str | int:
    return "—" if value is None else value


def table_texts(table: QTableWidget) -> list[list[str]]:
    """The cells of a table as shown, row by row (for tests and exports)."""
    items = [
        [table.item(r, c) for c in range(table.columnCount())] for r in range(table.rowCount())
    ]
    return [[item.text() if item is not None else "" for item in row] for row in items]


__all__ = ["DiffTable", "DiffView", "Selection", "table_texts"]
