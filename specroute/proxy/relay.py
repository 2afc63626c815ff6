"""The relay: one ASGI handler for the proxied routes, a request's life top to bottom. It reads
the request (`intake`), binds the current policy to it, routes it, forwards the client's bytes,
retries failures that happen before the first byte reaches the client, hands the reply over
(`reply`, within the limits `pool.deadlines` fits to the request and its backend), and keeps
the request's record: one log line, its metrics, an `Outcome` per attempt, and the breaker of a
backend that stalled or answered what the route does not promise."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog

from specroute.errors import (
    NoHealthyBackendError,
    SpecrouteError,
)
from specroute.policies import Decision, Outcome, Policy, RouteRequest
from specroute.pool import (
    AttemptLimits,
    BadReply,
    Deadlines,
    Lease,
    ReplyTooLarge,
    Stalled,
    UpstreamFailure,
    UpstreamResponse,
    attempt_limits,
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
from specroute.proxy.lanes import LANE_HEADER, LaneStats, decode_speed
from specroute.proxy.metrics import ProxyMetrics
from specroute.proxy.reply import Reply, shutting_down
from specroute.proxy.stalls import StreamClock
from specroute.proxy.state import ProxyState
from specroute.proxy.upstream_errors import attempt_error, upstream_error

__all__ = ["RELAY_PATHS", "Exchange", "Receive", "Relay", "Scope", "Send"]

log = structlog.get_logger()

RELAY_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/generate": "generate",
}
_UPSTREAM_PATH = {route: path for path, route in RELAY_PATHS.items()}
_KIND = {True: "stream", False: "request for JSON"}


class Relay:
    """The proxied routes: chat completions, completions and SGLang's native /generate."""

    def __init__(self, state: ProxyState) -> None:
        self._state = state
        ignored = state.metrics.class_ignored
        self._intake = Intake(
            state.config, state.pool, state.auth, lambda reason: ignored.inc((reason,))
        )
        self._deadlines = Deadlines(state.config.timeouts)
        self._max_reply_bytes = state.config.limits.max_reply_bytes
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
            ex.finish(state.metrics)
            ex.finish_lane(state.lanes)

    async def _forward(self, ex: Exchange, incoming: Incoming) -> None:
        """Attempts on distinct backends while failures happen before the first byte."""
        state = self._state
        retry = state.config.retry
        request, policy = incoming.request, ex.policy
        tried: list[str] = []
        for attempt in range(1, retry.max_attempts + 1):
            try:
                lease, decision = await state.admission.admit(request, policy, tried)
            except NoHealthyBackendError:
                if ex.failure is None:
                    raise
                # The failure that took the last backend out says more than "none left".
                raise attempt_error(*ex.failure) from ex.failure[1]
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
        # To the breaker: success, failure, a stall or a bad reply, or no verdict.
        verdict: bool | Stalled | BadReply | None = None
        status, error = 0, None
        state = self._state
        limits = attempt_limits(
            self._deadlines,
            state.pool.telemetry,
            backend,
            lease.in_flight_at_start,
            incoming.request,
            len(incoming.body),
        )
        try:
            upstream = await state.client.send(
                "POST",
                backend.url + _UPSTREAM_PATH[ex.route],
                incoming.body,
                _upstream_headers(backend.auth_headers),
                limits.header_s,
            )
            status = upstream.status
            if status >= 500 or status == 429:
                verdict = status == 429  # overload is not a broken backend
                error = f"upstream status {status}"
                detail = await upstream.read(limits.first_s, self._max_reply_bytes)
                if not last:
                    return f"status_{status}"
                raise upstream_error(status, detail)
            if status >= 400:
                verdict = True
                raise upstream_error(
                    status, await upstream.read(limits.first_s, self._max_reply_bytes)
                )
            await self._reply(ex, upstream, incoming, limits)
            verdict = ex.reply.error is None
            return None
        except UpstreamFailure as exc:
            verdict, error = _verdict(exc), str(exc)
            ex.failure = (backend.name, exc)
            if ex.reply.committed:
                return None
            if not last and not isinstance(exc, ReplyTooLarge):
                return type(exc).__name__  # the client has nothing yet: another may answer
            raise attempt_error(backend.name, exc) from exc
        finally:
            lease.release()
            self._judge(lease, verdict)
            if upstream is not None:
                await upstream.aclose()
            self._learn(ex, lease, status, error or ex.reply.error)

    async def _reply(
        self, ex: Exchange, upstream: UpstreamResponse, incoming: Incoming, limits: AttemptLimits
    ) -> None:
        """The reply the route promises: an event stream to a streamed request, a whole
        body to any other; a 200 of another kind is the backend's fault (BadReply)."""
        streamed = upstream.content_type.startswith(b"text/event-stream")
        if upstream.status == 200 and streamed != incoming.request.stream:
            kind = upstream.content_type[:60].decode("latin-1")
            raise BadReply(f"the backend answered a {_KIND[incoming.request.stream]} with {kind}")
        if upstream.status == 200 and streamed:
            state = self._state
            assert ex.backend is not None
            times = state.pool.telemetry.stream_times(ex.backend)
            clock = StreamClock(
                state.config.timeouts.heartbeat_s,
                limits.first_s,
                partial(self._deadlines.gap_rule.limit_s, times.gaps, unlearned_s=limits.gap_s),
            )
            limits_config = state.config.limits
            await ex.reply.send_stream(
                upstream,
                incoming.extras,
                ex.headers(),
                clock,
                limits_config.client_stall_s,
                limits_config.max_event_bytes,
            )
        else:
            await ex.reply.send_whole(
                upstream, incoming.extras, ex.headers(), limits.reply_s, self._max_reply_bytes
            )

    def _judge(self, lease: Lease, verdict: bool | Stalled | BadReply | None) -> None:
        """The attempt's verdict to its backend's breaker; a stall or a bad reply also to its
        health."""
        backend = lease.backend
        if isinstance(verdict, Stalled):
            self._state.metrics.stalls.inc((backend.name, verdict.phase))
            self._state.pool.stalled(backend, verdict.phase, verdict.limit_s)
        elif isinstance(verdict, BadReply):
            self._state.pool.misbehaved(backend, str(verdict))
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
        self.admitted: float | None = None  # when the first attempt began
        self.failure: tuple[str, UpstreamFailure] | None = None  # the last attempt's, by backend
        self.reply = Reply(send, self.started)

    def begin_attempt(self, lease: Lease, decision: Decision) -> None:
        self.attempts += 1
        self.decision = decision
        if self.admitted is None:
            self.admitted = time.perf_counter()
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
        if self.request is not None:
            headers.append((LANE_HEADER, self.request.lane.encode()))
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
            lane=self.request.lane,
        )

    def _attempt_ttft(self) -> float | None:
        """Time from this attempt's start to its first token (the client's `ttft` counts from
        the request's arrival, through admission and earlier attempts)."""
        stream = self.reply.stream
        if stream is None or stream.ttft is None:
            return None
        return stream.ttft - (self.attempt_started - self.started)

    def finish_lane(self, lanes: LaneStats) -> None:
        """What the request's lane got: its queue wait and a stream's decode speed."""
        if self.request is None or self.admitted is None or self.reply.status != 200:
            return
        stream = self.reply.stream
        ttft = stream.ttft if stream is not None else None
        end = time.perf_counter() - self.started
        tokens = self.reply.measured.completion_tokens
        lanes.observe(
            self.request.lane, self.admitted - self.started, decode_speed(tokens, ttft, end)
        )

    def finish(self, metrics: ProxyMetrics) -> None:
        """The one log line and the metrics of this request."""
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


def _verdict(exc: UpstreamFailure) -> bool | Stalled | BadReply | None:
    """A failed attempt's verdict on its backend: a reply too large for the proxy is no fault
    of the backend's."""
    if isinstance(exc, Stalled | BadReply):
        return exc
    return None if isinstance(exc, ReplyTooLarge) else False


def _upstream_headers(auth: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"accept", b"*/*"), *auth]


def _client_left(task: asyncio.Task[Any], reply: Reply) -> None:
    """Cancel the request's task the moment its client goes away."""
    if not reply.finished:
        reply.client_gone = True
        task.cancel()
