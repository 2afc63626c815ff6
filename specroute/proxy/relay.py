"""The relay: one ASGI handler for the proxied routes, a request's life top to bottom. It reads
the request (`intake`), binds the current policy to it, routes it, forwards the client's bytes,
retries failures that happen before the first byte reaches the client, moves a stream that
fails after it (or whose backend drains) to another backend (`moving`), sends a non-streamed
request whose backend fails after taking it (or drains) to another (`resend`), hands the reply over
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
from specroute.policies import Decision
from specroute.pool import (
    AttemptLimits,
    Backend,
    BadReply,
    Deadlines,
    Lease,
    ReplyTooLarge,
    Stalled,
    UpstreamFailure,
    UpstreamResponse,
    attempt_limits,
)
from specroute.proxy.chunks import EventFilter
from specroute.proxy.continued import Continued, Tap
from specroute.proxy.exchange import Exchange
from specroute.proxy.formats import EVENT_APIS, ApiEventFilter, measure_whole, render_error
from specroute.proxy.intake import (
    ClientGone,
    Incoming,
    Intake,
    Receive,
    Scope,
    Send,
    client_key,
    disconnect_signal,
    header,
    request_id,
    watch_disconnect,
)
from specroute.proxy.migrate import MIGRATING_ROUTES, Migration, Moved, move_due
from specroute.proxy.moving import Mover, upstream_headers
from specroute.proxy.reply import Reply, shutting_down
from specroute.proxy.resend import RESENT, DrainWatch, Resend, Resender
from specroute.proxy.routes import STORED_RESPONSE, Route, stored_response_id, upstream_path
from specroute.proxy.stalls import StreamClock
from specroute.proxy.state import ProxyState
from specroute.proxy.stored import ResponseHomes, gone, locate
from specroute.proxy.upstream_errors import attempt_error, upstream_error

__all__ = ["Receive", "Relay", "Scope", "Send"]

log = structlog.get_logger()

_KIND = {True: "stream", False: "request for JSON"}


class Relay:
    """The proxied routes (`routes`): generation routed by the policy, stored responses to
    the backend that holds them, the other inference routes to any healthy backend."""

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
        self.homes = ResponseHomes()
        self._mover = Mover(state, self._attempt)
        self._resender = Resender(state.metrics)
        self._drain_watch = DrainWatch(state.pool.holds, state.config.migration.drain_s)

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

    async def handle(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        # The policy is bound once, as the request comes in: a switch while it is in flight
        # leaves its routing, retries, headers and observation all with this one.
        ex = Exchange(route.kind, request_id(header(scope, b"x-request-id")), state.policy, send)
        ex.method, ex.path, ex.generates = scope["method"], route.path, route.generates
        reply = ex.reply
        if route.kind in ("messages", "count_tokens"):  # Anthropic's clients
            reply.render_error = partial(render_error, route.kind)
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
            state.auth.check(client_key(scope))
            incoming = await self._intake.read(route.kind, scope, receive, body)
            if route.kind == STORED_RESPONSE:
                incoming = incoming._replace(continues=stored_response_id(ex.method, ex.path))
            ex.arrive(incoming.request, state.lanes)
            stop_watching = watch_disconnect(signal, receive, partial(_client_left, task, reply))
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
        except Exception:  # the last resort: a bug (ours or a plug-in's), not the client's
            log.exception("request_failed", request_id=ex.request_id, route=route)
            await reply.send_error(SpecrouteError("internal error"), ex.headers())
        finally:
            body.release()
            del self._open[task]
            if self._idle is not None and not self._open:
                self._idle.set()
            if stop_watching is not None:
                stop_watching()
            ex.finish(state.metrics, state.request_log)
            ex.finish_lane(state.lanes)

    async def _forward(self, ex: Exchange, incoming: Incoming) -> None:
        """Attempts on distinct backends while failures happen before the first byte."""
        state = self._state
        retry = state.config.retry
        request, policy = incoming.request, ex.policy
        tried: list[str] = []
        home = None if incoming.continues is None else await self._home(incoming.continues)
        limit = state.config.migration.max_moves
        if limit and ex.route in MIGRATING_ROUTES:
            if request.stream:
                ex.migration = Migration(ex.route, incoming.body, limit)
                ex.reply.resumable = True
            else:  # the client sees nothing before the end: the whole request may move
                ex.resend = Resend(limit, ex.started, state.config.timeouts.reply_s)
        attempt = 1
        while attempt <= retry.max_attempts:
            if home is not None:  # the stored response is there and nowhere else: no retry
                lease = state.pool.lease(home)
                decision = Decision(backend=home.name, reason="stored response lives here")
            else:
                try:
                    lease, decision = await state.admission.admit(request, policy, tried)
                except SpecrouteError as exc:
                    self._resender.settle(ex.request_id, ex.resend, None)  # a move's: no_backend
                    if ex.failure is None or not isinstance(exc, NoHealthyBackendError):
                        raise
                    # The failure that took the last backend out says more than "none left".
                    raise attempt_error(*ex.failure) from ex.failure[1]
            backend = lease.backend
            ex.begin_attempt(lease, decision)
            self._resender.settle(ex.request_id, ex.resend, backend.name)
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
            last = home is not None or attempt == retry.max_attempts
            reason = await self._attempt(ex, lease, incoming, last)
            if reason is None:
                if ex.reply.held is not None:  # failed mid-stream: move it, or end it
                    await self._mover.migrate(ex, incoming, tried)
                return
            if reason == RESENT:  # a move, not a retry: its own bound (`migration.max_moves`)
                continue
            state.metrics.retries.inc((backend.name, reason))
            log.info(
                "upstream_retried", request_id=ex.request_id, backend=backend.name, reason=reason
            )
            await asyncio.sleep(min(retry.backoff_s * 2 ** (attempt - 1), retry.backoff_max_s))
            attempt += 1

    async def _home(self, response_id: str) -> Backend:
        """The backend that stores `response_id`: remembered, else found by asking; an
        OpenAI-shaped 404 (or 503 while it is unhealthy) when it cannot be reached."""
        state = self._state
        name = self.homes.home(response_id)
        if name is None:
            name = await locate(response_id, state.pool, state.client)
            if name is not None:
                self.homes.remember(response_id, name)
        error = gone(response_id, name, state.pool)
        if error is not None:
            raise error
        assert name is not None
        return state.pool.by_name[name]

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
        if ex.resend is not None:
            limits = ex.resend.bound(limits)
        try:
            sending = state.client.send(
                ex.method,
                backend.url + upstream_path(ex.path, backend.engine),
                incoming.body,
                upstream_headers(backend.auth_headers),
                limits.header_s,
            )
            if ex.resend is not None:  # its reply's headers come with its end
                sending = self._drain_watch.wait(sending, backend.name)
            upstream = await sending
            status = upstream.status
            if not ex.generates and status < 500:  # the backend's own answer, as it came
                verdict = status < 400 or status == 404
                idle_s = self._state.config.timeouts.idle_s
                await ex.reply.send_passthrough(upstream, ex.headers(), idle_s)
                return None
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
            response_id = ex.reply.measured.response_id
            if response_id is not None and ex.route == "responses" and verdict:
                self.homes.remember(response_id, backend.name)
            return None
        except UpstreamFailure as exc:
            verdict, error = _verdict(exc), str(exc)
            ex.failure = (backend.name, exc)
            if ex.reply.committed:
                return None
            moves = self._resender.failed(ex.request_id, ex.resend, backend.name, exc)
            if moves:
                return RESENT
            if moves is False:  # a move's failure with no move left
                raise attempt_error(backend.name, exc) from exc
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
            max_event = limits_config.max_event_bytes
            stream = _stream_relay(ex, incoming, max_event)
            mig = ex.migration
            if mig is not None:  # a drain moves it at its deadline, if it can move
                holds, after_s = state.pool.holds, state.config.migration.drain_s
                ex.reply.move_check = partial(move_due, mig, holds, ex.backend, after_s)
            await ex.reply.send_stream(
                upstream, stream, ex.headers(), clock, limits_config.client_stall_s
            )
        else:
            measure = measure_whole if ex.route in EVENT_APIS else None
            await ex.reply.send_whole(
                upstream,
                incoming.extras,
                ex.headers(),
                limits.reply_s,
                self._max_reply_bytes,
                measure,
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
        """The attempt's outcome to the pool's estimators, then to the request's policy;
        routes that generate nothing teach them nothing."""
        if not ex.generates or ex.request is None:
            return
        outcome = ex.outcome(lease, status, error)
        lease.observe(outcome)  # the pool's own estimators: a bug there surfaces as itself
        try:
            ex.policy.observe(outcome)
        except Exception:  # a third-party policy must not break the relay
            log.exception("policy_observe_failed", policy=ex.policy.name)


def _stream_relay(ex: Exchange, incoming: Incoming, max_event: int | None) -> EventFilter:
    """The relay of a stream's events: one that keeps what a migration needs only for a
    request that may move, one that rewrites the events of a continuation."""
    mig = ex.migration
    if ex.route in EVENT_APIS:
        return ApiEventFilter(ex.route, incoming.extras, ex.started, max_event)
    if mig is None:
        return EventFilter(incoming.extras, ex.started, max_event)
    if mig.moves == 0:
        return Tap(mig, incoming.extras, ex.started, max_event)
    return Continued(mig, mig.relayed, incoming.extras, ex.started, max_event)


def _verdict(exc: UpstreamFailure) -> bool | Stalled | BadReply | None:
    """A failed attempt's verdict on its backend: a reply too large for the proxy is no fault
    of the backend's."""
    if isinstance(exc, Stalled | BadReply):
        return exc
    return None if isinstance(exc, ReplyTooLarge | Moved) else False


def _client_left(task: asyncio.Task[Any], reply: Reply) -> None:
    """Cancel the request's task the moment its client goes away."""
    if not reply.finished:
        reply.client_gone = True
        task.cancel()
