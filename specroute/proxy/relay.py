"""The relay: one ASGI handler for the proxied routes, a request's life top to bottom. It reads
the request (`intake`), binds the current policy to it, routes it, forwards the client's bytes,
retries failures that happen before the first byte reaches the client, hands the reply over
(`reply`, with the stall limits learned for its backend), and keeps the request's record: one
log line, its metrics, an `Outcome` per attempt, and a stalled backend's breaker."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec
import structlog

from specroute.errors import (
    SpecrouteError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from specroute.policies import Decision, Outcome, Policy, RouteRequest
from specroute.pool import (
    Lease,
    Stalled,
    StallRule,
    TimedOut,
    UpstreamFailure,
    UpstreamResponse,
)
from specroute.proxy.intake import (
    ClientGone,
    Incoming,
    Intake,
    Receive,
    Scope,
    Send,
    disconnect_signal,
    header,
    request_id,
    watch_disconnect,
)
from specroute.proxy.metrics import ProxyMetrics
from specroute.proxy.reply import Reply, shutting_down
from specroute.proxy.request_log import RequestLogSampler
from specroute.proxy.stalls import StreamClock
from specroute.proxy.state import ProxyState

__all__ = ["RELAY_PATHS", "Exchange", "Receive", "Relay", "Scope", "Send"]

log = structlog.get_logger()

RELAY_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/generate": "generate",
}
_UPSTREAM_PATH = {route: path for path, route in RELAY_PATHS.items()}
_upstream_error = msgspec.json.Decoder(dict[str, Any])


class Relay:
    """The proxied routes: chat completions, completions and SGLang's native /generate."""

    def __init__(self, state: ProxyState) -> None:
        self._state = state
        ignored = state.metrics.class_ignored
        self._intake = Intake(
            state.config, state.pool, state.auth, lambda reason: ignored.inc((reason,))
        )
        t = state.config.timeouts
        self._first_rule = StallRule(t.stall_factor, t.first_token_floor_s, t.first_byte_s)
        self._gap_rule = StallRule(t.stall_factor, t.stall_floor_s, t.idle_s)
        self.draining = False
        self._open: dict[asyncio.Task[Any], Exchange] = {}
        self._idle: asyncio.Event | None = None  # set when draining and nothing is left open

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests; let those in flight run up to `grace_s` seconds, then end the
        rest: streams with an error event and `[DONE]`, the others with a 503."""
        self.draining = True
        self._idle = asyncio.Event()
        if self._open:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self._idle.wait()
        rest = list(self._open.items())
        if rest:
            log.warning("shutdown_ending_requests", requests=len(rest), grace_s=grace_s)
        for task, ex in rest:
            ex.reply.ending = True  # ended by shutdown, not by its client
            task.cancel()
        if rest:
            await asyncio.wait([task for task, _ in rest], timeout=5.0)

    async def handle(self, route: str, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        # The policy is bound once, as the request comes in: a switch while it is in flight
        # leaves its routing, retries, headers and observation all with this one.
        ex = Exchange(route, request_id(header(scope, b"x-request-id")), state.policy, send)
        reply = ex.reply
        signal = disconnect_signal(scope)
        reply.transport = signal.transport if signal is not None else None
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = ex
        stop_watching: Callable[[], object] | None = None
        body = state.bodies.hold()
        try:
            if self.draining:
                raise shutting_down()
            state.auth.check(header(scope, b"authorization"))
            incoming = await self._intake.read(route, scope, receive, body)
            ex.request = incoming.request
            stop_watching = watch_disconnect(scope, receive, partial(_client_left, task, reply))
            await self._forward(ex, incoming)
        except SpecrouteError as exc:
            await reply.send_error(exc, ex.headers())
        except ClientGone:
            reply.status, reply.error = 499, "client disconnected"
        except asyncio.CancelledError:
            if not (reply.client_gone or reply.ending):
                raise
            task.uncancel()
            if reply.client_gone:
                reply.status, reply.error = 499, reply.error or "client disconnected"
            else:  # a stream in flight got its error event already; the rest get a 503
                await reply.send_error(shutting_down(), ex.headers())
        finally:
            body.release()
            del self._open[task]
            if self._idle is not None and not self._open:
                self._idle.set()
            if stop_watching is not None:
                stop_watching()
            ex.finish(state.metrics, state.request_log)

    async def _forward(self, ex: Exchange, incoming: Incoming) -> None:
        """Attempts on distinct backends while failures happen before the first byte."""
        state = self._state
        retry = state.config.retry
        request, policy = incoming.request, ex.policy
        tried: list[str] = []
        for attempt in range(1, retry.max_attempts + 1):
            lease, decision = await state.admission.admit(request, policy, tried)
            backend = lease.backend
            ex.begin_attempt(lease, decision)
            state.decisions.record(
                ex.request_id,
                request.workload_class,
                backend.name,
                backend.steps,
                policy.name,
                decision.reason,
            )
            state.metrics.decisions.inc((policy.name, backend.name))
            tried.append(backend.name)
            reason = await self._attempt(ex, lease, incoming, attempt == retry.max_attempts)
            if reason is None:
                return
            state.metrics.retries.inc((backend.name, reason))
            log.info(
                "upstream_retried", request_id=ex.request_id, backend=backend.name, reason=reason
            )
            await asyncio.sleep(min(retry.backoff_s * 2 ** (attempt - 1), retry.backoff_max_s))

    async def _attempt(
        self, ex: Exchange, lease: Lease, incoming: Incoming, last: bool
    ) -> str | None:
        """One try on one backend: None when the client got its answer, else why to retry."""
        backend = lease.backend
        upstream: UpstreamResponse | None = None
        verdict: bool | Stalled | None = None  # breaker: success, failure, stall, no verdict
        status, error = 0, None
        try:
            upstream = await self._state.client.send(
                "POST",
                backend.url + _UPSTREAM_PATH[ex.route],
                incoming.body,
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
            await self._reply(ex, upstream, incoming)
            verdict = ex.reply.error is None
            return None
        except UpstreamFailure as exc:
            verdict, error = (exc if isinstance(exc, Stalled) else False), str(exc)
            if ex.reply.committed:
                return None
            if not last:  # a timeout too: the client has nothing yet, another backend may answer
                return type(exc).__name__
            if isinstance(exc, TimedOut):
                raise UpstreamTimeoutError(f"backend {backend.name} timed out") from exc
            raise UpstreamUnavailableError(f"backend {backend.name} failed: {exc}") from exc
        finally:
            lease.release()
            self._judge(lease, verdict)
            if upstream is not None:
                await upstream.aclose()
            self._learn(ex, lease, status, error or ex.reply.error)

    async def _reply(self, ex: Exchange, upstream: UpstreamResponse, incoming: Incoming) -> None:
        if upstream.status == 200 and upstream.content_type.startswith(b"text/event-stream"):
            state = self._state
            assert ex.backend is not None
            times = state.pool.telemetry.stream_times(ex.backend)
            clock = StreamClock(
                state.config.timeouts.heartbeat_s,
                self._first_rule.limit_s(times.first),
                partial(self._gap_rule.limit_s, times.gaps),
            )
            await ex.reply.send_stream(
                upstream, incoming.extras, ex.headers(), clock, state.config.limits.client_stall_s
            )
        else:
            await ex.reply.send_whole(upstream, incoming.extras, ex.headers())

    def _judge(self, lease: Lease, verdict: bool | Stalled | None) -> None:
        """The attempt's verdict to its backend's breaker; a stall also to its health."""
        backend = lease.backend
        if isinstance(verdict, Stalled):
            self._state.metrics.stalls.inc((backend.name, verdict.phase))
            self._state.pool.stalled(backend, verdict.phase, verdict.limit_s)
        elif verdict is None:
            backend.breaker.on_abandon()
        elif verdict:
            backend.breaker.on_success()
        else:
            backend.breaker.on_failure(time.monotonic())

    def _learn(self, ex: Exchange, lease: Lease, status: int, error: str | None) -> None:
        """The attempt's outcome to the pool's estimators, then to the request's policy."""
        outcome = ex.outcome(lease, status, error)
        lease.observe(outcome)  # the pool's own estimators: a bug there surfaces as itself
        try:
            ex.policy.observe(outcome)
        except Exception:  # a third-party policy must not break the relay
            log.exception("policy_observe_failed", policy=ex.policy.name)


