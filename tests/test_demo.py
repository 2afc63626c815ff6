"""`specroute demo` brings up emulators and the proxy, shows routed traffic, and cleans up."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from specroute.children import free_port


@pytest.mark.timeout(120)
def test_demo_shows_each_request_backend_and_how_to_use_the_proxy() -> None:
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "specroute", "demo", "--exit-after-traffic", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "EMULATED" in out
    assert f'base_url="http://127.0.0.1:{port}/v1"' in out
    rows = re.findall(r"^\s+(greedy|sampled)\s+(\S+)\s+([123])\s+96\s", out, re.MULTILINE)
    assert len(rows) == 4  # four single requests, each served in full by a known depth
    assert {backend for _, backend, _ in rows} <= {"steps1", "steps2", "steps3"}  # named
    assert "throughput ->" in out  # each shows the policy's reason
    burst = re.findall(r"^\s+\S+\s+([123])\s+(\d+)\s+\d+\s+\d+\s+[\d.]+$", out, re.MULTILINE)
    assert sum(int(n) for _, n in burst) == 24
    # Everything it started is gone: nothing listens on the port any more.
    probe = subprocess.run(
        ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True, check=False
    )
    assert probe.returncode != 0


def test_demo_refuses_a_busy_port_with_a_clear_message() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "specroute", "demo", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert f"port {port} is in use" in done.stderr
