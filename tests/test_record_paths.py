"""Where a recording goes and what a failed script leaves (issue 21, defects 1, 3 and 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckview.trace import open_trace
from tests.conftest import ROOT

pytestmark = [pytest.mark.torch, pytest.mark.recorder]

TRAIN = """\
import os, sys, torch
if len(sys.argv) > 1:
    os.chdir(sys.argv[1])
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""

FILL = """\
import resource, torch
def mapped():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped() + (768 << 20), resource.RLIM_INFINITY))
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
held = []
for i in range(1000):
    loss = model(torch.randn(64, 256)).sum()
    if i >= 3:
        held.append(torch.ones(32 << 20, dtype=torch.uint8))  # until an allocation fails
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def _ckview(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ckview", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_relative_output_is_where_ckview_started_when_the_script_changes_folder(
    tmp_path: Path,
) -> None:
    """NOTE [ Paths from where ckview started ]."""
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "elsewhere").mkdir()
    done = _ckview(tmp_path, "record", "-o", "out.h5", "--steps", "2", "--compare", "train.py")
    assert done.returncode == 0, done.stderr
    done = _ckview(tmp_path, "record", "-o", "moved.h5", "--steps", "2", "train.py", "elsewhere")
    assert done.returncode == 0, done.stderr
    assert "wrote moved.h5 (2 steps)" in done.stderr
    assert (tmp_path / "moved.h5").exists() and not list((tmp_path / "elsewhere").iterdir())
    assert not list(tmp_path.glob("*.journal"))


def test_a_second_recording_into_the_same_file_is_refused(tmp_path: Path) -> None:
    """Two recordings into one -o both said 'wrote', one trace replacing the other."""
    # The first recording holds its steps after the fourth until the second one is answered.
    waits = "range(40):\n    while _ > 4 and not os.path.exists('answered'): time.sleep(0.05)"
    (tmp_path / "slow.py").write_text("import time\n" + TRAIN.replace("range(4):", waits))
    (tmp_path / "train.py").write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "ckview", "record", "-o", "same.h5", "--steps", "6", "slow.py"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):  # until the first one's journal is there (at most a minute)
            if list(tmp_path.glob("same.recording-*.journal")) or first.poll() is not None:
                break
            time.sleep(0.1)
        second = _ckview(tmp_path, "record", "-o", "same.h5", "--steps", "2", "train.py")
        assert first.poll() is None, "the first recording ended too soon to test"
    finally:
        (tmp_path / "answered").touch()
        _, first_err = first.communicate(timeout=300)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert "same.h5 is being recorded by another ckview" in second.stderr
    assert first.returncode == 0 and "wrote same.h5 (6 steps)" in first_err


INTERRUPTED_CLOSE = """\
import sys
from recorder.session import Recorder
from ckview.cli.main import main

def interrupted(self, *args, **kwargs):  # the second Ctrl-C, as the trace is being closed
    raise KeyboardInterrupt

Recorder.close = interrupted
sys.argv = ["ckview", *sys.argv[1:]]
sys.exit(main())
"""


def test_ctrl_c_while_the_trace_is_closed_says_how_to_get_the_steps_back(
    tmp_path: Path,
) -> None:
    """A second Ctrl-C lands while the trace is being closed: the journal is what is left, and
    the last line says how to bring its steps back. (In a process of its own: the recorder is
    left installed, as it is when a real process ends there.)"""
    (tmp_path / "train.py").write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    record = ["record", "-o", "t.h5", "--steps", "2", "train.py"]
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_CLOSE, *record],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 130, done.stderr
    assert line.startswith("ckview: interrupted while the trace was being closed")
    assert "ckview recover t.h5" in line and ".journal" in line
    recovered = _ckview(tmp_path, "recover", "t.h5")
    assert recovered.returncode == 0 and "recovered 2 steps" in recovered.stderr


def test_a_module_in_the_working_folder_is_found_as_python_m_finds_it(tmp_path: Path) -> None:
    """Through the ``ckview`` entry point, whose ``sys.path[0]`` is its own folder."""
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(TRAIN)
    entry_point = Path(sys.executable).with_name("ckview")
    assert entry_point.exists(), "the test runs from the venv that pip install -e set up"
    done = subprocess.run(
        [str(entry_point), "record", "-o", "pkg.h5", "-m", "mypkg"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pkg.h5").exists()


def test_a_script_out_of_memory_leaves_its_oom_trace(tmp_path: Path) -> None:
    """NOTE [ A failed script's memory is released first ]: under an address-space limit the
    trace could not be written while the script's tensors were held (SIGSEGV, exit 139)."""
    (tmp_path / "fill.py").write_text(FILL)
    done = _ckview(tmp_path, "record", "-o", "oom.h5", "--steps", "1000", "fill.py")
    assert done.returncode == 1, done.stderr
    ckview_lines = [line for line in done.stderr.splitlines() if line.startswith("ckview:")]
    assert len(ckview_lines) == 1 and "ran out of memory" in ckview_lines[0], done.stderr
    # The script's traceback as Python prints it: its own frames, no runpy's or ckview's.
    for hidden in ("<frozen runpy>", "recorder/", "ckview/"):
        assert hidden not in done.stderr
    assert 'File "fill.py", line 13' in done.stderr
    with open_trace(tmp_path / "oom.h5") as trace:
        run = trace.run(trace.run_names[0])
        assert run.oom_bytes == 32 << 20 and not run.complete
