"""What `make demo` and `make test` install: the demo gets the proxy, the bench and the plots and
nothing heavy; the test tools come without torch; pip's progress is not silenced."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"torch", "playwright", "schemathesis", "sglang", "kubernetes-validate"}


def _extras() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        extras: dict[str, list[str]] = tomllib.load(fh)["project"]["optional-dependencies"]
    return extras


def _closure(extra: str) -> set[str]:
    """Distribution names an extra pulls in, following `specroute[...]` self-references."""
    extras, names, todo, seen = _extras(), set(), [extra], set()
    while todo:
        name = todo.pop()
        seen.add(name)
        for requirement in extras[name]:
            if inner := re.fullmatch(r"specroute\[([\w,-]+)\]", requirement):
                todo.extend(e for e in inner.group(1).split(",") if e not in seen)
            else:
                names.add(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower())
    return names


def _dry_run(target: str) -> str:
    return subprocess.run(
        ["make", "-n", target, "VENV=/nonexistent-venv", "PORT=8123"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_demo_extra_has_bench_and_plots_and_nothing_heavy() -> None:
    demo = _closure("demo")
    assert {"aiohttp", "matplotlib"} <= demo
    assert not demo & HEAVY


def test_test_tools_come_without_torch_but_with_plots() -> None:
    dev = _closure("dev")
    assert {"pytest", "mypy", "ruff", "matplotlib"} <= dev
    assert "torch" not in dev


def test_make_demo_installs_the_demo_extra_with_progress_on_the_chosen_port() -> None:
    commands = _dry_run("demo")
    assert "pip install -e '.[demo]'" in commands
    assert "--quiet" not in commands
    assert "specroute demo --port 8123" in commands


def test_make_test_installs_dev_without_the_gpu_extra() -> None:
    commands = _dry_run("unit")
    assert "pip install -e '.[dev]'" in commands
    assert "gpu-bench" not in commands
