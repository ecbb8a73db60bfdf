"""The long fault suite of ``ckview record`` (issue 12, items 1, 2, 3, 7): counts per family.

    python benchmarks/fault_suite_record.py [--family NAME ...]

Every case runs ``ckview record`` in a subprocess on the script of tests/test_faults.py, hurt
at a chosen moment, and checks what a careful user would: the exit status, no traceback from
ckview (the script's own may be printed, as Python would), every completed step in the trace
(after ``ckview recover`` when the process could not react: SIGKILL), and no user file
replaced. A case is *handled* when all hold, *lost* when a completed step or a user's file is
gone. Disk-full cases mount small tmpfs folders (root only; skipped otherwise).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_faults import SCRIPT, stops_as_by_default  # noqa: E402

EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129, "SIGKILL": -9}
MOMENTS = {  # name: (iteration hurt, --steps, --timing-steps, steps completed)
    "warmup": (0, 20, 0, 0),
    "after step 1": (2, 20, 0, 1),
    "after 25 steps": (26, 40, 0, 25),
    "timing steps": (4, 2, 2, 2),
}


@dataclass
class Result:
    handled: bool
    lost: bool
    note: str = ""


def ckview(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ckview", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=stops_as_by_default,  # however this suite was started (nohup, background)
    )


def clean(stderr: str) -> bool:
    return not any(m in stderr for m in ("ckview/", "recorder/", "h5py", "Fatal Python"))


def steps_in(path: Path) -> int:
    """Complete step rows in every run of the trace at ``path``; -1 if it does not open."""
    import numpy as np

    from ckview.trace import open_trace
    from ckview.trace.errors import TraceError

    try:
        with open_trace(path) as trace:
            return sum(
                int(np.count_nonzero(trace.run(n).table("steps").read()["complete"]))
                for n in trace.run_names
            )
    except (TraceError, OSError):
        return -1


def folder_with_script() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="ckview-faults-"))
    (folder / "train.py").write_text(SCRIPT)
    return folder


# ----------------------------------------------------------------------------- families


def signals() -> Iterator[tuple[str, Callable[[Path], Result]]]:
    for sig in EXIT:
        for moment, (at, steps, timing, kept) in MOMENTS.items():
            yield f"{sig} {moment}", _signal_case(sig, at, steps, timing, kept)


def _signal_case(sig: str, at: int, steps: int, timing: int, kept: int) -> Callable[[Path], Result]:
    def case(folder: Path) -> Result:
        run = ckview(
            folder,
            "record",
            f"--steps={steps}",
            f"--timing-steps={timing}",
            "-o",
            "out.h5",
            "train.py",
            sig,
            str(at),
            "60",
        )
        if sig == "SIGKILL":
            recover = ckview(folder, "recover", "out.h5")
            if not clean(recover.stderr):
                return Result(False, False, recover.stderr[-200:])
        got = steps_in(folder / "out.h5")
        ok = run.returncode == EXIT[sig] and clean(run.stderr)
        return Result(ok and got == kept, got < kept, f"rc {run.returncode}, {got}/{kept} steps")

    return case


REPEAT = 5
"""How many times each stop in a weak-reference callback runs (``--repeat``)."""


def stops_in_callbacks() -> Iterator[tuple[str, Callable[[Path], Result]]]:
    """The stop that Python would swallow (NOTE [ A stop is never lost ]), many times over:
    lost when the script runs its 20 steps to the end."""
    for sig in ("SIGTERM", "SIGINT"):
        for k in range(REPEAT):
            yield f"{sig} in a weakref callback #{k + 1}", _callback_case(sig)


def _callback_case(sig: str) -> Callable[[Path], Result]:
    def case(folder: Path) -> Result:
        run = ckview(
            folder, "record", "--steps=20", "-o", "out.h5", "train.py", f"{sig}-in-callback", "12"
        )
        got = steps_in(folder / "out.h5")
        stopped = 11 <= got < 20
        ok = run.returncode == EXIT[sig] and clean(run.stderr) and stopped
        return Result(ok, not stopped, f"rc {run.returncode}, {got} of 20 steps")

    return case


def os_exit() -> Iterator[tuple[str, Callable[[Path], Result]]]:
    for moment, (at, steps, _, kept) in MOMENTS.items():

        def case(folder: Path, at: int = at, steps: int = steps, kept: int = kept) -> Result:
            run = ckview(
                folder, "record", f"--steps={steps}", "-o", "out.h5", "train.py", "exit", str(at)
            )
            got = steps_in(folder / "out.h5")
            ok = run.returncode == 3 and clean(run.stderr) and got == kept
            return Result(ok, got < kept, f"rc {run.returncode}, {got}/{kept} steps")

        yield f"os._exit {moment}", case


WIDE = """\
import torch
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(200):
    model(torch.randn(32, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
"""
"""A script whose 190 recorded steps need about 0.5 MB of trace and 0.9 MB of journal."""


def disk_full() -> Iterator[tuple[str, Callable[[Path], Result]]]:
    for size in ("100k", "300k", "500k", "700k", "900k", "1100k", "1300k", "1600k"):

        def case(folder: Path, size: str = size) -> Result:
            (folder / "wide.py").write_text(WIDE)
            disk = folder / "disk"
            disk.mkdir()
            mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", disk])
            if mount.returncode != 0:
                return Result(True, False, "skipped: cannot mount a tmpfs")
            try:
                run = ckview(
                    folder, "record", "--steps=190", "--timing-steps=0", "-o", "disk/out.h5",
                    "wide.py",
                )  # fmt: skip
                one_line = run.stderr.count("ckview: ") <= 2 and clean(run.stderr)
                got = steps_in(disk / "out.h5")
                if got < 0:  # the journal is kept: rebuild it where there is room
                    room = folder / "room"
                    room.mkdir()
                    for journal in disk.glob("*.journal"):
                        shutil.copy(journal, room)
                    ckview(folder, "recover", "room/out.h5")
                    got = steps_in(room / "out.h5")
                note = f"rc {run.returncode}, {got} steps kept"
                return Result(one_line and got > 0, got <= 0, note)
            finally:
                subprocess.run(["umount", str(disk)])

        yield f"disk of {size}", case


def busy() -> Iterator[tuple[str, Callable[[Path], Result]]]:
    def locked_target(folder: Path) -> Result:
        """A viewer holds the target open: the recording is written beside and replaces it."""
        shutil.copy(ROOT / "sample_traces" / "mlp.h5", folder / "out.h5")
        holder = subprocess.Popen(
            [sys.executable, "-c", "import h5py,sys; f=h5py.File('out.h5','r'); print(1, "
             "flush=True); sys.stdin.read()"],
            cwd=folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            holder.stdout.readline()
            run = ckview(folder, "record", "--steps=2", "-o", "out.h5", "train.py", "none", "-1")
        finally:
            holder.communicate("")
        got = steps_in(folder / "out.h5")
        return Result(run.returncode == 0 and got == 2 and clean(run.stderr), got < 0)

    def written_elsewhere(folder: Path) -> Result:
        """Another process writes the trace: ckview's writer says it is open elsewhere."""
        holder = subprocess.Popen(
            [sys.executable, "-c", "import h5py,sys; f=h5py.File('x.h5','w'); print(1, "
             "flush=True); sys.stdin.read()"],
            cwd=folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        code = "from ckview.trace import TraceWriter\nTraceWriter('x.h5')"
        try:
            assert holder.stdout is not None
            holder.stdout.readline()
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            run = subprocess.run(
                [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True
            )
        finally:
            holder.communicate("")
        return Result("it is open elsewhere" in run.stderr, False)

    yield "target open in a viewer", locked_target
    yield "file written by another process", written_elsewhere


def collisions() -> Iterator[tuple[str, Callable[[Path], Result]]]:
    plan = '{"format": "ckview-plan", "version": 1, "name": "p", "regions": []}'

    def refused(args: list[str], path: str, content: str | None = None) -> Callable[[Path], Result]:
        def case(folder: Path) -> Result:
            if content is not None:
                (folder / path).write_text(content)
            before = (folder / path).read_bytes()
            run = ckview(folder, *args)
            kept = (folder / path).read_bytes() == before
            ok = run.returncode == 2 and run.stderr.count("\n") == 1 and kept
            return Result(ok, not kept, run.stderr.strip()[-120:])

        return case

    def good_then_failing(args: list[str]) -> Callable[[Path], Result]:
        def case(folder: Path) -> Result:
            ckview(folder, "record", "--steps=2", "-o", "out.h5", "train.py", "none", "-1")
            before = (folder / "out.h5").read_bytes()
            run = ckview(folder, *args)
            kept = (folder / "out.h5").read_bytes() == before
            return Result(kept and clean(run.stderr) and run.returncode != 0, not kept)

        return case

    yield "-o the script", refused(["record", "-o", "train.py", "train.py"], "train.py")
    yield (
        "verify -o the script",
        refused(["verify", "--plan", "none", "-o", "train.py", "train.py"], "train.py"),
    )
    yield (
        "-o the plan",
        refused(["record", "--plan", "p.json", "-o", "p.json", "train.py"], "p.json", plan),
    )
    yield "-o a file not a trace", refused(["record", "-o", "n.h5", "train.py"], "n.h5", "notes")
    yield (
        "plan -o its trace",
        refused(["plan", "t.h5", "--budget", "90%", "-o", "t.h5"], "t.h5", None),
    )
    yield (
        "good trace, warmup fails",
        good_then_failing(["record", "--warmup=5", "-o", "out.h5", "train.py", "SIGTERM", "2"]),
    )
    yield (
        "good trace, killed recording",
        good_then_failing(["record", "--steps=20", "-o", "out.h5", "train.py", "SIGTERM", "5"]),
    )


def bad_scripts() -> Iterator[tuple[str, Callable[[Path], Result]]]:
    def run_case(args: list[str], code: int, kept: int) -> Callable[[Path], Result]:
        def case(folder: Path) -> Result:
            run = ckview(folder, "record", "--timing-steps=0", "-o", "out.h5", *args)
            got = steps_in(folder / "out.h5") if kept else 0
            ok = run.returncode == code and clean(run.stderr) and got == kept
            return Result(ok, got < kept, f"rc {run.returncode}, {got}/{kept}")

        return case

    def package(folder: Path) -> Result:
        (folder / "pkg").mkdir()
        (folder / "pkg" / "__init__.py").write_text("")
        run = ckview(folder, "record", "-m", "pkg")
        return Result(run.returncode == 2 and run.stderr.count("\n") == 1, False)

    yield "forked child raises", run_case(["--steps=5", "train.py", "fork", "3", "7"], 0, 5)
    yield "closes every fd", run_case(["--steps=6", "train.py", "closefds", "3", "8"], 0, 6)
    yield "--steps 999999999999", run_case(["--steps=999999999999", "train.py"], 2, 0)
    yield "-m package without __main__", package


FAMILIES = {
    "signals": signals,
    "stops in callbacks": stops_in_callbacks,
    "os._exit": os_exit,
    "disk full": disk_full,
    "busy files": busy,
    "-o collisions": collisions,
    "bad scripts": bad_scripts,
}


def main() -> None:
    global REPEAT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=list(FAMILIES))
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    parser.add_argument(
        "--repeat", type=int, default=REPEAT, help="runs of each stop in a callback (default 5)"
    )
    args = parser.parse_args()
    REPEAT = args.repeat
    rows = []
    for family in args.family or list(FAMILIES):
        tried = handled = lost = 0
        for name, case in FAMILIES[family]():
            folder = folder_with_script()
            shutil.copy(ROOT / "sample_traces" / "mlp.h5", folder / "t.h5")
            try:
                result = case(folder)
            except Exception as exc:  # a case that breaks the suite counts as not handled
                result = Result(False, False, f"{type(exc).__name__}: {exc}")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            tried += 1
            handled += result.handled
            lost += result.lost
            if args.verbose or not result.handled:
                mark = "ok " if result.handled else "BAD"
                print(f"  {mark} {family}: {name}: {result.note}", flush=True)
        rows.append((family, tried, handled, lost))
    print(f"\n{'family':<16} {'tried':>6} {'handled':>8} {'lost':>5}")
    for family, tried, handled, lost in rows:
        print(f"{family:<16} {tried:>6} {handled:>8} {lost:>5}")
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'all':<16} {total[0]:>6} {total[1]:>8} {total[2]:>5}")


if __name__ == "__main__":
    main()
