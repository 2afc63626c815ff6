"""The relay: one ASGI handler for the proxied routes. Reads the body once, routes it, forwards
the client's bytes, retries failures that happen before the first byte reaches the client, and
streams replies event by event; a client that leaves cancels its upstream request at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from functools import partial
from typing import Any

import msgspec
import structlog

from specroute.errors import (
    ModelNotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServiceUnavailableError,
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
from specroute.proxy.intake import (
    ClientGone,
    DisconnectSignal,
    Receive,
    Scope,
    Send,
    disconnect_signal,
    header,
    printable,
    read_body,
    request_id,
)
from specroute.proxy.pacing import SendWatch
from specroute.proxy.state import ProxyState
from specroute.proxy.streaming import StreamRelay, strip_reply

__all__ = ["RELAY_PATHS", "Receive", "Relay", "Scope", "Send"]

log = structlog.get_logger()

RELAY_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/generate": "generate",
}
_UPSTREAM_PATH = {route: path for path, route in RELAY_PATHS.items()}
_upstream_error = msgspec.json.Decoder(dict[str, Any])
_CLASS_NAME_MAX = 64
_CLASSES_MAX = 256
"""Distinct client-named workload classes: each costs estimator state and metric series, so
names past this many fall back to the model's own class rather than grow without bound."""


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
        self.draining = False
        self._open: set[asyncio.Task[Any]] = set()
        self._ending: set[asyncio.Task[Any]] = set()  # ended by shutdown, not by their client
        self._idle: asyncio.Event | None = None  # set when draining and nothing is left open
        self._classes: set[str] = set()

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests; let those in flight run up to `grace_s` seconds, then end the
        rest: streams with an error event and `[DONE]`, the others with a 503."""
        self.draining = True
        self._idle = asyncio.Event()
        if self._open:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self._idle.wait()
        rest = list(self._open)
        if rest:
            log.warning("shutdown_ending_requests", requests=len(rest), grace_s=grace_s)
        for task in rest:
            self._ending.add(task)
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=5.0)

    async def handle(self, route: str, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        ex = Exchange(route, request_id(header(scope, b"x-request-id")), state.policy.name)
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        watcher: asyncio.Task[None] | None = None
        signal: DisconnectSignal | None = None
        try:
            if self.draining:
                raise _shutting_down()
            state.auth.check(header(scope, b"authorization"))
            limits = state.config.limits
            body = await read_body(
                scope, receive, state.config.max_body_bytes, limits.body_timeout_s
            )
            fields = decode_fields(route, body)
            ex.model = fields.model
            self._check_model(fields.model)
            klass = self._workload_class(header(scope, b"x-specroute-class"))
            ex.request = route_request(route, fields, klass)
            forwarded, extras = upstream_body(body, fields, state.config.learn)
            signal = disconnect_signal(scope)
            if signal is None:
                watcher = asyncio.create_task(_watch_disconnect(receive, task, ex))
            elif signal.fired:
                raise ClientGone
            else:
                signal.on_fire = partial(_client_left, task, ex)
            await self._forward(ex, forwarded, extras, send)
        except SpecrouteError as exc:
            await self._send_error(ex, exc, send)
        except ClientGone:
            ex.status, ex.error = 499, "client disconnected"
        except asyncio.CancelledError:
            if not (ex.client_gone or task in self._ending):
                raise
            task.uncancel()
            if ex.client_gone:
                ex.status, ex.error = 499, ex.error or "client disconnected"
            else:  # a stream in flight got its error event already; the rest get a 503
                await self._send_error(ex, _shutting_down(), send)
        finally:
            self._open.discard(task)
            self._ending.discard(task)
            if self._idle is not None and not self._open:
                self._idle.set()
            if watcher is not None:
                watcher.cancel()
            elif signal is not None:
                signal.on_fire = None
            ex.finish(state.metrics)

    def _workload_class(self, given: bytes | None) -> str | None:
        """The client's `X-Specroute-Class`, if it is a short printable name and either known
        or within the cap on distinct classes; else None (the model's own class)."""
        name = printable(given, _CLASS_NAME_MAX)
        if name is None or name in self._classes:
            return name
        if len(self._classes) >= _CLASSES_MAX:
            return None
        self._classes.add(name)
        return name

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
            state.decisions.record(
                ex.request_id,
                ex.request.workload_class,
                lease.backend.name,
                lease.backend.steps,
                ex.policy,
                decision.reason,
            )
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
            if not last:  # a timeout too: the client has nothing yet, another backend may answer
                return type(exc).__name__
            if isinstance(exc, TimedOut):
                raise UpstreamTimeoutError(f"backend {backend.name} timed out") from exc
            raise UpstreamUnavailableError(f"backend {backend.name} failed: {exc}") from exc
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
        headers = [
            (b"content-type", upstream.content_type),
            (b"content-length", str(len(body)).encode()),
            *ex.backend_headers(),
        ]
        ex.committed = ex.finished = True
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_stream(
        self, ex: Exchange, upstream: UpstreamResponse, extras: Extras, send: Send
    ) -> None:
        """Headers go out with the first event, so a backend that fails during prefill is
        still retried invisibly; after that, failures end the stream with an error event."""
        config = self._state.config
        relay = ex.stream = StreamRelay(extras, ex.started)
        chunks = upstream.chunks(config.timeouts.idle_s).__aiter__()
        first = await anext(chunks, b"")
        headers = [(b"content-type", upstream.content_type), *ex.backend_headers()]
        ex.status = 200
        ex.committed = True
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        tail = b""
        task = asyncio.current_task()
        assert task is not None
        watch = SendWatch(task, config.limits.client_stall_s)
        try:
            data: bytes | None = first
            while data is not None:
                out = relay.feed(data, time.perf_counter())
                if out:
                    watch.sending = True
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    watch.sending = False
                    watch.sent += 1
                data = await anext(chunks, None)
            tail = relay.rest()
            if not relay.saw_done:
                raise StreamBroken("stream ended before [DONE]")
        except UpstreamFailure as exc:
            ex.error = str(exc)
            tail = error_event(_stream_failure(exc))
            raise
        except asyncio.CancelledError:
            if watch.stalled:  # nothing more can reach a client that stopped reading
                ex.client_gone = True
                ex.error = "client stopped reading"
            elif task in self._ending:
                ex.error = "proxy shutting down"
                tail = error_event(_shutting_down())
            raise
        finally:
            watch.close()
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
        if isinstance(exc, RequestTimeoutError | PayloadTooLargeError):
            headers.append((b"connection", b"close"))  # the rest of its body was never read
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


def _client_left(task: asyncio.Task[Any], ex: Exchange) -> None:
    """Cancel the request's task the moment its client goes away."""
    if not ex.finished:
        ex.client_gone = True
        task.cancel()


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], ex: Exchange) -> None:
    """The same, under an ASGI server that gives no `DisconnectSignal`."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            _client_left(task, ex)
            return


def _shutting_down() -> ServiceUnavailableError:
    return ServiceUnavailableError("proxy is shutting down", code="shutting_down", retry_after=1)


def _stream_failure(exc: UpstreamFailure) -> SpecrouteError:
    if isinstance(exc, TimedOut):
        return UpstreamTimeoutError(f"backend stream stalled: {exc}")
    return StreamInterruptedError(f"backend stream interrupted: {exc}")
