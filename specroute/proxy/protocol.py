"""uvicorn's httptools protocol with the limits a public endpoint needs: header size and count,
time to send the headers, and open connections. Over a limit the client gets a 4xx in OpenAI's
error shape, or its connection is closed; nothing it sends can grow without bound."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from specroute.config import LimitsConfig
from specroute.errors import HeadersTooLargeError, RequestTimeoutError, SpecrouteError, error_body
from specroute.proxy.intake import DISCONNECT, DisconnectSignal, Scope, disconnect_signal

__all__ = ["limited_protocol"]

log = structlog.get_logger()

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _HeadersRejected(Exception):
    """Raised inside a parser callback to stop parsing a request already answered."""


def _response(exc: SpecrouteError) -> bytes:
    body = error_body(exc)
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (exc.status, _REASONS.get(exc.status, b"Error")),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class _CoalescingTransport:
    """The client's transport, with the writes made in one event-loop step sent together: a
    reply's status line and headers go out in the same packet as its first bytes of body.
    Loopback sends cost tens of microseconds each here, more than a whole step of the relay."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedProtocol(HttpToolsProtocol):
    """One client connection; `limits` is set on the subclass `limited_protocol` makes."""

    limits: LimitsConfig = LimitsConfig()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._header_count = 0
        self._rejected = False
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, _CoalescingTransport(transport, self.loop))
        if len(self.connections) > self.limits.max_connections:
            log.warning("connection_refused", reason="max_connections", limit=len(self.connections))
            self._rejected = True
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:
            signal = disconnect_signal(cast(Scope, cycle.scope))
            if signal is not None:
                signal.fire()

    def data_received(self, data: bytes) -> None:
        if not self._rejected:
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        if not self._rejected:  # a rejected request was answered already
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {DISCONNECT: DisconnectSignal()}  # type: ignore[dict-item]
        self._header_bytes = self._header_count = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _count(self, size: int, headers: int) -> None:
        self._header_bytes += size
        self._header_count += headers
        limits = self.limits
        if self._header_bytes > limits.max_header_bytes or self._header_count > limits.max_headers:
            self._reject(
                HeadersTooLargeError(
                    f"request headers over the limit of {limits.max_header_bytes} bytes "
                    f"or {limits.max_headers} fields"
                )
            )
            raise _HeadersRejected

    def _reject(self, exc: SpecrouteError) -> None:
        self._rejected = True
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_response(exc))
            self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        self._reject(
            RequestTimeoutError(
                f"request headers not received within {self.limits.header_timeout_s:g} s"
            )
        )


def limited_protocol(limits: LimitsConfig) -> type[HttpToolsProtocol]:
    """The protocol class to pass as uvicorn's `http=`, bound to `limits`."""
    return type("LimitedHttpToolsProtocol", (LimitedProtocol,), {"limits": limits})
