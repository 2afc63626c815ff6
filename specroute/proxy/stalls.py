"""Stalls on either side of a stream: a backend that goes quiet (`StreamClock`: heartbeats to the
client while it waits, and the learned limit past which the stream fails) and a client that
stops reading (`SendWatch`: the bytes it has not taken, so the backend's slot is freed)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import struct
import termios
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["HEARTBEAT", "ClientTransport", "SendWatch", "StreamClock", "unsent_bytes"]

HEARTBEAT = b": keep-alive\n\n"
"""An SSE comment: clients and load balancers see bytes, parsers skip it (the spec's own)."""
_OWN_GAPS = 64  # a stream's latest gaps that count toward its own limit
_SIOCOUTQ: int | None = getattr(termios, "TIOCOUTQ", None)  # Linux: bytes not yet acknowledged
_INT = struct.Struct("i")


class StreamClock:
    """A stream's waits for its backend. Each read of the upstream waits at most `heartbeat_s`
    (the read's own timeout: nothing runs per chunk); one that times out before the limit
    sends the client a heartbeat. The limit is `first_s` before the first token, then
    `gap_s(gaps)`: the backend's learned limit with the stream's own latest gaps counted in."""

    __slots__ = ("first_s", "gap_s", "heartbeat_s")

    def __init__(
        self,
        heartbeat_s: float,
        first_s: float,
        gap_s: Callable[[Sequence[float]], float],
    ) -> None:
        self.heartbeat_s = heartbeat_s
        self.first_s = first_s
        self.gap_s = gap_s

    def first_wait(self) -> float:
        """The read timeout before the first token."""
        return min(self.heartbeat_s, self.first_s)

    def gap_wait(self) -> float:
        """The read timeout between chunks."""
        return min(self.heartbeat_s, self.gap_s(()))

    def limit_s(self, first: bool, gaps: Sequence[float]) -> float:
        """How long the stream may stay quiet now."""
        return self.first_s if first else self.gap_s(gaps[-_OWN_GAPS:])


class ClientTransport(Protocol):
    """What the watch reads of the client's connection."""

    def get_write_buffer_size(self) -> int: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...

    def is_closing(self) -> bool: ...


def _socket_fd(transport: ClientTransport) -> int | None:
    sock = transport.get_extra_info("socket")
    if sock is None or _SIOCOUTQ is None:
        return None
    try:
        fd = sock.fileno()
        fcntl.ioctl(fd, _SIOCOUTQ, _INT.pack(0))
    except (OSError, AttributeError, ValueError):
        return None
    return int(fd)


def unsent_bytes(transport: ClientTransport, fd: int | None) -> int:
    """Bytes written for the client that it has not taken: in the transport's buffer, and in
    the kernel's send queue not yet acknowledged (`SIOCOUTQ`, where `fd` is known)."""
    waiting = transport.get_write_buffer_size()
    if fd is not None and _SIOCOUTQ is not None and not transport.is_closing():
        with contextlib.suppress(OSError):
            waiting += _INT.unpack(fcntl.ioctl(fd, _SIOCOUTQ, _INT.pack(0)))[0]
    return waiting


class SendWatch:
    """A watch on a streaming client's reading pace. A client that stops reading but keeps its
    connection open would otherwise hold a backend slot for as long as it likes, and a kernel
    send buffer absorbs megabytes before any write blocks. So the watch reads the bytes the
    client has not taken (`unsent_bytes`) every quarter of `limit_s`: with some outstanding
    and none taken for `limit_s`, it cancels `task` and sets `stalled`. Count what is written
    in `sent` (bytes). Without a transport (another ASGI server), set `sending` around each
    write: a write blocked through two checks `limit_s` apart is the stall."""

    __slots__ = (
        "_fd",
        "_handle",
        "_limit_s",
        "_loop",
        "_period_s",
        "_since",
        "_taken",
        "_task",
        "_transport",
        "sending",
        "sent",
        "stalled",
    )

    def __init__(
        self, task: asyncio.Task[Any], limit_s: float, transport: ClientTransport | None = None
    ) -> None:
        self._task = task
        self._limit_s = limit_s
        self._transport = transport
        self._fd = _socket_fd(transport) if transport is not None else None
        self._loop = asyncio.get_running_loop()
        self._period_s = limit_s if transport is None else limit_s / 4
        self.sending = False
        self.sent = 0
        self.stalled = False
        self._taken = -1  # without a transport: what `sent` was at the last check
        self._since = self._loop.time()
        self._handle = self._loop.call_later(self._period_s, self._check)

    def _check(self) -> None:
        if self._transport is None:
            stuck = self.sending and self.sent == self._taken
            self._taken = self.sent
        else:
            stuck = self._behind(self._loop.time())
        if stuck:
            self.stalled = True
            self._task.cancel()
            return
        self._handle = self._loop.call_later(self._period_s, self._check)

    def _behind(self, now: float) -> bool:
        """Whether bytes have been waiting for the client, none of them taken, for the limit."""
        assert self._transport is not None
        unsent = unsent_bytes(self._transport, self._fd)
        taken = self.sent - unsent  # grows only as the client takes bytes
        progressed = unsent == 0 or taken > self._taken
        self._taken = taken
        if progressed:
            self._since = now
            return False
        return now - self._since >= self._limit_s

    def close(self) -> None:
        self._handle.cancel()
