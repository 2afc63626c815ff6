"""The proxy's HTTP/1.1 client (`specroute.pool.h1`) against a scripted loopback server:
keep-alive, streaming as bytes arrive, timeouts, broken and stale connections, the connection
limit, back-pressure, and the same pool behind httpx's API."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from inprocess import until

from specroute.config import ClientConfig, TimeoutConfig
from specroute.pool import ConnectFailed, Stalled, StreamBroken, TimedOut, UpstreamClient
from specroute.pool.h1 import H1Pool, H1Transport


def synchronous(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TIMEOUTS: dict[str, float | None] = {"connect": 2.0, "read": 2.0, "pool": 2.0}


class Scripted:
    """A loopback server running `handler` for each request it reads."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                self.requests.append(head + await reader.readexactly(length))
                await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.set()
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Scripted]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()

    @property
    def url(self) -> httpx.URL:
        return httpx.URL(f"http://127.0.0.1:{self.port}/v1/chat/completions?x=1")


def reply(body: bytes, *, status: int = 200, extra: bytes = b"") -> Handler:
    async def handler(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (status, len(body), extra, body)
        )
        await writer.drain()

    return handler


def chunked(parts: list[bytes], gap_s: float = 0.0, *, end: bool = True) -> Handler:
    async def handler(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for part in parts:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(gap_s)
        if end:
            writer.write(b"0\r\n\r\n")
        else:
            writer.close()  # the backend dies mid-reply
        await writer.drain()

    return handler


async def read_all(pool: H1Pool, url: httpx.URL, body: bytes = b"{}") -> tuple[int, bytes]:
    json_type = [(b"content-type", b"application/json")]
    answer = await pool.request(b"POST", url, json_type, body, TIMEOUTS)
    parts = []
    try:
        while (chunk := await answer.next_chunk(2.0)) is not None:
            parts.append(chunk)
    finally:
        answer.close()
    return answer.status, b"".join(parts)


@synchronous
async def test_keep_alive_reuses_one_connection_and_sends_the_request_as_given() -> None:
    async with Scripted(reply(b'{"ok":true}')).running() as server:
        pool = H1Pool(8)
        for _ in range(3):
            assert await read_all(pool, server.url, b'{"model":"m"}') == (200, b'{"ok":true}')
        await pool.aclose()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    assert b"\r\nhost: 127.0.0.1:%d\r\n" % server.port in first
    assert b"\r\ncontent-length: 13\r\n" in first
    assert first.endswith(b'\r\n\r\n{"model":"m"}')


@synchronous
async def test_a_stream_arrives_chunk_by_chunk_not_at_the_end() -> None:
    parts = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    release = asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(parts[0]), parts[0]))
        await writer.drain()
        await release.wait()  # the rest only once the client has the first
        for part in parts[1:]:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with Scripted(held).running() as server:
        pool = H1Pool(8)
        answer = await pool.request(b"POST", server.url, [], b"{}", TIMEOUTS)
        first = await answer.next_chunk(2.0)  # held back until the reply ends: a timeout here
        assert first == b"data: 1\n\n"
        release.set()
        rest = [c async for c in _rest(answer)]
        assert b"".join(rest) == b"data: 2\n\ndata: [DONE]\n\n"
        answer.close()
        await read_all(pool, server.url)
        assert server.connections == 1  # read to its end: kept for the next request
        await pool.aclose()


async def _rest(answer: object) -> AsyncIterator[bytes]:
    while (chunk := await answer.next_chunk(2.0)) is not None:  # type: ignore[attr-defined]
        yield chunk


@synchronous
async def test_closing_a_reply_mid_body_closes_its_connection() -> None:
    async with Scripted(chunked([b"data: x\n\n"] * 50, gap_s=0.05)).running() as server:
        pool = H1Pool(1)
        answer = await pool.request(b"POST", server.url, [], b"{}", TIMEOUTS)
        assert await answer.next_chunk(2.0)
        answer.close()
        await asyncio.wait_for(server.closed_by_client.wait(), 2.0)  # the backend saw it go
        quick = {**TIMEOUTS, "pool": 0.2}
        (await pool.request(b"POST", server.url, [], b"{}", quick)).close()  # its slot is free
        assert server.connections == 2
        await pool.aclose()


@synchronous
async def test_a_kept_alive_connection_the_backend_dropped_is_replaced_invisibly() -> None:
    served: dict[int, int] = {}

    async def drops_its_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count = served[id(writer)] = served.get(id(writer), 0) + 1
        if count == 2:  # as if it had timed the idle connection out as the request came
            writer.transport.abort()
            return
        await reply(b"{}")(reader, writer)

    async with Scripted(drops_its_second).running() as server:
        pool = H1Pool(8)
        for _ in range(3):
            assert (await read_all(pool, server.url))[0] == 200
        await pool.aclose()
    assert server.connections == 3  # requests 2 and 3 each found theirs dropped, and went on


