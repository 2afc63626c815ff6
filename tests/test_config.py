"""Configuration: file, then SPECROUTE_* environment, then flags; bad input names the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from specroute.config import load_config
from specroute.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "specroute.toml"
    path.write_text(text)
    return path


def test_file_values_are_read(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'policy = "round_robin"\nport = 9001\nbackends = ["http://a:1", {url = "http://b:2", '
        'name = "deep"}]\n[timeouts]\nidle_s = 7\n',
    )
    config = load_config(path, environ={})
    assert config.policy == "round_robin"
    assert config.port == 9001
    assert [b.label for b in config.backends] == ["a:1", "deep"]
    assert config.timeouts.idle_s == 7


def test_environment_overrides_file_and_flags_override_environment(tmp_path: Path) -> None:
    path = _write(tmp_path, "port = 9001\n[retry]\nmax_attempts = 5\n")
    env = {
        "SPECROUTE_PORT": "9002",
        "SPECROUTE_RETRY__MAX_ATTEMPTS": "2",
        "SPECROUTE_BACKENDS": "http://x:1, http://y:2",
        "SPECROUTE_TEST_QUIET": "1",  # belongs to someone else: ignored
    }
    config = load_config(path, environ=env, overrides={"port": 9003})
    assert config.port == 9003
    assert config.retry.max_attempts == 2
    assert [b.url for b in config.backends] == ["http://x:1", "http://y:2"]


@pytest.mark.parametrize(
    ("text", "env", "path"),
    [
        ('backends = [{url = "http://a:1"}, {url = "ftp://b"}]', {}, "$.backends[1]"),
        ("[timeouts]\nidle_s = -1", {}, "$.timeouts.idle_s"),
        ("bogus = 1", {}, "bogus"),
        ("", {"SPECROUTE_PORT": "eighty"}, "$.port"),
        ('backends = [{url = "http://a:1", colour = "red"}]', {}, "$.backends[0]"),
    ],
)
def test_bad_config_names_the_field(
    tmp_path: Path, text: str, env: dict[str, str], path: str
) -> None:
    with pytest.raises(
        ConfigError, match=path.replace("$", r"\$").replace("[", r"\[").replace("]", r"\]")
    ):
        load_config(_write(tmp_path, text), environ=env)


def test_without_environ_the_process_environment_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, "port = 9001\n")
    monkeypatch.setenv("SPECROUTE_PORT", "9002")
    assert load_config(path).port == 9002
    assert load_config(path, environ={}).port == 9001


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "port = = 3"), environ={})


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.toml", environ={})


def test_duplicate_backend_names_are_rejected() -> None:
    with pytest.raises(ConfigError, match="unique"):
        load_config(
            environ={}, overrides={"backends": [{"url": "http://a:1"}, {"url": "http://a:1"}]}
        )


def test_shipped_example_config_loads_as_documented() -> None:
    from pathlib import Path

    from specroute.config import load_config as load

    example = Path(__file__).parent.parent / "examples" / "specroute.toml"
    config = load(example, environ={})
    assert [b.label for b in config.backends] == ["steps1", "steps2", "steps3"]
    assert config.policy.startswith("throughput")


def test_serve_flags_name_backends_and_default_to_the_throughput_policy() -> None:
    import argparse

    from specroute.proxy.command import build_config, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "--backend", "deep=http://gpu-a:30000", "--backend", "http://gpu-b:30000"]
    )
    config = build_config(args)
    assert [b.label for b in config.backends] == ["deep", "gpu-b:30000"]
    assert [b.url for b in config.backends] == ["http://gpu-a:30000", "http://gpu-b:30000"]
    assert config.policy == "throughput"


def test_environment_backends_take_names_like_the_flag() -> None:
    env = {"SPECROUTE_BACKENDS": "steps1=http://a:1, http://b:2,deep=https://c:3/"}
    config = load_config(environ=env)
    assert [(b.label, b.url) for b in config.backends] == [
        ("steps1", "http://a:1"),
        ("b:2", "http://b:2"),
        ("deep", "https://c:3/"),
    ]


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('polcy = "throughput"\n', "unknown field `polcy`; did you mean policy?"),
        ("[lanes]\nresrve = 4\n", "unknown field `resrve` - at `$.lanes`; did you mean reserve?"),
        (
            '[[backends]]\nurl = "http://127.0.0.1:9"\nnmae = "a"\n',
            "unknown field `nmae` - at `$.backends[0]`; did you mean name?",
        ),
        ("zzzzqq = 1\n", "unknown field `zzzzqq`; `specroute config example` lists them"),
    ],
)
def test_a_misspelt_key_in_the_file_is_refused_naming_the_closest_setting(
    tmp_path: Path, toml: str, said: str
) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as refused:
        load_config(path, environ={})
    assert said in str(refused.value)


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("SPECROUTE_TIMEOUT__IDLE_S", "SPECROUTE_TIMEOUTS__IDLE_S"),
        ("SPECROUTE_BACKEND", "SPECROUTE_BACKENDS"),
        ("SPECROUTE_ADMINKEY", "SPECROUTE_ADMIN_KEY"),
        ("SPECROUTE_LIMITS__MAX_CONECTIONS", "SPECROUTE_LIMITS__MAX_CONNECTIONS"),
    ],
)
def test_a_misspelt_variable_is_refused_naming_the_closest_setting(name: str, closest: str) -> None:
    with pytest.raises(ConfigError, match=rf"{name} is not a setting; did you mean {closest}\?"):
        load_config(environ={name: "1"})


def test_a_section_name_alone_is_not_a_setting() -> None:
    with pytest.raises(ConfigError, match="SPECROUTE_TIMEOUTS is not a setting"):
        load_config(environ={"SPECROUTE_TIMEOUTS": "1"})


def test_variables_that_tests_and_tools_read_are_not_settings_and_not_refused() -> None:
    from specroute.config import NON_CONFIG_VARIABLES, env_names

    env = dict.fromkeys(NON_CONFIG_VARIABLES, "x")
    assert load_config(environ=env) == load_config(environ={})
    assert not NON_CONFIG_VARIABLES & set(env_names())
    assert {"SPECROUTE_PORT", "SPECROUTE_TIMEOUTS__IDLE_S", "SPECROUTE_BACKENDS"} <= set(
        env_names()
    )


def test_serve_exits_2_on_a_misspelt_variable() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECROUTE_POLICYY": "round_robin"}
    done = subprocess.run(
        [sys.executable, "-m", "specroute", "serve", "--backend", "http://127.0.0.1:9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "SPECROUTE_POLICYY is not a setting; did you mean SPECROUTE_POLICY?" in done.stderr
