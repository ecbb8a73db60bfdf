"""Damage that ``ckview validate`` refuses although every reference still resolves (issue 21,
defect 7)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import h5py

from tests.conftest import ROOT


def test_a_resized_string_table_is_refused(tmp_path: Path, run_cli: Any) -> None:
    trace = tmp_path / "t.h5"
    shutil.copy(ROOT / "sample_traces" / "mlp.h5", trace)
    with h5py.File(trace, "r+") as f:
        f["strings"].resize((f["strings"].shape[0] + 5,))  # five empty strings appended
    code, out, err = run_cli("validate", str(trace))
    assert code == 1, (out, err)
    assert "/strings holds 5 repeated strings, first ''" in out + err


def test_the_sample_traces_hold_each_string_once(run_cli: Any) -> None:
    for trace in sorted((ROOT / "sample_traces").glob("*.h5")):
        code, out, err = run_cli("validate", str(trace))
        assert code == 0, (trace, out, err)
