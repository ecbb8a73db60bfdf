"""A recording keeps the PYTORCH_CUDA_ALLOC_CONF it ran with (issue 23), for the allocator
model to replay with the same rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from ckview.analysis.allocator import settings_from_meta
from ckview.trace import open_trace
from tests.factory import record_model

pytestmark = pytest.mark.torch


def test_the_allocator_configuration_is_in_the_meta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    record_model(tmp_path / "t.h5", nn.Linear(4, 4), (2, 4))
    with open_trace(tmp_path / "t.h5") as trace:
        settings = settings_from_meta(trace.meta.allocator_settings)
    assert settings.max_split_size == 128 << 20
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    record_model(tmp_path / "u.h5", nn.Linear(4, 4), (2, 4))
    with open_trace(tmp_path / "u.h5") as trace:
        assert trace.meta.allocator_settings == ""
