"""`specroute launch --emulate`: the whole launcher path (supervision, readiness, the proxy in
front, restart after a crash, orderly stop) with emulated servers as real child processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient
from servers import launch_ports

from specroute.children import spawn, stop
from specroute.emulator import EmulatorOptions
from specroute.emulator.seed import SEED_MAX_RUNNING_REQUESTS
from specroute.emulator.server import create_app

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Launch:
    url: str
    process: subprocess.Popen[bytes]
    output: Path
    log_dir: Path

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def pid_of(self, name: str) -> int:
        match = re.search(rf"^\s+{name}\s+\S+\s+pid (\d+)", self.text(), re.MULTILINE)
        assert match, self.text()
        return int(match.group(1))


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    port, base = launch_ports(3)
    output = tmp_path / "launch.out"
    argv = [sys.executable, "-m", "specroute", "launch", "--emulate", "--steps", "1,2,3"]
    argv += ["--model", "tiny", "--port", str(port), "--base-port", str(base)]
    argv += ["--log-dir", str(tmp_path / "logs"), "--drain", "10", "--policy", "least_loaded"]
    argv += ["--emulator-arg=--time-scale=20"]
    with output.open("wb") as out:
        process = spawn(argv, stdout=out, stderr=subprocess.STDOUT)
    run = Launch(f"http://127.0.0.1:{port}", process, output, tmp_path / "logs")
    try:
        _until(lambda: "pool ready" in run.text() or process.poll() is not None, "the pool")
        assert process.poll() is None, run.text()
        yield run
    finally:
        stop(process, grace_s=30)


def _healthy(url: str, backend_port: int) -> bool:
    try:
        pool = httpx.get(url + "/pool", timeout=2).json()
    except httpx.HTTPError:
        return False
    return any(b["url"].endswith(f":{backend_port}") and b["healthy"] for b in pool["backends"])


def test_launch_emulate_serves_requests_through_the_proxy(launch: Launch) -> None:
    steps_seen = set()
    for _ in range(6):
        reply = httpx.post(launch.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        steps_seen.add(reply.headers["x-specroute-steps"])
    assert steps_seen == {"1", "2", "3"}  # idle pool: least_loaded takes each in turn
    assert sorted(p.name for p in launch.log_dir.iterdir()) == [
        "proxy.log",
        "steps1.log",
        "steps2.log",
        "steps3.log",
    ]


def test_launched_servers_report_the_limits_of_emulate_started_by_hand(launch: Launch) -> None:
    for k in (1, 2, 3):
        match = re.search(rf"steps{k}\s+(http://127\.0\.0\.1:\d+)", launch.text())
        assert match, launch.text()
        launched = httpx.get(match.group(1) + "/server_info", timeout=10).json()
        with TestClient(create_app(EmulatorOptions(steps=k))) as by_hand:
            expected = by_hand.get("/server_info").json()["max_running_requests"]
        # The launcher's --max-running-requests 48 is a cap: each depth runs what memory holds.
        assert launched["max_running_requests"] == expected == SEED_MAX_RUNNING_REQUESTS[k]
        state = launched["internal_states"][0]
        assert state["effective_max_running_requests_per_dp"] == expected


def test_killed_server_is_restarted_and_readmitted(launch: Launch) -> None:
    pid = launch.pid_of("steps2")
    port = int(re.search(r"steps2\s+http://127\.0\.0\.1:(\d+)", launch.text()).group(1))  # type: ignore[union-attr]
    os.kill(pid, signal.SIGKILL)
    _until(lambda: "steps2 exited with status -9; restarting" in launch.text(), "the crash report")
    # The restart can be quicker than the proxy's two failed probes: whether it ever marked
    # steps2 down is a race; serving requests from the new process afterwards is not.
    _until(lambda: (launch.log_dir / "steps2.log").read_text().count("=== start:") == 2, "restart")
    _until(lambda: _healthy(launch.url, port), "the proxy to readmit steps2")

    def served_by_steps2() -> bool:
        reply = httpx.post(launch.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert reply.status_code == 200, reply.text
        return reply.headers["x-specroute-steps"] == "2"

    _until(served_by_steps2, "a request served by the restarted steps2")


def test_sigterm_drains_a_stream_then_stops_every_process(launch: Launch) -> None:
    pids = [launch.pid_of(name) for name in ("steps1", "steps2", "steps3", "proxy")]
    body = {**CHAT, "max_tokens": 200, "stream": True}
    with httpx.stream("POST", launch.url + "/v1/chat/completions", json=body, timeout=30) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        launch.process.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert rest[-1] == "data: [DONE]" or rest[-2:] == ["data: [DONE]", ""]
    assert not any('"error"' in line for line in rest)
    assert launch.process.wait(timeout=30) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
