"""Recording under a distributed launcher: ``ckview record [OPTIONS] -m torch.distributed.run
--nproc-per-node N train.py ARGS`` (also ``torch.distributed.launch``, the ``torchrun`` script,
and ``ckview verify``) records one trace per rank.

NOTE [ Recording every rank ]
The ranks are the launcher's child processes; the process that runs the launcher trains nothing
and records nothing. So ckview runs the launcher itself, as ``python -m torch.distributed.run``
would, with the training script replaced by ckview.cli.rank: each rank runs ``python -m
ckview.cli.rank TARGET ARGS`` and finds the verb and its options in the environment
variable ``CKVIEW_RANK_RUN`` (JSON), then runs the verb as ``ckview VERB OPTIONS TARGET ARGS``
would, into ``NAME.rank{R}.h5`` (NOTE [ One file per rank ] in ckview/trace/ranks.py). Nothing in
ckview communicates between ranks, so no rank ever waits for another while recording or
writing; steps stay aligned because every rank's loop runs the same steps under the same step
rule. When a rank fails, the launcher stops the others with SIGTERM and each closes its trace,
marked incomplete. ``torchrun ... -m ckview record train.py`` (ckview inside the launcher) needs
none of this: each rank is a plain ``ckview record`` that names its file by its rank.

NOTE [ One JSON document for all ranks ]
The ranks share the launcher's stdout, so a ``--json`` document printed by each rank would come
out interleaved, never one valid document. Under a launch that ckview runs, each rank hands its
document to the launcher's process instead (``print_json``: a file ``rank{R}.json`` in the
folder that ``CKVIEW_RANK_JSON`` names), and that process prints one document once the launch
has ended: ``{"trace": STEM, "ranks": [{"rank": R, ...that rank's document}, ...]}``, by rank,
with the ranks that wrote none left out (their failure is on stderr, as without ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckview.cli.errors import CLIError

LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
ENV = "CKVIEW_RANK_RUN"
JSON_ENV = "CKVIEW_RANK_JSON"
"""The folder where each rank leaves its JSON document (NOTE [ One JSON document for all
ranks ])."""
RANK_MODULE = "ckview.cli.rank"
"""What each rank runs (``python -m ckview.cli.rank``): named, not imported, as it imports
every verb."""


def is_launcher(target: str, module: bool) -> bool:
    """Whether ckview was asked to run a distributed launcher rather than a training script."""
    return target in LAUNCHERS if module else Path(target).name == "torchrun"


def run_launcher(args: argparse.Namespace, default_output: Callable[[str], Path]) -> int:
    """Run the launcher in ``args.args`` so that every rank runs ``args.verb`` on the training
    script (NOTE [ Recording every rank ]); report the rank traces. Exit code: 0 if every rank
    ended well, 1 if one failed, CLIError if no rank recorded a step."""
    from torch.distributed import run as torchrun

    launcher = _parse_launcher_args(args)
    user = [launcher.training_script, *launcher.training_script_args]
    from ckview.cli.recording import check_target

    check_target(launcher.training_script, bool(launcher.module))
    stem = args.output or default_output(launcher.training_script)
    launcher.training_script_args = ["-m", *user] if launcher.module else user
    launcher.training_script, launcher.module = RANK_MODULE, True
    started = time.time()
    os.environ[ENV] = json.dumps(_rank_config(args))
    failed: dict[int, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ckview-ranks-") as docs:
        os.environ[JSON_ENV] = docs
        try:
            torchrun.run(launcher)
        except Exception as exc:  # ChildFailedError: one or more ranks failed
            failed = dict(getattr(exc, "failures", None) or {-1: exc})
        finally:
            os.environ.pop(ENV, None)
            os.environ.pop(JSON_ENV, None)
        exit_code = _report(stem, started, failed)
        if getattr(args, "json", False):
            _print_rank_docs(stem, Path(docs))
    return exit_code


def print_json(doc: dict[str, Any]) -> None:
    """Print a verb's JSON document, or in a rank of a launch that ckview runs, hand it to the
    launcher's process (NOTE [ One JSON document for all ranks ])."""
    from ckview.trace.ranks import launcher_rank

    folder, rank = os.environ.get(JSON_ENV), launcher_rank()
    if folder and rank is not None:
        Path(folder, f"rank{rank}.json").write_text(json.dumps(doc), encoding="utf-8")
        return
    json.dump(doc, sys.stdout, indent=2)
    print()


