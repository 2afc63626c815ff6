"""Configuration fails closed and clear: a blank key list, a file that is not UTF-8 or nests
without end, a backend URL the client could not connect to, and a period that would spin a
core are each refused at start-up, with status 2, the cause, and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from specroute.cli import main
from specroute.config import load_config
from specroute.errors import ConfigError


@pytest.mark.parametrize("value", [" ", ",", " , "])
def test_a_blank_api_key_list_in_the_environment_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="SPECROUTE_API_KEYS is set but lists no key"):
        load_config(environ={"SPECROUTE_API_KEYS": value})


def test_a_blank_key_from_a_file_or_flag_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"api_keys\[1\] is blank"):
        load_config(environ={}, overrides={"api_keys": ["sk-a", "  "]})


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1", "is not a valid URL"),
        ("http://h:abc", "is not a valid URL"),
        ("http://h:99999", "is not a valid URL"),
        ("http://:8000", "names no host"),
        ("http://h:1/?debug=1", "must not have a query"),
        ("h:8000", "must start with http"),
    ],
)
def test_a_backend_url_the_client_could_not_use_is_refused_naming_it(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"{why}.*\$\.backends\[0\]"):
        load_config(environ={}, overrides={"backends": [{"url": url}]})


@pytest.mark.parametrize(
    "variable",
    [
        "SPECROUTE_HEALTH__INTERVAL_S",
        "SPECROUTE_HEALTH__DISCOVERY_INTERVAL_S",
        "SPECROUTE_HEALTH__METRICS_INTERVAL_S",
        "SPECROUTE_TIMEOUTS__HEARTBEAT_S",
        "SPECROUTE_LIMITS__CLIENT_STALL_S",
        "SPECROUTE_REPLICAS__RESOLVE_EVERY_S",
        "SPECROUTE_REPLICAS__READ_EVERY_S",
        "SPECROUTE_REPLICAS__SCRAPE_MIN_INTERVAL_S",
    ],
)
def test_a_period_too_short_to_be_meant_is_refused(variable: str) -> None:
    with pytest.raises(ConfigError, match=r">= 0\.05"):
        load_config(environ={variable: "1e-9"})


def test_a_dns_backends_resolve_period_is_bounded_too() -> None:
    backend = {"url": "http://svc:30000", "resolve_every_s": 1e-9}
    with pytest.raises(ConfigError, match=r">= 0\.05 - at `\$\.backends\[0\]\.resolve_every_s`"):
        load_config(environ={}, overrides={"backends": [backend]})


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (b'port = 8000\nhost = "\xff\xfe"\n', "is not UTF-8 text"),
        (b"x = " + b"[" * 10_000 + b"]" * 10_000 + b"\n", "nests tables or arrays too deeply"),
    ],
    ids=["not-utf8", "10k-deep"],
)
def test_serve_exits_2_with_the_cause_on_a_file_it_cannot_read(
    tmp_path: Path, content: bytes, cause: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "specroute.toml"
    path.write_bytes(content)
    assert main(["serve", "--config", str(path), "--backend", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert cause in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_an_fd_that_is_no_inherited_socket_exits_2_naming_it(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file's descriptor, then a closed one: `serve --fd -1` ended in a traceback.
    with (tmp_path / "not-a-socket").open("w") as handle:
        fd = handle.fileno()
        argv = [command, "--fd", str(fd)] + (
            ["--backend", "http://127.0.0.1:9"] * (command == "serve")
        )
        assert main(argv) == 2
    assert f"--fd {fd} is not a socket this process inherited" in capsys.readouterr().err
    argv[2] = "-1"
    assert main(argv) == 2
    assert "--fd -1 is not a socket this process inherited" in capsys.readouterr().err
