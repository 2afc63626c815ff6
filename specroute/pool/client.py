"""The one upstream HTTP client: probes, scrapes and streamed requests to backends.

Proxied requests go through `H1Pool` directly (bytes in, chunks out); probes, discovery and
scrapes through `httpx.AsyncClient` over the same HTTP/1.1 code (`H1Transport`), on a pool of
their own. `transport = "httpx"` in the config puts both on httpx's own connection pool
instead. Every other module sees only `UpstreamResponse` and the `UpstreamFailure` tree.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from specroute.config import ClientConfig, TimeoutConfig
from specroute.pool.h1 import H1Pool, H1Transport

__all__ = [
    "ConnectFailed",
    "Stalled",
    "StreamBroken",
    "TimedOut",
    "UpstreamClient",
    "UpstreamFailure",
    "UpstreamResponse",
]


_URLS_CACHED = 4096
"""Parsed upstream URLs kept: one per backend and route, not one per stored response id."""


class UpstreamFailure(Exception):
    """A backend could not be reached or stopped answering; no HTTP status to pass on."""


class ConnectFailed(UpstreamFailure):
    """No connection (refused, reset before a reply, DNS): safe to retry elsewhere."""


class TimedOut(UpstreamFailure):
    """No first byte within `first_byte_s`, or a stream idle for longer than `idle_s`."""


class Stalled(TimedOut):
    """A stream quiet past its backend's learned limit (`StallRule`), before its first token
    or between chunks (`phase`)."""

    def __init__(self, phase: str, limit_s: float) -> None:
        super().__init__(f"no bytes from the backend for {limit_s:.3g} s ({phase})")
        self.phase = phase
        self.limit_s = limit_s


class StreamBroken(UpstreamFailure):
    """The connection dropped in the middle of a reply."""


def _translate(exc: httpx.HTTPError) -> UpstreamFailure:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return ConnectFailed(f"cannot connect: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return TimedOut(f"upstream timed out ({type(exc).__name__}: {exc})")
    return StreamBroken(f"{type(exc).__name__}: {exc}")


NextChunk = Callable[[float | None], Awaitable[bytes | None]]


class UpstreamResponse:
    """A reply whose body has not been read yet; `aclose()` it in `finally`."""

    __slots__ = ("_close", "_first_byte_s", "_next", "headers", "status")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        next_chunk: NextChunk,
        close: Callable[[], Awaitable[None] | None],
        first_byte_s: float,
    ) -> None:
        self.status = status
        self.headers = headers
        self._next = next_chunk
        self._close = close
        self._first_byte_s = first_byte_s

    @property
    def content_type(self) -> bytes:
        for name, value in self.headers:
            if name.lower() == b"content-type":
                return value
        return b"application/json"

    async def read(self) -> bytes:
        """The whole body; each wait for more is bounded by `first_byte_s`."""
        parts = []
        while (chunk := await self.next_chunk(self._first_byte_s)) is not None:
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self, idle_s: float) -> AsyncIterator[bytes]:
        """Body bytes as they arrive: the first within `first_byte_s`, each next within
        `idle_s`."""
        wait_s = self._first_byte_s
        while (chunk := await self.next_chunk(wait_s)) is not None:
            wait_s = idle_s
            yield chunk

    async def next_chunk(self, wait_s: float) -> bytes | None:
        """The body bytes received since the last call, waiting up to `wait_s` seconds for
        some (else TimedOut, after which the reply may be read on); None at its end."""
        try:
            return await self._next(wait_s)
        except httpx.TimeoutException as exc:
            raise TimedOut(f"no bytes from the backend for {wait_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise _translate(exc) from exc

    async def aclose(self) -> None:
        closing = self._close()
        if closing is not None:
            await closing


class _HttpxReader:
    """`next_chunk` over an httpx response, for the `httpx` transport. A wait that times out
    leaves its read pending for the next call: cancelling it would end httpx's stream."""

    __slots__ = ("_pending", "_response", "_stream")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._stream = response.aiter_raw().__aiter__()
        self._pending: asyncio.Future[bytes | None] | None = None

    async def next_chunk(self, wait_s: float | None) -> bytes | None:
        pending = self._pending
        if pending is None:
            pending = self._pending = asyncio.ensure_future(anext(self._stream, None))
        done, _ = await asyncio.wait((pending,), timeout=wait_s)
        if not done:
            raise httpx.ReadTimeout(f"nothing within {wait_s:g} s")
        self._pending = None
        return pending.result()

    async def aclose(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._pending
        await self._response.aclose()


class UpstreamClient:
    """Owns the connection pools; build once in the app's lifespan and close at shutdown.

    Proxied requests skip httpx's `Request`/`Response` objects and `AsyncClient` layers
    (cookies, auth, redirects, URL merging): on this path they cost more than the HTTP itself
    and do nothing a proxy wants. Probes use a pool of their own: sharing one would keep idle
    proxied connections alive, so the pool would never shrink after a burst.
    """

    def __init__(self, timeouts: TimeoutConfig, client: ClientConfig) -> None:
        self._timeouts = timeouts
        timeout = httpx.Timeout(
            connect=timeouts.connect_s,
            read=timeouts.first_byte_s,
            write=timeouts.connect_s,
            pool=timeouts.first_byte_s,
        )
        self._timeout_dict: dict[str, float | None] = dict(timeout.as_dict())
        self._pool: H1Pool | None = None
        self._httpx: httpx.AsyncHTTPTransport | None = None
        if client.transport == "h1":
            self._pool = H1Pool(client.max_connections)
            probes = H1Transport(H1Pool(64))
            self._client = httpx.AsyncClient(timeout=timeout, transport=probes)
        else:
            limits = httpx.Limits(
                max_connections=client.max_connections,
                max_keepalive_connections=client.max_connections,
                keepalive_expiry=4.0,
            )
            self._httpx = httpx.AsyncHTTPTransport(limits=limits, http1=True)
            probe_limits = httpx.Limits(max_keepalive_connections=64, keepalive_expiry=4.0)
            self._client = httpx.AsyncClient(timeout=timeout, limits=probe_limits)
        self._urls: dict[str, httpx.URL] = {}

    async def send(
        self, method: str, url: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        """Send and return once the status line and headers are in. `headers` carry neither
        Host nor Content-Length."""
        target = self._urls.get(url)
        if target is None:
            target = httpx.URL(url)
            if len(self._urls) < _URLS_CACHED:  # per-id paths must not grow it without bound
                self._urls[url] = target
        first_byte_s = self._timeouts.first_byte_s
        try:
            if self._pool is not None:
                reply = await self._pool.request(
                    method.encode("ascii"), target, headers, body, self._timeout_dict
                )
                return UpstreamResponse(
                    reply.status, reply.headers, reply.next_chunk, reply.close, first_byte_s
                )
            assert self._httpx is not None
            request = httpx.Request(
                method, target, content=body, headers=headers,
                extensions={"timeout": self._timeout_dict},
            )  # fmt: skip
            response = await self._httpx.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise _translate(exc) from exc
        reader = _HttpxReader(response)
        return UpstreamResponse(
            response.status_code,
            response.headers.raw,
            reader.next_chunk,
            reader.aclose,
            first_byte_s,
        )

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
        if self._pool is not None:
            await self._pool.aclose()
        if self._httpx is not None:
            await self._httpx.aclose()
