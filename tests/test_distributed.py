"""Recording under torchrun (issue 10, part 2): one trace per rank for DDP and FSDP2 on the
CPU (gloo, 2 ranks), found and shown together; a failing rank; verify per rank.
NOTE [ One file per rank ] (ckview/trace/ranks.py), NOTE [ Recording every rank ]
(ckview/cli/distributed.py), NOTE [ FSDP's storages ] (recorder/ledger.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ckview.analysis.ranks import peak_imbalance
from ckview.trace import open_trace
from ckview.trace.ranks import (
    common_stem,
    expand_rank_paths,
    launcher_rank,
    launcher_world,
    rank_files,
    rank_of,
    rank_path,
)
from ckview.trace.schema import Category
from tests.conftest import DETERMINISTIC, EXAMPLES, ckview

pytestmark = pytest.mark.torch

SCRIPT = str(EXAMPLES / "distributed.py")
LAUNCH = ["-m", "torch.distributed.run", "--nproc-per-node", "2"]


# ----------------------------------------------------------------------------- names


def test_rank_file_names() -> None:
    assert rank_path("out/run.h5", 3) == Path("out/run.rank3.h5")
    assert rank_path("run.rank3.h5", 3) == Path("run.rank3.h5")  # already this rank's
    assert rank_path("run.rank3.h5", 1) == Path("run.rank3.rank1.h5")
    assert rank_of("a/run.rank12.h5") == 12 and rank_of("run.h5") is None
    assert common_stem("a/run.rank1.h5") == Path("a/run.h5")
    assert launcher_rank({"RANK": "1", "WORLD_SIZE": "2"}) == 1
    assert launcher_rank({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: plain name
    assert launcher_rank({}) is None


def test_rank_files_are_found_from_the_stem(tmp_path: Path) -> None:
    for name in ("run.rank1.h5", "run.rank0.h5", "run.rank10.h5", "run2.rank0.h5", "x.h5"):
        (tmp_path / name).touch()
    (tmp_path / "run[1].rank0.h5").touch()
    names = [p.name for p in rank_files(tmp_path / "run.h5")]
    assert names == ["run.rank0.h5", "run.rank1.h5", "run.rank10.h5"]
    assert [p.name for p in rank_files(tmp_path / "run[1].h5")] == ["run[1].rank0.h5"]
    # an existing file is itself; a missing stem with ranks is its ranks; else kept (to fail)
    expanded = expand_rank_paths([tmp_path / "x.h5", tmp_path / "run.h5", tmp_path / "no.h5"])
    assert [p.name for p in expanded] == [
        "x.h5", "run.rank0.h5", "run.rank1.h5", "run.rank10.h5", "no.h5"
    ]  # fmt: skip


def test_peak_imbalance() -> None:
    assert peak_imbalance([100, 150, 150]) == (1.5, 1, 0)
    assert peak_imbalance([0, 10])[0] == float("inf")
    with pytest.raises(ValueError):
        peak_imbalance([])


# ----------------------------------------------------------------------------- torchrun


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """DDP, rank 1 with twice rank 0's batch: `ckview record` wrapping the launcher."""
    folder = tmp_path_factory.mktemp("ddp")
    proc = ckview("record", "--steps", "2", "-o", "run.h5", *LAUNCH, SCRIPT, "--uneven", cwd=folder)
    return folder, proc


def _rank_trace(path: Path, rank: int, world: int, start: str) -> None:
    from ckview.trace import TraceWriter

    meta = {"rank": rank, "world_size": world, "start_time": start}
    with TraceWriter(path, meta=meta):
        pass


def test_rank_files_left_from_a_larger_run_are_not_shown(tmp_path: Path) -> None:
    """NOTE [ One file per rank ]: ranks 2 and 3 of an earlier 4-rank run stay on disk beside
    a new 2-rank run's files; the run's meta (world_size) leaves them out."""
    for rank in range(4):
        _rank_trace(tmp_path / f"run.rank{rank}.h5", rank, 4, "2026-11-01T10:00:00+00:00")
    for rank in range(2):
        _rank_trace(tmp_path / f"run.rank{rank}.h5", rank, 2, "2026-11-23T10:00:00+00:00")
    assert [p.name for p in rank_files(tmp_path / "run.h5")] == ["run.rank0.h5", "run.rank1.h5"]
    with open_trace(tmp_path / "run.rank1.h5") as trace:
        assert (trace.meta.rank, trace.meta.world_size) == (1, 2)
    assert launcher_world({"RANK": "1", "WORLD_SIZE": "2"}) == (1, 2)
    assert launcher_world({}) == (-1, 1)


def test_ddp_one_complete_trace_per_rank(ddp: tuple[Path, subprocess.CompletedProcess[str]]):
    folder, proc = ddp
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in folder.glob("*.h5")) == ["run.rank0.h5", "run.rank1.h5"]
    activations = []
    for rank in (0, 1):
        with open_trace(folder / f"run.rank{rank}.h5") as trace:
            assert trace.meta.complete and trace.meta.steps_recorded == 2
            assert (trace.meta.rank, trace.meta.world_size) == (rank, 2)
            assert "torch.distributed.run" in trace.meta.command
            run = trace.run("main")
            steps = run.table("steps").read()
            assert list(steps["complete"]) == [1, 1]
            assert list(steps["optimizer_steps"]) == [1, 1]  # aligned: one iteration each
            ops = run.table("ops").read()
            names = {trace.strings[i] for i in np.unique(ops["name"])}
            assert any(n.startswith("c10d.allreduce_") for n in names), names  # DDP's reducer
            saved = run.table("saved_events").read()
            activations.append(int(saved["nbytes"][saved["kind"] == 0].sum()))
    assert activations[1] > activations[0]  # twice the batch (the weights saved are the same)
    assert "next: ckview summary run.h5 (all ranks)" in proc.stderr


