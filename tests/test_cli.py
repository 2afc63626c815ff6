"""The `specroute` command line: `specroute policies` shows each policy in full, with every
option's type, allowed values and default, read from the policies' own option types."""

from __future__ import annotations

import inspect

import pytest

from specroute.cli import main
from specroute.policies import available


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_policies_shows_every_description_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies"]) == 0
    out = _flat(capsys.readouterr().out)
    for name, factory in available().items():
        assert _flat(inspect.getdoc(factory) or "") in out, name
        options = getattr(factory, "Options", None)
        if options is not None:
            assert _flat(inspect.getdoc(options) or "") in out, name


def test_policies_lists_each_option_with_its_type_allowed_values_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policies", "throughput"]) == 0
    lines = capsys.readouterr().out.splitlines()
    objective = next(line for line in lines if line.split()[:1] == ["objective"])
    assert set(objective.split()[1].rstrip(",").split("|")) == {"latency", "throughput", "goodput"}
    assert objective.endswith("default throughput")
    floor = next(line for line in lines if line.split()[:1] == ["floor_tok_s"])
    assert "number" in floor
    assert floor.endswith("default 0.0")
    assert not any(line.startswith("bandit") for line in lines)  # only the one asked for


def test_policies_shows_a_field_docstring_under_its_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policies", "threshold"]) == 0
    out = capsys.readouterr().out
    spread = out.index("spread")
    assert "Load (in flight per slot) one depth step away" in out[spread:]


def test_policies_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "fastest"]) == 2
    assert "no policy 'fastest'; choose one of:" in capsys.readouterr().err
