"""`examples/specroute.toml` is written from the config types: it matches what
`specroute config example` prints, loads, shows every default, and its examples are valid."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from specroute.cli import main
from specroute.config import Config, env_names, load_config
from specroute.proxy.config_example import EXAMPLE_PATH, render_example

EXAMPLE = Path(__file__).resolve().parent.parent / EXAMPLE_PATH
COMMENTED_SETTING = re.compile(r"^# (\w+) = (.+)$", re.MULTILINE)


def test_committed_example_is_the_generated_one() -> None:
    assert EXAMPLE.read_text() == render_example(), (
        f"{EXAMPLE_PATH} is stale: run `specroute config example > {EXAMPLE_PATH}`"
    )


def test_config_example_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "example"]) == 0
    assert capsys.readouterr().out == render_example()


def test_example_loads_with_every_default_and_three_named_backends() -> None:
    config = load_config(EXAMPLE, environ={})
    assert [b.label for b in config.backends] == ["steps1", "steps2", "steps3"]
    assert msgspec.structs.replace(config, backends=()) == Config()


def test_every_setting_is_in_the_example() -> None:
    text = render_example()
    keys = set(re.findall(r"^(?:# )?(\w+) = ", text, re.MULTILINE))
    sections = set(re.findall(r"^\[(\w+)\]$", text, re.MULTILINE))
    for name in set(env_names()) - {"SPECROUTE_BACKENDS"}:  # backends: [[backends]] tables
        *section, key = name.removeprefix("SPECROUTE_").lower().split("__")
        assert key in keys, f"{key} is missing"
        assert set(section) <= sections, f"[{section[0]}] is missing"
    assert "[[backends]]" in text
    for key in ("api_key", "max_in_flight", "resolve_every_s"):  # a backend's own settings
        assert f"# {key} = " in text


def test_commented_out_examples_are_valid_values(tmp_path: Path) -> None:
    commented = COMMENTED_SETTING.findall(EXAMPLE.read_text())
    assert len(commented) >= 5
    enabled = COMMENTED_SETTING.sub(r"\1 = \2", EXAMPLE.read_text())
    path = tmp_path / "all.toml"
    path.write_text(enabled)
    config = load_config(path, environ={})
    assert config.admin_key == "change-me"
    assert config.backends[0].api_key == "sglang-key"
    assert config.limits.reserved_connections == 256