def test_summary_shows_the_ranks_together(ddp: tuple[Path, subprocess.CompletedProcess[str]]):
    folder, _ = ddp
    by_stem = ckview("summary", "run.h5", cwd=folder)
    assert by_stem.returncode == 0, by_stem.stderr
    assert "rank 0" in by_stem.stdout and "rank 1" in by_stem.stdout
    assert "imbalance: highest peak / lowest" in by_stem.stdout
    by_glob = ckview("summary", "--json", "run.rank0.h5", "run.rank1.h5", cwd=folder)
    doc = json.loads(by_glob.stdout)["runs"]["main"]
    peaks = [r["peak_bytes"] for r in doc["ranks"]]
    for rank, peak in enumerate(peaks):
        alone = json.loads(ckview("summary", "--json", f"run.rank{rank}.h5", cwd=folder).stdout)
        assert alone["runs"]["main"]["peak_bytes"] == peak
    assert doc["imbalance"] == pytest.approx(max(peaks) / min(peaks))
    assert doc["highest"] == f"rank {peaks.index(max(peaks))}"
    module_rows = {m["module"]: m["bytes"] for m in doc["modules"]}
    assert "DistributedDataParallel.module.0.net.0" in module_rows
    assert all(len(b) == 2 for b in module_rows.values())  # each module, in both ranks


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FSDP2 (fully_shard per block and on the root), by torchrun with ckview record inside."""
    folder = tmp_path_factory.mktemp("fsdp")
    proc = subprocess.run(
        [sys.executable, *LAUNCH, "-m", "ckview", "record", "--steps", "2", "--no-progress",
         SCRIPT, "--fsdp"],
        capture_output=True, text=True, cwd=folder, timeout=300, env=DETERMINISTIC,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return folder


def test_fsdp_categories(fsdp: Path) -> None:
    """Each rank holds half of every parameter (the model's dims split evenly in two), and the
    all-gathered parameters come and go (NOTE [ FSDP's storages ])."""
    width = 64
    block = width * 4 * width + 4 * width + 4 * width * width + width
    total = (3 * block + width * 10 + 10) * 4  # bytes of the whole model, float32
    assert sorted(p.name for p in fsdp.glob("*.h5")) == [
        "distributed.rank0.h5",
        "distributed.rank1.h5",
    ]
    for rank in (0, 1):
        with open_trace(fsdp / f"distributed.rank{rank}.h5") as trace:
            assert trace.meta.complete and trace.meta.steps_recorded == 2
            st = trace.run("main").table("storages").read()
        category, nbytes = st["category"], st["nbytes"]
        assert nbytes[category == Category.SHARDED_PARAMETER].sum() == total // 2
        assert not (category == Category.PARAMETER).any()  # no placeholder of global size
        unsharded = category == Category.UNSHARDED_PARAMETER
        assert unsharded.any() and (st["free_ns"][unsharded] >= 0).any()  # resharded
        assert (category == Category.COMM_BUFFER).any()
        # AdamW's two states per parameter, DTensors counted at their local size, and its step
        # counter per parameter (a 4-byte scalar); 14 parameters (4 per block, 2 in the head)
        assert nbytes[category == Category.OPTIMIZER_STATE].sum() == total + 14 * 4


def test_a_failing_rank(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from torch import nn\n"
        "dist.init_process_group('gloo')\n"
        "model = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(5):\n"
        "    if dist.get_rank() == 1 and step == 3:\n"  # DDP warms up 2 iterations
        "        raise RuntimeError('rank 1 broke')\n"
        "    model(torch.randn(4, 8)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    proc = ckview("record", "--steps", "3", *LAUNCH, "fail.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 failed (exit code 1)" in proc.stderr
    for rank in (0, 1):
        with open_trace(tmp_path / f"fail.rank{rank}.h5") as trace:
            assert not trace.meta.complete and trace.meta.steps_recorded == 1
    with open_trace(tmp_path / "fail.rank1.h5") as trace:
        assert "rank 1 broke" in trace.meta.error


def test_no_rank_recorded_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "idle.py").write_text("import torch.distributed as dist\n")
    proc = ckview("record", *LAUNCH, "idle.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("ckview: error: no rank recorded a step into idle.rank*.h5")
    )


def test_verify_per_rank(tmp_path: Path) -> None:
    proc = ckview(
        "verify", "--plan", "all", "--steps", "1", "--timing-steps", "0", *LAUNCH, SCRIPT,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        path = tmp_path / f"distributed-verify.rank{rank}.h5"
        with open_trace(path) as trace:
            assert trace.run_names == ["baseline", "plan:all"]
            assert trace.meta.complete
    assert proc.stdout.count("distributed-verify.rank") == 2, proc.stdout  # each rank's table


def test_verify_json_per_rank_is_one_document(tmp_path: Path) -> None:
    """NOTE [ One JSON document for all ranks ]: the ranks' documents, by rank, as one."""
    proc = ckview(
        "verify", "--plan", "all", "--steps", "1", "--timing-steps", "0", "--json", *LAUNCH,
        SCRIPT, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # one valid document, nothing else on stdout
    assert doc["trace"] == "distributed-verify.h5"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for rank, r in enumerate(doc["ranks"]):
        assert r["trace"] == f"distributed-verify.rank{rank}.h5"
        assert [p["plan"] for p in r["plans"]] == ["all"]


def test_a_recorder_by_hand_names_its_rank_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recorder import Recorder

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert Recorder(tmp_path / "run.h5").path == tmp_path / "run.rank1.h5"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert Recorder(tmp_path / "run.h5").path == tmp_path / "run.h5"
