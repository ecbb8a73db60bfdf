"""Every bundled sample trace stays readable, valid and explainable (compatibility fixtures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckview.analysis import summarize_run
from ckview.trace import open_trace, validate_trace
from ckview.trace.schema import Phase
from tests.conftest import ROOT, read_run

SAMPLES = sorted((ROOT / "sample_traces").glob("*.h5"))


def test_there_are_sample_traces() -> None:
    names = {p.stem for p in SAMPLES}
    assert {"mlp", "cnn", "transformer", "gpt2", "transformer_checkpointed"} <= names


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_sample_trace_is_valid_and_summarises(path: Path) -> None:
    report = validate_trace(path)
    assert report.ok, report.problems
    with open_trace(path) as trace:
        runs = trace.run_names
    assert runs in (["main"], ["baseline", "checkpointed"])
    for run in runs:
        tables = read_run(path, run)
        assert tables["meta"].complete and tables["meta"].steps_recorded == 2
        summary = summarize_run(tables, tables["modules"], tables["strings"])
        assert summary.peak_bytes > summary.baseline_bytes > 0


def test_checkpointing_shows_in_the_traces() -> None:
    plain = read_run(ROOT / "sample_traces" / "transformer.h5")
    ckpt = read_run(ROOT / "sample_traces" / "transformer_checkpointed.h5")

    def peak(tables: dict) -> int:
        return summarize_run(tables, tables["modules"], tables["strings"]).peak_bytes

    assert (ckpt["ops"]["phase"] == Phase.RECOMPUTE).any()
    assert not (plain["ops"]["phase"] == Phase.RECOMPUTE).any()
    assert peak(ckpt) < 0.6 * peak(plain)
