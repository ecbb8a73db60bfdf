"""``recorder.run.record``: a script recorded without the CLI, and every torch patch undone
(recorder/_torch.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint

from ckview.trace import open_trace
from recorder import RecordingResult, RecordOptions, StopScript, record
from recorder import _torch as patches
from recorder.runs import RunSpec

pytestmark = [pytest.mark.torch, pytest.mark.recorder]
SCRIPT = """
import sys
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
sys.exit(int(sys.argv[2]))
"""


def test_record_returns_how_the_recording_ended(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "t.h5"
    result = record(str(script), ["4", "3"], out, RecordOptions(steps=2, warmup=1, progress=False))
    assert isinstance(result, RecordingResult)
    assert result.exit_code == 3 and result.error == "SystemExit: 3"  # the script's own
    assert (result.steps, result.warmup_done, result.written) == (2, 1, out)
    assert result.write_error is None and not result.existed
    with open_trace(out) as trace:
        assert trace.meta.complete and trace.meta.steps_recorded == 2


def test_a_run_that_aborts_leaves_no_trace(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def refuse(recorder: object) -> object:
        raise StopScript("this plan does not fit")

    out = tmp_path / "t.h5"
    options = RecordOptions(steps=1, warmup=1, progress=False)
    try:
        record(str(script), ["3", "0"], out, options, runs=[RunSpec("plan:x", refuse)])
    except StopScript as abort:
        assert str(abort) == "this plan does not fit"
    else:
        raise AssertionError("the abort did not reach the caller")
    assert not out.exists()


class _Listener:
    def created(self, optimizer: torch.optim.Optimizer) -> None:
        pass


def test_every_patch_is_undone() -> None:
    originals = (
        os.closerange,
        torch.optim.Optimizer.__init__,
        torch.autograd.graph.saved_tensors_hooks.__init__,
        torch.utils.checkpoint.CheckpointFunction.backward,
    )
    hook_cls = torch.utils.checkpoint._recomputation_hook
    enter_exit = (hook_cls.__enter__, hook_cls.__exit__)
    undos = [
        patches.keep_fd_on_closerange(lambda: -1, lambda: None),
        patches.watch_optimizer_init(_Listener().created),
        patches.observe_saved_tensor_hooks(lambda x, kind: None),
        patches.bracket_recompute(lambda *a: None, lambda: None, lambda f: None),
    ]
    assert os.closerange is not originals[0]
    assert torch.optim.Optimizer.__init__ is not originals[1]
    assert (hook_cls.__enter__, hook_cls.__exit__) != enter_exit
    for undo in reversed(undos):
        undo()
    assert (
        os.closerange,
        torch.optim.Optimizer.__init__,
        torch.autograd.graph.saved_tensors_hooks.__init__,
        torch.utils.checkpoint.CheckpointFunction.backward,
    ) == originals
    assert (hook_cls.__enter__, hook_cls.__exit__) == enter_exit
