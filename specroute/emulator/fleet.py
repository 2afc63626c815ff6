"""Start emulated SGLang servers as child processes on loopback sockets this process binds and
hands over (so no other process can take a port in between), and stop them."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import structlog

from specroute.children import bound_socket, spawn, stop_async, wait_ready

__all__ = ["EmulatedServer", "emulated_fleet"]

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class EmulatedServer:
    label: str
    steps: int
    url: str
    process: subprocess.Popen[bytes]


@contextlib.asynccontextmanager
async def emulated_fleet(
    steps: Sequence[int],
    *,
    profile: str,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    ready_timeout: float = 30.0,
    new_session: bool = False,
) -> AsyncIterator[list[EmulatedServer]]:
    """One `specroute emulate` process per depth in `steps`, ready when the block starts;
    `new_session` keeps a terminal's Ctrl-C from reaching them (the caller stops them)."""
    servers: list[EmulatedServer] = []
    try:
        for k in steps:
            with bound_socket(host) as sock:  # the child listens on it; ours closes after spawn
                port, fd = sock.getsockname()[1], sock.fileno()
                process = spawn(
                    [sys.executable, "-m", "specroute", "emulate", "--steps", str(k),
                     "--profile", profile, "--host", host, "--port", str(port), "--fd", str(fd),
                     *extra_args],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    new_session=new_session,
                    pass_fds=[fd],
                )  # fmt: skip
            servers.append(EmulatedServer(f"steps{k}", k, f"http://{host}:{port}", process))
        await asyncio.gather(
            *(
                wait_ready(
                    s.url + "/ready",
                    process=s.process,
                    within=ready_timeout,
                    name=f"emulated server {s.label}",
                )
                for s in servers
            )
        )
        log.info("emulators_ready", servers={s.label: s.url for s in servers}, profile=profile)
        yield servers
    finally:
        await asyncio.gather(*(stop_async(s.process) for s in servers))
