"""Real servers on loopback for tests: start a `specroute` subcommand, poll until it answers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

__all__ = ["Server", "free_port", "run_server", "start_emulator"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    url: str
    port: int
    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        """Die at once, as a crashed backend does."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def _wait_until_up(server: Server, ready_path: str | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server on port {server.port} exited with {server.process.returncode}"
            )
        try:
            if ready_path is None:
                with socket.create_connection(("127.0.0.1", server.port), timeout=0.5):
                    return
            elif httpx.get(server.url + ready_path, timeout=0.5).status_code == 200:
                return
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"server on port {server.port} did not come up in {timeout} s")


@contextlib.contextmanager
def run_server(
    args: list[str],
    *,
    port: int | None = None,
    ready_path: str | None = "/ready",
    timeout: float = 30.0,
) -> Iterator[Server]:
    """Run `python -m specroute ARGS --port P` until the block ends; `ready_path=None` waits
    only for the port to accept connections (for servers that start not ready on purpose)."""
    port = port or free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "specroute", *args, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if os.environ.get("SPECROUTE_TEST_QUIET", "1") == "1" else None,
    )
    server = Server(url=f"http://127.0.0.1:{port}", port=port, process=process)
    try:
        _wait_until_up(server, ready_path, timeout)
        yield server
    finally:
        server.stop()


def start_emulator(
    steps: int = 3, *extra: str, ready_path: str | None = "/ready", port: int | None = None
) -> contextlib.AbstractContextManager[Server]:
    """An emulated SGLang server at depth `steps`; `extra` are more `specroute emulate` flags."""
    return run_server(["emulate", "--steps", str(steps), *extra], port=port, ready_path=ready_path)
