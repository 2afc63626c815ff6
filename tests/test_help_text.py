"""Help a user reads: descriptions that end where their sentence does, each default shown once
and only when it says something, every policy option described."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from specroute.cli import main
from specroute.policies import available
from specroute.policies.registry import option_help, options_of

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def _description(text: str) -> str:
    """The paragraph after the usage lines, joined."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    return " ".join(paragraphs[1].split())


def test_policies_help_describes_in_whole_sentences(capsys: pytest.CaptureFixture[str]) -> None:
    description = _description(_help(["policies"], capsys))
    assert description.endswith("read from the policy itself.")


@pytest.mark.parametrize("script", ["depth_sim.py", "policy_sim.py", "proxy_overhead.py"])
def test_benchmark_help_describes_in_whole_sentences(script: str) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert _description(out).endswith(".")


@pytest.mark.parametrize("command", [["launch"], ["tune"], ["emulate"], ["demo"], ["calibrate"]])
def test_each_default_is_shown_once_and_never_as_none(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = " ".join(_help(command, capsys).split())
    assert "(default: None)" not in text
    assert not re.search(r"default[^()]*\)\s*\(default:", text)


def test_bench_sweep_help_shows_the_levels_and_tokens_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = " ".join(_help(["bench", "sweep"], capsys).split())
    assert "comma-separated (default: 1,4,16,32,64)" in text
    assert "tokens per reply (default: 256)" in text


def test_every_policy_option_is_described_in_its_field_or_its_options_class() -> None:
    missing = []
    for name, factory in available().items():
        kind = options_of(factory)
        described = kind.__doc__ or "" if kind is not None else ""
        missing += [
            f"{name}.{option.name}"
            for option in option_help(factory)
            if not option.doc and option.name not in described
        ]
    assert not missing
