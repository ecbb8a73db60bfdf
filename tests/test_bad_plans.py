"""Bad and hostile plan files (issue 12, item 6): each is refused with one line, in bounded time.

``ckview project``, ``ckview record --plan`` and ``ckpt_runtime.apply_plan`` all read plans
through ``ckpt_runtime.plan.load_plan`` (NOTE [ Plans from untrusted files ]). A hang would stop
the test run: ``faulthandler`` ends the process after ``LIMIT_S`` seconds on one case.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ckpt_runtime.plan import (
    MAX_MESSAGE,
    MAX_PLAN_BYTES,
    PlanError,
    load_plan,
    match_path,
    match_paths,
)

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "sample_traces" / "mlp.h5"
LIMIT_S = 60


def doc(**fields: object) -> str:
    return json.dumps({"format": "ckview-plan", "version": 1, **fields})


def nested(depth: int) -> str:
    return doc(regions=[], meta={"deep": json.loads("[" * 50 + "]" * 50)})[:-1] + (
        ', "more": ' + "[" * depth + "]" * depth + "}"
    )


BAD_PLANS: dict[str, str | bytes] = {
    "nested_arrays": "[" * 200_000,
    "nested_objects": '{"a":' * 200_000,
    "nested_meta": doc(regions=[])[:-1] + ', "meta": ' + '{"a":' * 100_000 + "1" + "}" * 100_001,
    "nested_regions": doc(regions="[" * 50_000),
    "digits_version": doc(regions=[])[:-2].replace('"version": 1', '"version": ' + "9" * 5000)
    + "]}",
    "digits_index": doc(regions=[{"sequential": "layers", "start": 0, "stop": 10**4000}]),
    "digits_50000": '{"format": "ckview-plan", "version": ' + "1" * 50_000 + "}",
    "globstar_120": doc(regions=[{"module": "**." * 120 + "x"}]),
    "globstar_3000": doc(regions=[{"module": "**." * 3000 + "x"}]),
    "globstar_between": doc(regions=[{"module": ".".join(["**", "a"] * 120) + ".b"}]),
    "components_100000": doc(regions=[{"module": "a." * 100_000 + "b"}]),
    "star_component": doc(regions=[{"module": "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b"}]),
    "many_segments": doc(
        regions=[{"sequential": "layers", "start": i, "stop": i + 2} for i in range(20_000)]
    ),
    "invalid_utf8": b'{"format": "ckview-plan", "name": "\xff\xfe"}',
    "nan": doc(regions=[{"sequential": "layers", "start": float("nan"), "stop": 1}]),
    "empty": "",
    "control_name": doc(regions=[], name="\x1b[2Jowned"),
}


@contextmanager
def bounded() -> Iterator[None]:
    """Dump the stacks and end the process if the block runs past LIMIT_S."""
    faulthandler.dump_traceback_later(LIMIT_S, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(params=sorted(BAD_PLANS))
def bad_plan(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / f"{request.param}.json"
    text = BAD_PLANS[request.param]
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def one_line_refusal(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:2000]
    assert "\x1b" not in err
    return lines[0]


def test_project_refuses_each_bad_plan(run_cli, bad_plan: Path) -> None:
    with bounded():
        code, _, err = run_cli("project", "--plan", str(bad_plan), str(TRACE))
    line = one_line_refusal(code, err)
    assert len(line) < MAX_MESSAGE + 200


RESOLVED_LATER = frozenset({"globstar_120", "globstar_between", "star_component"})
"""Well-formed patterns: refused when resolved (they match no module), after matching ends."""


def test_load_plan_raises_plan_error(bad_plan: Path) -> None:
    with bounded():
        if bad_plan.stem in RESOLVED_LATER:
            pattern = load_plan(bad_plan).regions[0].pattern  # type: ignore[union-attr]
            assert match_paths(pattern, ["a." * 200 + "y", "y", "a.b"]) == []
            return
        with pytest.raises(PlanError) as caught:
            load_plan(bad_plan)
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) <= MAX_MESSAGE


def test_apply_plan_raises_plan_error(bad_plan: Path) -> None:
    torch = pytest.importorskip("torch")
    from ckpt_runtime import apply_plan

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    with bounded(), pytest.raises(PlanError):
        apply_plan(model, bad_plan)


@pytest.mark.parametrize("source", ["/dev/zero", "/dev/urandom"])
def test_endless_files_are_read_up_to_the_limit(run_cli, source: str) -> None:
    with bounded():
        code, _, err = run_cli("project", "--plan", source, str(TRACE))
    line = one_line_refusal(code, err)
    assert str(MAX_PLAN_BYTES // 2**20) in line or "UTF-8" in line or "utf-8" in line


def test_a_plan_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(doc(regions=[])[:-1] + ', "meta": {"pad": "' + " " * MAX_PLAN_BYTES + '"}}')
    with pytest.raises(PlanError, match="larger than 16 MiB"):
        load_plan(path)


def test_record_refuses_a_bad_plan_before_running_the_script(run_cli, tmp_path: Path) -> None:
    plan = tmp_path / "deep.json"
    plan.write_text("[" * 200_000)
    script = tmp_path / "never.py"
    marker = tmp_path / "ran"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with bounded():
        code, _, err = run_cli(
            "record", "--plan", str(plan), "-o", str(tmp_path / "t.h5"), str(script)
        )
    one_line_refusal(code, err)
    assert not marker.exists()


# --- matching stays linear ---------------------------------------------------------------------


def naive(parts: list[str], pattern: list[str]) -> bool:
    """The recursive definition of NOTE [ Module path patterns ] (exponential, small inputs)."""
    from fnmatch import fnmatchcase

    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(naive(parts[i:], rest) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and naive(parts[1:], rest)


PATTERNS = ["**", "**.b", "a.**", "a.**.b", "**.**.b", "a.*.b", "**.a.**.b.**", "*", "a", ""]
PATHS = ["", "a", "b", "a.b", "a.x.b", "a.b.b", "x.a.y.b.z", "a.a.a.b", "b.a"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_matching_agrees_with_the_recursive_definition(pattern: str) -> None:
    def split(text: str) -> list[str]:
        return text.split(".") if text else []

    for path in PATHS:
        assert match_path(pattern, path) == naive(split(path), split(pattern)), (pattern, path)


def test_many_globstars_match_in_linear_steps() -> None:
    pattern = ".".join(["**", "a"] * 200) + ".b"
    path = ".".join(["a"] * 250)
    calls = 0
    import ckpt_runtime.plan as plan_module

    real = plan_module.fnmatchcase

    def counting(name: str, pat: str) -> bool:
        nonlocal calls
        calls += 1
        return real(name, pat)

    plan_module.fnmatchcase = counting  # type: ignore[assignment]
    try:
        assert not match_path(pattern, path)
        assert match_paths(pattern, [path + ".b"]) == [0]
    finally:
        plan_module.fnmatchcase = real  # type: ignore[assignment]
    # Each path component is compared with each pattern component at most once per match.
    assert calls <= 2 * (251 * 401)
