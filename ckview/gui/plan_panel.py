"""The plan panel: module tree with checkboxes, the op-level choices of its current module
(``OpGroupsView``), the chain strip, presets, a budget, and the projected peak / saving / extra
compute of what is selected.

Owns a ``PlanSession``; every toggle re-projects and emits ``outcomeChanged``. Building the
incremental model (and the planner) can take a second on a big run, so it runs on a worker
thread; until it is ready the exact projection answers.
"""

from __future__ import annotations

import html

from PyQt6.QtCore import QLine, QPoint, QRect, QSize, Qt, pyqtSignal
from PyQt6.QtGui import (
    QColor,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
    QResizeEvent,
    QWheelEvent,
)
from PyQt6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QToolTip,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ckpt_runtime.plan import Plan
from ckview.analysis import (
    PlannerResult,
    Region,
    already_checkpointed,
    budget_answer,
    format_bytes,
    parse_budget,
)
from ckview.analysis.timing import extra_range_text
from ckview.app.planning import PlanOutcome, PlanSession
from ckview.app.style import PEAK_COLOR, PROJECTION_COLOR
from ckview.gui.background import in_background
from ckview.gui.op_groups import OpGroupsView

TREE_COLUMNS = ("module", "type", "activations", "forward", "recompute")


def _ms(ns: int | None) -> str:
    return "…" if ns is None else f"{ns / 1e6:.1f} ms"


def _cost(session: PlanSession, row: int) -> str:
    """Recompute cost of a module: '—' if it is never called (nothing to checkpoint)."""
    if not session.modules[row].calls:
        return "—"
    return _ms(session.recompute_cost_ns(row))


