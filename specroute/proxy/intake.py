"""Reading a client's request, first thing: header values as given, the body within its size
and time limits and under the cap on bodies held at once, the few fields routing needs decoded
from the client's bytes (`fields`), and the workload class (named by the client only where its
key may)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any, NamedTuple

import msgspec

from specroute.config import Config
from specroute.errors import (
    BadRequestError,
    ModelNotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
)
from specroute.policies import RouteRequest
from specroute.pool import Pool
from specroute.proxy.auth import Auth, presented_key
from specroute.proxy.bodies import BodyHold
from specroute.proxy.fields import (
    Extras,
    ForwardFields,
    ResponsesFields,
    decode_fields,
    route_request,
    upstream_body,
)
from specroute.proxy.lanes import LANE_HEADER, LaneResolver, with_priority
from specroute.proxy.stalls import ClientTransport

__all__ = [
    "DISCONNECT",
    "ClientGone",
    "DisconnectSignal",
    "Incoming",
    "Intake",
    "Receive",
    "Scope",
    "Send",
    "class_name",
    "client_key",
    "disconnect_signal",
    "header",
    "printable",
    "read_body",
    "request_id",
    "served_name",
    "watch_disconnect",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_REQUEST_ID_MAX = 128
_CLASS_NAME = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,63}")
"""A client-named workload class: it becomes a Prometheus label value, so a short plain name."""
_CLASSES_MAX = 256
"""Distinct client-named workload classes: each costs estimator state and metric series, so
names past this many fall back to the model's own class rather than grow without bound."""


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class Incoming(NamedTuple):
    """A request read and decoded: what the policy sees, what goes upstream, what to strip,
    and the stored response it continues (`previous_response_id`), which pins its backend."""

    request: RouteRequest
    body: bytes
    extras: Extras
    continues: str | None = None


class Intake:
    """Reads each request of one app: its limits, its pool's models, the keys that may name a
    workload class, and the client-named classes it has accepted so far. A class header it
    does not honour is passed to `on_ignored` with the reason (`not_allowed`, `invalid`,
    `too_many`)."""

    def __init__(
        self, config: Config, pool: Pool, auth: Auth, on_ignored: Callable[[str], None]
    ) -> None:
        self._config = config
        self._pool = pool
        self._auth = auth
        self._on_ignored = on_ignored
        self._classes: set[str] = set()
        self._lanes = LaneResolver(config.lanes, auth)
        self._lane_target = config.lanes.target

    async def read(self, route: str, scope: Scope, receive: Receive, hold: BodyHold) -> Incoming:
        """The request on `route`, its body's bytes reserved in `hold`: a 4xx error if it is
        too big, too slow, malformed, or asks for a model no backend serves; a 503 when bodies
        in flight leave no room for it."""
        config = self._config
        body = await read_body(
            scope, receive, config.max_body_bytes, config.limits.body_timeout_s, hold
        )
        fields = decode_fields(route, body)
        given = fields.model if isinstance(fields.model, str) else None
        model = self._served_model(given)
        klass = self._workload_class(scope)
        forwarded, extras = upstream_body(body, fields, config.learn)
        named = fields if model in (None, given) else msgspec.structs.replace(fields, model=model)
        continues = fields.previous_response_id if isinstance(fields, ResponsesFields) else None
        lanes = self._lanes
        named_lane = header(scope, LANE_HEADER)
        # The key is read only when it can decide the lane: a lane header to trust, or keys
        # with lanes of their own.
        key = header(scope, b"authorization") if named_lane or lanes.keyed else None
        lane = lanes.resolve(key, named_lane, getattr(fields, "service_tier", None))
        if config.lanes.engine_priority and not isinstance(fields, ForwardFields):
            priority = getattr(fields, "priority", msgspec.UNSET)
            forwarded = with_priority(forwarded, priority, config.lanes.priority(lane))
        request = route_request(route, named, klass, lane, self._lane_target)
        return Incoming(request, forwarded, extras, continues)

    def _served_model(self, model: str | None) -> str | None:
        """The served model a request names, which routes it (the client's bytes go upstream
        as they came): a name the pool lists, else as `served_name` reads it; 404 if none."""
        known = self._pool.known_models()
        if model is None:
            return self._only_model()
        if not known or model in known:
            return model
        found = served_name(model, self._pool.base_models())
        if found is None:
            raise ModelNotFoundError(
                f"The model `{model}` does not exist; served: {', '.join(sorted(known))}",
                param="model",
            )
        return found

    def _only_model(self) -> str | None:
        """No `model`: SGLang (one model per server) serves its own; a pool of one model does
        the same, a pool of several cannot guess (400)."""
        served = self._pool.base_models()
        if len(served) <= 1:
            return next(iter(served), None)
        raise BadRequestError(
            f"`model` is required: this proxy serves several models ({', '.join(sorted(served))})",
            param="model",
        )

    def _workload_class(self, scope: Scope) -> str | None:
        """The client's `X-Specroute-Class` if its key may name one, the name is plain
        (`class_name`), and it is known or within the cap on distinct classes; else None
        (the model's own class). An estimate is only as good as the labels that feed it."""
        given = header(scope, b"x-specroute-class")
        if given is None:
            return None
        name = class_name(given)
        if not self._auth.may_name_class(client_key(scope)):
            self._on_ignored("not_allowed")
        elif name is None:
            self._on_ignored("invalid")
        elif name in self._classes:
            return name
        elif len(self._classes) >= _CLASSES_MAX:
            self._on_ignored("too_many")
        else:
            self._classes.add(name)
            return name
        return None


