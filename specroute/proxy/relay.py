"""The relay: one ASGI handler for the proxied routes. Reads the body once, routes it, forwards
the client's bytes, retries failures that happen before the first byte reaches the client, and
streams replies event by event; a client that leaves cancels its upstream request at once."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec
import structlog

from specroute.errors import (
    ModelNotFoundError,
    PayloadTooLargeError,
    SpecrouteError,
    StreamInterruptedError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    error_body,
    error_event,
)
from specroute.pool import Lease, StreamBroken, TimedOut, UpstreamFailure, UpstreamResponse
from specroute.proxy.exchange import Exchange
from specroute.proxy.fields import Extras, decode_fields, route_request, upstream_body
from specroute.proxy.state import ProxyState
from specroute.proxy.streaming import StreamRelay, strip_reply

__all__ = ["RELAY_PATHS", "Relay"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

log = structlog.get_logger()

RELAY_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/generate": "generate",
}
_UPSTREAM_PATH = {route: path for path, route in RELAY_PATHS.items()}
_upstream_error = msgspec.json.Decoder(dict[str, Any])


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
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


def upstream_error(status: int, body: bytes) -> UpstreamError:
    """An upstream 4xx/5xx as our error with the same status and the upstream's message."""
    message, kind = f"backend answered {status}", None
    try:
        data = _upstream_error.decode(body)
    except msgspec.DecodeError:
        data = {}
    detail = data.get("error", data)
    if isinstance(detail, dict):
        message = str(detail.get("message") or message)
        kind = detail.get("type")
    elif isinstance(detail, str):
        message = detail
    exc = UpstreamError(message, status=status)
    exc.error_type = kind if isinstance(kind, str) else "invalid_request_error"
    return exc


