"""How fast the explorer opens, redraws, answers a toggle and exports, against the GUI targets.

    QT_QPA_PLATFORM=offscreen python benchmarks/gui_performance.py [--events N] [--points M]
        [--rounds R] [--toggles T] [--blocks B]

Writes a one-run trace ('main') of the synthetic training step of
``projection_speed.synthetic_run`` (about N memory events, B blocks in a ModuleList) to a
temporary directory and measures, in this process, with real widgets (the ``offscreen`` Qt
platform unless ``QT_QPA_PLATFORM`` says otherwise):

1. open to first paint (target 1 s): a fresh, shown 1600x1000 ``MainWindow`` (settings in a
   temporary INI file); from ``open_paths([path])`` the Qt event loop runs, as in the app,
   until the timeline's plot has finished a paint with the run's stacked curves in it (an
   invisible item above all others marks the end of a paint); R rounds. Beside it, not
   counted: when the loading thread emitted ``loaded``, when the window's handler of it
   returned, and when the plan panel's background model was built (``PlanPanel.is_ready``);
2. pan/zoom redraw (target 16 ms): a 1600x900 ``TimelineView`` on a run of M memory events,
   zoomed out so all M points are in view, then a sequence of 50 ``setXRange`` calls (zoom in
   by 2x steps, pan by 10%, zoom out, pan) each followed by a synchronous ``repaint()`` of the
   plot's viewport; R passes. A paint counter on the viewport checks every step painted;
3. toggle to redraw (target 50 ms): in the window of 1, once the model is built,
   ``PlanPanel.toggle_module`` of T random blocks, each followed by a synchronous repaint (Qt
   paints then everything of the window waiting for it: plot, chain strip, readout, tree); one
   toggle is checked: the readout's projected peak must be ``ProjectionModel.peak`` and
   ``project`` of the same selection, from the fast path (``PlanOutcome.incremental``);
4. PNG export (target 100 ms): ``MainWindow.export_view`` of the same window, R rounds; each
   file must exist and be over 10 kB.

Prints one line per measurement as it goes, then one table: median (p90 where there are many
samples), target, median / target, MET or MISSED, and the machine (cores, Qt, pyqtgraph).
The measuring functions are importable (``tests/test_gui_benchmark.py`` runs them tiny).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np

if TYPE_CHECKING:
    from PyQt6.QtWidgets import QApplication

    from ckview.app.run import Run
    from ckview.gui.main_window import MainWindow
    from ckview.gui.timeline import TimelineView

FIRST_PAINT_S = 1.0
REDRAW_S = 0.016
TOGGLE_S = 0.050
EXPORT_S = 0.100
MIN_PNG_BYTES = 10_000
WINDOW_SIZE = (1600, 1000)
TIMELINE_SIZE = (1600, 900)
TIMEOUT_S = 120.0


# ----------------------------------------------------------------------------- results


@dataclass
class Result:
    """Seconds of every sample of one measurement, against its target."""

    name: str
    target_s: float
    samples: list[float]
    informative: bool = False
    """Shown for context; no target, never MISSED."""
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p90(self) -> float | None:
        """The 90th percentile, for measurements with at least 5 samples."""
        return float(np.percentile(self.samples, 90)) if len(self.samples) >= 5 else None

    @property
    def ratio(self) -> float:
        return self.median / self.target_s if self.target_s else float("nan")

    @property
    def met(self) -> bool:
        return self.median <= self.target_s

    @property
    def verdict(self) -> str:
        if self.informative:
            return "(info)"
        return "MET" if self.met else "MISSED"


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"


def format_table(results: Sequence[Result]) -> str:
    """The results as an aligned text table."""
    header = ("measurement", "median", "p90", "target", "median/target", "")
    rows = [
        (
            r.name,
            _fmt(r.median),
            _fmt(r.p90),
            "-" if r.informative else _fmt(r.target_s),
            "-" if r.informative else f"{r.ratio:.2f}x",
            r.verdict,
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = []
    for row in (header, *rows):
        rest = [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        cells = [row[0].ljust(widths[0]), *rest]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def machine_info() -> str:
    """One line about where this ran."""
    import pyqtgraph as pg
    from PyQt6.QtCore import PYQT_VERSION_STR, QT_VERSION_STR
    from PyQt6.QtWidgets import QApplication

    app = QApplication.instance()
    qpa = app.platformName() if isinstance(app, QApplication) else "?"
    return (
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, Qt {QT_VERSION_STR} (PyQt {PYQT_VERSION_STR}, "
        f"platform {qpa}), pyqtgraph {pg.__version__}, numpy {np.__version__}"
    )


# ----------------------------------------------------------------------------- data


def _projection_speed() -> Any:
    path = Path(__file__).with_name("projection_speed.py")
    spec = importlib.util.spec_from_file_location("projection_speed", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_tables(events: int, blocks: int, seed: int = 0) -> dict[str, Any]:
    """``projection_speed.synthetic_run``: run tables plus ``modules`` and ``strings``."""
    tables: dict[str, Any] = _projection_speed().synthetic_run(events, blocks, seed)
    return tables


def write_tables(path: str | os.PathLike[str], tables: dict[str, Any], run: str = "main") -> None:
    """Write ``tables`` (as ``synthetic_tables`` makes them) as a complete one-run trace."""
    from ckview.trace import TraceWriter
    from ckview.trace.schema import RUN_TABLES

    with TraceWriter(path, meta={"device": "cpu", "command": ["synthetic"]}) as writer:
        ids = [writer.intern(text) for text in tables["strings"]]
        if ids != list(range(len(tables["strings"]))):
            raise ValueError("the strings of the tables are not distinct")
        writer.append_modules(tables["modules"])
        runner = writer.run(run)
        for table in RUN_TABLES:
            if table in tables:  # synthetic tables have no timing steps
                runner.append(table, tables[table])
        runner.set_attrs(steps_recorded=len(tables["steps"]["step"]))
        runner.close(complete=True)


def write_synthetic_trace(
    path: str | os.PathLike[str], events: int = 1_000_000, blocks: int = 200, seed: int = 0
) -> int:
    """Write the synthetic step of about ``events`` memory events and ``blocks`` blocks as a
    one-run trace ('main') at ``path``; returns the number of memory events written."""
    tables = synthetic_tables(events, blocks, seed)
    write_tables(path, tables)
    return len(tables["memory_events"]["kind"])


def synthetic_run_data(points: int, blocks: int = 200, seed: int = 0) -> Run:
    """A ``Run`` of about ``points`` memory events (timeline points), without a file."""
    from ckview.app.run import build_run

    return build_run("synthetic.h5", "main", synthetic_tables(points, blocks, seed))


# ----------------------------------------------------------------------------- Qt helpers


def qt_app() -> QApplication:
    """The QApplication, created (as ``ckview view`` does) if there is none yet."""
    import pyqtgraph as pg
    from PyQt6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        pg.setConfigOptions(antialias=False, useNumba=False)
        _quiet_offscreen_warnings()
        app = QApplication(sys.argv[:1])
        app.setApplicationName("ckview-benchmark")
    assert isinstance(app, QApplication)
    return app


_QUIET = ("This plugin does not support propagateSizeHints()",)


def _quiet_offscreen_warnings() -> None:
    """Drop the offscreen platform's harmless one-line warning about every new window."""
    from PyQt6.QtCore import qInstallMessageHandler

    def handler(mode: Any, context: Any, message: str | None) -> None:
        if message and not message.startswith(_QUIET):
            print(message, file=sys.stderr)

    qInstallMessageHandler(handler)


