"""Take the explorer screenshots shown in the README, offscreen, from the real app.

    QT_QPA_PLATFORM=offscreen python docs/screenshots.py [--diff-only | --oom-ranks-only]

Writes docs/images/explorer-*.png from the sample traces (explorer-export.png through File ->
Export View), the explorer opened on an out-of-memory failure (explorer-oom*.png, from a step
recorded here that asks for more memory than any machine has; once with the test fakes of
torch.cuda and pynvml, for the device lines), the two ranks of an FSDP recording side by side
(ranks.png, recorded here with torchrun: about 15 s; the peaks vary a little from one recording
to the next, rank 1 with its larger batch most often the higher), and
docs/images/snapshot-import.png from the CUDA snapshot fixture when it is there; the options
below make only some of them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PyQt6.QtCore import QSettings
from PyQt6.QtWidgets import QApplication, QWidget

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
OUT = ROOT / "docs" / "images"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` prints this module's docstring and exits, writing nothing)."""
    parser = argparse.ArgumentParser(
        prog="docs/screenshots.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--diff-only",
        action="store_true",
        help="only the Diff view's and the budget answers' images (explorer-diff*.png, "
        "explorer-budget*.png)",
    )
    only.add_argument(
        "--size-only",
        action="store_true",
        help="only the size field's images (explorer-size*.png; records a small transformer "
        "at batch 4 and 8)",
    )
    only.add_argument(
        "--oplevel-only",
        action="store_true",
        help="only the plan panel's op-level choices (explorer-oplevel*.png)",
    )
    only.add_argument(
        "--offload-only",
        action="store_true",
        help="only the host curve of an offload plan (explorer-offload*.png)",
    )
    only.add_argument(
        "--oom-ranks-only",
        action="store_true",
        help="only explorer-oom*.png and ranks.png (records an OOM step and an FSDP run)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    app = QApplication(sys.argv[:1])
    from ckview.app.style import DARK
    from ckview.gui.main_window import MainWindow

    opened: list[MainWindow] = []
    """Every window stays referenced: a shown window dropped into a reference cycle can be
    collected by the cyclic GC in the middle of its own paint event."""

    def window(*traces: str) -> MainWindow:
        settings = QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat)
        w = MainWindow(settings=settings)
        opened.append(w)
        w.resize(1600, 1000)
        w.show()
        w.open_paths([str(SAMPLES / t) for t in traces])
        settle(lambda: len(w.traces) == len(traces) and w.plan.is_ready())
        return w

    def settle(done: object = None, timeout: float = 30.0) -> None:
        end = time.time() + timeout
        while time.time() < end and not (done() if callable(done) else True):
            app.processEvents()
            time.sleep(0.01)
        for _ in range(5):
            app.processEvents()

    def save(w: QWidget, name: str) -> None:
        settle()
        w.grab().save(str(OUT / name))
        print(f"wrote docs/images/{name}")

    OUT.mkdir(parents=True, exist_ok=True)
    _offload_shots(window, save, settle)
    if args.offload_only:
        return 0
    _oplevel_shots(window, save)
    if args.oplevel_only:
        return 0
    if not args.oom_ranks_only and not args.diff_only:
        _size_shots(window, save)
    if args.size_only:
        return 0
    if not args.oom_ranks_only:
        _diff_and_budget_shots(window, save, settle)
    if args.diff_only:
        return 0
    _oom_and_ranks_shots(window, save)
    if args.oom_ranks_only:
        return 0
    w = window("transformer_compare.h5")
    w.plan.apply_preset("sqrt")
    w.timeline.select_point(w.runs()[0].peak.point)
    save(w, "explorer-timeline.png")

    w = window("transformer_compare.h5")  # the timeline and the plan panel, dark
    w.set_theme(DARK)
    w.plan.apply_preset("sqrt")
    w.timeline.jump_to_peak()
    save(w, "explorer-timeline-dark.png")

    for theme, name in ((None, "explorer-empty.png"), (DARK, "explorer-empty-dark.png")):
        w = window()  # no trace open: how to open or record one
        if theme is not None:
            w.set_theme(theme)
        w.resize(1200, 700)
        save(w, name)

    w = window("gpt2_compare.h5")
    w.plan.budget.setText("60%")
    w.plan.plan_for_budget()
    settle(lambda: w.plan.plan_button.isEnabled())
    w.timeline.jump_to_peak()
    save(w, "explorer-plan.png")

    w = window("transformer_compare.h5")
    w.plan.apply_preset("all")
    w.tabs.setCurrentIndex(1)
    save(w, "explorer-compare.png")

    w = window("gpt2_compare.h5")
    w.set_theme(DARK)
    w.plan.apply_preset("sqrt")
    w.side_action.setChecked(True)
    w.tabs.setCurrentIndex(1)
    save(w, "explorer-dark-side-by-side.png")

    w = window("gpt2_compare.h5")  # File -> Export View: titled, no hover or selection
    w.plan.apply_preset("sqrt")
    w.timeline.select_point(w.runs()[0].peak.point)
    settle()
    w.export_view(str(OUT / "explorer-export.png"))
    print("wrote docs/images/explorer-export.png")

    snapshot = _fixture_snapshot()
    if snapshot is None:
        print("no CUDA snapshot fixture (../shared/fixtures/cuda_snapshots): skipped its image")
        return 0
    from ckview.snapshot import load_snapshot, snapshot_to_trace

    trace = Path(tempfile.mkdtemp()) / "cnn_fwd_bwd.h5"
    snapshot_to_trace(load_snapshot(snapshot), trace)
    settings = QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    w.resize(1400, 900)
    w.show()
    w.open_paths([str(trace)])
    settle(lambda: len(w.traces) == 1)  # nothing to plan: no module tree in a snapshot
    w.timeline.jump_to_peak()
    save(w, "snapshot-import.png")
    return 0


