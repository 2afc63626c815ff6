"""Real servers on loopback for tests: start a `specroute` subcommand, poll until it answers."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from specroute.children import bound_socket, spawn, stop, wait_ready_sync

__all__ = [
    "Server",
    "bound_socket",
    "closed_port",
    "free_run",
    "launch_ports",
    "refused_url",
    "run_server",
    "start_emulator",
]


@dataclass
class Server:
    url: str
    port: int
    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        """Die at once, as a crashed backend does."""
        stop(self.process, sig=signal.SIGKILL)

    def stop(self) -> None:
        stop(self.process, sig=signal.SIGINT, grace_s=10)


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port nothing answers on: bound here and never listened on, so every
    connection is refused, and no other process can take the port while the block runs (a
    port picked and let go could be a new server's by the time it is tried)."""
    with socket.socket() as sock:  # no SO_REUSEADDR: nobody else may bind it meanwhile
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections and `bind(0)`."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_run(count: int, avoid: Collection[int] = ()) -> int:
    """A first port such that `count` ports from it are free now, for `launch --base-port`
    (server i listens on base + i, for its whole life and again after each restart). Taken
    below the kernel's ephemeral range: there no outgoing connection's local port and no
    `bind(0)` of another test worker lands on it while a server is down between restarts
    (a run from `free_port()` lost its second port that way under two workers)."""
    high = _ephemeral_low() - count
    for _ in range(100):
        base = random.randrange(10_000, high)
        ports = range(base, base + count)
        if any(p in avoid for p in ports):
            continue
        try:
            for port in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no run of {count} free ports below {high + count}")


def launch_ports(servers: int) -> tuple[int, int]:
    """(the proxy's `--port`, the servers' `--base-port`) for a launched pool: one `free_run`
    below the kernel's ephemeral range, the proxy after the servers. The proxy binds its port
    only once every server is ready, seconds later: a port from `free_port()` was another
    worker's `bind(0)` by then, and that process's 404s were taken for the proxy's."""
    base = free_run(servers + 1)
    return base + servers, base


@contextlib.contextmanager
def refused_url() -> Iterator[str]:
    """`http://127.0.0.1:P` for a `closed_port` P."""
    with closed_port() as port:
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def run_server(
    args: list[str],
    *,
    port: int | None = None,
    sock: socket.socket | None = None,
    ready_path: str | None = "/ready",
    timeout: float = 30.0,
) -> Iterator[Server]:
    """Run `python -m specroute ARGS --port P` until the block ends; `ready_path=None` waits
    only for the port to accept connections (for servers that start not ready on purpose).
    The server inherits `sock` (`--fd`), or without `port` one bound here to a free port: no
    other process can take the port in between."""
    quiet = os.environ.get("SPECROUTE_TEST_QUIET", "1") == "1"
    with contextlib.ExitStack() as bound:
        argv = [sys.executable, "-m", "specroute", *args, "--host", "127.0.0.1"]
        fds: list[int] = []
        if port is None:
            sock = sock or bound.enter_context(bound_socket())
            port = int(sock.getsockname()[1])
            fds.append(sock.fileno())
            argv += ["--fd", str(sock.fileno())]
        process = spawn(
            [*argv, "--port", str(port)],
            env={"PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if quiet else None,
            pass_fds=fds,
        )  # the parent's copy of the socket closes here: the child holds it
    server = Server(url=f"http://127.0.0.1:{port}", port=port, process=process)
    try:
        wait_ready_sync(
            server.url + (ready_path or ""),
            process=process,
            within=timeout,
            poll_s=0.05,
            name=f"server on port {port}",
            connect_only=ready_path is None,
        )
        yield server
    finally:
        server.stop()


def start_emulator(
    steps: int = 3, *extra: str, ready_path: str | None = "/ready", port: int | None = None
) -> contextlib.AbstractContextManager[Server]:
    """An emulated SGLang server at depth `steps`; `extra` are more `specroute emulate` flags."""
    return run_server(["emulate", "--steps", str(steps), *extra], port=port, ready_path=ready_path)
