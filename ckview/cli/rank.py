"""Entry of each rank of a distributed launch: ``python -m ckview.cli.rank [-m] TARGET ARGS``
runs the verb that ``CKVIEW_RANK_RUN`` names (NOTE [ Recording every rank ] in
ckview/cli/distributed.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ckview.cli.distributed import ENV
from ckview.cli.errors import EXIT_USAGE, CLIError

_LEGACY_RANK_ARGS = ("--local-rank=", "--local_rank=")


def rank_main(argv: list[str] | None = None) -> int:
    """Entry of each rank: run the verb that ``CKVIEW_RANK_RUN`` names on ``[-m] TARGET ARGS``."""
    from ckview.cli.main import VERBS
    from ckview.trace.errors import TraceError

    config = os.environ.get(ENV)
    if config is None:
        print(f"ckview: error: {ENV} is not set; run ckview record -m torch.distributed.run ...")
        return EXIT_USAGE
    args = _rank_args(json.loads(config), list(sys.argv[1:] if argv is None else argv))
    verb = next(v for v in VERBS if v.__name__.rsplit(".", 1)[-1] == args.verb)
    try:
        return int(verb.run(args))
    except (CLIError, TraceError) as exc:
        print(f"ckview: error: rank {os.environ.get('RANK', '?')}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _rank_args(config: dict[str, Any], argv: list[str]) -> argparse.Namespace:
    """The verb's arguments in this rank: the options handed down, the target from ``argv``.

    ``torch.distributed.launch`` without ``--use-env`` puts ``--local-rank=N`` before the
    target; it belongs to the script, as it would without ckview.
    """
    legacy = []
    while argv and argv[0].startswith(_LEGACY_RANK_ARGS):
        legacy.append(argv.pop(0))
    module = bool(argv) and argv[0] == "-m"
    if module:
        argv.pop(0)
    if not argv:
        raise SystemExit("ckview: error: no training script given to the rank")
    options = dict(config["options"])
    if options.get("output") is not None:
        options["output"] = Path(options["output"])
    sys.argv = list(config["command"])  # the trace's command: the line the user typed
    return argparse.Namespace(**options, target=argv[0], args=[*legacy, *argv[1:]], module=module)


if __name__ == "__main__":
    sys.exit(rank_main())