@synchronous
async def test_failures_are_httpx_exceptions_and_upstream_failures() -> None:
    async def silent(reader: asyncio.StreamReader, __: asyncio.StreamWriter) -> None:
        await reader.read()  # says nothing until the client gives up and closes

    async def garbage(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SPDY/9 what\r\n\r\n")
        await writer.drain()

    pool = H1Pool(1)  # one slot: a failure that kept it would leave the next request waiting
    quick = {**TIMEOUTS, "read": 0.2, "pool": 0.2}
    async with Scripted(silent).running() as server:
        with pytest.raises(httpx.ReadTimeout):
            await pool.request(b"POST", server.url, [], b"{}", quick)
    async with Scripted(garbage).running() as server:
        with pytest.raises(httpx.RemoteProtocolError):
            await pool.request(b"POST", server.url, [], b"{}", TIMEOUTS)
    async with Scripted(chunked([b"data: 1\n\n"], end=False)).running() as server:
        with pytest.raises(httpx.RemoteProtocolError, match="before the reply ended"):
            await read_all(pool, server.url)
    with pytest.raises(httpx.ConnectError):
        await pool.request(b"POST", server.url, [], b"{}", quick)  # the server is gone
    with pytest.raises(httpx.ConnectError):
        await pool.request(b"POST", server.url, [], b"{}", quick)  # and its failure freed the slot
    await pool.aclose()

    client = UpstreamClient(TimeoutConfig(first_byte_s=0.2, idle_s=0.2), ClientConfig())
    with pytest.raises(ConnectFailed):
        await client.send("POST", str(server.url), b"{}", [])
    async with Scripted(silent).running() as server:
        with pytest.raises(TimedOut):
            await client.send("POST", str(server.url), b"{}", [])
    async with Scripted(chunked([b"data: 1\n\n"], end=False)).running() as server:
        answer = await client.send("POST", str(server.url), b"{}", [])
        with pytest.raises(StreamBroken):
            await answer.read(1.0, 1 << 20)
        await answer.aclose()
    await client.aclose()


@synchronous
async def test_past_the_connection_limit_a_request_waits_for_one_to_free() -> None:
    async with Scripted(chunked([b"a"] * 4, gap_s=0.05)).running() as server:
        pool = H1Pool(1)
        first = await pool.request(b"POST", server.url, [], b"{}", TIMEOUTS)
        with pytest.raises(httpx.PoolTimeout):
            await pool.request(b"POST", server.url, [], b"{}", {**TIMEOUTS, "pool": 0.1})
        second = asyncio.create_task(read_all(pool, server.url))
        await until(lambda: len(pool._waiters) == 1, "the second request to wait for room")
        assert not second.done()
        while await first.next_chunk(2.0) is not None:
            pass
        first.close()
        assert await asyncio.wait_for(second, 2.0) == (200, b"aaaa")
        assert server.connections == 1  # the first's connection, freed and kept, served it
        await pool.aclose()


@synchronous
async def test_a_consumer_that_stops_reading_stops_the_socket_being_read() -> None:
    big = b"x" * (1 << 20)
    writers: list[asyncio.StreamWriter] = []

    async def flood(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (16 * len(big)))
        for _ in range(16):
            writer.write(big)
        await writer.drain()

    async with Scripted(flood).running() as server:
        pool = H1Pool(8)
        answer = await pool.request(b"POST", server.url, [], b"{}", TIMEOUTS)
        # Read nothing: the connection stops reading, and the backend's bytes wait on its side.
        await until(lambda: answer._conn is not None and answer._conn._paused, "a paused read")
        assert writers[0].transport.get_write_buffer_size() > 8 * len(big)
        received = 0
        while (chunk := await answer.next_chunk(2.0)) is not None:
            received += len(chunk)
        assert received == 16 * len(big)
        answer.close()
        await pool.aclose()


@synchronous
async def test_the_pool_behind_httpx_async_client() -> None:
    transport = H1Transport(H1Pool(4))
    async with (
        Scripted(reply(b'{"status":"ok"}')).running() as server,
        httpx.AsyncClient(transport=transport, timeout=2.0) as client,
    ):
        for _ in range(2):
            response = await client.get(f"http://127.0.0.1:{server.port}/ready?probe=1")
            assert response.status_code == 200
            assert response.json() == {"status": "ok"}
    assert server.requests[0].startswith(b"GET /ready?probe=1 HTTP/1.1\r\n")
    assert server.connections == 1


@synchronous
async def test_headers_trickled_a_byte_at_a_time_run_out_one_deadline() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-padding: " + b"x" * 500

    async def trickles(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for byte in head:  # each byte well inside the limit, the whole head far past it
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.02)

    async with Scripted(trickles).running() as server:
        pool = H1Pool(4)
        async with asyncio.timeout(5):  # the old per-read clock would run for 10 s
            with pytest.raises(httpx.ReadTimeout, match=r"within 0\.3 s"):
                await pool.request(b"POST", server.url, [], b"{}", TIMEOUTS, head_s=0.3)
        await pool.aclose()
        client = UpstreamClient(TimeoutConfig(), ClientConfig())
        async with asyncio.timeout(5):
            with pytest.raises(Stalled, match=r"headers from the backend within 0\.3 s"):
                await client.send("POST", str(server.url), b"{}", [], head_s=0.3)
        await client.aclose()
