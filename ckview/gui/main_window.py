"""The explorer's main window: open traces, the timeline, the plan panel, the inspector and the
comparison, with menus, shortcuts, recent files, drag and drop and a status bar."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from PyQt6.QtCore import QSettings, Qt, pyqtSignal
from PyQt6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QKeySequence,
)
from PyQt6.QtWidgets import (
    QApplication,
    QComboBox,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMenuBar,
    QMessageBox,
    QProgressDialog,
    QStatusBar,
    QTabWidget,
    QToolBar,
    QToolTip,
    QWidget,
)

from ckpt_runtime.plan import Plan
from ckview import __version__
from ckview.analysis import format_bytes
from ckview.app.planning import PlanOutcome, PlanSession
from ckview.app.run import Axis, Run, TraceData, load_trace
from ckview.app.sizing import SizedRuns, allocator_settings, size_of_path, size_verdict
from ckview.app.style import DARK, LIGHT, THEMES, Theme
from ckview.gui.background import in_background
from ckview.gui.compare import CompareView
from ckview.gui.diff_view import DiffView
from ckview.gui.fit import ElidedComboBox, ElidedLabel
from ckview.gui.inspector import Inspector
from ckview.gui.plan_panel import PlanPanel
from ckview.gui.size_panel import SizePanel
from ckview.gui.themes import apply_qt_theme

MAX_RECENT = 10
TRACE_FILTER = "ckview traces (*.h5 *.hdf5);;All files (*)"

SHORTCUTS = (
    ("Ctrl+O", "open a trace"),
    ("Ctrl+E", "export the current view (PNG or SVG)"),
    ("Ctrl+S / Ctrl+L", "save / load a plan"),
    ("P", "jump to the peak"),
    ("F or Home", "zoom to fit"),
    ("+ / −", "zoom in / out"),
    ("← / →", "pan"),
    ("T", "switch the x axis: time / op index"),
    ("Ctrl+1 / Ctrl+2 / Ctrl+3", "timeline / comparison / diff of two runs"),
    ("S", "comparison: overlay / side by side"),
    ("Ctrl+D", "light / dark theme"),
    ("Ctrl+Q", "quit"),
)


class MainWindow(QMainWindow):
    """The ckview explorer."""

    loaded = pyqtSignal(object)  # TraceData, from the loading thread
    load_failed = pyqtSignal(str, str)  # path, one-line message
    _progress = pyqtSignal(float, str, str)  # fraction, path, what

    def __init__(self, theme: Theme = LIGHT, settings: QSettings | None = None) -> None:
        super().__init__()
        self.setWindowTitle("ckview")
        self.resize(1500, 900)
        self.setAcceptDrops(True)
        self.settings = settings or QSettings("ckview", "ckview")
        self.theme = theme
        self.traces: list[TraceData] = []
        self._run: Run | None = None
        """The current run (``current_run``); the run box only picks it among ``runs()``."""
        self.axis = Axis.TIME
        self.outcome: PlanOutcome | None = None
        self.last_error: str | None = None
        self._loading: dict[str, QProgressDialog] = {}
        self._opened: list[str] = []  # paths in the order asked for (loads finish in any order)
        self._plan_on_open: tuple[Plan, str] | None = None
        """A plan and its source to apply to the first run opened (``ckview view --plan``)."""

        from ckview.gui.timeline import TimelineView

        self.timeline = TimelineView(theme=theme)
        self.compare = CompareView(theme=theme)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.timeline, "Timeline")
        self.tabs.addTab(self.compare, "Compare")
        self.diff = DiffView(theme=theme)
        self.tabs.addTab(self.diff, "Diff")
        self.tabs.currentChanged.connect(lambda _: self._refresh_compare())
        self.tabs.currentChanged.connect(lambda _: self._show_docks())
        self.setCentralWidget(self.tabs)
        self.plan = PlanPanel()
        self.inspector = Inspector()
        plan_dock = self._dock("Plan", self.plan, Qt.DockWidgetArea.RightDockWidgetArea)
        live_dock = self._dock(
            "Live tensors", self.inspector, Qt.DockWidgetArea.BottomDockWidgetArea
        )
        self.sizes = SizePanel()
        size_dock = self._dock("Size", self.sizes, Qt.DockWidgetArea.RightDockWidgetArea)
        self.splitDockWidget(plan_dock, size_dock, Qt.Orientation.Vertical)
        self._second: Run | None = None
        """The recording of the current run's step at another size (the size field's)."""
        self._size_name = "size"
        self._projected: dict[int, tuple[SizedRuns, int]] = {}
        """Each run shown at a size (by id): the fit it was projected from, and the size."""
        self._reserved: dict[int, np.ndarray | None] = {}
        """The reserved-memory curve of each run shown (by id), computed once."""
        self.docks = (plan_dock, live_dock, size_dock)
        self.resizeDocks([plan_dock], [560], Qt.Orientation.Horizontal)
        self.resizeDocks([live_dock], [250], Qt.Orientation.Vertical)
        # NOTE [ Long names never widen the window ] in ckview/gui/fit.py
        self.run_box = ElidedComboBox("The run shown on the timeline and planned over", most=64)
        self.run_box.setMinimumContentsLength(28)
        self.run_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.run_box.currentIndexChanged.connect(self._on_run_chosen)
        self.run_scope = QLabel()
        self.run_scope.setContentsMargins(8, 0, 8, 0)
        """Beside the run box, for a run on several devices: which one the figures are on and
        what was left out (``Run.scope``); hidden otherwise."""
        self.run_scope.setToolTip(
            "A run with storages on several devices is shown on its main device (the GPU "
            "holding the most): the timeline, peak and plans count that device's memory only, "
            "as ckview summary does"
        )
        self.status_run = ElidedLabel()
        self.status_point = QLabel()
        # Not permanent: a message ("exported ...", an error) hides the hover readout while it
        # shows; a permanent widget stretched over the bar would hide the message instead.
        self._status().addWidget(self.status_point, stretch=1)
        self._status().addPermanentWidget(self.status_run)
        self._build_actions()

        self.timeline.pointClicked.connect(self._on_point)
        self.timeline.hovered.connect(self.status_point.setText)
        self.plan.outcomeChanged.connect(self._on_outcome)
        self.plan.message.connect(lambda text: self._status().showMessage(text, 8000))
        self.plan.error.connect(self.show_error)
        self.sizes.openRequested.connect(self.open_second_dialog)
        self.sizes.sizeChosen.connect(self.show_size)
        self.loaded.connect(self._on_loaded)
        self.load_failed.connect(self._on_load_failed)
        self._progress.connect(self._on_progress)
        self.set_theme(theme)
        self._update_enabled()
        self._status().showMessage("Open a trace (Ctrl+O) or drop one here.")

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(title)
        dock.setWidget(widget)
        dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
        )
        self.addDockWidget(area, dock)
        return dock

    # -- actions

    def _action(
        self, text: str, shortcut: str | Sequence[str] | None, slot: object, tip: str = ""
    ) -> QAction:
        action = QAction(text, self)
        if isinstance(shortcut, str):
            action.setShortcut(QKeySequence(shortcut))
        elif shortcut:
            action.setShortcuts([QKeySequence(s) for s in shortcut])
        action.setToolTip(tip or text)
        action.setStatusTip(tip or text)
        action.triggered.connect(slot)  # type: ignore[arg-type]
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        file = self._menu("&File")
        file.addAction(self._action("&Open…", "Ctrl+O", self.open_dialog, "Open trace files"))
        self.recent_menu = _submenu(file, "Open &Recent")
        self._fill_recent()
        file.addSeparator()
        self.export_action = self._action(
            "&Export View…", "Ctrl+E", self.export_dialog, "Save the current view as PNG or SVG"
        )
        self.csv_action = self._action(
            "Export &CSV…", None, self.export_csv_dialog, "Save the shown curves as CSV"
        )
        self.save_plan_action = self._action(
            "&Save Plan…", "Ctrl+S", self.save_plan_dialog, "Save the selection as a plan"
        )
        self.load_plan_action = self._action(
            "&Load Plan…", "Ctrl+L", self.load_plan_dialog, "Select what a plan file checkpoints"
        )
        for action in (self.export_action, self.csv_action):
            file.addAction(action)
        file.addSeparator()
        file.addAction(self.save_plan_action)
        file.addAction(self.load_plan_action)
        file.addSeparator()
        file.addAction(self._action("&Close All", "Ctrl+W", self.close_all))
        file.addAction(self._action("&Quit", "Ctrl+Q", self.close))

        view = self._menu("&View")
        self.peak_action = self._action(
            "Jump to &Peak", "P", self.timeline.jump_to_peak, "Centre the view on the peak"
        )
        view.addAction(self.peak_action)
        view.addAction(self._action("Zoom to &Fit", ("F", "Home"), self.timeline.zoom_to_fit))
        view.addAction(self._action("Zoom &In", ("+", "="), lambda: self.timeline.zoom(0.5)))
        view.addAction(self._action("Zoom &Out", "-", lambda: self.timeline.zoom(2.0)))
        view.addAction(self._action("Pan Left", "Left", lambda: self.timeline.pan(-0.25)))
        view.addAction(self._action("Pan Right", "Right", lambda: self.timeline.pan(0.25)))
        view.addSeparator()
        self.axis_action = self._action(
            "Op &Index Axis", "T", self.toggle_axis, "Place points by op index instead of time"
        )
        self.axis_action.setCheckable(True)
        view.addAction(self.axis_action)
        view.addAction(self._action("&Timeline", "Ctrl+1", lambda: self.tabs.setCurrentIndex(0)))
        view.addAction(self._action("&Compare", "Ctrl+2", lambda: self.tabs.setCurrentIndex(1)))
        view.addAction(
            self._action("&Diff", "Ctrl+3", lambda: self.tabs.setCurrentWidget(self.diff))
        )
        self.side_action = self._action(
            "Compare &Side by Side",
            "S",
            self._refresh_compare,
            "Show compared runs as separate stacked plots instead of overlaid",
        )
        self.side_action.setCheckable(True)
        view.addAction(self.side_action)
        view.addSeparator()
        themes = QActionGroup(self)
        self.theme_actions = {}
        for theme in THEMES.values():
            action = QAction(f"{theme.name.title()} Theme", self)
            action.setCheckable(True)
            action.triggered.connect(lambda _=False, t=theme: self.set_theme(t))
            themes.addAction(action)
            view.addAction(action)
            self.theme_actions[theme.name] = action
        view.addAction(self._action("Toggle Theme", "Ctrl+D", self.toggle_theme))

        help_menu = self._menu("&Help")
        help_menu.addAction(self._action("&Keyboard Shortcuts", "F1", self.show_shortcuts))
        help_menu.addAction(self._action("&About ckview", None, self.show_about))

        bar = QToolBar("Main")
        bar.setObjectName("main toolbar")
        bar.setMovable(False)
        self.addToolBar(bar)
        bar.addWidget(QLabel(" Run: "))
        bar.addWidget(self.run_box)
        self.run_scope_action = bar.addWidget(self.run_scope)
        bar.addSeparator()
        bar.addAction(self.peak_action)
        bar.addAction(self.axis_action)
        bar.addAction(self.side_action)
        bar.addAction(self.export_action)

    def _menu(self, title: str) -> QMenu:
        bar = self.menuBar()
        assert bar is not None
        return _submenu(bar, title)

    def _status(self) -> QStatusBar:
        bar = self.statusBar()
        assert bar is not None
        return bar

    # -- opening

    def open_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Open traces", "", TRACE_FILTER)
        self.open_paths(paths)

    def apply_plan_on_open(self, plan: Plan, source: str) -> None:
        """Apply ``plan`` (read from ``source``) to the next run shown that can be planned
        over: ticked in the plan panel, its projection drawn (``ckview view --plan``)."""
        self._plan_on_open = (plan, source)

    def open_paths(self, paths: Sequence[str]) -> None:
        """Load traces on a worker thread, with a progress dialog; errors open a dialog."""
        for path in paths:
            self._load(os.path.abspath(path))

    def _load(self, path: str) -> None:
        if path in self._loading:
            return
        self._opened = [p for p in self._opened if p != path] + [path]
        dialog = QProgressDialog(f"Loading {os.path.basename(path)}…", "", 0, 100, self)
        dialog.setCancelButton(None)
        dialog.setWindowTitle("ckview")
        dialog.setMinimumDuration(400)
        # Not modal: a modal QProgressDialog.setValue runs the event loop, which can deliver
        # `loaded` and delete the dialog inside its own setValue.
        dialog.setWindowModality(Qt.WindowModality.NonModal)
        # Nor active: the main window keeps the keyboard (its shortcuts need it active).
        dialog.setAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
        self._loading[path] = dialog

        def report(fraction: float, what: str) -> None:
            self._progress.emit(fraction, path, what)

        in_background(lambda: load_trace(path, report), lambda r: self._loaded(path, r))

    def _loaded(self, path: str, result: TraceData | Exception) -> None:
        """On the loading thread: hand the trace, or a one-line error, to the UI thread."""
        from ckview.trace.errors import TraceError
        from ckview.trace.text import printable

        if isinstance(result, TraceData):
            self.loaded.emit(result)
        elif isinstance(result, TraceError):
            self.load_failed.emit(path, printable(str(result)))
        elif isinstance(result, OSError):
            self.load_failed.emit(path, f"cannot read {path}: {result.strerror or result}")
        else:
            self.load_failed.emit(path, f"cannot show {path}: {type(result).__name__}: {result}")

    def _on_progress(self, fraction: float, path: str, what: str) -> None:
        dialog = self._loading.get(path)
        if dialog is not None:
            dialog.setLabelText(f"Loading {os.path.basename(path)}: {what}…")
            dialog.setValue(int(fraction * 100))

    def _finish_loading(self, path: str) -> None:
        dialog = self._loading.pop(path, None)
        if dialog is not None:
            shown = dialog.isVisible()
            dialog.reset()
            dialog.deleteLater()
            if shown:  # give the keyboard (and the shortcuts) back to the window
                self.activateWindow()

    def _on_loaded(self, data: TraceData) -> None:
        self._finish_loading(data.path)
        self.traces = [t for t in self.traces if t.path != data.path] + [data]
        order = {p: i for i, p in enumerate(self._opened)}
        self.traces.sort(key=lambda t: order.get(t.path, len(order)))  # rank 0 first
        self._remember(data.path)
        first_new = len(self.runs()) - len(data.runs)
        # A run that ended in an OOM is why the trace was opened: show it first.
        oom = next((i for i, run in enumerate(data.runs) if run.oom is not None), 0)
        self._fill_run_box(select=first_new + oom if len(self.traces) == 1 else None)
        self._status().showMessage(
            f"opened {data.path}: {len(data.runs)} run(s), "
            f"{sum(r.n_events for r in data.runs):,} memory events",
            8000,
        )
        self._refresh_compare()
        self.diff.set_runs(self.runs(), self.axis)

    def _on_load_failed(self, path: str, message: str) -> None:
        self._finish_loading(path)
        self._forget(path)
        self.show_error(message)

    def close_all(self) -> None:
        self.traces = []
        self._fill_run_box()
        self.diff.set_runs([])

    def runs(self) -> list[Run]:
        """Every run of every open trace, in opening order."""
        return [run for trace in self.traces for run in trace.runs]

    def current_run(self) -> Run | None:
        """The run shown on the timeline and planned over (None before a trace is open)."""
        return self._run

    def _fill_run_box(self, select: int | None = None) -> None:
        """List the open runs; then show run ``select`` (an index into ``runs()``), else the
        run shown before if it is still open, else the one at its place."""
        runs = self.runs()
        keep = self.run_box.currentIndex()
        if self._run is not None and any(r is self._run for r in runs):
            keep = next(i for i, r in enumerate(runs) if r is self._run)
        self.run_box.blockSignals(True)
        self.run_box.clear()
        for run in runs:
            self.run_box.addItem(f"{run.label}  ({_peak_text(run).removeprefix('peak ')})")
        index = max(0, min(select if select is not None else keep, len(runs) - 1))
        self.run_box.setCurrentIndex(index if runs else -1)
        self.run_box.blockSignals(False)
        self._show_run(runs[index] if runs else None)

    def _on_run_chosen(self, index: int) -> None:
        """The user picked run ``index`` of ``runs()`` in the run box."""
        runs = self.runs()
        self._show_run(runs[index] if 0 <= index < len(runs) else None)

    def _show_run(self, run: Run | None) -> None:
        """Make ``run`` the current run: the timeline, plan panel and status show it."""
        self._run = run
        self.outcome = None
        self._update_enabled()
        self.inspector.clear()
        if run is None:
            self.plan.set_session(None)
            self.timeline.clear()
            self.compare.set_runs([])
            self.status_run.show_text("")
            self._show_scope("")
            self.setWindowTitle("ckview")
            return
        self.setWindowTitle(f"{run.label} — ckview")
        self.timeline.set_run(run, self.axis, self._reserved_of(run))
        if run.n_events == 0:
            self.plan.set_session(None, "This run holds no step: nothing to plan.")
        elif len(run.tables["modules"]["path"]):
            self.plan.set_session(PlanSession(run))
            if self._plan_on_open is not None:
                self.plan.apply_plan(*self._plan_on_open)
                self._plan_on_open = None
        else:  # imported from a memory snapshot: no module tree to checkpoint
            self.plan.set_session(
                None, "This run has no modules (a memory snapshot): nothing to plan."
            )
        self.status_run.show_text(f"{run.label} · {run.n_events:,} events · {_peak_text(run)}")
        self._show_scope(run.scope)
        self._refresh_compare()

    def _show_scope(self, scope: str) -> None:
        """Show the run's device scope beside the run box, or hide the label if it has none."""
        self.run_scope.setText(scope)
        action = self.run_scope_action
        assert action is not None
        action.setVisible(bool(scope))

    def _update_enabled(self) -> None:
        has = self.current_run() is not None
        for action in (
            self.export_action,
            self.csv_action,
            self.save_plan_action,
            self.load_plan_action,
            self.peak_action,
        ):
            action.setEnabled(has)

    # -- recent files

    def recent_files(self) -> list[str]:
        value = self.settings.value("recent", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _remember(self, path: str) -> None:
        recent = [path] + [p for p in self.recent_files() if p != path]
        self.settings.setValue("recent", recent[:MAX_RECENT])
        self._fill_recent()

    def _forget(self, path: str) -> None:
        self.settings.setValue("recent", [p for p in self.recent_files() if p != path])
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for path in self.recent_files():
            action = self.recent_menu.addAction(path)
            assert action is not None
            action.triggered.connect(lambda _=False, p=path: self.open_paths([p]))
        self.recent_menu.setEnabled(bool(self.recent_files()))

    # -- drag and drop

    def dragEnterEvent(self, event: QDragEnterEvent | None) -> None:
        mime = event.mimeData() if event is not None else None
        if event is not None and mime is not None and mime.hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent | None) -> None:
        mime = event.mimeData() if event is not None else None
        if event is None or mime is None:
            return
        paths = [url.toLocalFile() for url in mime.urls() if url.isLocalFile()]
        if paths:
            self.open_paths(paths)
            event.acceptProposedAction()

    # -- the timeline, the plan, the comparison

    # -- the size field

    def open_second_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open the step recorded at another size", "", TRACE_FILTER
        )
        if path:
            self.open_second(path)

    def open_second(self, path: str) -> None:
        """Read ``path``, the shown run's step recorded at another size, for the size field
        (its run of the same name, else its first); the sizes come from the file names when
        they say them (``ckview record --sizes``: ``train.batch8.h5``)."""
        from ckview.trace.errors import TraceError

        base = self._size_base()
        if base is None:
            self.sizes.show_error("Open a trace first.")
            return
        try:
            data = load_trace(path)
        except (TraceError, OSError) as exc:
            self.sizes.show_error(f"cannot read {path}: {exc}")
            return
        self._second = data.run(base.name) if base.name in data.names else data.runs[0]
        named = size_of_path(base.source), size_of_path(path)
        sizes = None
        if named[0] is not None and named[1] is not None:
            sizes = (named[0][1], named[1][1])
            self._size_name = named[0][0] if named[0][0] == named[1][0] else "size"
        self.sizes.set_second(f"{os.path.basename(path)} · {self._second.name}", sizes)

    def show_size(self, n: int) -> None:
        """Show the current run's step at size ``n`` (a run of its own in the run box, with the
        current plan), and say whether it fits the plan panel's budget."""
        base, second = self._size_base(), self._second
        if base is None or second is None:
            return
        trace = self._trace_of(base)
        settings = allocator_settings(trace.meta.allocator_settings if trace else "")
        try:
            sized = SizedRuns.pair(base, second, self.sizes.sizes(), self._size_name, settings)
        except ValueError as exc:
            self.sizes.show_error(" ".join(str(exc).split()))
            return
        keep = self.plan.session.regions() if self.plan.session is not None else []
        run = sized.run_at(n)
        self._projected[id(run)] = (sized, n)
        data = TraceData(path=f"{base.source} ({run.name})", meta=trace.meta, runs=[run])
        self.traces = [t for t in self.traces if t.path != data.path] + [data]
        self._fill_run_box(select=len(self.runs()) - 1)
        if keep and self.plan.session is not None:
            self.plan.set_selection(keep)
        self._answer_size()

    def _answer_size(self) -> None:
        """What the shown size comes to with the current plan, against the budget."""
        run = self.current_run()
        if run is None or id(run) not in self._projected:
            return
        sized, n = self._projected[id(run)]
        regions = self.plan.session.regions() if self.plan.session is not None else []
        try:
            verdict = size_verdict(
                run, regions, self.plan.budget.text(), sized, f"{sized.name} {n}"
            )
        except ValueError as exc:
            self.sizes.show_error(str(exc))
            return
        self.sizes.show_answer(verdict.text, verdict.fits)
        self._status().showMessage(verdict.text, 8000)

    def _size_base(self) -> Run | None:
        """The recorded run behind the current one (itself, unless it is shown at a size)."""
        run = self.current_run()
        if run is None or id(run) not in self._projected:
            return run
        return self._projected[id(run)][0].base

    def _trace_of(self, run: Run) -> TraceData:
        return next(t for t in self.traces if any(r is run for r in t.runs))

    def _reserved_of(self, run: Run) -> np.ndarray | None:
        """The run's reserved-memory curve from the allocator model (a CUDA run of at most
        ``reserved.MAX_EVENTS`` events: the model replays in Python), else None."""
        if id(run) not in self._reserved:
            from ckview.analysis.reserved import MAX_EVENTS, reserved_at_points

            curve = None  # NOTE: a longer run keeps only its 'reserved (at most)' line
            if run.device is not None and run.n_events <= MAX_EVENTS:
                trace = self._trace_of(run)
                settings = allocator_settings(trace.meta.allocator_settings)
                t = run.tables
                curve = reserved_at_points(
                    t["storages"], t["strings"], t["memory_events"], settings
                )
            self._reserved[id(run)] = curve
        return self._reserved[id(run)]

    def _on_point(self, point: int) -> None:
        run = self.current_run()
        if run is not None:
            self.inspector.show_point(run, point)

    def _on_outcome(self, outcome: PlanOutcome | None) -> None:
        self.outcome = outcome
        self.timeline.set_outcome(outcome)
        self._answer_size()
        if self.tabs.currentWidget() is self.compare:
            self._refresh_compare()

    def _show_docks(self) -> None:
        """The plan and live-tensor docks serve the timeline and comparison; the Diff view
        takes the whole window."""
        for dock in self.docks:
            dock.setVisible(self.tabs.currentWidget() is not self.diff)

    def show_compare(self, side_by_side: bool) -> None:
        """Switch to the Compare tab, runs side by side or overlaid."""
        self.side_action.setChecked(side_by_side)
        self.tabs.setCurrentWidget(self.compare)

    def _refresh_compare(self) -> None:
        if self.tabs.currentWidget() is not self.compare:
            return
        run = self.current_run()
        plan = (self.outcome, run) if self.outcome is not None and run is not None else None
        self.compare.set_runs(
            self.runs(), plan, axis=self.axis, side_by_side=self.side_action.isChecked()
        )

    def toggle_axis(self) -> None:
        self.set_axis(Axis.OP if self.axis is Axis.TIME else Axis.TIME)

    def set_axis(self, axis: Axis) -> None:
        self.axis = axis
        self.axis_action.setChecked(axis is Axis.OP)
        self.timeline.set_axis(axis)
        self.diff.set_axis(axis)
        self._refresh_compare()

    # -- export

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export view", "ckview.png", "PNG image (*.png);;SVG image (*.svg)"
        )
        if path:
            self.export_view(path)

    def export_view(self, path: str) -> None:
        """Save the visible tab (timeline or comparison) as PNG or SVG, by extension, under a
        title (trace, run, plan) and without what follows the mouse."""
        from ckview.gui.export import save_view

        widget = self.tabs.currentWidget()
        assert widget is not None
        QToolTip.hideText()
        try:
            with self.timeline.without_transients():
                save_view(widget, path, self.export_title(), self.theme)
        except (OSError, ValueError) as exc:
            self.show_error(str(exc))
            return
        self._status().showMessage(f"exported {path}", 8000)

    def export_title(self) -> str:
        """The title line of an exported view: what it shows."""
        from ckview.gui.export import export_title

        run = self.current_run()
        shown = self.runs() if self.tabs.currentWidget() is self.compare else [run]
        session = self.plan.session
        regions = [session.region_label(r) for r in session.regions()] if session else []
        return export_title([r for r in shown if r is not None], self.outcome, regions)

    def export_csv_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export CSV", "ckview.csv", "CSV (*.csv)")
        if path:
            self.export_csv(path)

    def export_csv(self, path: str) -> None:
        """The shown runs' curves (and the projected plan's) as CSV."""
        from ckview.app.report import write_csv

        run = self.current_run()
        runs = self.runs() if self.tabs.currentWidget() is self.compare else [run]
        plans = [("plan", self.outcome, run)] if self.outcome is not None and run else []
        try:
            write_csv([r for r in runs if r is not None], plans, path)
        except OSError as exc:
            self.show_error(f"cannot write {path}: {exc.strerror or exc}")
            return
        self._status().showMessage(f"exported {path}", 8000)

    # -- plans

    def save_plan_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save plan", "plan.json", "Plans (*.json)")
        if path:
            try:
                self.plan.save_plan(path)
            except (OSError, ValueError) as exc:
                self.show_error(f"cannot save the plan: {exc}")

    def load_plan_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load plan", "", "Plans (*.json)")
        if path:
            self.plan.load_plan(path)

    # -- look and feel

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_qt_theme(app, theme)
        self.theme_actions[theme.name].setChecked(True)
        self.timeline.set_theme(theme)
        self.compare.set_theme(theme)
        self.diff.set_theme(theme)
        self.settings.setValue("theme", theme.name)

    def toggle_theme(self) -> None:
        self.set_theme(DARK if self.theme is LIGHT else LIGHT)

    def show_error(self, message: str) -> None:
        """A one-line problem in a dialog that does not block (the app never crashes on it)."""
        self.last_error = message
        self._status().showMessage(message, 10000)
        box = QMessageBox(QMessageBox.Icon.Warning, "ckview", message, parent=self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def show_shortcuts(self) -> None:
        rows = "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in SHORTCUTS)
        QMessageBox.information(self, "Keyboard shortcuts", f"<table>{rows}</table>")

    def show_about(self) -> None:
        QMessageBox.about(
            self,
            "About ckview",
            f"ckview {__version__}: see what fills memory in a PyTorch training step and what "
            "gradient checkpointing would change.",
        )

    def closeEvent(self, event: QCloseEvent | None) -> None:
        self.settings.sync()
        super().closeEvent(event)


def _peak_text(run: Run) -> str:
    """``peak 88.8 MiB``, or ``no step`` for a run without a memory event (not "peak 0 B")."""
    return f"peak {format_bytes(run.peak.bytes)}" if run.n_events else "no step"


def _submenu(parent: QMenu | QMenuBar, title: str) -> QMenu:
    menu = parent.addMenu(title)
    assert menu is not None
    return menu