class Relay:
    """The proxied routes: chat completions, completions and SGLang's native /generate."""

    def __init__(self, state: ProxyState) -> None:
        self._state = state

    async def handle(self, route: str, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        request_id = (header(scope, b"x-request-id") or os.urandom(8).hex().encode()).decode()
        ex = Exchange(route, request_id, state.policy.name)
        task = asyncio.current_task()
        assert task is not None
        watcher: asyncio.Task[None] | None = None
        try:
            state.auth.check(header(scope, b"authorization"))
            body = await read_body(scope, receive, state.config.max_body_bytes)
            fields = decode_fields(route, body)
            ex.model = fields.model
            self._check_model(fields.model)
            ex.request = route_request(route, fields, _text(header(scope, b"x-specroute-class")))
            forwarded, extras = upstream_body(body, fields, state.config.learn)
            watcher = asyncio.create_task(_watch_disconnect(receive, task, ex))
            await self._forward(ex, forwarded, extras, send)
        except SpecrouteError as exc:
            await self._send_error(ex, exc, send)
        except ClientGone:
            ex.status, ex.error = 499, "client disconnected"
        except asyncio.CancelledError:
            if not ex.client_gone:
                raise
            task.uncancel()
            ex.status, ex.error = 499, "client disconnected"
        finally:
            if watcher is not None:
                watcher.cancel()
            ex.finish(state.metrics)

    def _check_model(self, model: str | None) -> None:
        if model is None:
            return
        known = self._state.pool.known_models()
        if known and model not in known:
            raise ModelNotFoundError(
                f"The model `{model}` does not exist; served: {', '.join(sorted(known))}",
                param="model",
            )

    async def _forward(self, ex: Exchange, body: bytes, extras: Extras, send: Send) -> None:
        """Attempts on distinct backends while failures happen before the first byte."""
        state = self._state
        retry = state.config.retry
        assert ex.request is not None
        tried: list[str] = []
        for attempt in range(1, retry.max_attempts + 1):
            lease, decision = await state.admission.admit(ex.request, state.policy, tried)
            ex.begin_attempt(lease, decision)
            state.metrics.decisions.inc((ex.policy, lease.backend.name))
            tried.append(lease.backend.name)
            reason = await self._attempt(
                ex, lease, body, extras, send, attempt == retry.max_attempts
            )
            if reason is None:
                return
            state.metrics.retries.inc((lease.backend.name, reason))
            log.info(
                "upstream_retried",
                request_id=ex.request_id,
                backend=lease.backend.name,
                reason=reason,
            )
            await asyncio.sleep(min(retry.backoff_s * 2 ** (attempt - 1), retry.backoff_max_s))

    async def _attempt(
        self, ex: Exchange, lease: Lease, body: bytes, extras: Extras, send: Send, last: bool
    ) -> str | None:
        """One try on one backend: None when the client got its answer, else why to retry."""
        backend = lease.backend
        upstream: UpstreamResponse | None = None
        verdict: bool | None = None  # breaker: True success, False failure, None no verdict
        status, error = 0, None
        try:
            upstream = await self._state.client.send(
                "POST",
                backend.url + _UPSTREAM_PATH[ex.route],
                body,
                _upstream_headers(backend.auth_headers),
            )
            status = upstream.status
            if status >= 500 or status == 429:
                verdict = status == 429  # overload is not a broken backend
                error = f"upstream status {status}"
                detail = await upstream.read()
                if not last:
                    return f"status_{status}"
                raise upstream_error(status, detail)
            if status >= 400:
                verdict = True
                raise upstream_error(status, await upstream.read())
            if status == 200 and upstream.content_type.startswith(b"text/event-stream"):
                await self._relay_stream(ex, upstream, extras, send)
            else:
                await self._relay_whole(ex, upstream, extras, send)
            verdict = ex.error is None
            return None
        except UpstreamFailure as exc:
            verdict, error = False, str(exc)
            if ex.committed:
                return None
            if isinstance(exc, TimedOut):
                raise UpstreamTimeoutError(f"backend {backend.name} timed out") from exc
            if last:
                raise UpstreamUnavailableError(f"backend {backend.name} failed: {exc}") from exc
            return type(exc).__name__
        finally:
            lease.release()
            _judge(lease, verdict)
            if upstream is not None:
                await upstream.aclose()
            self._observe(ex, lease, status, error or ex.error)

    async def _relay_whole(
        self, ex: Exchange, upstream: UpstreamResponse, extras: Extras, send: Send
    ) -> None:
        body = strip_reply(await upstream.read(), extras, ex.meter)
        ex.status = upstream.status
        headers = [(b"content-type", upstream.content_type), *ex.backend_headers()]
        ex.committed = ex.finished = True
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_stream(
        self, ex: Exchange, upstream: UpstreamResponse, extras: Extras, send: Send
    ) -> None:
        """Headers go out with the first event, so a backend that fails during prefill is
        still retried invisibly; after that, failures end the stream with an error event."""
        relay = ex.stream = StreamRelay(extras, ex.started)
        chunks = upstream.chunks(self._state.config.timeouts.idle_s).__aiter__()
        first = await anext(chunks, b"")
        headers = [(b"content-type", upstream.content_type), *ex.backend_headers()]
        ex.status = 200
        ex.committed = True
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        tail = b""
        try:
            out = relay.feed(first, time.perf_counter())
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            async for data in chunks:
                out = relay.feed(data, time.perf_counter())
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            tail = relay.rest()
            if not relay.saw_done:
                raise StreamBroken("stream ended before [DONE]")
        except UpstreamFailure as exc:
            ex.error = str(exc)
            tail = error_event(_stream_failure(exc))
            raise
        finally:
            ex.finished = True
            if not ex.client_gone:
                await send({"type": "http.response.body", "body": tail, "more_body": False})

    def _observe(self, ex: Exchange, lease: Lease, status: int, error: str | None) -> None:
        if ex.request is None:
            return
        try:
            self._state.policy.observe(ex.outcome(lease, status, error))
        except Exception:  # a third-party policy must not break the relay
            log.exception("policy_observe_failed", policy=ex.policy)

    async def _send_error(self, ex: Exchange, exc: SpecrouteError, send: Send) -> None:
        ex.status = exc.status
        ex.error = ex.error or exc.message
        if ex.committed:
            return
        ex.committed = ex.finished = True
        headers = [(b"content-type", b"application/json"), *exc.headers(), *ex.backend_headers()]
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": error_body(exc), "more_body": False})


def _judge(lease: Lease, verdict: bool | None) -> None:
    breaker = lease.backend.breaker
    if verdict is None:
        breaker.on_abandon()
    elif verdict:
        breaker.on_success()
    else:
        breaker.on_failure(time.monotonic())


def _upstream_headers(auth: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"accept", b"*/*"), *auth]


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value else None


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], ex: Exchange) -> None:
    """Cancel the request's task the moment its client goes away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not ex.finished:
                ex.client_gone = True
                task.cancel()
            return


def _stream_failure(exc: UpstreamFailure) -> SpecrouteError:
    if isinstance(exc, TimedOut):
        return UpstreamTimeoutError(f"backend stream stalled: {exc}")
    return StreamInterruptedError(f"backend stream interrupted: {exc}")
