"""HTTP/1.1 to the backends on asyncio protocols and httptools' parser: keep-alive
connections and nothing a proxy does not need (no HTTP/2, proxies, cookies or redirects).

`H1Pool.request` is the relay's path: bytes in, status, raw headers and body chunks out,
failures raised as httpx's exceptions. `H1Transport` puts the same pool behind httpx's
transport API for everything else (probes, discovery, scrapes). Measured in
benchmarks/proxy_overhead.py: building httpx `Request` and `Response` objects costs about
100 us of CPU per proxied request here, more than this whole client; aiohttp's client more
again. One write per request, the parser's callbacks hand the body straight to its reader,
and reading pauses while a slow consumer leaves too much unread.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import cast

import httptools
import httpx

__all__ = ["H1Pool", "H1Reply", "H1Transport"]

_HIGH_WATER = 256 * 1024
"""Unread body bytes past which the socket is no longer read: a slow consumer slows the
backend down instead of growing the proxy's memory."""

_Key = tuple[bytes, bytes, int]
Headers = list[tuple[bytes, bytes]]
Timeouts = dict[str, float | None]


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: _Key) -> None:
        self.key = key
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.used = False  # served a request before: a failure with no reply may be a stale one
        self._reset()

    def _reset(self) -> None:
        self._headers: Headers = []
        self._status = 0
        self._head_done = False
        self._until_close = False
        self._keep_alive = False
        self._complete = False
        self.received = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: httpx.TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed reply from the backend: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._head_done and self._until_close and exc is None:
            self._complete = True  # a body with neither length nor chunks ends with the connection
            self._wake()
        if not self._complete:
            message = (
                "backend closed the connection before the reply ended"
                if self._head_done
                else "backend closed the connection without a reply"
            )
            self._fail(httpx.RemoteProtocolError(message if exc is None else f"{message}: {exc}"))

    # httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._until_close = not any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self._headers
        )
        self._keep_alive = self._parser.should_keep_alive()  # llhttp forgets it once complete
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        self._wake()

    # used by the transport --------------------------------------------------------------
    def send(self, head: bytes, body: bytes) -> None:
        assert self._transport is not None
        self._reset()
        self.used = True
        self._transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self._transport.write(body)

    async def head(self, wait_s: float | None) -> tuple[int, Headers]:
        """The status and headers, within `wait_s` seconds: bytes of a head that is not
        complete wake nothing, so a head trickled a byte at a time runs out the same clock."""
        while not self._head_done:
            await self._wait(wait_s, "no reply headers from the backend")
        return self._status, self._headers

    async def next_chunk(self, wait_s: float | None) -> bytes | None:
        """The body bytes received since the last call; None at the end of the body."""
        while not self._chunks:
            if self._complete:
                return None
            await self._wait(wait_s, "backend stopped sending")
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    @property
    def reusable(self) -> bool:
        return self._complete and self._keep_alive and not self.closed

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    async def _wait(self, wait_s: float | None, what: str) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._loop.create_future()
        timer = None if wait_s is None else self._loop.call_later(wait_s, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            raise httpx.ReadTimeout(f"{what} within {wait_s:g} s") from None
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: httpx.TransportError) -> None:
        if self._error is None:
            self._error = error
        self._wake()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class H1Reply:
    """A reply whose headers are in: read its body with `next_chunk`, then `close()` it (a
    reply read to its end returns its connection to the pool; one left mid-body closes it, so
    the backend sees the client leave and stops generating)."""

    __slots__ = ("_conn", "_pool", "headers", "status")

    def __init__(self, pool: H1Pool, conn: _Connection, status: int, headers: Headers) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers

    async def next_chunk(self, wait_s: float | None) -> bytes | None:
        """The body bytes received since the last call (waiting up to `wait_s` seconds for
        some); None at the end of the body."""
        if self._conn is None:
            raise httpx.StreamClosed()
        return await self._conn.next_chunk(wait_s)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn)