def _oplevel_shots(window: Any, save: Any) -> None:
    """The plan panel's op-level choices on the transformer, light and dark: block 1 saves
    its matmuls and softmax, block 3 recomputes every op (issue 22, item 5)."""
    from ckview.app.style import DARK

    for theme, name in ((None, "explorer-oplevel.png"), (DARK, "explorer-oplevel-dark.png")):
        w = window("transformer_compare.h5")
        w.resize(1600, 1300)  # room for the module tree and the groups of block 1
        if theme is not None:
            w.set_theme(theme)
        blocks = w.plan.session.chain.blocks
        for row in (blocks[1], blocks[3]):
            w.plan.toggle_module(row)
        w.plan.set_saved(blocks[1], ["aten.addmm", "aten._safe_softmax", "aten.bmm"])
        w.plan.show_op_groups(blocks[1])
        save(w.plan, name)


def _offload_shots(window: Any, save: Any, settle: Any) -> None:
    """An offload plan's host curve, light and dark: the bundled transformer moved onto a faked
    cuda:0 (the test helper ``as_cuda``), blocks 0 and 1 offloading what they save, block 3
    recomputing every op; opened as ``ckview view TRACE --plan PLAN`` opens it."""
    from ckpt_runtime.plan import load_plan
    from ckview.app.style import DARK

    sys.path.insert(0, str(ROOT))
    from tests.fit_helpers import as_cuda

    folder = Path(tempfile.mkdtemp())
    trace = as_cuda(SAMPLES / "transformer.h5", folder / "transformer_cuda.h5", 1 << 30, 0)
    plan = folder / "offload.json"
    plan.write_text(
        '{"format": "ckview-plan", "version": 2, "name": "offload", "regions": ['
        '{"module": "encoder.layers.[0-1]", "save": ["*"], "offload": true}, '
        '{"module": "encoder.layers.3"}]}'
    )
    for theme, name in ((None, "explorer-offload.png"), (DARK, "explorer-offload-dark.png")):
        w = window()
        if theme is not None:
            w.set_theme(theme)
        w.resize(1600, 1150)  # room for the module tree and block 0's offload checkbox
        w.apply_plan_on_open(load_plan(plan), str(plan))
        w.open_paths([str(trace)])
        settle(lambda w=w: w.plan.is_ready() and w.timeline.outcome is not None)
        w.plan.show_op_groups(w.plan.session.chain.blocks[0])
        w.timeline.select_point(w.runs()[0].peak.point)
        save(w, name)


def _diff_and_budget_shots(window: Any, save: Any, settle: Any) -> None:
    """The Diff view (a module's row clicked: its bytes shaded under both curves) and the
    planner's answers to a budget no plan meets, in the light and dark themes."""
    from ckview.app.style import DARK

    for theme, name in ((None, "explorer-diff.png"), (DARK, "explorer-diff-dark.png")):
        w = window("transformer_compare.h5")
        if theme is not None:
            w.set_theme(theme)
        w.tabs.setCurrentWidget(w.diff)
        w.diff.modules.selectRow(1)
        save(w, name)
    for theme, trace, budget, name in (
        (None, "transformer.h5", "10%", "explorer-budget.png"),
        (DARK, "transformer_checkpointed.h5", "30 MiB", "explorer-budget-dark.png"),
    ):
        w = window(trace)
        if theme is not None:
            w.set_theme(theme)
        w.resize(1400, 700)
        w.plan.budget.setText(budget)
        w.plan.plan_for_budget()
        settle(lambda w=w: w.plan.plan_button.isEnabled())
        save(w.plan, name)


