"""`specroute demo` brings up emulators and the proxy, shows routed traffic, and cleans up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from process_tree import Terminal, descendants, still_running

from specroute.children import bound_socket


def _demo(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`specroute demo ARGS` to its end, its proxy on a socket bound here and handed over:
    (the port, what it printed, what it said on stderr)."""
    with bound_socket() as sock:
        port, fd = sock.getsockname()[1], sock.fileno()
        done = subprocess.run(
            [sys.executable, "-m", "specroute", "demo", *args,
             "--port", str(port), "--fd", str(fd)],
            capture_output=True,
            text=True,
            timeout=110,
            check=False,
            pass_fds=[fd],
            env=env,
        )  # fmt: skip
    return port, done.stdout, done.stderr + f"\n[status {done.returncode}]"


@pytest.mark.timeout(120)
def test_demo_shows_each_request_backend_and_how_to_use_the_proxy() -> None:
    port, out, err = _demo("--exit-after-traffic")
    assert err.endswith("[status 0]"), err
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


def _child_running(pid: int, *words: str) -> int:
    for child in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(w.encode() in argv for w in words):
            return child
    raise AssertionError(f"no child running {words}")


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("words", "name"),
    [(("serve",), "the proxy"), (("emulate", "2"), "emulated backend steps2")],
)
def test_demo_says_which_child_died_and_exits_1(
    tmp_path: Path, words: tuple[str, ...], name: str
) -> None:
    with bound_socket() as sock:  # the proxy's, held from here on
        port, fd = sock.getsockname()[1], sock.fileno()
        args = ["demo", "--port", str(port), "--fd", str(fd)]
        terminal = Terminal(args, tmp_path, pass_fds=[fd])
    children: set[int] = set()
    try:
        terminal.wait_for("Serving until Ctrl-C.")
        children = descendants(terminal.process.pid)
        os.kill(_child_running(terminal.process.pid, *words), signal.SIGKILL)
        assert terminal.process.wait(timeout=60) == 1
        assert f"specroute demo: {name} exited with status -9; stopping the rest" in terminal.err
        assert "Traceback" not in terminal.err
        assert not still_running(children)
    finally:
        terminal.close(children)


@pytest.mark.timeout(90)
def test_demo_whose_proxy_refuses_its_settings_says_why_without_a_traceback() -> None:
    _, _, err = _demo(
        "--exit-after-traffic", env={**os.environ, "SPECROUTE_POLICYY": "round_robin"}
    )
    assert err.endswith("[status 1]"), err
    assert "SPECROUTE_POLICYY is not a setting; did you mean SPECROUTE_POLICY?" in err
    assert "specroute demo: the proxy exited with status 2" in err
    assert "Traceback" not in err
