"""The one upstream HTTP client (httpx): probes, scrapes and streamed requests to backends.

Every other module sees only `UpstreamResponse` and the `UpstreamFailure` tree, so the
transport can change without touching the relay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from specroute.config import ClientConfig, TimeoutConfig
from specroute.pool.transport import AiohttpTransport

__all__ = [
    "ConnectFailed",
    "StreamBroken",
    "TimedOut",
    "UpstreamClient",
    "UpstreamFailure",
    "UpstreamResponse",
]


class UpstreamFailure(Exception):
    """A backend could not be reached or stopped answering; no HTTP status to pass on."""


class ConnectFailed(UpstreamFailure):
    """No connection (refused, reset before a reply, DNS): safe to retry elsewhere."""


class TimedOut(UpstreamFailure):
    """No first byte within `first_byte_s`, or a stream idle for longer than `idle_s`."""


class StreamBroken(UpstreamFailure):
    """The connection dropped in the middle of a reply."""


def _translate(exc: httpx.HTTPError) -> UpstreamFailure:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ConnectFailed(f"cannot connect: {exc!r}")
    if isinstance(exc, httpx.TimeoutException):
        return TimedOut(f"upstream timed out ({type(exc).__name__})")
    return StreamBroken(f"{type(exc).__name__}: {exc}")


class UpstreamResponse:
    """A reply whose body has not been read yet; `aclose()` it in `finally`."""

    __slots__ = ("_response", "headers", "status")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = response.headers.raw

    @property
    def content_type(self) -> bytes:
        for name, value in self.headers:
            if name.lower() == b"content-type":
                return value
        return b"application/json"

    async def read(self) -> bytes:
        try:
            return await self._response.aread()
        except httpx.HTTPError as exc:
            raise _translate(exc) from exc

    async def chunks(self, idle_s: float) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; the wait for any chunk after the first is bounded."""
        stream = self._response.aiter_raw().__aiter__()
        first = True
        while True:
            try:
                if first:
                    chunk = await stream.__anext__()
                    first = False
                else:
                    async with asyncio.timeout(idle_s):
                        chunk = await stream.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                raise TimedOut(f"stream idle for more than {idle_s:g} s") from exc
            except httpx.HTTPError as exc:
                raise _translate(exc) from exc
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


class UpstreamClient:
    """Owns the connection pool; build once in the app's lifespan and close at shutdown.

    Proxied requests go straight to the httpx transport with a prebuilt URL per target: the
    `AsyncClient` layers (cookies, auth, redirects, URL merging) cost more than the transport
    itself on this path and do nothing a proxy wants. Probes use the full client over a pool of
    their own: sharing one would keep every idle proxied connection alive (aiohttp reuses its
    idle connections in turn), so the pool would never shrink after a burst.
    """

    def __init__(self, timeouts: TimeoutConfig, client: ClientConfig) -> None:
        limits = httpx.Limits(
            max_connections=client.max_connections,
            max_keepalive_connections=client.max_connections,
            keepalive_expiry=30.0,
        )
        timeout = httpx.Timeout(
            connect=timeouts.connect_s,
            read=timeouts.first_byte_s,
            write=timeouts.connect_s,
            pool=timeouts.first_byte_s,
        )
        self._transport: httpx.AsyncBaseTransport = (
            AiohttpTransport(client.max_connections)
            if client.transport == "aiohttp"
            else httpx.AsyncHTTPTransport(limits=limits, http1=True)
        )
        self._extensions = {"timeout": timeout.as_dict()}
        self._urls: dict[str, httpx.URL] = {}
        probe_limits = httpx.Limits(max_keepalive_connections=64, keepalive_expiry=10.0)
        self._client = httpx.AsyncClient(timeout=timeout, limits=probe_limits)

    async def send(
        self, method: str, url: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        """Send and return once the status line and headers are in."""
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = httpx.URL(url)
        request = httpx.Request(
            method, target, content=body, headers=headers, extensions=self._extensions
        )
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise _translate(exc) from exc
        return UpstreamResponse(response)

    async def get(
        self, url: str, *, timeout_s: float, headers: list[tuple[bytes, bytes]] | None = None
    ) -> tuple[int, bytes]:
        """A small GET (probe, discovery, scrape) with its own short timeout."""
        try:
            response = await self._client.get(url, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise _translate(exc) from exc
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._transport.aclose()
