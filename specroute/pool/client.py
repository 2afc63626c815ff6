"""The one upstream HTTP client: probes, scrapes and streamed requests to backends.

Proxied requests go through `H1Pool` directly (bytes in, chunks out); probes, discovery and
scrapes through `httpx.AsyncClient` over the same HTTP/1.1 code (`H1Transport`), on a pool of
their own. One transport: httpx's own pool added 1.3 ms a request at one client against
0.3-0.45 ms and served a tenth of the requests per second at 64 (`benchmarks/proxy_overhead.py`
before it was removed). Every other module sees only `UpstreamResponse` and the
`UpstreamFailure` tree.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from specroute.config import ClientConfig, TimeoutConfig
from specroute.pool.h1 import H1Pool, H1Transport

__all__ = [
    "BadReply",
    "ConnectFailed",
    "ReplyTooLarge",
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
    """A wait on the backend ran out: the connection's, a probe's, or one of a request's."""


_STALL_WHAT = {
    "headers": "no reply headers from the backend within {:.3g} s",
    "reply": "the backend's reply was not whole within {:.3g} s",
    "first_token": "no event from the backend for {:.3g} s (first_token)",
    "between_chunks": "no event from the backend for {:.3g} s (between_chunks)",
}


class Stalled(TimedOut):
    """A request's wait on its backend ran past its limit (`Deadlines`): for the reply's
    headers, for a non-streamed reply to end, or for a stream's next complete event before its
    first token or between chunks (`phase`). The backend is unhealthy until a success."""

    def __init__(self, phase: str, limit_s: float) -> None:
        super().__init__(_STALL_WHAT[phase].format(limit_s))
        self.phase = phase
        self.limit_s = limit_s


class BadReply(UpstreamFailure):
    """A 200 that is not what the route promises (a body that is not JSON where JSON was
    asked for, a stream that is not an event stream, an event past its cap): the backend is
    broken, so it counts against its health and breaker."""


class ReplyTooLarge(UpstreamFailure):
    """A non-streamed reply past `limits.max_reply_bytes`: nothing wrong with the backend, but
    more than the proxy holds for one reply."""


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

    __slots__ = ("_close", "_next", "headers", "status")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        next_chunk: NextChunk,
        close: Callable[[], Awaitable[None] | None],
    ) -> None:
        self.status = status
        self.headers = headers
        self._next = next_chunk
        self._close = close

    @property
    def content_type(self) -> bytes:
        for name, value in self.headers:
            if name.lower() == b"content-type":
                return value
        return b"application/json"

    async def read(self, within_s: float, max_bytes: int) -> bytes:
        """The whole body, within `within_s` seconds from now (else Stalled, phase "reply")
        and at most `max_bytes` long (else ReplyTooLarge, read no further)."""
        parts: list[bytes] = []
        size = 0
        deadline = time.monotonic() + within_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Stalled("reply", within_s)
            try:
                chunk = await self.next_chunk(left)
            except TimedOut as exc:
                raise Stalled("reply", within_s) from exc
            if chunk is None:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            size += len(chunk)
            if size > max_bytes:
                raise ReplyTooLarge(f"the backend's reply is over {max_bytes} bytes")
            parts.append(chunk)

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
        self._pool = H1Pool(client.max_connections)
        self._client = httpx.AsyncClient(timeout=timeout, transport=H1Transport(H1Pool(64)))
        self._urls: dict[str, httpx.URL] = {}

    async def send(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        head_s: float | None = None,
    ) -> UpstreamResponse:
        """Send and return once the status line and headers are in, within `head_s` seconds
        (else Stalled, phase "headers"; unset: `first_byte_s`). `headers` carry neither Host
        nor Content-Length."""
        target = self._urls.get(url)
        if target is None:
            target = httpx.URL(url)
            if len(self._urls) < _URLS_CACHED:  # per-id paths must not grow it without bound
                self._urls[url] = target
        head_s = self._timeouts.first_byte_s if head_s is None else head_s
        try:
            reply = await self._pool.request(
                method.encode("ascii"), target, headers, body, self._timeout_dict, head_s
            )
        except httpx.ReadTimeout as exc:
            raise Stalled("headers", head_s) from exc
        except httpx.HTTPError as exc:
            raise _translate(exc) from exc
        return UpstreamResponse(reply.status, reply.headers, reply.next_chunk, reply.close)

    async def get(
        self, url: str, *, timeout_s: float, headers: list[tuple[bytes, bytes]] | None = None
    ) -> tuple[int, bytes]:
        """A small GET (probe, discovery, scrape), whole within `timeout_s` seconds: a reply
        trickled a byte at a time times out as one that never comes."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client.get(url, headers=headers, timeout=timeout_s)
        except TimeoutError as exc:
            raise TimedOut(f"no whole reply within {timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise _translate(exc) from exc
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._pool.aclose()
