"""Backends from DNS: a backend entry with `resolve_every_s` names a host (a Kubernetes headless
Service) whose addresses are each a backend; the name is resolved again on that interval, so
servers that come are added to the pool and servers that go are removed from it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol
from urllib.parse import urlsplit

import msgspec
import structlog

from specroute.config import BackendConfig
from specroute.tasks import cancel

__all__ = ["DnsDiscovery", "Resolver", "expand", "resolve_host", "static_entries"]

log = structlog.get_logger()

Resolver = Callable[[str, int], Awaitable[set[str]]]


class BackendSet(Protocol):
    """What discovery needs of the pool: add and remove backends by configuration and name."""

    def add_backend(self, config: BackendConfig) -> Awaitable[None]: ...

    def remove_backend(self, name: str) -> None: ...


async def resolve_host(host: str, port: int) -> set[str]:
    """Every address `host` has now (A and AAAA records), as the system resolver sees it."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return {str(info[4][0]) for info in infos}


def static_entries(entries: Iterable[BackendConfig]) -> list[BackendConfig]:
    """The entries that are backends as written (not DNS names to resolve)."""
    return [e for e in entries if e.resolve_every_s is None]


def expand(entry: BackendConfig, addresses: Iterable[str]) -> dict[str, BackendConfig]:
    """One backend per address, keyed by name; each keeps the entry's key and limits."""
    parts = urlsplit(entry.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    found = {}
    for address in sorted(addresses):
        host = f"[{address}]" if ":" in address else address
        url = f"{parts.scheme}://{host}:{port}{parts.path}"
        name = f"{entry.name}/{host}:{port}" if entry.name else f"{host}:{port}"
        found[name] = msgspec.structs.replace(entry, url=url, name=name, resolve_every_s=None)
    return found


class DnsDiscovery:
    """Keeps the pool's share of DNS-discovered backends equal to what DNS says now."""

    def __init__(
        self, entries: Iterable[BackendConfig], pool: BackendSet, resolve: Resolver = resolve_host
    ) -> None:
        self._entries = [e for e in entries if e.resolve_every_s is not None]
        self._pool = pool
        self._resolve = resolve
        self._current: dict[int, set[str]] = {i: set() for i in range(len(self._entries))}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Resolve every name once (the pool starts with what DNS says), then keep watching."""
        for index in range(len(self._entries)):
            await self.refresh(index)
        self._tasks = [
            asyncio.create_task(self._watch(i), name=f"dns-{e.url}")
            for i, e in enumerate(self._entries)
        ]

    async def stop(self) -> None:
        await cancel(self._tasks)
        self._tasks = []

    async def refresh(self, index: int) -> None:
        """Resolve entry `index` again; add new addresses and remove vanished ones."""
        entry = self._entries[index]
        parts = urlsplit(entry.url)
        try:
            addresses = await self._resolve(parts.hostname or "", parts.port or 80)
        except OSError as exc:
            # A failed lookup keeps what we had: a DNS hiccup must not empty the pool.
            log.warning("dns_lookup_failed", url=entry.url, error=str(exc))
            return
        wanted = expand(entry, addresses)
        had = self._current[index]
        for name in sorted(had - wanted.keys()):
            self._pool.remove_backend(name)
            log.info("backend_removed", backend=name, source=entry.url)
        for name in sorted(wanted.keys() - had):
            await self._pool.add_backend(wanted[name])
            log.info("backend_added", backend=name, source=entry.url)
        self._current[index] = set(wanted)

    async def _watch(self, index: int) -> None:
        interval = self._entries[index].resolve_every_s or 30.0
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh(index)
            except Exception:  # the watch must outlive any one bad refresh; log and go on
                log.exception("dns_refresh_failed", url=self._entries[index].url)
