"""The other replicas of this proxy at run time: their names resolved by DNS (the headless
Service mechanism the backends use), each one's `GET /pool/estimates` read on an interval into
a `PeerTable`; the pool is told when the blend or the replicas' share may have changed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import msgspec
import structlog

from specroute.config import Config
from specroute.pool.client import UpstreamClient, UpstreamFailure
from specroute.pool.discovery import Resolver, resolve_host
from specroute.pool.load import Share
from specroute.pool.sharing import EstimatesWire, PeerTable
from specroute.tasks import cancel

__all__ = ["Peers"]

log = structlog.get_logger()
_decode = msgspec.json.Decoder(EstimatesWire).decode


class Peers:
    """Keeps `table` in step with DNS and with what each peer says; calls `changed` after."""

    def __init__(
        self,
        config: Config,
        client: UpstreamClient,
        table: PeerTable,
        changed: Callable[[], None],
        resolve: Resolver = resolve_host,
    ) -> None:
        self._config = config.replicas
        self._timeout_s = config.health.timeout_s
        self._client = client
        self.table = table
        self._changed = changed
        self._resolve = resolve
        key = self._config.api_key or (config.api_keys[0] if config.api_keys else None)
        self._headers = [(b"authorization", b"Bearer " + key.encode())] if key else []
        self._task: asyncio.Task[None] | None = None
        self._share = Share()

    @property
    def configured(self) -> bool:
        return bool(self._config.peers)

    async def start(self) -> None:
        """Resolve and read once (the share is right from the start), then keep at it."""
        if not self.configured:
            return
        await self.refresh(resolve=True)
        self._task = asyncio.create_task(self._run(), name="peers")

    async def stop(self) -> None:
        await cancel([self._task])
        self._task = None

    async def _run(self) -> None:
        resolved = time.monotonic()
        while True:
            await asyncio.sleep(self._config.read_every_s)
            due = time.monotonic() - resolved >= self._config.resolve_every_s
            try:
                await self.refresh(resolve=due)
            except Exception:  # the watch must outlive any one bad round; log and go on
                log.exception("peers_refresh_failed")
            if due:
                resolved = time.monotonic()

    async def refresh(self, *, resolve: bool) -> None:
        """One round: DNS again if `resolve`, then every listed replica read at once."""
        before = self.table.version
        if resolve:
            await self._list()
        async with asyncio.TaskGroup() as group:
            for endpoint in self.table.ages(time.monotonic()):
                group.create_task(self._read(endpoint))
        share = self.table.share(time.monotonic())
        if self.table.version != before or share != self._share:
            self._share = share
            self._changed()

    async def _list(self) -> None:
        endpoints: set[str] = set()
        for url in self._config.peers:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                addresses = await self._resolve(parts.hostname or "", port)
            except OSError as exc:
                # A failed lookup keeps what we had: a DNS hiccup must not split the pool.
                log.warning("peer_lookup_failed", url=url, error=str(exc))
                return
            for address in addresses:
                host = f"[{address}]" if ":" in address else address
                endpoints.add(f"{parts.scheme}://{host}:{port}")
        self.table.listed(endpoints)

    async def _read(self, endpoint: str) -> None:
        try:
            status, body = await self._client.get(
                endpoint + "/pool/estimates", timeout_s=self._timeout_s, headers=self._headers
            )
            if status == 200:
                self.table.read(endpoint, _decode(body), time.monotonic())
        except (UpstreamFailure, msgspec.DecodeError) as exc:
            log.info("peer_unread", peer=endpoint, error=str(exc))