class PaintCounter:
    """Counts the paint events a widget receives (an event filter; ``count`` so far)."""

    def __init__(self, widget: Any) -> None:
        from PyQt6.QtCore import QEvent, QObject

        paint = QEvent.Type.Paint
        counter = self

        class _Filter(QObject):
            def eventFilter(self, obj: Any, event: Any) -> bool:
                if event is not None and event.type() == paint:
                    counter.count += 1
                return False

        self.count = 0
        self.widget = widget
        self._filter = _Filter()
        widget.installEventFilter(self._filter)

    def remove(self) -> None:
        self.widget.removeEventFilter(self._filter)


def wait_until(predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> float:
    """Process events until ``predicate()``; returns the seconds waited (TimeoutError)."""
    app = qt_app()
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"still waiting after {timeout_s:.0f} s")
        app.processEvents()
        time.sleep(0.001)
    return time.perf_counter() - start


def new_window(settings_dir: str, size: tuple[int, int] = WINDOW_SIZE) -> MainWindow:
    """A fresh explorer window with its settings in ``settings_dir``, shown and laid out."""
    from PyQt6.QtCore import QSettings

    from ckview.gui.main_window import MainWindow

    app = qt_app()
    settings = QSettings(os.path.join(settings_dir, "ckview.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings)
    window.resize(*size)
    window.show()
    app.processEvents()
    return window


def close_window(window: Any) -> None:
    """Close and delete a window (waits for its plan model first, so no thread outlives it)."""
    from PyQt6.QtCore import QCoreApplication, QEvent

    plan = getattr(window, "plan", None)
    if plan is not None and plan.session is not None:
        wait_until(plan.is_ready)
    window.close()
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)
    qt_app().processEvents()
    gc.collect()


def repaint_timeline(timeline: TimelineView) -> None:
    """Paint the timeline's main plot now, as the event loop would after an update. Qt paints
    a window's pending regions together: whatever else of the window waits is painted too."""
    viewport = timeline.main.viewport()
    assert viewport is not None
    viewport.repaint()


def curves_shown(timeline: TimelineView) -> bool:
    """True once the timeline holds the stacked curves of a run, with data in view."""
    layers = timeline._layers
    if timeline.run is None or layers is None or not layers.items:
        return False
    x = layers.items[0].xData
    return x is not None and len(x) > 1


# ----------------------------------------------------------------------------- 1. first paint


@dataclass
class FirstPaint:
    """One open, in seconds from ``open_paths``: the trace read (``loaded`` emitted by the
    loading thread), the window done with it (its ``loaded`` handler returned: run set on the
    timeline, plan session made), the timeline's first paint of the run, the plan model built."""

    loaded_s: float
    handled_s: float
    first_paint_s: float
    ready_s: float
    paints: int
    """Paint events the timeline's plot received up to and including the first paint."""


class PaintDone:
    """Calls ``callback()`` at the end of every paint of a ``QGraphicsView``'s items: through
    an invisible item over the whole scene, above every other item, so painted last."""

    def __init__(self, view: Any, callback: Callable[[], None]) -> None:
        from PyQt6.QtCore import QRectF
        from PyQt6.QtWidgets import QGraphicsItem

        everywhere = QRectF(-1e7, -1e7, 2e7, 2e7)

        class _Last(QGraphicsItem):
            def boundingRect(self) -> QRectF:
                return everywhere

            def paint(self, painter: Any, option: Any, widget: Any = None) -> None:
                callback()

        self.scene = view.scene()
        self.item = _Last()
        self.item.setZValue(1e12)
        self.scene.addItem(self.item)

    def remove(self) -> None:
        self.scene.removeItem(self.item)


def open_to_first_paint(window: MainWindow, path: str) -> FirstPaint:
    """Open ``path`` in a shown, empty ``window`` and run the event loop until the timeline's
    plot has finished a paint with the run's curves in it; then wait for the plan model."""
    from PyQt6.QtCore import QEventLoop, Qt, QTimer

    counter = PaintCounter(window.timeline.main.viewport())
    loop = QEventLoop()
    timer = QTimer()
    timer.setSingleShot(True)
    timer.timeout.connect(loop.quit)
    seen: dict[str, Any] = {}

    def on_emitted(data: object) -> None:  # in the loading thread, as it emits
        seen["emitted"] = time.perf_counter()

    def on_loaded(data: object) -> None:  # queued after the window's own handler
        seen["handled"] = time.perf_counter()

    def on_failed(path: str, message: str) -> None:
        seen["failed"] = message
        loop.quit()

    def on_paint() -> None:
        if "handled" in seen and "painted" not in seen and curves_shown(window.timeline):
            seen["painted"] = time.perf_counter()
            seen["paints"] = counter.count
            loop.quit()

    hook = PaintDone(window.timeline.main, on_paint)
    direct = Qt.ConnectionType.DirectConnection  # PyQt6 takes it; its stub does not say so
    window.loaded.connect(on_emitted, direct)  # type: ignore[call-arg]
    window.loaded.connect(on_loaded)
    window.load_failed.connect(on_failed)
    try:
        timer.start(int(TIMEOUT_S * 1e3))
        start = time.perf_counter()
        window.open_paths([path])
        loop.exec()
        timer.stop()
        if "failed" in seen:
            raise RuntimeError(f"cannot open {path}: {seen['failed']}")
        if "painted" not in seen:
            raise TimeoutError(f"no paint of the run {TIMEOUT_S:.0f} s after opening {path}")
        wait_until(window.plan.is_ready)
        ready = time.perf_counter()
    finally:
        timer.stop()
        hook.remove()
        counter.remove()
        window.loaded.disconnect(on_emitted)
        window.loaded.disconnect(on_loaded)
        window.load_failed.disconnect(on_failed)
    return FirstPaint(
        loaded_s=seen["emitted"] - start,
        handled_s=seen["handled"] - start,
        first_paint_s=seen["painted"] - start,
        ready_s=ready - start,
        paints=seen["paints"],
    )


def measure_first_paint(
    path: str, rounds: int, settings_dir: str, size: tuple[int, int] = WINDOW_SIZE
) -> list[FirstPaint]:
    """``rounds`` opens of ``path``, each in a fresh window."""
    out = []
    for _ in range(rounds):
        window = new_window(settings_dir, size)
        try:
            out.append(open_to_first_paint(window, path))
        finally:
            close_window(window)
    return out


# ----------------------------------------------------------------------------- 2. pan/zoom


def pan_zoom_ranges(
    x0: float, x1: float, zooms: int = 13, pans: int = 6
) -> list[tuple[float, float]]:
    """The x ranges of a pan/zoom session from the whole ``[x0, x1]``: zoom in by 2x
    ``zooms`` times about the middle, pan right then left by 10% of the width ``pans`` times
    each, zoom back out by 2x to the whole range, then pan a 2x-zoomed view right and left the
    same way: ``2 * zooms + 4 * pans`` ranges (50 by default; 2 ** 13 x zoomed in, 1e7 points
    leave about 1200 in view)."""
    ranges: list[tuple[float, float]] = []
    centre, half = (x0 + x1) / 2, (x1 - x0) / 2

    def pan_around(half: float) -> None:
        c = centre
        for step in [1] * pans + [-1] * pans:
            c += step * 0.2 * half  # 10% of the width (2 * half)
            ranges.append((c - half, c + half))

    for _ in range(zooms):
        half /= 2
        ranges.append((centre - half, centre + half))
    pan_around(half)
    for _ in range(zooms):
        half *= 2
        ranges.append((centre - half, centre + half))
    pan_around(half / 2)
    return ranges


@dataclass
class Redraws:
    """Seconds per redraw (range change + synchronous paint) and what was drawn."""

    seconds: list[float]
    update_seconds: list[float]
    """The ``setXRange`` part alone (curve slices recomputed, no painting)."""
    paint_seconds: list[float]
    overview_seconds: list[float]
    """Repainting the overview strip after the plot (its region moved); not in ``seconds``."""
    points_in_view: int
    """Timeline points in view when zoomed out."""
    drawn_zoomed_out: int
    """Envelope bins drawn per curve when zoomed out."""
    set_run_s: float


def measure_redraws(run: Run, passes: int = 1, size: tuple[int, int] = TIMELINE_SIZE) -> Redraws:
    """Show ``run`` on a ``TimelineView`` of ``size``, zoomed out, and time ``passes`` passes
    of ``pan_zoom_ranges``: each ``setXRange`` followed by a synchronous repaint."""
    from ckview.gui.timeline import TimelineView

    app = qt_app()
    timeline = TimelineView()
    timeline.resize(*size)
    timeline.show()
    app.processEvents()
    started = time.perf_counter()
    timeline.set_run(run)
    app.processEvents()
    repaint_timeline(timeline)
    set_run_s = time.perf_counter() - started
    viewport = timeline.main.viewport()
    counter = PaintCounter(viewport)
    try:
        xs = run.x(timeline.axis)
        (v0, v1), _ = timeline.main.getPlotItem().getViewBox().viewRange()
        in_view = int(np.count_nonzero((xs >= v0) & (xs <= v1)))
        assert timeline._layers is not None
        drawn = len(timeline._layers.items[0].yData)
        overview = timeline.overview.viewport()
        assert overview is not None
        seconds, updates, paints, overviews = [], [], [], []
        for _ in range(passes):
            for a, b in pan_zoom_ranges(float(xs[0]), float(xs[-1])):
                app.processEvents()  # what the event loop does between two mouse events
                before = counter.count
                t0 = time.perf_counter()
                timeline.main.setXRange(a, b, padding=0)
                t1 = time.perf_counter()
                repaint_timeline(timeline)
                t2 = time.perf_counter()
                if counter.count == before:
                    raise RuntimeError("a redraw did not paint the plot")
                seconds.append(t2 - t0)
                updates.append(t1 - t0)
                paints.append(t2 - t1)
                overview.repaint()
                overviews.append(time.perf_counter() - t2)
    finally:
        counter.remove()
        timeline.close()
        timeline.deleteLater()
        app.processEvents()
    return Redraws(seconds, updates, paints, overviews, in_view, drawn, set_run_s)


# ----------------------------------------------------------------------------- 3. toggles


def block_rows(window: MainWindow) -> list[int]:
    """Module rows of the blocks of the chain (called in forward), else every called module
    below the root."""
    session = window.plan.session
    assert session is not None
    if session.chain is not None:
        return [r for r in session.chain.blocks if session.modules[r].calls]
    return [m.row for m in session.modules if m.calls and m.parent >= 0]


def toggle_and_paint(window: MainWindow, row: int) -> float:
    """Seconds from ``PlanPanel.toggle_module(row)`` to the timeline repainted."""
    counter = PaintCounter(window.timeline.main.viewport())
    try:
        start = time.perf_counter()
        window.plan.toggle_module(row)
        repaint_timeline(window.timeline)
        elapsed = time.perf_counter() - start
        if counter.count == 0:
            raise RuntimeError("the toggle did not repaint the timeline")
    finally:
        counter.remove()
    return elapsed


def measure_toggles(window: MainWindow, toggles: int, seed: int = 1) -> list[float]:
    """Toggle ``toggles`` random blocks of the open run, once its model is built; the
    selection is left as it ends."""
    wait_until(window.plan.is_ready)
    app = qt_app()
    app.processEvents()
    rows = block_rows(window)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(toggles):
        app.processEvents()
        out.append(toggle_and_paint(window, int(rows[rng.integers(len(rows))])))
    return out


@dataclass
class ToggleCheck:
    """What one toggle showed against what the model and the exact projection say."""

    readout_peak: int
    model_peak: int
    exact_peak: int
    incremental: bool
    readout_shows_it: bool
    drawn: bool
    """The timeline's projected curve is the outcome's."""

    @property
    def ok(self) -> bool:
        return (
            self.incremental
            and self.readout_shows_it
            and self.drawn
            and self.readout_peak == self.model_peak == self.exact_peak
        )


def check_toggle(window: MainWindow, row: int) -> ToggleCheck:
    """Toggle ``row`` (so something is selected) and compare the readout's projected peak
    with ``ProjectionModel.peak`` and ``project`` of the same selection."""
    from ckview.analysis import format_bytes, project

    wait_until(window.plan.is_ready)
    session = window.plan.session
    assert session is not None and session.model is not None
    window.plan.toggle_module(row)
    if not session.selection:
        window.plan.toggle_module(row)
    repaint_timeline(window.timeline)
    outcome = window.outcome
    assert outcome is not None
    regions = session.regions()
    model_peak = session.model.peak([session.index[r] for r in regions]).bytes
    exact = project(session.run.tables, regions).projected_peak.bytes
    return ToggleCheck(
        readout_peak=outcome.peak_bytes,
        model_peak=model_peak,
        exact_peak=exact,
        incremental=outcome.incremental,
        readout_shows_it=f"Projected peak {format_bytes(outcome.peak_bytes)}"
        in window.plan.readout.text(),
        drawn=window.timeline.outcome is outcome,
    )


# ----------------------------------------------------------------------------- 4. export


@dataclass
class Exports:
    """Seconds of every ``export_view`` to a PNG, and of ``grab()`` of the same tab alone (the
    painting part, without encoding and writing the file)."""

    seconds: list[float]
    grab_seconds: list[float]
    png_bytes: int
    png_size: tuple[int, int]
    """Width and height of the image (the visible tab, not the whole window)."""


def measure_export(window: MainWindow, directory: str, rounds: int) -> Exports:
    """``rounds`` exports of the window's view to PNG files in ``directory``; checks each."""
    from PyQt6.QtGui import QImage

    app = qt_app()
    seconds, grabs, size, image = [], [], 0, QImage()
    for i in range(rounds):
        path = os.path.join(directory, f"view{i}.png")
        app.processEvents()
        window.last_error = None
        start = time.perf_counter()
        window.export_view(path)
        seconds.append(time.perf_counter() - start)
        if window.last_error is not None:
            raise RuntimeError(f"export failed: {window.last_error}")
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size <= MIN_PNG_BYTES:
            raise RuntimeError(f"{path} holds {size} bytes, expected over {MIN_PNG_BYTES}")
        image = QImage(path)
        tab = window.tabs.currentWidget()
        assert tab is not None
        app.processEvents()
        start = time.perf_counter()
        tab.grab()
        grabs.append(time.perf_counter() - start)
    return Exports(seconds, grabs, size, (image.width(), image.height()))


# ----------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the trace")
    parser.add_argument("--points", type=int, default=10_000_000, help="points of the pan run")
    parser.add_argument("--rounds", type=int, default=5, help="opens, pan passes, exports")
    parser.add_argument("--toggles", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=200)
    return parser


def run_benchmark(args: argparse.Namespace, out: Callable[[str], None] = print) -> list[Result]:
    """Run the four measurements (progress lines through ``out``); returns the table rows."""
    qt_app()
    with tempfile.TemporaryDirectory(prefix="ckview-gui-bench-") as tmp:
        path = os.path.join(tmp, "synthetic.h5")
        t0 = time.perf_counter()
        n_events = write_synthetic_trace(path, args.events, args.blocks)
        out(
            f"trace: {n_events:,} memory events, {args.blocks} blocks, "
            f"{os.path.getsize(path) / 2**20:.1f} MiB, written in {time.perf_counter() - t0:.1f} s"
        )
        opening, window = _first_paint_rows(path, tmp, args, n_events, out)
        toggling = _toggle_rows(window, args, n_events, out)
        exporting = _export_rows(window, tmp, args, out)
        close_window(window)
        del window
        gc.collect()
    panning = _redraw_rows(args, out)
    return [*opening, *panning, *toggling, *exporting]


def _events(n: int) -> str:
    return f"{n:.0e}".replace("e+0", "e")


def _first_paint_rows(
    path: str, tmp: str, args: argparse.Namespace, n_events: int, out: Callable[[str], None]
) -> tuple[list[Result], MainWindow]:
    """Rows of 1, and the window of the last open, left open for 3 and 4."""
    opens = measure_first_paint(path, max(args.rounds - 1, 0), tmp)
    window = new_window(tmp)
    opens.append(open_to_first_paint(window, path))
    first = Result(
        f"1. open {_events(n_events)} events -> first paint",
        FIRST_PAINT_S,
        [o.first_paint_s for o in opens],
    )
    loaded = Result(
        "   (trace read: loaded emitted)", 0, [o.loaded_s for o in opens], informative=True
    )
    handled = Result(
        "   (window's loaded handler done)", 0, [o.handled_s for o in opens], informative=True
    )
    ready = Result(
        "   (plan model ready, background)", 0, [o.ready_s for o in opens], informative=True
    )
    first.notes.append(
        f"{len(opens)} opens of a {window.width()}x{window.height()} window; the first (cold) "
        f"{_fmt(opens[0].first_paint_s)}; "
        f"{statistics.median(o.paints for o in opens):.0f} paint(s) of the plot by then"
    )
    out(
        f"open -> first paint: median {_fmt(first.median)} ({first.notes[0]}); loaded at "
        f"{_fmt(loaded.median)}, handled at {_fmt(handled.median)}; plan model ready at "
        f"{_fmt(ready.median)}; {first.ratio:.2f}x the {_fmt(FIRST_PAINT_S)} target"
    )
    return [first, loaded, handled, ready], window


def _toggle_rows(
    window: MainWindow, args: argparse.Namespace, n_events: int, out: Callable[[str], None]
) -> list[Result]:
    rows = block_rows(window)
    check = check_toggle(window, rows[len(rows) // 2])
    toggle = Result(
        f"3. toggle -> redraw ({_events(n_events)} events)",
        TOGGLE_S,
        measure_toggles(window, args.toggles),
    )
    selected = len(window.plan.session.selection) if window.plan.session else 0
    toggle.notes.append(
        f"{len(toggle.samples)} random toggles of {len(rows)} blocks ({selected} selected at "
        f"the end); check of one toggle: readout {check.readout_peak:,} B, "
        f"ProjectionModel.peak {check.model_peak:,} B, exact project {check.exact_peak:,} B, "
        f"incremental {check.incremental}, shown in the readout {check.readout_shows_it}, "
        f"drawn {check.drawn}: {'OK' if check.ok else 'MISMATCH'}"
    )
    out(
        f"toggle -> redraw: median {_fmt(toggle.median)} (p90 {_fmt(toggle.p90)}); "
        f"{toggle.ratio:.2f}x the {_fmt(TOGGLE_S)} target; {toggle.notes[0]}"
    )
    return [toggle]


def _export_rows(
    window: MainWindow, tmp: str, args: argparse.Namespace, out: Callable[[str], None]
) -> list[Result]:
    exports = measure_export(window, tmp, args.rounds)
    name = f"4. PNG export ({window.width()}x{window.height()} window)"
    export = Result(name, EXPORT_S, exports.seconds)
    grab = Result("   (grab() alone: painting)", 0, exports.grab_seconds, informative=True)
    export.notes.append(
        f"{len(exports.seconds)} exports of the timeline tab, {exports.png_size[0]}x"
        f"{exports.png_size[1]} px, {exports.png_bytes / 1e3:.0f} kB"
    )
    out(
        f"PNG export: median {_fmt(export.median)} ({export.notes[0]}; grab() alone "
        f"{_fmt(grab.median)}); {export.ratio:.2f}x the {_fmt(EXPORT_S)} target"
    )
    return [export, grab]


def _redraw_rows(args: argparse.Namespace, out: Callable[[str], None]) -> list[Result]:
    t0 = time.perf_counter()
    run = synthetic_run_data(args.points, args.blocks)
    built = time.perf_counter() - t0
    redraws = measure_redraws(run, passes=args.rounds)
    del run
    gc.collect()
    redraw = Result(
        f"2. pan/zoom redraw ({_events(redraws.points_in_view)} points)", REDRAW_S, redraws.seconds
    )
    rows = [
        redraw,
        Result("   (setXRange: slice the envelope)", 0, redraws.update_seconds, informative=True),
        Result("   (repaint of the plot)", 0, redraws.paint_seconds, informative=True),
        Result("   (overview strip repaint, extra)", 0, redraws.overview_seconds, informative=True),
    ]
    redraw.notes.append(
        f"{redraws.points_in_view:,} points in view zoomed out, {redraws.drawn_zoomed_out:,} "
        f"bins drawn per curve; {len(redraws.seconds)} redraws; run built in {built:.1f} s, "
        f"set_run + first paint {_fmt(redraws.set_run_s)}"
    )
    out(
        f"pan/zoom redraw: median {_fmt(redraw.median)} (p90 {_fmt(redraw.p90)}); "
        f"{redraw.ratio:.2f}x the {_fmt(REDRAW_S)} target; {redraw.notes[0]}"
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    results = run_benchmark(args)
    print()
    print(format_table(results))
    for r in results:
        for note in r.notes:
            print(f"{r.name.split()[0]} {note}")
    print(f"machine: {machine_info()}")
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    missed = [r.name.strip() for r in results if not r.informative and not r.met]
    print("all targets MET" if not missed else f"MISSED: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
