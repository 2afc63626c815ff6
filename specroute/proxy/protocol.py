"""uvicorn's httptools protocol with the limits a public endpoint needs: header bytes counted as
they arrive, deadlines for the headers and for the body, and who may hold a connection (see
`connections.py`). Over a limit the client gets a 4xx or 503 in OpenAI's error shape and its
connection closes; nothing it sends can grow without bound or keep a connection it will not use."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, cast

import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from specroute.config import LimitsConfig
from specroute.errors import (
    AuthenticationError,
    BadRequestError,
    HeadersTooLargeError,
    RequestTimeoutError,
    ServiceUnavailableError,
    SpecrouteError,
    error_body,
)
from specroute.proxy.auth import Auth
from specroute.proxy.connections import ConnectionTable
from specroute.proxy.intake import DISCONNECT, DisconnectSignal, Scope, disconnect_signal
from specroute.proxy.keyless import KEYED

__all__ = ["limited_protocol"]

log = structlog.get_logger()

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
_LINGER_S = 2.0
"""How long a connection closed while its client may still be sending reads and drops what
comes, so that the reply is not lost to a reset (nginx's lingering close)."""
_IDLE, _HEAD, _BODY = 0, 1, 2  # what the connection is waiting for


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


class _Discard(asyncio.Protocol):
    """A lingering connection's protocol: drops what the client still sends, closes on its
    end or at the timer, and hands the end of the connection back to the HTTP protocol."""

    __slots__ = ("_owner", "_timer")

    def __init__(self, owner: asyncio.Protocol, timer: asyncio.TimerHandle) -> None:
        self._owner = owner
        self._timer = timer

    def data_received(self, data: bytes) -> None:
        pass

    def resume_writing(self) -> None:
        self._owner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        self._owner.connection_lost(exc)


class _CoalescingTransport:
    """The client's transport, with the writes made in one event-loop step sent together: a
    reply's status line and headers go out in the same packet as its first bytes of body.
    Loopback sends cost tens of microseconds each here, more than a whole step of the relay.
    Closed while `input_pending`, it sends its end of the stream and lingers (`_LINGER_S`)."""

    __slots__ = ("_closing", "_loop", "_pending", "_transport", "input_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._closing = False
        self.input_pending = False

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not (self._closing or self._transport.is_closing()):  # nothing after our end
                self._transport.write(data)

    def close(self) -> None:
        """Flush and close; a second call ends a linger at once."""
        self._flush()
        transport = self._transport
        if self._closing or not self.input_pending or transport.is_closing():
            transport.close()
        else:
            owner = cast(asyncio.Protocol, transport.get_protocol())
            timer = self._loop.call_later(_LINGER_S, transport.close)
            transport.write_eof()
            transport.set_protocol(_Discard(owner, timer))
            transport.resume_reading()
        self._closing = True

    def abort(self) -> None:
        self._pending.clear()
        self._closing = True
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedProtocol(HttpToolsProtocol):
    """One client connection; `limits`, `auth` and the shared `table` are set on the subclass
    `limited_protocol` makes."""

    limits: ClassVar[LimitsConfig] = LimitsConfig()
    auth: ClassVar[Auth | None] = None
    table: ClassVar[ConnectionTable[LimitedProtocol]]
    _wire: _CoalescingTransport  # the client's transport, from connection_made on

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading = _HEAD
        self._head_bytes = 0  # in the URL and the complete header lines, from the parser
        self._head_raw = 0  # in the chunks that ended inside the head: all of them head bytes
        self._head_count = 0
        self._ended_in_feed = False  # a request ended in this chunk: the next began inside it
        self._keep_alive: bool | None = None  # the request's own, held while its body is due
        self._key: bytes | None = None  # the last Authorization value found valid
        self._rejected = False
        self._shutting_down = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wire = _CoalescingTransport(transport, self.loop)
        self.transport = cast(asyncio.Transport, self._wire)
        admitted, victim = self.table.admit(self, self.client[0] if self.client else "")
        if victim is not None:
            victim._evict()
        if not admitted:
            log.warning("connection_refused", reason="max_connections", open=len(self.table))
            self._rejected = True
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.table.release(self)
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:
            signal = disconnect_signal(cast(Scope, cycle.scope))
            if signal is not None:
                signal.fire()

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        self._ended_in_feed = False
        super().data_received(data)
        reading = self._reading
        if reading == _IDLE or self._rejected:
            return
        if reading == _HEAD and not self._ended_in_feed:
            self._head_raw += len(data)
            if self._head_raw > self.limits.max_header_bytes:
                self._reject(self._headers_too_large())
                return
        if self._timer is None:
            self._arm()
        if reading == _BODY and self._keep_alive is None:
            # A reply given before the body is in ends the connection (`connection: close`),
            # so nothing left unread can hold it open.
            self._keep_alive, self.cycle.keep_alive = self.cycle.keep_alive, False

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot read (a `CONNECT`, bad framing): a 400 in OpenAI's shape,
        the connection closed, and nothing more read from it."""
        if not self._rejected:  # a rejected request was answered already
            self._reject(BadRequestError(msg))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        signal = DisconnectSignal(self._wire)  # the client's transport, for its unsent bytes
        self.scope["extensions"] = {DISCONNECT: signal}  # type: ignore[dict-item]
        self._reading = _HEAD
        self._head_bytes = self._head_raw = self._head_count = 0
        self._wire.input_pending = True

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # `_count`, spelled out: this runs for every header of every request.
        self._head_bytes += len(name) + len(value) + 4
        self._head_count += 1
        limits = self.limits
        if self._head_bytes > limits.max_header_bytes or self._head_count > limits.max_headers:
            self._reject(self._headers_too_large())
            raise _HeadersRejected
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._reading = _BODY
        if len(self.pipeline) >= self.limits.max_pipelined:
            # Each queued request is one more answer owed in order; a client that sends this
            # many ahead is not waiting for them. Nothing is written: it would answer the
            # first request, which is still in progress.
            log.warning("connection_refused", reason="max_pipelined", open=len(self.table))
            self._rejected = True
            self.pipeline.clear()
            self.transport.close()
            raise _HeadersRejected
        keyed = self._keyed()
        if self.auth is not None and self.auth.required:  # said only where keys are checked
            self.scope["extensions"][KEYED] = keyed  # type: ignore[assignment]  # ours
        if not self.table.request(self, keyed=keyed):
            log.warning("connection_refused", reason="reserved_for_keys", open=len(self.table))
            self._reject(
                ServiceUnavailableError("too many connections without an API key; retry later")
            )
            raise _HeadersRejected
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading = _IDLE
        self._ended_in_feed = True
        self._wire.input_pending = False
        self._disarm()
        held, self._keep_alive = self._keep_alive, None
        if held is not None and not self.cycle.response_started and not self._shutting_down:
            self.cycle.keep_alive = held
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if not self.pipeline:
            self.table.idle(self)
        super().on_response_complete()

    def shutdown(self) -> None:
        self._shutting_down = True
        super().shutdown()

    def _keyed(self) -> bool:
        """Whether this request presents a valid client or admin key (only with API keys)."""
        auth = self.auth
        if auth is None or not auth.required:
            return False
        value = next((v for k, v in self.headers if k == b"authorization"), None)
        if value is None:
            return False
        if value == self._key:
            return True
        try:
            auth.check(value)
        except AuthenticationError:
            return False
        self._key = value
        return True

    def _count(self, size: int, headers: int) -> None:
        self._head_bytes += size
        self._head_count += headers
        limits = self.limits
        if self._head_bytes > limits.max_header_bytes or self._head_count > limits.max_headers:
            self._reject(self._headers_too_large())
            raise _HeadersRejected

    def _headers_too_large(self) -> HeadersTooLargeError:
        limits = self.limits
        return HeadersTooLargeError(
            f"request headers over the limit of {limits.max_header_bytes} bytes "
            f"or {limits.max_headers} fields"
        )

    def _reject(self, exc: SpecrouteError) -> None:
        self._rejected = True
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_response(exc))
            self.transport.close()

    def _evict(self) -> None:
        """Closed to make room for a newcomer: keyless, and idle longest (see the table)."""
        log.info("connection_evicted", open=len(self.table))
        self._rejected = True
        self._disarm()
        self.transport.abort()

    def _arm(self) -> None:
        limits = self.limits
        timeout = limits.body_timeout_s if self._reading == _BODY else limits.header_timeout_s
        self._timer = self.loop.call_later(timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        limits = self.limits
        if self._reading != _BODY:
            message = f"request headers not received within {limits.header_timeout_s:g} s"
            self._reject(RequestTimeoutError(message))
            return
        cycle = self.cycle
        signal = disconnect_signal(cast(Scope, cycle.scope))
        if signal is not None:
            signal.timed_out = True  # the app records our 408, not a client that left
        cycle.disconnected = True  # the app's wait for the body ends; what it sends is dropped
        cycle.message_event.set()
        if cycle.response_started:
            self._rejected = True
            self.transport.close()
        else:
            message = f"request body not received within {limits.body_timeout_s:g} s"
            self._reject(RequestTimeoutError(message))


def limited_protocol(limits: LimitsConfig, auth: Auth | None = None) -> type[HttpToolsProtocol]:
    """The protocol class to pass as uvicorn's `http=`, bound to `limits` and, for the connection
    reserve, to the keys in `auth` (without API keys every connection is keyless)."""
    reserve = limits.reserve if auth is not None and auth.required else 0
    table: ConnectionTable[LimitedProtocol] = ConnectionTable(
        limits.max_connections, reserve=reserve, per_peer=limits.max_connections_per_peer
    )
    namespace = {"limits": limits, "auth": auth, "table": table}
    return type("LimitedHttpToolsProtocol", (LimitedProtocol,), namespace)
