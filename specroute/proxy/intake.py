"""Reading a client's request before anything else happens: header values as given, the body
within its size and time limits, and the header values the proxy echoes or keeps (request id,
workload class) only when they are short printable ASCII."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from specroute.errors import PayloadTooLargeError, RequestTimeoutError

__all__ = [
    "DISCONNECT",
    "ClientGone",
    "DisconnectSignal",
    "Receive",
    "Scope",
    "Send",
    "disconnect_signal",
    "header",
    "printable",
    "read_body",
    "request_id",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_REQUEST_ID_MAX = 128


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


DISCONNECT = "specroute.disconnect"
"""The scope extension under which the proxy's own server protocol puts a `DisconnectSignal`."""


class DisconnectSignal:
    """Fired by the server protocol when a client's connection drops before its reply ended:
    calls `on_fire` at once. Cheaper than a task per request waiting on `receive()`, which is
    the fallback under other ASGI servers."""

    __slots__ = ("fired", "on_fire")

    def __init__(self) -> None:
        self.fired = False
        self.on_fire: Callable[[], None] | None = None

    def fire(self) -> None:
        self.fired = True
        callback, self.on_fire = self.on_fire, None
        if callback is not None:
            callback()


def disconnect_signal(scope: Scope) -> DisconnectSignal | None:
    extensions = scope.get("extensions")
    return extensions.get(DISCONNECT) if extensions else None


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def read_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
    """The whole body, refused past `limit` bytes or when it takes longer than `timeout_s`."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
    try:
        async with asyncio.timeout(timeout_s):
            return await _receive_body(receive, limit)
    except TimeoutError as exc:
        raise RequestTimeoutError(f"request body not received within {timeout_s:g} s") from exc


async def _receive_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def printable(value: bytes | None, limit: int) -> str | None:
    """`value` as text if it is at most `limit` bytes of printable ASCII, else None."""
    if value and len(value) <= limit and value.isascii():
        text = value.decode("ascii")
        if text.isprintable():
            return text
    return None


def request_id(given: bytes | None) -> str:
    """The client's `X-Request-Id` when it is short printable ASCII, else a fresh one: it goes
    into logs and back into a response header, so nothing else is echoed."""
    return printable(given, _REQUEST_ID_MAX) or os.urandom(8).hex()
