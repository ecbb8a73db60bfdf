"""``ckview export``: the report figure (PNG/SVG) and CSV curves, headless and without torch."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckview.analysis import regions_from_plan
from ckview.app.planning import PlanSession
from ckview.app.report import CSV_COLUMNS, plan_label
from ckview.app.run import Run, load_trace
from ckview.app.style import CATEGORY_COLORS, DARK, RUN_COLORS
from ckview.trace.schema import Category
from tests.conftest import ROOT

pytestmark = pytest.mark.gui

SAMPLES = ROOT / "sample_traces"
COMPARE = SAMPLES / "transformer_compare.h5"
L0_PLAN = {
    "format": "ckview-plan",
    "version": 1,
    "name": "l0",
    "regions": [{"module": "encoder.layers.0"}],
}


def export(*argv: str) -> tuple[int, str, str]:
    """``ckview export ARGV`` in-process (usable from module-scoped fixtures)."""
    from ckview.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["export", *argv])
    return code, out.getvalue(), err.getvalue()


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def pixels(path: Path) -> np.ndarray:
    """(h, w, 3) RGB of an image file."""
    from PyQt6.QtGui import QImage

    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB32)
    assert not image.isNull(), path
    bits = image.constBits()
    assert bits is not None
    bits.setsize(image.sizeInBytes())
    raw = np.frombuffer(bits, np.uint8).reshape(image.height(), image.bytesPerLine() // 4, 4)
    return raw[:, : image.width(), 2::-1].copy()  # BGRA in memory -> RGB


def share_near(rgb: np.ndarray, color: str, tolerance: int = 24) -> float:
    """Share of the pixels within ``tolerance`` of ``color`` in every channel."""
    want = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
    near = np.all(np.abs(rgb.astype(np.int32) - want) <= tolerance, axis=-1)
    return float(near.mean())


def plan_peak(run: Run, plan: str | dict[str, Any]) -> int:
    session = PlanSession(run)
    t = run.tables
    session.set_selection(regions_from_plan(plan, t["modules"], t["strings"]))
    return session.outcome().peak_bytes


@pytest.fixture(scope="module")
def compare_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """transformer_compare.h5 with a preset and a plan file, as PNG plus CSV."""
    out = tmp_path_factory.mktemp("export")
    plan_file = out / "l0.json"
    plan_file.write_text(json.dumps(L0_PLAN), encoding="utf-8")
    png, curves = out / "report.png", out / "curves.csv"
    code, stdout, stderr = export(
        str(COMPARE),
        "--plan",
        "sqrt",
        "--plan",
        str(plan_file),
        "-o",
        str(png),
        "--csv",
        str(curves),
    )
    assert code == 0, stderr
    return {"png": png, "csv": curves, "stdout": stdout, "trace": load_trace(COMPARE)}


def test_png_is_a_full_width_non_blank_figure(compare_report: dict[str, Any]) -> None:
    png: Path = compare_report["png"]
    assert png.stat().st_size > 20_000
    rgb = pixels(png)
    height, width = rgb.shape[:2]
    assert width == 1600
    line = compare_report["stdout"].strip()
    assert line.startswith(f"wrote {png} (1600x{height}, 2 runs, 2 plans)")
    n_rows = len(read_csv(compare_report["csv"])[1])
    assert line.endswith(f"{compare_report['csv']} ({n_rows} rows)")
    assert len(compare_report["stdout"].strip().splitlines()) == 1
    # Drawn, not blank: many colours, and the data's colours in real amounts.
    packed = rgb.astype(np.int64) @ np.array([1 << 16, 1 << 8, 1])
    assert len(np.unique(packed)) > 500
    assert share_near(rgb, CATEGORY_COLORS[Category.ACTIVATION]) > 0.01
    for category in (Category.PARAMETER, Category.OPTIMIZER_STATE, Category.TEMPORARY):
        assert share_near(rgb, CATEGORY_COLORS[category]) > 0.001, category
    for color in RUN_COLORS[:4]:  # two runs, then two plans
        assert share_near(rgb, color, tolerance=12) > 0.0003, color


def test_csv_holds_every_point_of_every_run(compare_report: dict[str, Any]) -> None:
    header, rows = read_csv(compare_report["csv"])
    assert header == list(CSV_COLUMNS)
    assert header[5:] == [
        "sharded_parameters_bytes",
        "unsharded_parameters_bytes",
        "parameters_bytes",
        "gradients_bytes",
        "optimizer_state_bytes",
        "communication_buffers_bytes",
        "inputs_bytes",
        "activations_bytes",
        "temporaries_bytes",
        "other_bytes",
        "unknown_bytes",
    ]
    for run in compare_report["trace"].runs:
        mine = [r for r in rows if r["run"] == run.label]
        assert len(mine) == run.n_events + 1
        assert [int(r["point"]) for r in mine] == list(range(run.n_events + 1))
        total = np.array([int(r["total_bytes"]) for r in mine])
        assert total.max() == run.peak.bytes
        np.testing.assert_array_equal(total, run.timeline.total)
        parts = np.array([[int(r[c]) for c in header[5:]] for r in mine]).sum(axis=1)
        np.testing.assert_array_equal(parts, total)
        np.testing.assert_allclose([float(r["time_ms"]) for r in mine], run.x_time, atol=1e-6)


@pytest.mark.parametrize("plan", ["sqrt", "l0"])
def test_csv_plan_curve_peaks_at_the_projected_peak(
    compare_report: dict[str, Any], plan: str
) -> None:
    baseline = next(r for r in compare_report["trace"].runs if r.name == "baseline")
    _, rows = read_csv(compare_report["csv"])
    mine = [r for r in rows if r["run"] == plan_label(plan, baseline)]
    assert mine
    assert all(r["activations_bytes"] == "" for r in mine)
    expected = plan_peak(baseline, "sqrt" if plan == "sqrt" else L0_PLAN)
    assert max(int(r["total_bytes"]) for r in mine) == expected
    assert expected < baseline.peak.bytes


def test_svg_is_vector_xml(tmp_path: Path) -> None:
    out = tmp_path / "report.svg"
    code, stdout, stderr = export(str(COMPARE), "--plan", "sqrt", "-o", str(out))
    assert code == 0, stderr
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("viewBox", "").split()[2] == "1600"
    paths = root.findall(".//{http://www.w3.org/2000/svg}path")
    assert len(paths) >= 2 * 7  # one filled path per category per run, at least
    assert sum(len(p.get("d", "")) for p in paths) > 20_000  # the curves, not just boxes
    assert root.find(".//{http://www.w3.org/2000/svg}image") is None  # all vector
    texts = "".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "baseline" in texts and "checkpointed" in texts
    assert stdout.startswith(f"wrote {out} (1600x")


def test_two_traces_in_one_figure(tmp_path: Path) -> None:
    out, curves = tmp_path / "two.png", tmp_path / "two.csv"
    traces = [SAMPLES / "transformer.h5", SAMPLES / "transformer_checkpointed.h5"]
    code, stdout, stderr = export(*map(str, traces), "-o", str(out), "--csv", str(curves))
    assert code == 0, stderr
    assert "2 runs, 0 plans" in stdout
    _, rows = read_csv(curves)
    assert {r["run"] for r in rows} == {
        "transformer.h5 · main",
        "transformer_checkpointed.h5 · main",
    }
    rgb = pixels(out)
    assert share_near(rgb, RUN_COLORS[0], 12) > 0.0003
    assert share_near(rgb, RUN_COLORS[1], 12) > 0.0003


def test_run_filter_dark_theme_op_axis(tmp_path: Path) -> None:
    out = tmp_path / "dark.png"
    code, stdout, stderr = export(
        str(COMPARE),
        "--run",
        "checkpointed",
        "--theme",
        "dark",
        "--x",
        "op",
        "-o",
        str(out),
        "--width",
        "1000",
    )
    assert code == 0, stderr
    assert "(1000x" in stdout and "1 run, 0 plans" in stdout
    rgb = pixels(out)
    assert rgb.shape[1] == 1000
    assert share_near(rgb, DARK.background, 2) > 0.3
    assert share_near(rgb, CATEGORY_COLORS[Category.ACTIVATION]) > 0.002


def test_csv_only(tmp_path: Path) -> None:
    out = tmp_path / "curves.csv"
    code, stdout, stderr = export(str(SAMPLES / "cnn.h5"), "-o", str(out))
    assert code == 0, stderr
    run = load_trace(SAMPLES / "cnn.h5").runs[0]
    _, rows = read_csv(out)
    assert len(rows) == run.n_events + 1
    assert stdout.strip() == f"wrote {out} ({run.n_events + 1} rows)"
    assert not list(tmp_path.glob("*.png"))


def test_csv_option_alone_writes_only_the_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--csv`` without ``-o`` asks for the curves only: no report.png beside them."""
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = export(str(SAMPLES / "cnn.h5"), "--csv", "c.csv")
    assert code == 0, stderr
    rows = load_trace(SAMPLES / "cnn.h5").runs[0].n_events + 1
    assert stdout.strip() == f"wrote c.csv ({rows} rows)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv"]


