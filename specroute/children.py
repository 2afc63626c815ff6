"""Child processes for the launcher, the demo, the emulator fleet, benchmarks and tests: a free
port or a socket bound for a child to listen on, spawning, waiting until the child answers (or
failing fast when it dies first), and a graceful stop that ends in SIGKILL. A leaf: the
standard library and httpx only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, ParamSpec

import httpx

__all__ = [
    "ChildExited",
    "ChildFailed",
    "NotReady",
    "Output",
    "bound_socket",
    "free_port",
    "free_ports",
    "inherited_socket",
    "spawn",
    "stop",
    "stop_async",
    "tail",
    "wait_exit",
    "wait_ready",
    "wait_ready_sync",
]

P = ParamSpec("P")

Output = int | IO[bytes] | None  # what Popen takes for stdout and stderr


class ChildFailed(RuntimeError):
    """A child process did not come up; the message names it (and ends with its log's tail)."""


class ChildExited(ChildFailed):
    """The child exited before it answered; `status` is its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NotReady(ChildFailed, TimeoutError):
    """The child was still running but had not answered by the deadline."""


_HANDED_OUT: set[int] = set()
"""Ports `free_ports` has returned in this process: the kernel hands a port let go to the next
`bind(0)`, so two calls in a row could name the same port for two children (a benchmark's
proxy and another pool's server got one port, and the proxy's clients went to that server)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing is bound to right now, and that this process has not handed
    out before."""
    return free_ports(1, host)


def free_ports(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive TCP ports that are free now and that this process has
    not handed out before (`--base-port` for servers that take base, base + 1, ...)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            base = int(sock.getsockname()[1])
        span = range(base, base + count)
        if span[-1] > 65535 or _HANDED_OUT.intersection(span):
            continue
        if all(_bindable(host, port) for port in span[1:]):
            _HANDED_OUT.update(span)
            return base


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to a free port on `host`, not listening yet, for a child to inherit
    (`spawn(..., pass_fds=[sock.fileno()])` and `--fd`): the port is held from now on, so no
    other process can take it before the child is up, and connections are refused, as to a
    closed port, until the child listens. Close the parent's copy once the child is spawned."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.set_inheritable(True)
    return sock


def is_socket(fd: int) -> bool:
    """Is descriptor `fd` open here, and a socket (what `--fd N` must name)?"""
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except (OSError, ValueError, OverflowError):
        return False


def inherited_socket(fd: int) -> socket.socket:
    """The socket a parent bound and handed over as descriptor `fd` (see `bound_socket`)."""
    return socket.socket(fileno=fd)


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log file (empty if it does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdout: Output = None,
    stderr: Output = None,
    new_session: bool = False,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start `argv` with `env` on top of this environment and no stdin; `new_session` gives it
    its own session and process group, so a terminal's Ctrl-C reaches only this process and
    `stop(..., kill_group=True)` takes the child's own children too; `pass_fds` are inherited
    under the same numbers."""
    return subprocess.Popen(
        list(argv),
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=new_session,
        pass_fds=tuple(pass_fds),
    )


def _with_log(message: str, output: Path | None) -> str:
    last = tail(output) if output is not None else ""
    return f"{message}; last lines of {output}:\n{last}" if last else message


async def _answers(client: httpx.AsyncClient, url: str, connect_only: bool) -> bool:
    if connect_only:
        parts = httpx.URL(url)
        try:
            _, writer = await asyncio.open_connection(parts.host, parts.port or 80)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    try:
        return (await client.get(url)).status_code == 200
    except httpx.HTTPError:
        return False


async def wait_ready(
    url: str,
    *,
    process: subprocess.Popen[bytes] | None = None,
    within: float = 30.0,
    poll_s: float = 0.05,
    name: str | None = None,
    output: Path | None = None,
    connect_only: bool = False,
) -> None:
    """Return once GET `url` answers 200 (with `connect_only`, once its port accepts a
    connection). Raises ChildExited as soon as `process` exits, NotReady at the deadline; both
    messages end with the tail of `output`, the child's log, when there is one."""
    name = name or url
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=min(2.0, within)) as client:
        while True:
            status = process.poll() if process is not None else None
            if status is not None:
                raise ChildExited(_with_log(f"{name} exited with status {status}", output), status)
            if await _answers(client, url, connect_only):
                return
            if time.monotonic() >= deadline:
                raise NotReady(_with_log(f"{name} was not ready after {within:g} s", output))
            await asyncio.sleep(poll_s)


def _blocking(wait: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(wait(*args, **kwargs))

    run.__doc__ = f"`{wait.__name__}` for code with no event loop running (tests, benchmarks)."
    return run


wait_ready_sync = _blocking(wait_ready)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_exit(process: subprocess.Popen[bytes]) -> int:
    """The child's exit status once it exits: the event loop watches a pidfd (Linux), else a
    worker thread waits."""
    if process.poll() is None:
        try:
            pidfd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):  # no pidfd here, or the child is gone already
            return await asyncio.to_thread(process.wait)
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()
        loop.add_reader(pidfd, _settle, exited)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
    return process.wait()


def _send(process: subprocess.Popen[bytes], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)


def stop(
    process: subprocess.Popen[bytes],
    *,
    grace_s: float = 10.0,
    sig: int = signal.SIGTERM,
    kill_group: bool = False,
) -> int:
    """Send `sig` (SIGTERM, or SIGINT for a graceful Ctrl-C), wait up to `grace_s` for the
    child to finish, then SIGKILL it, its whole process group with `kill_group` (a child
    spawned with `new_session`). The exit status: -9 means it had to be killed."""
    if process.poll() is None:
        _send(process, sig, group=False)
        try:
            return process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _send(process, signal.SIGKILL, group=kill_group)
    return process.wait()


async def stop_async(
    process: subprocess.Popen[bytes],
    *,
    grace_s: float = 10.0,
    sig: int = signal.SIGTERM,
    kill_group: bool = False,
) -> int:
    """`stop` without blocking the event loop (the wait runs in a worker thread)."""
    return await asyncio.to_thread(stop, process, grace_s=grace_s, sig=sig, kill_group=kill_group)
