"""``ckview record --sizes`` (NOTE [ One recording per size ] in ckview/cli/sizes.py) and
``ckview verify --fit``: the script recorded at each size, one trace per size named by it, a
fit between two of them, and the fit's answers checked by recording at the sizes they name."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ckview.cli.recording import add_record_options
from ckview.cli.sizes import FORWARDED
from tests.conftest import ckview

pytestmark = pytest.mark.torch

SCRIPT = """\
import argparse, torch
from torch import nn
p = argparse.ArgumentParser(); p.add_argument("--batch", type=int); a = p.parse_args()
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
model = nn.Sequential(nn.Embedding(50, 32), nn.TransformerEncoder(layer, 2,
                      enable_nested_tensor=False), nn.Linear(32, 50))
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    ids = torch.randint(0, 50, (a.batch, 16))
    nn.functional.cross_entropy(model(ids).reshape(-1, 50), ids.reshape(-1)).backward()
    opt.step(); opt.zero_grad()
"""


def test_record_at_sizes_then_fit_then_verify(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT, encoding="utf-8")
    fast = ("--timing-steps", "0")
    done = ckview(
        "record", "--sizes", "batch=4,8", *fast, "train.py", "--batch", "{}", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    a, b = tmp_path / "train.batch4.h5", tmp_path / "train.batch8.h5"
    assert a.is_file() and b.is_file()
    assert "next: ckview fit train.batch4.h5 train.batch8.h5 --sizes 4 8" in done.stderr

    fit = ckview(
        "fit", str(a), str(b), "--sizes", "4", "8", "--at", "12", "--plan", "all", "--json"
    )
    assert fit.returncode == 0, fit.stderr
    (tmp_path / "at.json").write_text(fit.stdout, encoding="utf-8")
    check = ckview(
        "verify", "--fit", "at.json", *fast, "--json", "train.py", "--batch", "{}", cwd=tmp_path
    )
    assert check.returncode == 0, check.stderr
    doc = json.loads(check.stdout)
    assert doc["size"] == 12 and doc["plan"] == "all" and doc["holds"]
    assert doc["trace"] == "train-verify.size12.h5" and abs(doc["error_percent"]) <= 2

    budget = str(json.loads(fit.stdout)["projected_peak_bytes"] + 1000) + "B"
    fit = ckview("fit", str(a), str(b), "--sizes", "4", "8", "--budget", budget, "--json")
    assert fit.returncode == 0, fit.stderr
    (tmp_path / "budget.json").write_text(fit.stdout, encoding="utf-8")
    check = ckview(
        "verify", "--fit", "budget.json", *fast, "train.py", "--batch", "{}", cwd=tmp_path
    )
    assert check.returncode == 0, check.stderr + check.stdout
    n = json.loads(fit.stdout)["largest"]
    assert check.stdout.startswith(f"fit: largest size {n} under ")
    assert f"at {n} (fits)" in check.stdout and f"at {n + 1} (does not fit)" in check.stdout


def test_sizes_need_a_slot_and_valid_values(tmp_path: Path) -> None:
    done = ckview("record", "--sizes", "batch=4,8", "train.py", "--batch", "4", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--sizes puts the size where {} stands among the script's arguments" in done.stderr
    done = ckview("record", "--sizes", "4", "train.py", "--batch", "{}", cwd=tmp_path)
    assert done.returncode == 2 and "two or more different positive whole numbers" in done.stderr
    (tmp_path / "fit.json").write_text("{}", encoding="utf-8")
    done = ckview("verify", "--fit", "fit.json", "train.py", "{}", cwd=tmp_path)
    assert done.returncode == 2 and "is not the JSON of ckview fit" in done.stderr


def test_every_record_option_reaches_each_size() -> None:
    """A new option of ``ckview record`` must be forwarded to each size's recording."""
    parser = argparse.ArgumentParser()
    add_record_options(parser)
    dests = {a.dest for a in parser._actions} - {"help", "output", "module"}
    assert dests == set(FORWARDED)
