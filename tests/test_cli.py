"""The ckview command end to end: record, validate, summary, and every bad input."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import pytest

from ckview.analysis import format_bytes
from tests.conftest import EXAMPLES, ROOT, ckview

pytestmark = pytest.mark.torch


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("ckview: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def mlp_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rec") / "mlp.h5"
    proc = ckview(
        "record",
        "-o",
        str(out),
        "--steps",
        "2",
        "--progress",
        str(EXAMPLES / "mlp.py"),
        "--depth",
        "2",
        "--steps",
        "4",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("loss") == 4  # the script's own output, untouched
    assert "ckview: recorded step 2/2" in proc.stderr
    return out


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.py")))
def test_record_validate_summary_each_example(name: str, tmp_path: Path) -> None:
    """Every bundled example records as the README says (distributed.py without a launcher
    runs as one rank)."""
    out = tmp_path / "t.h5"
    proc = ckview("record", "-o", str(out), "--steps", "2", f"examples/{name}.py")
    assert proc.returncode == 0, proc.stderr
    assert ckview("validate", str(out)).returncode == 0
    summary = ckview("summary", str(out))
    assert summary.returncode == 0, summary.stderr
    assert "peak" in summary.stdout and "activation" in summary.stdout
    doc = json.loads(ckview("summary", str(out), "--json").stdout)
    run = doc["runs"]["main"]
    assert doc["meta"]["steps_recorded"] == 2 and doc["meta"]["complete"]
    assert run["peak_bytes"] > run["baseline_bytes"] > 0
    assert run["by_category"]["activation"] >= 0 and len(run["steps"]) == 2


def test_the_script_arguments_are_in_the_command(mlp_trace: Path) -> None:
    from ckview.trace import open_trace

    with open_trace(mlp_trace) as trace:
        assert trace.meta.steps_recorded == 2
        assert "--depth" in trace.meta.command


def test_module_target(tmp_path: Path) -> None:
    pkg = tmp_path / "trainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(EXAMPLES / "mlp.py", pkg / "train.py")
    out = tmp_path / "m.h5"
    proc = ckview(
        "record",
        "-o",
        str(out),
        "-m",
        "trainpkg.train",
        "--depth",
        "1",
        "--steps",
        "3",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert ckview("validate", str(out)).returncode == 0


def test_script_that_raises_leaves_incomplete_trace_and_its_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(3):\n"
        "    m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "raise RuntimeError('out of patience')\n"
    )
    out = tmp_path / "boom.h5"
    proc = ckview("record", "-o", str(out), "--steps", "5", str(script))
    assert proc.returncode == 1
    assert "RuntimeError: out of patience" in proc.stderr
    assert "marked incomplete" in proc.stderr
    summary = ckview("summary", str(out))
    assert summary.returncode == 0
    assert "INCOMPLETE: RuntimeError: out of patience" in summary.stdout


def test_script_exit_code_is_passed_through(tmp_path: Path) -> None:
    script = tmp_path / "exit3.py"
    script.write_text("import sys\nsys.exit(3)\n")
    assert ckview("record", "-o", str(tmp_path / "e.h5"), str(script)).returncode == 3


def test_missing_script(tmp_path: Path) -> None:
    line = _one_line_error(ckview("record", str(tmp_path / "nope.py")))
    assert "not found" in line


def test_missing_module() -> None:
    assert "no module named" in _one_line_error(ckview("record", "-m", "no_such_mod_xyz"))


def test_unwritable_output(tmp_path: Path) -> None:
    line = _one_line_error(
        ckview("record", "-o", str(tmp_path / "no" / "t.h5"), str(EXAMPLES / "mlp.py"))
    )
    assert "does not exist" in line


@pytest.mark.parametrize("verb", ["summary", "validate"])
def test_not_a_trace(verb: str, tmp_path: Path) -> None:
    text = tmp_path / "notes.h5"
    text.write_text("hello")
    assert "not a ckview trace" in _one_line_error(ckview(verb, str(text)))
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["x"] = [1, 2, 3]
    assert "not a ckview trace" in _one_line_error(ckview(verb, str(plain)))


@pytest.mark.parametrize("verb", ["summary", "validate"])
def test_truncated_and_corrupted_traces(verb: str, mlp_trace: Path, tmp_path: Path) -> None:
    data = mlp_trace.read_bytes()
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(data[: len(data) // 2])
    _one_line_error(ckview(verb, str(truncated)))
    # Garbage over the middle half: the compressed columns no longer decode.
    corrupted = tmp_path / "corrupted.h5"
    quarter = len(data) // 4
    garbage = random.Random(0).randbytes(2 * quarter)
    corrupted.write_bytes(data[:quarter] + garbage + data[3 * quarter :])
    _one_line_error(ckview(verb, str(corrupted)))


@pytest.mark.parametrize("verb", ["summary", "validate"])
def test_newer_format_version(verb: str, mlp_trace: Path, tmp_path: Path) -> None:
    newer = tmp_path / "newer.h5"
    shutil.copy(mlp_trace, newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["format_version"] = 99
    assert "upgrade" in _one_line_error(ckview(verb, str(newer)))


def test_missing_trace(tmp_path: Path) -> None:
    _one_line_error(ckview("summary", str(tmp_path / "none.h5")))


def test_unknown_run(mlp_trace: Path) -> None:
    assert "no run" in _one_line_error(ckview("summary", str(mlp_trace), "--run", "baseline"))


def test_summary_does_not_import_torch(mlp_trace: Path) -> None:
    code = (
        "import sys; from ckview.cli.main import main; "
        f"rc = main(['summary', {str(mlp_trace)!r}]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_summary_into_a_closed_pipe_is_quiet() -> None:
    trace = ROOT / "sample_traces" / "gpt2_compare.h5"  # --json --top 100000: ~160 kB of output
    proc = subprocess.run(
        f"{sys.executable} -m ckview summary {trace} --json --top 100000 | head -1",
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_summary_reports_the_activation_high_water_mark(run_cli: Any) -> None:
    """The MLP peaks on its gradients and optimizer state, when no activation is left: the
    summary still says how many bytes were saved for backward at most, when, and by whom."""
    trace = str(ROOT / "sample_traces" / "mlp.h5")
    code, out, _ = run_cli("summary", trace, "--json")
    run = json.loads(out)["runs"]["main"]
    peak = run["activation_peak"]
    assert code == 0 and run["by_category"]["activation"] == 0 < peak["bytes"]
    assert run["activation_peak_phase"] == "forward" and peak["step"] == 0
    assert peak["top_modules"][0][0].startswith("ResidualMLP.blocks.")
    code, text, _ = run_cli("summary", trace)
    assert f"activations {format_bytes(peak['bytes']):>11}  at most" in text
