"""Re-record the sample traces from the bundled examples and rewrite sample_traces/README.md.

    python sample_traces/regenerate.py

The traces are compatibility fixtures: once a trace format version is released, keep its traces
(rename them with the version) so that tests keep reading old files through the migrations.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: trace name -> (example script, ckview options, script arguments)
SAMPLES: dict[str, tuple[str, list[str], list[str]]] = {
    # Enough script steps for the warmup, the recorded steps and 3 rounds of timing steps.
    "mlp": ("mlp.py", ["--steps", "2"], ["--steps", "8"]),
    "mlp_checkpointed": ("mlp.py", ["--steps", "2"], ["--steps", "8", "--checkpoint"]),
    "cnn": ("cnn.py", ["--steps", "2"], ["--steps", "8"]),
    "transformer": ("transformer.py", ["--steps", "2"], ["--steps", "8"]),
    "transformer_checkpointed": (
        "transformer.py",
        ["--steps", "2"],
        ["--steps", "8", "--checkpoint"],
    ),
    "gpt2": ("gpt2.py", ["--steps", "2"], ["--steps", "8"]),
    "transformer_compare": (
        "transformer.py",
        ["--steps", "1", "--compare"],
        ["--steps", "16", "--checkpoint"],
    ),
    "gpt2_compare": ("gpt2.py", ["--steps", "1", "--compare"], ["--steps", "16", "--checkpoint"]),
}


def record(name: str, script: str, options: list[str], script_args: list[str]) -> list[str]:
    out = HERE / f"{name}.h5"
    command = [
        "ckview",
        "record",
        "-o",
        f"sample_traces/{out.name}",
        *options,
        "--no-progress",
        f"examples/{script}",
        *script_args,
    ]
    subprocess.run(
        [sys.executable, "-m", "ckview", *command[1:]],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return command


def describe(path: Path) -> tuple[str, str, int]:
    from ckview.trace import open_trace

    with open_trace(path) as trace:
        return trace.meta.ckview_version, trace.meta.torch_version, trace.format_version


def main() -> None:
    rows = []
    for name, (script, options, script_args) in SAMPLES.items():
        print(f"recording {name}", file=sys.stderr)
        command = record(name, script, options, script_args)
        ckview_version, torch_version, format_version = describe(HERE / f"{name}.h5")
        rows.append(
            f"| `{name}.h5` | `{' '.join(command)}` | {format_version} | {ckview_version} "
            f"| {torch_version} |"
        )
    (HERE / "README.md").write_text(README.format(rows="\n".join(rows)))


README = """# Sample traces

Traces written by `ckview record` from the bundled examples (CPU). They feed the demo and are
compatibility fixtures: tests read every one of them, so a change to the trace format that
breaks old files fails CI. Regenerate them with `python sample_traces/regenerate.py` (this
file is rewritten too).

| trace | command | format | ckview | torch |
| --- | --- | --- | --- | --- |
{rows}
"""


if __name__ == "__main__":
    main()