def served_name(model: str, served: Collection[str]) -> str | None:
    """The served model `model` selects, as SGLang reads `name:adapter`
    (`_parse_model_parameter`): a served name then `:adapter`, else the part before the first
    colon; any other name reaches a pool's only model, and none of several (None)."""
    prefixed = [name for name in served if model.startswith(f"{name}:")]
    if prefixed:
        return max(prefixed, key=len)
    base = model.split(":", 1)[0].strip()
    if base in served:
        return base
    return next(iter(served)) if len(served) == 1 else None


# Headers and body --------------------------------------------------------------------------


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def client_key(scope: Scope) -> bytes | None:
    """The client's `Authorization` header, or its `x-api-key` (Anthropic's clients send the
    key there) as a Bearer token."""
    return presented_key(header(scope, b"authorization"), header(scope, b"x-api-key"))


def printable(value: bytes | None, limit: int) -> str | None:
    """`value` as text if it is at most `limit` bytes of printable ASCII, else None."""
    if value and len(value) <= limit and value.isascii():
        text = value.decode("ascii")
        if text.isprintable():
            return text
    return None


def class_name(given: bytes) -> str | None:
    """`given` as a workload class name: up to 64 letters, digits and `._:/@+-`, else None."""
    return given.decode("ascii") if _CLASS_NAME.fullmatch(given) else None


def request_id(given: bytes | None) -> str:
    """The client's `X-Request-Id` when it is short printable ASCII, else a fresh one: it goes
    into logs and back into a response header, so nothing else is echoed."""
    return printable(given, _REQUEST_ID_MAX) or os.urandom(8).hex()


async def read_body(
    scope: Scope, receive: Receive, limit: int, timeout_s: float, hold: BodyHold | None = None
) -> bytes:
    """The whole body, refused past `limit` bytes or when it takes longer than `timeout_s`; its
    bytes reserved in `hold` before they are read (a declared length at once). The proxy's own
    protocol keeps the deadline and says when it fired; the timer here is the fallback under
    other ASGI servers."""
    given = header(scope, b"content-length")
    declared = int(given) if given is not None and given.isdigit() else None
    if declared is not None and declared > limit:
        raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
    signal = disconnect_signal(scope)
    if signal is not None:
        return await _receive_body(receive, limit, declared, hold, signal, timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            return await _receive_body(receive, limit, declared, hold, None, timeout_s)
    except TimeoutError as exc:
        raise _too_slow(timeout_s) from exc


def _too_slow(timeout_s: float) -> RequestTimeoutError:
    return RequestTimeoutError(f"request body not received within {timeout_s:g} s")


async def _receive_body(
    receive: Receive,
    limit: int,
    declared: int | None,
    hold: BodyHold | None,
    signal: DisconnectSignal | None,
    timeout_s: float,
) -> bytes:
    if hold is not None and declared:
        await hold.take(declared)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if signal is not None and signal.timed_out:
                raise _too_slow(timeout_s)
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
        if hold is not None and declared is None:
            await hold.take(len(chunk))
        parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


# The client leaving ------------------------------------------------------------------------

DISCONNECT = "specroute.disconnect"
"""The scope extension under which the proxy's own server protocol puts a `DisconnectSignal`."""


class DisconnectSignal:
    """Fired by the server protocol when a client's connection drops before its reply ended:
    calls `on_fire` at once. Cheaper than a task per request waiting on `receive()`, which is
    the fallback under other ASGI servers. `timed_out` is set when the protocol ended the
    request because its body came too slowly (it answered 408 itself); `transport` is the
    client's connection, whose unsent bytes show a client that stopped reading."""

    __slots__ = ("fired", "on_fire", "timed_out", "transport")

    def __init__(self, transport: ClientTransport | None = None) -> None:
        self.fired = False
        self.timed_out = False
        self.transport = transport
        self.on_fire: Callable[[], None] | None = None

    def fire(self) -> None:
        self.fired = True
        callback, self.on_fire = self.on_fire, None
        if callback is not None:
            callback()

    def forget(self) -> None:
        self.on_fire = None


def disconnect_signal(scope: Scope) -> DisconnectSignal | None:
    extensions = scope.get("extensions")
    return extensions.get(DISCONNECT) if extensions else None


def watch_disconnect(
    signal: DisconnectSignal | None, receive: Receive, on_gone: Callable[[], None]
) -> Callable[[], object]:
    """Call `on_gone` the moment the client's connection drops (ClientGone if it already
    has): told by the request's `signal` (`disconnect_signal`), else by `receive`; returns the
    function that stops watching."""
    if signal is None:
        return asyncio.create_task(_wait_disconnect(receive, on_gone)).cancel
    if signal.fired:
        raise ClientGone
    signal.on_fire = on_gone
    return signal.forget


async def _wait_disconnect(receive: Receive, on_gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    on_gone()