def _nothing_plan(tmp_path: Path) -> str:
    path = tmp_path / "nothing.json"
    doc = {"format": "ckview-plan", "version": 1, "regions": [{"module": "nosuch"}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([str(COMPARE), "-o", "{tmp}/r.jpg"], ".png, .svg, .csv"),
        ([str(SAMPLES / "nosuch.h5"), "-o", "{tmp}/r.png"], "does not exist"),
        ([str(ROOT / "README.md"), "-o", "{tmp}/r.png"], "not a ckview trace"),
        ([str(COMPARE), "--run", "nosuch", "-o", "{tmp}/r.png"], "runs: baseline, checkpointed"),
        ([str(COMPARE), "--plan", "{nothing}", "-o", "{tmp}/r.png"], "nosuch"),
        ([str(COMPARE), "--plan", "every:0", "-o", "{tmp}/r.png"], "every:0"),
        ([str(COMPARE), "--plan", "{tmp}/missing.json", "-o", "{tmp}/r.png"], "no plan file"),
        ([str(COMPARE), "--width", "100", "-o", "{tmp}/r.png"], "--width 100"),
        ([str(COMPARE), "--width", "20000", "-o", "{tmp}/r.png"], "400 to 10000"),
        ([str(COMPARE), "-o", "{tmp}/no/such/dir/r.png"], "cannot write"),
    ],
)
def test_errors_are_one_line(run_cli: Any, tmp_path: Path, argv: list[str], message: str) -> None:
    argv = [a.format(tmp=tmp_path, nothing=_nothing_plan(tmp_path)) for a in argv]
    code, _, err = run_cli("export", *argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ckview: error: ")
    assert message in lines[0]
    assert "Traceback" not in err
    assert not list(tmp_path.glob("r.*"))


def test_damaged_trace_is_one_line(run_cli: Any, tmp_path: Path) -> None:
    data = (SAMPLES / "mlp.h5").read_bytes()
    quarter = len(data) // 4
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(data[:quarter] + bytes(2 * quarter) + data[3 * quarter :])
    code, _, err = run_cli("export", str(damaged), "-o", str(tmp_path / "r.png"))
    assert code == 2
    assert err.startswith("ckview: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("platform", [None, "", "xcb"])
def test_export_never_imports_torch_and_needs_no_display(
    tmp_path: Path, platform: str | None
) -> None:
    """Whatever QT_QPA_PLATFORM says (unset, empty, or xcb with a display named but maybe
    without xcb's system libraries), the report renders offscreen."""
    out = tmp_path / "x.png"
    code = (
        "import sys\n"
        "from ckview.cli.main import main\n"
        f"assert main(['export', {str(SAMPLES / 'transformer.h5')!r}, '--plan', 'sqrt', "
        f"'-o', {str(out)!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'export imported torch'\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY")}
    env.pop("WAYLAND_DISPLAY", None)
    if platform is not None:
        env.update(QT_QPA_PLATFORM=platform, DISPLAY=":99")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 20_000