def _print_rank_docs(stem: Path, folder: Path) -> None:
    """The ranks' documents as one (NOTE [ One JSON document for all ranks ])."""
    docs = {int(p.stem.removeprefix("rank")): p for p in folder.glob("rank*.json")}
    ranks = [
        {"rank": rank, **json.loads(docs[rank].read_text(encoding="utf-8"))}
        for rank in sorted(docs)
    ]
    json.dump({"trace": str(stem), "ranks": ranks}, sys.stdout, indent=2)
    print()


def _parse_launcher_args(args: argparse.Namespace) -> argparse.Namespace:
    """The launcher's own arguments, parsed by the launcher's parser."""
    import importlib

    name = args.target if args.module else "torch.distributed.run"
    try:
        launcher = importlib.import_module(name).parse_args(list(args.args))
    except SystemExit as exc:  # argparse printed what was wrong
        raise CLIError(f"{name} did not accept its arguments (see above)") from exc
    if launcher.no_python or launcher.run_path:
        raise CLIError(
            "ckview records a Python script or module in each rank; drop --no-python / --run-path"
        )
    return launcher


def _rank_config(args: argparse.Namespace) -> dict[str, Any]:
    """What each rank needs to run the verb as this process was asked to: its options (the
    launcher's own target and arguments left out) and the command line, for the trace."""
    options = {
        k: str(v) if isinstance(v, Path) else v
        for k, v in vars(args).items()
        if k not in ("handler", "target", "args", "module")
    }
    return {"options": options, "command": ["ckview", *sys.argv[1:]]}


def _report(stem: Path, started: float, failed: dict[int, Any]) -> int:
    """One line per rank trace written by this launch; CLIError if none recorded a step."""
    from ckview.analysis.units import plural
    from ckview.trace import open_trace
    from ckview.trace.errors import TraceError
    from ckview.trace.ranks import rank_files

    recorded, lines = 0, []
    for path in rank_files(stem):
        if path.stat().st_mtime < started:
            continue  # an older recording's rank
        try:
            with open_trace(path) as trace:
                meta = trace.meta
        except TraceError as exc:
            lines.append(f"{path}: unreadable ({exc})")
            continue
        recorded += meta.steps_recorded > 0
        state = "complete" if meta.complete else f"incomplete: {meta.error or 'stopped'}"
        lines.append(f"{path}: {plural(meta.steps_recorded, 'step')}, {state}")
    why = _failures(failed)
    if not recorded:
        raise CLIError(
            f"no rank recorded a step into {stem.stem}.rank*{stem.suffix}"
            + (f" ({why})" if why else "")
            + "; check the script's output above, lower --warmup or run more steps"
        )
    for line in lines:
        print(f"ckview: {line}", file=sys.stderr)
    if why:
        print(f"ckview: {why}; the other ranks' traces are kept", file=sys.stderr)
    print(f"ckview: next: ckview summary {shlex.quote(str(stem))} (all ranks)", file=sys.stderr)
    return 1 if failed else 0


def _failures(failed: dict[int, Any]) -> str:
    """``rank 1 failed (exit code 1)`` for the launcher's failures."""
    parts = [
        f"rank {rank} failed (exit code {getattr(f, 'exitcode', '?')})" if rank >= 0 else str(f)
        for rank, f in sorted(failed.items())
    ]
    return ", ".join(parts)
