"""NOTE [ Memory this process may use ]: the memory limit of a process, not the machine's free
memory, bounds what a trace may declare (issue 21, defect 5: a compressed bomb read under
``prlimit --as`` gave numpy's ArrayMemoryError traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

from tests.conftest import ROOT

ROOM = 256 << 20
"""Address space the limited child may map beyond what it maps once started."""


def _limited(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a Python whose address space is limited to ROOM beyond its start-up."""
    start = (
        "import resource, sys\n"
        "from ckview.trace.structure import _status_kib\n"
        "import ckview.cli.main, numpy, h5py\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (_status_kib('VmSize') + {ROOM}, "
        "resource.RLIM_INFINITY))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CKVIEW_MEMORY_LIMIT"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", start + code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_address_space_limit_bounds_what_a_run_may_declare() -> None:
    done = _limited(
        "from ckview.trace.structure import usable_memory, memory_limit, READ_FACTOR\n"
        "print(usable_memory(), memory_limit(), READ_FACTOR)"
    )
    usable, limit, factor = map(int, done.stdout.split())
    assert 0 < usable <= ROOM and limit == usable // factor


def test_a_compressed_bomb_under_a_memory_limit_is_refused_in_one_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.h5"
    shutil.copy(ROOT / "sample_traces" / "mlp.h5", bomb)
    rows = 8_000_000  # 136 MB declared, in a few hundred KB; reading it takes about 4 times that
    with h5py.File(bomb, "r+") as f:
        table = f["runs"][next(iter(f["runs"]))]["memory_events"]
        for name in list(table):
            dtype = table[name].dtype
            del table[name]
            table.create_dataset(
                name,
                data=np.zeros(rows, dtype),
                chunks=(1 << 20,),
                maxshape=(None,),
                compression="gzip",
                compression_opts=9,
            )
    assert bomb.stat().st_size < 2 << 20
    for verb in ("validate", "summary"):
        done = _limited(
            "from ckview.cli.main import main\nsys.argv = ['ckview', *sys.argv[1:]]\n"
            "sys.exit(main())",
            verb,
            str(bomb),
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "CKVIEW_MEMORY_LIMIT" in done.stderr