class Exchange:
    """One proxied request's record: the policy bound to it, what was routed where, and its
    reply; one log line and its metrics once it ends."""

    def __init__(self, route: str, request_id: str, policy: Policy, send: Send) -> None:
        self.route = route
        self.request_id = request_id
        self.policy = policy
        self.started = time.perf_counter()
        self.request: RouteRequest | None = None
        self.decision: Decision | None = None
        self.backend: str | None = None
        self.steps: int | None = None
        self.attempts = 0
        self.attempt_started = self.started
        self.reply = Reply(send, self.started)

    def begin_attempt(self, lease: Lease, decision: Decision) -> None:
        self.attempts += 1
        self.decision = decision
        self.backend = lease.backend.name
        self.steps = lease.backend.steps
        self.attempt_started = time.perf_counter()
        self.reply.new_attempt()

    def headers(self) -> list[tuple[bytes, bytes]]:
        """What every proxied reply says about its routing."""
        headers = [
            (b"x-specroute-policy", self.policy.name.encode()),
            (b"x-request-id", self.request_id.encode()),
        ]
        if self.backend is not None:
            headers.append((b"x-specroute-backend", self.backend.encode()))
            steps = "" if self.steps is None else str(self.steps)
            headers.append((b"x-specroute-steps", steps.encode()))
        return headers

    def outcome(self, lease: Lease, status: int, error: str | None) -> Outcome:
        """The attempt on `lease`'s backend as the estimators and the policy learn it."""
        stream = self.reply.stream
        meter = self.reply.measured
        assert self.request is not None
        return Outcome(
            backend=lease.backend.name,
            steps=self.steps,
            workload_class=self.request.workload_class,
            status=status,
            stream=self.request.stream,
            completion_tokens=meter.completion_tokens,
            prompt_tokens=meter.prompt_tokens,
            chunks=stream.chunks if stream is not None else 0,
            verify_count=meter.verify_ct,
            accept_length=meter.accept_length,
            ttft_s=self._attempt_ttft(),
            chunk_gaps_s=tuple(stream.gaps) if stream is not None else (),
            duration_s=time.perf_counter() - self.attempt_started,
            in_flight_at_start=lease.in_flight_at_start,
            mean_in_flight=lease.mean_in_flight,
            error=error,
        )

    def _attempt_ttft(self) -> float | None:
        """Time from this attempt's start to its first token (the client's `ttft` counts from
        the request's arrival, through admission and earlier attempts)."""
        stream = self.reply.stream
        if stream is None or stream.ttft is None:
            return None
        return stream.ttft - (self.attempt_started - self.started)

    def finish(self, metrics: ProxyMetrics, request_log: RequestLogSampler) -> None:
        """The metrics of this request, and its one log line if `request_log` keeps it."""
        duration = time.perf_counter() - self.started
        reply, request = self.reply, self.request
        backend = self.backend or "-"
        steps = "" if self.steps is None else str(self.steps)
        meter = reply.measured
        ttft = reply.stream.ttft if reply.stream is not None else None
        metrics.requests.inc((self.route, backend, steps, str(reply.status)))
        if self.backend is not None:
            if request is not None:
                metrics.routed.inc((self.policy.name, request.workload_class, steps))
            metrics.duration.observe((backend, steps), duration)
            if ttft is not None:
                metrics.ttft.observe((backend, steps), ttft)
            if meter.completion_tokens:
                metrics.tokens.inc((backend, steps), meter.completion_tokens)
        if not request_log.keep(failed=reply.status >= 400 or reply.error is not None):
            return
        log.info(
            "request_finished",
            request_id=self.request_id,
            route=self.route,
            model=request.model if request else None,
            workload_class=request.workload_class if request else None,
            stream=request.stream if request else None,
            backend=self.backend,
            steps=self.steps,
            policy=self.policy.name,
            reason=self.decision.reason if self.decision else None,
            attempts=self.attempts,
            status=reply.status,
            prompt_tokens=meter.prompt_tokens,
            completion_tokens=meter.completion_tokens,
            ttft_s=None if ttft is None else round(ttft, 6),
            duration_s=round(duration, 6),
            error=reply.error,
        )


