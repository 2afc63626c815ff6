"""An httpx transport backed by aiohttp's connection pool: same httpx API, about a third of
the per-request cost of the default httpcore pool (see benchmarks/proxy_overhead.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import httpx

__all__ = ["AiohttpTransport"]

_SKIP = {b"host", b"content-length", b"transfer-encoding", b"connection"}


def _translate(exc: BaseException) -> httpx.HTTPError:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc))
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(str(exc) or "read timed out")
    return httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}")


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _translate(exc) from exc

    async def aclose(self) -> None:
        # Closing mid-body drops the connection, so the backend sees the client leave.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_connections: int, keepalive_s: float = 30.0) -> None:
        self._limit = max_connections
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        # Created on first use: aiohttp binds its session to the running event loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit, keepalive_timeout=self._keepalive_s, ttl_dns_cache=60
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        limits = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=limits.get("connect"), sock_read=limits.get("read")
        )
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers.raw
            if k.lower() not in _SKIP
        ]
        try:
            response = await self._get_session().request(
                request.method,
                str(request.url),
                data=request.content,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _translate(exc) from exc
        return httpx.Response(
            response.status, headers=list(response.raw_headers), stream=_Body(response)
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let aiohttp finish closing its transports