class H1Pool:
    """Keep-alive connections to any number of backends, at most `max_connections` open at
    once (a request past that waits up to its pool timeout); idle ones close after
    `keepalive_s`, kept below the 5 s after which uvicorn (and so SGLang) closes them."""

    def __init__(self, max_connections: int, keepalive_s: float = 4.0) -> None:
        self._limit = max_connections
        self._keepalive_s = keepalive_s
        self._idle: dict[_Key, deque[_Connection]] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def request(
        self,
        method: bytes,
        url: httpx.URL,
        headers: Headers,
        body: bytes,
        timeouts: Timeouts,
        head_s: float | None = None,
    ) -> H1Reply:
        """Send one request; return once its status line and headers are in. `headers` must
        not hold Host or Content-Length: they are added here."""
        fixed = [(b"host", url.netloc), (b"content-length", b"%d" % len(body))]
        head = _head(method, url, fixed + headers)
        return await self.exchange(url, head, body, timeouts, head_s)

    async def exchange(
        self,
        url: httpx.URL,
        head: bytes,
        body: bytes,
        timeouts: Timeouts,
        head_s: float | None = None,
    ) -> H1Reply:
        """Send a serialized request head and body to `url`'s backend; its status and headers
        must be in within `head_s` seconds (unset: the read timeout). On a kept-alive
        connection the backend had already closed, once more on a fresh one."""
        wait_s = timeouts.get("read") if head_s is None else head_s
        port = url.port or (443 if url.scheme == "https" else 80)
        key = (url.raw_scheme, url.raw_host, port)
        while True:
            conn = await self._acquire(key, timeouts.get("connect"), timeouts.get("pool"))
            reused = conn.used
            try:
                conn.send(head, body)
                status, headers = await conn.head(wait_s)
            except httpx.RemoteProtocolError:
                self.release(conn)
                if reused and not conn.received:
                    continue  # a kept-alive connection the backend had closed: once more, fresh
                raise
            except BaseException:
                self.release(conn)
                raise
            return H1Reply(self, conn, status, headers)

    async def _acquire(
        self, key: _Key, connect_s: float | None, pool_s: float | None
    ) -> _Connection:
        if self._closed:
            raise httpx.ConnectError("the upstream client is closed")
        loop = asyncio.get_running_loop()
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()  # the most recently used: the rest can expire after a burst
                if not conn.closed and loop.time() - conn.idle_since < self._keepalive_s:
                    return conn
                self._discard(conn)
            if self._open < self._limit:
                break
            if not self._evict_idle():
                await self._wait_for_room(loop, pool_s)
        self._open += 1
        try:
            return await self._connect(loop, key, connect_s)
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, key: _Key, wait_s: float | None
    ) -> _Connection:
        scheme, host, port = key
        secure = scheme == b"https"
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        conn = _Connection(loop, key)
        try:
            async with asyncio.timeout(wait_s):
                await loop.create_connection(
                    lambda: conn,
                    host.decode("ascii"),
                    port,
                    ssl=self._ssl if secure else None,
                    server_hostname=host.decode("ascii") if secure else None,
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {host.decode()}:{port}") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host.decode()}:{port}: {exc}") from exc
        return conn

    def release(self, conn: _Connection) -> None:
        """Back to the idle connections if its reply was read to the end, else closed."""
        if self._closed or not conn.reusable:
            self._discard(conn)
            return
        loop = asyncio.get_running_loop()
        conn.idle_since = now = loop.time()
        idle = self._idle.setdefault(conn.key, deque())
        idle.append(conn)
        oldest = idle[0]
        if now - oldest.idle_since >= self._keepalive_s:  # expire one per release
            idle.popleft()
            self._discard(oldest)
        self._wake_one()

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._wake_one()

    def _evict_idle(self) -> bool:
        """At the limit: close the idle connection that waited longest, if there is one."""
        oldest: deque[_Connection] | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest[0].idle_since):
                oldest = idle
        if oldest is None:
            return False
        self._discard(oldest.popleft())
        return True

    async def _wait_for_room(self, loop: asyncio.AbstractEventLoop, wait_s: float | None) -> None:
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(wait_s):
                await waiter
        except TimeoutError as exc:
            raise httpx.PoolTimeout(f"all {self._limit} upstream connections busy") from exc
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                self._discard(idle.pop())
        self._idle.clear()


class _Stream(httpx.AsyncByteStream):
    def __init__(self, reply: H1Reply, read_timeout: float | None) -> None:
        self._reply = reply
        self._timeout = read_timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._reply.next_chunk(self._timeout)) is not None:
            yield chunk

    async def aclose(self) -> None:
        self._reply.close()


class H1Transport(httpx.AsyncBaseTransport):
    """An `H1Pool` behind httpx's transport API: `httpx.AsyncClient(transport=...)`."""

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = _head(request.method.encode("ascii"), url, request.headers.raw)
        reply = await self._pool.exchange(url, head, body, timeouts)
        return httpx.Response(
            reply.status,
            headers=reply.headers,
            stream=_Stream(reply, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def _head(method: bytes, url: httpx.URL, headers: Headers) -> bytes:
    """The request line and headers, ready to send."""
    lines = [b"%s %s HTTP/1.1" % (method, url.raw_path)]
    lines.extend(name + b": " + value for name, value in headers)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)