def upstream_error(status: int, body: bytes) -> UpstreamError:
    """An upstream 4xx/5xx as our error with the same status and the upstream's message."""
    message, kind = f"backend answered {status}", None
    try:
        data = _upstream_error.decode(body)
    except msgspec.DecodeError:
        # A plain-text refusal (a server's or a load balancer's own page): its first line is
        # the reason, so the client learns why and not only that.
        text = body[:300].decode("utf-8", "replace").strip().splitlines()
        data = {"message": f"{message}: {text[0][:200]}"} if text and text[0].isprintable() else {}
    detail = data.get("error", data)
    if isinstance(detail, dict):
        # OpenAI's and SGLang's {"message"}, or FastAPI's (and Litestar's) {"detail"}.
        reason = detail.get("message") or detail.get("detail")
        message = str(reason) if isinstance(reason, str) and reason else message
        kind = detail.get("type")
    elif isinstance(detail, str):
        message = detail
    exc = UpstreamError(message, status=status)
    exc.error_type = kind if isinstance(kind, str) else "invalid_request_error"
    return exc


def _upstream_headers(auth: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"accept", b"*/*"), *auth]


def _client_left(task: asyncio.Task[Any], reply: Reply) -> None:
    """Cancel the request's task the moment its client goes away."""
    if not reply.finished:
        reply.client_gone = True
        task.cancel()
