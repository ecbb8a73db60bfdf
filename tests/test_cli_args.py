"""``ckview record`` and ``verify`` take arguments as ``python`` does (NOTE [ The script's
arguments are the script's ] in ckview/cli/command.py): ckview's options before the script,
everything after it to the script, unchanged."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from ckview.cli.command import split_command
from ckview.cli.main import main

pytestmark = pytest.mark.torch

# A real training loop (six iterations of a tiny model) that prints what it was given.
ARGV_SCRIPT = """\
import json, sys
import torch
print("ARGV " + json.dumps(sys.argv))
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(6):
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""

NAMED_LIKE_CKVIEW = [
    "--steps",
    "3",
    "-o",
    "x",
    "-m",
    "y",
    "--plan",
    "p",
    "--compare",
    "--warmup",
    "2",
]


def _argv_seen(out: str) -> list[str]:
    lines = [line for line in out.splitlines() if line.startswith("ARGV ")]
    assert len(lines) == 1, out
    return list(json.loads(lines[0][5:]))


@pytest.fixture
def argv_script(tmp_path: Path) -> Path:
    script = tmp_path / "show_argv.py"
    script.write_text(ARGV_SCRIPT)
    return script


@pytest.mark.parametrize(
    "script_args",
    [
        ["--lr", "0.1", "data/train.txt", "-v"],
        NAMED_LIKE_CKVIEW,
        ["--", "--steps", "2"],
        ["--steps=3", "--", "-o", "--"],
        [],
    ],
    ids=["plain options", "named like ckview's", "leading --", "= and -- inside", "none"],
)
def test_record_passes_everything_after_the_script(
    script_args: list[str], argv_script: Path, tmp_path: Path, run_cli: Any
) -> None:
    trace = tmp_path / "t.h5"
    code, out, err = run_cli(
        "record", "-o", str(trace), "--steps", "2", str(argv_script), *script_args
    )
    assert code == 0, err
    assert _argv_seen(out) == [str(argv_script), *script_args]
    assert "wrote" in err and "(2 steps)" in err  # ckview's own --steps 2, not the script's


def test_record_module_passes_everything_after_it(
    tmp_path: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "argvpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "show.py").write_text(ARGV_SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    trace = tmp_path / "m.h5"
    code, out, err = run_cli("record", "-o", str(trace), "-m", "argvpkg.show", *NAMED_LIKE_CKVIEW)
    assert code == 0, err
    seen = _argv_seen(out)
    assert seen[1:] == NAMED_LIKE_CKVIEW and seen[0].endswith("show.py")  # as python -m sets it
    assert trace.exists()


def test_verify_passes_everything_after_the_script(
    argv_script: Path, tmp_path: Path, run_cli: Any
) -> None:
    script_args = ["--json", "--timing-steps", "7", *NAMED_LIKE_CKVIEW]
    code, out, err = run_cli(
        "verify", "-o", str(tmp_path / "v.h5"), "--plan", "none", "--timing-steps", "0",
        str(argv_script), *script_args,
    )  # fmt: skip
    assert code == 0, err
    assert _argv_seen(out) == [str(argv_script), *script_args]
    assert "projected peak" in out  # verify's table, not --json: that was the script's


@pytest.mark.parametrize(
    ("argv", "target", "module", "args"),
    [
        (["-o", "t.h5", "train.py", "-o", "x"], "train.py", False, ["-o", "x"]),
        (["--output=t.h5", "--compare", "train.py"], "train.py", False, []),
        (["-ot.h5", "-m", "pkg.train", "--", "a"], "pkg.train", True, ["--", "a"]),
        (["-mpkg.train", "-m", "y"], "pkg.train", True, ["-m", "y"]),
        (["--steps", "2", "--", "train.py", "--"], "train.py", False, ["--"]),
        (["--steps", "2"], None, False, []),
    ],
)
def test_split_command(argv: list[str], target: str, module: bool, args: list[str]) -> None:
    from ckview.cli.recording import add_record_options

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_record_options(parser)
    command = split_command(argv, parser)
    assert (command.target, command.module, command.args) == (target, module, args)
    parser.parse_args(command.options)  # what is left is ckview's own, parseable


def test_no_abbreviations(argv_script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["record", "--step", "2", str(argv_script)])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --step" in capsys.readouterr().err


def test_no_script_named(run_cli: Any) -> None:
    code, _, err = run_cli("record", "--steps", "2")
    assert code == 2
    assert err.strip() == (
        "ckview: error: name the script: ckview record [OPTIONS] script.py [ARGS ...] "
        "(or -m module [ARGS ...])"
    )


def test_hint_when_the_script_fails_on_an_option_named_like_ckview(
    tmp_path: Path, run_cli: Any
) -> None:
    script = tmp_path / "strict.py"
    script.write_text(
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr')\np.parse_args()\n"
    )
    code, _, err = run_cli("record", "-o", str(tmp_path / "s.h5"), str(script), "--warmup", "2")
    assert code == 2
    assert "unrecognized arguments: --warmup 2" in err  # the script's own argparse error
    assert (
        f"ckview: hint: --warmup went to the script, as everything after it does; ckview's "
        f"options go before it: ckview record [OPTIONS] {script} [ARGS ...]"
    ) in err
    # A script that fails on an option of its own gets no hint.
    code, _, err = run_cli("record", "-o", str(tmp_path / "s.h5"), str(script), "--lrr", "2")
    assert code == 2 and "ckview: hint" not in err


def test_ckview_without_arguments_lists_the_verbs(run_cli: Any) -> None:
    code, out, err = run_cli()
    assert code == 0 and err == ""
    for verb in ("record", "summary", "view", "export", "validate", "project", "verify", "plan"):
        assert f"\n    {verb} " in out, out


def test_help_shows_where_options_go(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("record", "verify"):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        out = capsys.readouterr().out
        assert f"ckview {verb} [OPTIONS] script.py [ARGS ...]" in out
        assert f"ckview {verb} [OPTIONS] -m module [ARGS ...]" in out
        assert "everything after it goes to the script unchanged" in " ".join(out.split())


def test_docs_use_the_new_form() -> None:
    """No example in the README, docs or examples puts ckview's options after the script."""
    from tests.conftest import ROOT

    texts = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/**/*.md")]
    texts += [*ROOT.glob("examples/*.py"), ROOT / "sample_traces" / "README.md"]
    stale = []
    for path in texts:
        for line in path.read_text().splitlines():
            for verb in ("record", "verify"):
                _, found, rest = line.partition(f"ckview {verb} ")
                words = rest.split("`")[0].split()
                if found and _options_after_script(words):
                    stale.append(f"{path.name}: {line.strip()}")
    assert not stale, "\n".join(stale)


def _options_after_script(words: list[str]) -> bool:
    """Whether a documented command line puts ckview's options (or a ``--``) after the script
    (``--steps`` there is the bundled scripts' own)."""
    ours = {"--", "-o", "--output", "--warmup", "--plan", "--compare", "--stop-after"}
    scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
    return bool(scripts) and any(w in ours for w in words[scripts[0] + 1 :])
