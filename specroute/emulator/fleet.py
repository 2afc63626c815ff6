"""Start emulated SGLang servers as child processes on free loopback ports, and stop them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx
import structlog

__all__ = ["EmulatedServer", "emulated_fleet", "free_port"]

log = structlog.get_logger()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class EmulatedServer:
    label: str
    steps: int
    url: str
    process: asyncio.subprocess.Process


async def _wait_ready(server: EmulatedServer, client: httpx.AsyncClient, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if server.process.returncode is not None:
            raise RuntimeError(
                f"emulated server {server.label} exited with status {server.process.returncode}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(server.url + "/ready")).status_code == 200:
                return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"emulated server {server.label} was not ready after {within:.0f} s")


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), timeout=10)
    except TimeoutError:
        process.kill()
        await process.wait()


@contextlib.asynccontextmanager
async def emulated_fleet(
    steps: Sequence[int],
    *,
    profile: str,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    ready_timeout: float = 30.0,
) -> AsyncIterator[list[EmulatedServer]]:
    """One `specroute emulate` process per depth in `steps`, ready when the block starts."""
    servers: list[EmulatedServer] = []
    try:
        for k in steps:
            port = free_port(host)
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "specroute", "emulate", "--steps", str(k),
                "--profile", profile, "--host", host, "--port", str(port), *extra_args,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            servers.append(EmulatedServer(f"steps{k}", k, f"http://{host}:{port}", process))
        async with httpx.AsyncClient(timeout=2.0) as client:
            await asyncio.gather(*(_wait_ready(s, client, ready_timeout) for s in servers))
        log.info("emulators_ready", servers={s.label: s.url for s in servers}, profile=profile)
        yield servers
    finally:
        await asyncio.gather(*(_stop(s.process) for s in servers))