class ChainStrip(QWidget):
    """The chain of blocks: click a block to checkpoint its segment, a gap to cut or join
    segments (NOTE [ Chain strip ] in ``ckview.app.planning``). A long chain keeps blocks wide
    enough to click and to number (``MIN_CELL``): the strip then grows wider than the panel and
    scrolls inside ``ChainView``."""

    blockClicked = pyqtSignal(int)
    gapClicked = pyqtSignal(int)

    GAP = 6
    MIN_CELL = 28
    """Least width of a block and its gap, in pixels: 22 pixels of block, room for ``79``."""
    HEIGHT = 32

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session: PlanSession | None = None
        self.setFixedHeight(self.HEIGHT)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(max(400, self.minimumWidth()), self.HEIGHT)

    def set_session(self, session: PlanSession | None) -> None:
        self.session = session
        chain = session.chain if session is not None else None
        self.setMinimumWidth(2 + self.MIN_CELL * len(chain.blocks) if chain is not None else 0)
        self.setVisible(chain is not None)
        self.update()

    def _geometry(self) -> list[QRect]:
        """Rectangle of every block."""
        assert self.session is not None and self.session.chain is not None
        n = len(self.session.chain.blocks)
        width = max(self.width() - 2, n)
        rects = []
        for i in range(n):
            x0 = 1 + i * width // n
            x1 = 1 + (i + 1) * width // n - self.GAP // 2
            rects.append(
                QRect(x0 + self.GAP // 2, 2, max(x1 - x0 - self.GAP // 2, 1), self.HEIGHT - 4)
            )
        return rects

    def hit(self, pos: QPoint) -> tuple[str, int] | None:
        """('block', i) or ('gap', i) (gap i: before block i) under ``pos``."""
        if self.session is None or self.session.chain is None:
            return None
        rects = self._geometry()
        for i, rect in enumerate(rects):
            if i and abs(pos.x() - (rects[i - 1].right() + rect.left()) / 2) <= self.GAP:
                return "gap", i
            if rect.left() <= pos.x() <= rect.right():
                return "block", i
        return None

    def paintEvent(self, event: QPaintEvent | None) -> None:
        session = self.session
        if session is None or session.chain is None:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rects = self._geometry()
        fg = self.palette().windowText().color()
        on = QColor(PROJECTION_COLOR)
        selected = [False] * len(rects)
        for start, stop in session.segments():
            if session.segment_selected(start, stop):
                selected[start:stop] = [True] * (stop - start)
        # One call per colour: a chain of hundreds of blocks paints in ~1 ms, not ~8.
        painter.setPen(QPen(fg, 1))
        for flag, brush in ((False, self.palette().base().color()), (True, on)):
            group = [r for r, s in zip(rects, selected, strict=True) if s is flag]
            painter.setBrush(brush)
            if group and group[0].width() > 8:
                for rect in group:
                    painter.drawRoundedRect(rect, 3, 3)
            elif group:
                painter.drawRects(*group)
        metrics = painter.fontMetrics()
        for i, rect in enumerate(rects):
            if rect.width() >= metrics.horizontalAdvance(str(i)) + 4:
                painter.setPen(QColor("white") if selected[i] else fg)
                painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, str(i))
        painter.setPen(QPen(fg, 3))
        gaps = sorted(session.boundaries)
        xs = [(rects[gap - 1].right() + rects[gap].left()) // 2 for gap in gaps]
        if xs:
            painter.drawLines(*[QLine(x, 0, x, self.HEIGHT) for x in xs])
        painter.end()

    def mousePressEvent(self, event: QMouseEvent | None) -> None:
        if event is None or event.button() != Qt.MouseButton.LeftButton:
            return
        hit = self.hit(event.position().toPoint())
        if hit is None:
            return
        (self.blockClicked if hit[0] == "block" else self.gapClicked).emit(hit[1])

    def mouseMoveEvent(self, event: QMouseEvent | None) -> None:
        if event is None or self.session is None or self.session.chain is None:
            return
        hit = self.hit(event.position().toPoint())
        text = ""
        if hit is not None and hit[0] == "block":
            row = self.session.chain.blocks[hit[1]]
            info = self.session.modules[row]
            text = f"{info.path}: {format_bytes(info.activation_bytes)} of activations"
        elif hit is not None:
            text = (
                f"click to cut or join segments before block {hit[1]}"
                if self.session.chain.sequential
                else self.session.chain.fixed
            )
        QToolTip.showText(event.globalPosition().toPoint(), text, self)


class SidewaysScroll(QScrollArea):
    """A scroll area that scrolls only sideways, by the mouse wheel too."""

    def wheelEvent(self, event: QWheelEvent | None) -> None:
        bar = self.horizontalScrollBar()
        if event is None or bar is None:
            return
        delta = event.angleDelta()
        bar.setValue(bar.value() - (delta.y() or delta.x()))
        event.accept()


class ChainView(QWidget):
    """The chain's heading over its strip, the strip scrolling sideways when its blocks need
    more room than the panel has."""

    def __init__(self, strip: ChainStrip, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.strip = strip
        self.title = QLabel()
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.area = SidewaysScroll()
        self.area.setWidget(strip)
        self.area.setWidgetResizable(True)
        self.area.setFrameShape(QScrollArea.Shape.NoFrame)
        self.area.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        bar = self.area.horizontalScrollBar()
        bar_height = bar.sizeHint().height() if bar is not None else 16
        self.area.setFixedHeight(strip.HEIGHT + bar_height + 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.title)
        layout.addWidget(self.area)

    def set_session(self, session: PlanSession | None) -> None:
        self.strip.set_session(session)
        self.setVisible(session is not None and session.chain is not None)
        self._update_title()

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        super().resizeEvent(event)
        self._update_title()

    def _update_title(self) -> None:
        """The chain's path, kind and length; says to scroll when not every block is shown."""
        session = self.strip.session
        chain = session.chain if session is not None else None
        if chain is None:
            return
        n = len(chain.blocks)
        hint = " — scroll for more" if self.strip.minimumWidth() > self.area.width() else ""
        self.title.setText(f"{chain.path} ({chain.kind}, {n} blocks){hint}")
        self.title.setToolTip(self.title.text())


class PlanPanel(QWidget):
    """Everything about the plan being built over the baseline run."""

    outcomeChanged = pyqtSignal(object)
    message = pyqtSignal(str)
    error = pyqtSignal(str)
    _ready = pyqtSignal(object)  # a PlanSession whose model is built (from the worker thread)
    _planned = pyqtSignal(object)  # PlannerResult or an error message

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session: PlanSession | None = None
        self.readout = QLabel("Open a trace to plan checkpointing.")
        self.readout.setWordWrap(True)
        self.readout.setTextFormat(Qt.TextFormat.RichText)
        self.readout.setMinimumHeight(58)
        self.presets = {
            "none": self._button("None", "Checkpoint nothing (the recorded baseline)"),
            "all": self._button("Every block", "Checkpoint every block of the chain"),
            "sqrt": self._button("√n", "Checkpoint √n segments of the chain (Chen et al.)"),
        }
        for name, button in self.presets.items():
            button.clicked.connect(lambda _=False, n=name: self.apply_preset(n))
        self.budget = QLineEdit()
        self.budget.setPlaceholderText("budget, e.g. 60 MiB or 70%")
        self.budget.setToolTip(
            "Memory budget for the planner: bytes with a unit (KiB, MiB, GiB), a percentage "
            "of the recorded peak, or 'device' (the capacity of the device the trace was "
            "recorded on). Enter finds the plan with the least extra compute that fits."
        )
        self.budget.returnPressed.connect(self.plan_for_budget)
        self.plan_button = self._button("Best plan", "Find the cheapest plan for the budget")
        self.plan_button.clicked.connect(self.plan_for_budget)
        self.budget_note = QLabel()
        """The planner's answer to the last budget: met, not met by how much, or why no plan
        can be made on this run (issue 13)."""
        self.budget_note.setWordWrap(True)
        self.budget_note.setTextFormat(Qt.TextFormat.RichText)
        self.budget_note.setVisible(False)
        self._budget_shown = ""
        self.strip = ChainStrip()
        self.chain_view = ChainView(self.strip)
        self.strip.blockClicked.connect(self.toggle_block)
        self.strip.gapClicked.connect(self.toggle_boundary)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(list(TREE_COLUMNS))
        self.tree.setToolTip(
            "Tick a module to checkpoint every call of it; below, choose the ops it saves"
        )
        header = self.tree.header()
        assert header is not None
        header.setStretchLastSection(False)
        # Module names are never cut: the type column gives up its width first (elided, its
        # full text in the tooltip), then the tree scrolls sideways.
        for column in range(len(TREE_COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.tree.itemChanged.connect(self._on_item_changed)
        self.tree.currentItemChanged.connect(self._on_current_changed)
        self._items: dict[int, QTreeWidgetItem] = {}
        self.op_groups = OpGroupsView()
        """The op-level choices of the module current in the tree."""
        self.op_groups.savedChanged.connect(self.set_saved)
        self.op_groups.offloadChanged.connect(self.set_offload)

        presets = QHBoxLayout()
        for button in self.presets.values():
            presets.addWidget(button)
        budget = QHBoxLayout()
        budget.addWidget(self.budget, stretch=1)
        budget.addWidget(self.plan_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.readout)
        layout.addLayout(presets)
        layout.addLayout(budget)
        layout.addWidget(self.budget_note)
        layout.addWidget(self.chain_view)
        # The user sizes the tree against the op-level choices of its current module.
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.tree)
        split.addWidget(self.op_groups)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        layout.addWidget(split, stretch=1)
        self._ready.connect(self._on_ready)
        self._planned.connect(self._on_planned)
        self.set_session(None)

    @staticmethod
    def _button(text: str, tip: str) -> QPushButton:
        button = QPushButton(text)
        button.setToolTip(tip)
        return button

    # -- session

    def set_session(
        self, session: PlanSession | None, why_none: str = "Open a trace to plan checkpointing."
    ) -> None:
        """Plan over a new baseline run (None: nothing to plan, and ``why_none`` says why)."""
        self.session = session
        self.budget_note.setVisible(False)
        self.chain_view.set_session(session)
        self.op_groups.set_session(session)
        self._fill_tree()
        for w in (*self.presets.values(), self.budget, self.plan_button, self.tree):
            w.setEnabled(session is not None)
        if session is None:
            self.readout.setText(why_none)
            return
        self._refresh()
        in_background(lambda: _prepared(session), self._ready.emit)

    def _on_ready(self, session: PlanSession | Exception) -> None:
        if isinstance(session, Exception):
            self.error.emit(f"cannot project plans on this run: {session}")
            return
        if session is not self.session:
            return
        for row, item in self._items.items():
            item.setText(4, _cost(session, row))
        self._refresh()

    def is_ready(self) -> bool:
        """True once the incremental model is built (toggles then take milliseconds)."""
        return self.session is not None and self.session.model is not None

    # -- user actions

    def set_selection(self, regions: list[Region]) -> None:
        """Select exactly ``regions`` (the plan carried to the same step at another size)."""
        assert self.session is not None
        self.session.set_selection(regions)
        self._refresh()

    def toggle_module(self, row: int) -> None:
        assert self.session is not None
        self.session.toggle_module(row)
        self._refresh()

    def show_op_groups(self, row: int) -> None:
        """Show the op-level choices of module ``row`` (the tree's current module)."""
        item = self._items.get(row)
        if item is not None:
            self.tree.setCurrentItem(item)
            self.tree.scrollToItem(item)
        self.op_groups.show_row(row)

    def set_saved(self, row: int, packets: list[str]) -> None:
        """Make checkpointed module ``row`` save the ops of the groups ``packets`` (none:
        recompute every op)."""
        assert self.session is not None
        try:
            self.session.set_saved(row, packets)
        except ValueError as exc:
            self.message.emit(str(exc))
        self._refresh()

    def set_offload(self, row: int, on: bool) -> None:
        """Make checkpointed module ``row`` offload what it saves, or recompute it all."""
        assert self.session is not None
        try:
            self.session.set_offload(row, on)
        except ValueError as exc:
            self.message.emit(str(exc))
        self._refresh()

    def toggle_block(self, block: int) -> None:
        """Checkpoint the strip segment holding ``block``, or stop."""
        assert self.session is not None
        self.session.toggle_block(block)
        self._refresh()

    def toggle_boundary(self, gap: int) -> None:
        """Cut or join strip segments before block ``gap`` (a ModuleList's gaps say why not)."""
        assert self.session is not None
        try:
            self.session.toggle_boundary(gap)
        except ValueError as exc:
            self.message.emit(str(exc))
            return
        self._refresh()

    def apply_preset(self, name: str) -> None:
        assert self.session is not None
        why_not = already_checkpointed(self.session.run.tables)
        if why_not is not None:  # a preset would project nothing: say why instead
            self._answer(f"No plan for the {name} preset: {why_not}.", unmet=True)
            return
        try:
            self.session.apply_preset(name)
        except ValueError as exc:
            self.error.emit(f"preset {name!r}: {exc}")
            return
        self._refresh()

    def plan_for_budget(self) -> None:
        session = self.session
        if session is None:
            return
        text = self.budget.text().strip()
        try:
            wanted = parse_budget(text)
        except ValueError as exc:
            self.error.emit(f"budget {text!r}: {exc}")
            return
        try:
            wanted = wanted.on_device(session.run.device_total_bytes)
        except ValueError as exc:  # 'device' on a trace that does not know its capacity
            self._answer(str(exc), unmet=True)
            return
        budget = wanted.bytes(session.run.peak.bytes)
        self._budget_shown = wanted.describe(session.run.peak.bytes)
        why_not = already_checkpointed(session.run.tables)
        if why_not is not None:
            self._answer(f"No plan for budget {self._budget_shown}: {why_not}.", unmet=True)
            return
        self.plan_button.setEnabled(False)
        self.message.emit(f"planning for {self._budget_shown}…")

        in_background(lambda: session.planner().for_budget(budget), self._planned.emit)

    def _answer(self, text: str, unmet: bool) -> None:
        """Show the answer to a budget under the budget field and in the status bar."""
        colour = f" style='color:{PEAK_COLOR}'" if unmet else ""
        self.budget_note.setText(f"<span{colour}>{html.escape(text)}</span>")
        self.budget_note.setVisible(True)
        self.message.emit(text)

    def _on_planned(self, result: PlannerResult | Exception) -> None:
        self.plan_button.setEnabled(True)
        if isinstance(result, ValueError):  # no chain of blocks to plan over: say why
            self._answer(f"No plan for budget {self._budget_shown}: {result}", unmet=True)
            return
        if isinstance(result, Exception):
            self.error.emit(f"planner: {result}")
            return
        assert self.session is not None
        self.session.apply_planner(result)
        picked = ", ".join(self.session.region_label(r) for r in self.session.regions())
        if result.fits:
            text = (
                f"budget {self._budget_shown} is met: {picked or 'nothing checkpointed'} → "
                f"{format_bytes(result.peak_bytes)}, +{result.extra_compute_ns / 1e6:.1f} ms "
                "extra compute"
            )
        else:
            text = budget_answer(result, self._budget_shown) + (
                "; " + "; ".join(result.notes) if result.notes else "; raise the budget"
            )
        self._answer(text, unmet=not result.fits)
        self._refresh()

    def save_plan(self, path: str) -> None:
        assert self.session is not None
        self.session.save_plan(path)
        self.message.emit(f"saved plan {path}")

    def load_plan(self, path: str) -> None:
        """Select what a plan file checkpoints; errors go to ``error``."""
        assert self.session is not None
        try:
            self.session.load_plan(path)
        except ValueError as exc:
            self.error.emit(str(exc))
            return
        self.message.emit(f"loaded plan {path}")
        self._refresh()

    def apply_plan(self, plan: Plan, source: str) -> None:
        """Select what ``plan`` (read from ``source``) checkpoints; errors go to ``error``."""
        assert self.session is not None
        try:
            self.session.apply_plan(plan)
        except ValueError as exc:
            self.error.emit(f"plan {source}: {exc}")
            return
        self.message.emit(f"applied plan {source}")
        self._refresh()

    # -- display

    def _fill_tree(self) -> None:
        self.tree.blockSignals(True)
        self.tree.clear()
        self._items = {}
        session = self.session
        if session is not None:
            for info in session.modules:
                parent = self._items.get(info.parent)
                item = QTreeWidgetItem(parent if parent is not None else self.tree)
                item.setText(0, info.name)
                item.setText(1, info.type)
                item.setToolTip(1, info.type)
                item.setText(2, format_bytes(info.activation_bytes))
                item.setText(3, _ms(info.forward_ns) if info.calls else "—")
                item.setText(4, _cost(session, info.row))
                item.setToolTip(0, f"{info.path}: {info.calls} forward call(s)")
                for column in (2, 3, 4):
                    item.setTextAlignment(column, Qt.AlignmentFlag.AlignRight)
                if info.calls:
                    item.setCheckState(0, Qt.CheckState.Unchecked)
                item.setData(0, Qt.ItemDataRole.UserRole, info.row)
                self._items[info.row] = item
            self.tree.expandToDepth(2)
        self.tree.blockSignals(False)

    def _on_item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if column != 0 or self.session is None:
            return
        row = int(item.data(0, Qt.ItemDataRole.UserRole))
        wanted = item.checkState(0) == Qt.CheckState.Checked
        if wanted != (self.session.region_of(row) is not None):
            self.toggle_module(row)

    def _on_current_changed(self, item: QTreeWidgetItem | None, _: object) -> None:
        if item is not None:
            self.op_groups.show_row(int(item.data(0, Qt.ItemDataRole.UserRole)))

    def _sync_checks(self) -> None:
        session = self.session
        assert session is not None
        shadowed = session.shadowed()
        self.tree.blockSignals(True)
        for row, item in self._items.items():
            info = session.modules[row]
            if info.calls == 0:
                continue
            # Only what changed: each change makes the tree re-measure its columns (sized to
            # their contents), all rows of them; a toggle changes a few rows.
            on = session.region_of(row) is not None
            state = Qt.CheckState.Checked if on else Qt.CheckState.Unchecked
            if item.checkState(0) != state:
                item.setCheckState(0, state)
            font = item.font(0)
            if font.italic() != (row in shadowed):
                font.setItalic(row in shadowed)
                item.setFont(0, font)
                item.setToolTip(
                    0,
                    "inside another checkpointed module: the outer one wins"
                    if row in shadowed
                    else f"{info.path}: {info.calls} forward call(s)",
                )
        self.tree.blockSignals(False)

    def _refresh(self) -> None:
        """Re-project the selection and show it everywhere."""
        session = self.session
        assert session is not None
        outcome = session.outcome()
        self._sync_checks()
        self.op_groups.sync()
        self.strip.update()
        self.readout.setText(readout_html(outcome, len(session.selection)))
        self.outcomeChanged.emit(outcome if session.selection else None)


def _prepared(session: PlanSession) -> PlanSession:
    session.prepare()
    return session


def readout_html(outcome: PlanOutcome, regions: int) -> str:
    """The readout: projected peak, saving and extra compute."""
    base = format_bytes(outcome.baseline_peak_bytes)
    if not regions:
        return (
            f"<b>Recorded peak {base}</b><br>Tick modules, click blocks or pick a preset "
            "to project a checkpoint plan."
        )
    sign = "−" if outcome.saving_bytes > 0 else "+" if outcome.saving_bytes < 0 else "±"
    return (
        f"<span style='font-size:13pt'><b>Projected peak {format_bytes(outcome.peak_bytes)}"
        f"</b></span> &nbsp; {sign}{format_bytes(abs(outcome.saving_bytes))} "
        f"({sign}{abs(outcome.saving_share):.1%} of {base})<br>"
        f"extra compute +{outcome.extra_compute_ns / 1e6:.1f} ms "
        f"({outcome.extra_share:.1%} of the step{_times_hint(outcome)}"
        f"{extra_range_text(outcome.extra_compute_range_ns)}) · {regions} region(s), "
        f"{len(outcome.recomputes)} recompute(s)"
        + _offload_html(outcome)
        + idle_html(outcome, regions)
        + warnings_html(outcome)
    )


def _offload_html(outcome: PlanOutcome) -> str:
    """What the offload regions move to host memory; empty if none (NOTE [ Offloaded
    instances ] in ckview.analysis.projection)."""
    if not outcome.offloaded_bytes:
        return ""
    return (
        f"<br>offloads {format_bytes(outcome.offloaded_bytes)} to host memory "
        f"(host peak {format_bytes(outcome.host_peak_bytes)})"
    )


def _times_hint(outcome: PlanOutcome) -> str:
    """Where the times come from (NOTE [ Extra compute from plain times ] in
    ckview/analysis/timing.py): said only when they carry the recorder's cost."""
    if outcome.plain_times:
        return ""
    return (
        "; <span title='No plain timing steps in this trace: times are recorded op times, "
        "inflated by the recorder. Record with --timing-steps 3.'>recorded times</span>"
    )


def warnings_html(outcome: PlanOutcome) -> str:
    """The save entries the projection cannot hold, one line each (NOTE [ Saves the projection
    cannot hold ] in ckview/analysis/planner_ops.py); empty if none."""
    if not outcome.warnings:
        return ""
    lines = "<br>".join(f"· {html.escape(line)}" for line in outcome.warnings)
    head = f"<span style='color:{PEAK_COLOR}'><b>The projection can be low</b></span>"
    return f"<br>{head}<br><small>{lines}</small>"


def idle_html(outcome: PlanOutcome, regions: int) -> str:
    """The selected regions that cannot take effect, and why (NOTE [ Regions that cannot take
    effect ] in ckpt_runtime/resolve.py); empty if all can."""
    if not outcome.idle_regions:
        return ""
    if outcome.idle_regions == regions:
        what = "None of them will run in the recorded step: the plan changes nothing"
    else:
        what = f"{outcome.idle_regions} of them will not run in the recorded step"
    notes = "<br>".join(f"· {html.escape(note)}" for note in outcome.notes)
    return f"<br><span style='color:{PEAK_COLOR}'><b>{what}</b></span><br><small>{notes}</small>"
