"""A proxy listening beyond this machine without keys is warned about in the same words by
`serve` and `launch`; loopback and keyed proxies are not."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specroute.exposure import is_loopback, keyless_proxy_warning

WARNING = keyless_proxy_warning("0.0.0.0", ())


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("proxy.internal", False)],
)  # fmt: skip
def test_loopback_is_only_this_machine(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    assert (keyless_proxy_warning(host, ()) is None) is loopback
    assert keyless_proxy_warning(host, ("sk-1",)) is None


def _serve_on_a_taken_port(*flags: str) -> subprocess.CompletedProcess[str]:
    """`serve --host 0.0.0.0` on a port held on loopback: the bind fails after the start-up
    checks, so nothing listens beyond this machine, even for a moment."""
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = str(held.getsockname()[1])
        argv = [sys.executable, "-m", "specroute", "serve", "--host", "0.0.0.0", "--port", port,
                "--backend", "http://127.0.0.1:9", "--log-level", "error", *flags]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_serve_on_all_interfaces_without_keys_warns_as_launch_does() -> None:
    assert WARNING is not None
    run = _serve_on_a_taken_port()
    assert run.returncode != 0
    assert WARNING in run.stderr


def test_serve_with_a_key_does_not_warn() -> None:
    run = _serve_on_a_taken_port("--api-key", "sk-test")
    assert "without api_keys" not in run.stderr


@pytest.mark.parametrize("name", ["compose.yaml", "compose.emulated.yaml"])
def test_compose_publishes_the_proxy_on_loopback_unless_told(name: str) -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((Path(__file__).parent.parent / "deploy" / name).read_text())
    proxy = compose["services"]["proxy"]
    assert proxy["ports"] == ["${SPECROUTE_PUBLISH:-127.0.0.1}:8000:8000"]
    assert proxy["environment"]["SPECROUTE_API_KEYS"] == "${SPECROUTE_API_KEYS:-}"