def _oom_and_ranks_shots(window: Any, save: Any) -> None:
    """The explorer opened on an OOM (a CPU one, and one with fake CUDA device samples) and on
    the two ranks of an FSDP recording, side by side on the Compare tab."""
    folder = Path(tempfile.mkdtemp())
    for name, trace in (
        ("explorer-oom.png", _record_oom(folder / "oom.h5")),
        ("explorer-oom-fake-device.png", _record_oom(folder / "fake_oom.h5", fake_device=True)),
    ):
        w = window(str(trace))  # opens centred on the failure, its live tensors listed
        w.resize(1300, 800)
        save(w, name)

    from ckview.trace.ranks import expand_rank_paths

    subprocess.run(
        [sys.executable, "-m", "ckview", "record", "-o", "fsdp.h5", "--no-progress",
         "-m", "torch.distributed.run", "--nproc-per-node", "2",
         str(ROOT / "examples" / "distributed.py"), "--fsdp", "--uneven"],
        cwd=folder, check=True, capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    w = window(*map(str, expand_rank_paths([folder / "fsdp.h5"])))  # as `ckview view fsdp.h5`
    w.resize(1400, 900)
    w.side_action.setChecked(True)
    w.tabs.setCurrentWidget(w.compare)
    save(w, "ranks.png")


def _size_shots(window: Any, save: Any) -> None:
    """The size field: a small transformer recorded at batch 4 and 8 shown at batch 48 with
    the sqrt plan, over a budget it does not meet (light); the same step moved onto a faked
    cuda:0 of 160 MiB, where the allocator model draws reserved memory and the size is
    checked against the device (dark)."""
    from ckview.app.style import DARK

    sys.path.insert(0, str(ROOT))
    from tests.factory import encoder, record_lm
    from tests.fit_helpers import as_cuda

    folder = Path(tempfile.mkdtemp())
    cpu = [record_lm(folder / f"lm.batch{n}.h5", encoder(), n, 64) for n in (4, 8)]
    cuda_folder = folder / "cuda"
    cuda_folder.mkdir()
    cuda = [as_cuda(p, cuda_folder / p.name, 160 << 20, 96 << 20) for p in cpu]
    for theme, (a, b), budget, name in (
        (None, cpu, "6 MiB", "explorer-size.png"),
        (DARK, cuda, "device", "explorer-size-dark.png"),
    ):
        w = window(str(a))
        if theme is not None:
            w.set_theme(theme)
        w.resize(1500, 950)
        w.plan.apply_preset("sqrt")
        w.open_second(str(b))
        w.plan.budget.setText(budget)
        w.sizes.field.setText("48")
        w.show_size(48)
        save(w, name)


def _record_oom(path: Path, fake_device: bool = False) -> Path:
    """Record a small step whose module ``Huge`` asks for 4 EiB in the second recorded step
    (a real allocation failure of the CPU allocator). ``fake_device``: with the test fakes of
    torch.cuda and pynvml (there may be no GPU), a 20 KiB device scaled to the step."""
    import torch
    from torch import nn

    from recorder import Recorder
    from recorder.device import DeviceSampler, Nvml
    from recorder.sources import device as session

    class Huge(nn.Module):
        boom = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.boom:
                torch.empty(2**62, dtype=torch.uint8)
            return x * 2

    torch.manual_seed(0)
    huge = Huge()
    model = nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), huge), nn.Linear(32, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = session.DeviceSampler
    if fake_device:
        sys.path.insert(0, str(ROOT))
        from tests.fake_cuda import FakeCuda, FakePynvml

        KiB = 1024
        cuda = FakeCuda(
            total=20 * KiB, allocated=12 * KiB, reserved=16 * KiB, grow=0, peak_extra=2 * KiB
        )
        nvml = FakePynvml(total=20 * KiB, mine=18 * KiB, others=0)
        session.DeviceSampler = functools.partial(  # type: ignore[assignment,misc]
            DeviceSampler, cuda=cuda, nvml=lambda: Nvml(nvml, os.getpid())
        )
    try:
        with (
            contextlib.suppress(RuntimeError),
            Recorder(path, steps=2, warmup=1, progress=False),
        ):
            for step in range(3):
                huge.boom = step == 2
                model(torch.randn(8, 16)).sum().backward()
                opt.step()
                opt.zero_grad()
    finally:
        session.DeviceSampler = sampler  # type: ignore[misc]
    return path


def _fixture_snapshot() -> Path | None:
    """The real CUDA snapshot beside the repository (../shared/fixtures/cuda_snapshots)."""
    for parent in ROOT.parents[:3]:
        found = sorted((parent / "shared" / "fixtures" / "cuda_snapshots").glob("*.pickle"))
        if found:
            return found[0]
    return None


if __name__ == "__main__":
    sys.exit(main())
