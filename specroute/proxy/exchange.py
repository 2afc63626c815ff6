"""One proxied request's record: the policy bound to it, what was routed where and how the
attempt went (its `Outcome` for the estimators and the policy), and its reply; one log line
and its metrics once it ends."""

from __future__ import annotations

import time

import structlog

from specroute.lanes import LANES
from specroute.policies import Decision, Outcome, Policy, RouteRequest
from specroute.pool import Lease, UpstreamFailure
from specroute.proxy.intake import Send
from specroute.proxy.lane_stats import LaneStats
from specroute.proxy.lanes import LANE_HEADER, decode_speed
from specroute.proxy.metrics import ProxyMetrics
from specroute.proxy.migrate import Migration
from specroute.proxy.reply import Reply
from specroute.proxy.request_log import RequestLogSampler
from specroute.proxy.resend import Resend

__all__ = ["Exchange"]

log = structlog.get_logger()

_LANE_BYTES: dict[str, bytes] = {lane: lane.encode() for lane in LANES}


class Exchange:
    """One proxied request's record: the policy bound to it, what was routed where, and its
    reply; one log line and its metrics once it ends."""

    def __init__(self, route: str, request_id: str, policy: Policy, send: Send) -> None:
        self.route = route
        self.method = "POST"
        self.path = ""
        self.generates = True
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
        self.ended: float | None = None  # when the reply ended (`finish`)
        self.failure: tuple[str, UpstreamFailure] | None = None  # the last attempt's, by backend
        self.reply = Reply(send, self.started)
        self.migration: Migration | None = None  # a stream that may move if its backend fails
        self.resend: Resend | None = None  # a non-streamed request that may move

    def begin_attempt(self, lease: Lease, decision: Decision) -> None:
        self.attempts += 1
        self.decision = decision
        now = time.perf_counter()
        if self.admitted is None:
            self.admitted = now
        self.backend = lease.backend.name
        self.steps = lease.backend.steps
        self.attempt_started = now
        self.reply.new_attempt()

    def headers(self) -> list[tuple[bytes, bytes]]:
        """What every proxied reply says about its routing."""
        policy = (b"x-specroute-policy", self.policy.name.encode())
        request_id = (b"x-request-id", self.request_id.encode())
        if self.request is None:
            return [policy, request_id]
        lane = (LANE_HEADER, _LANE_BYTES[self.request.lane])
        if self.backend is None:
            return [policy, request_id, lane]
        steps = b"" if self.steps is None else str(self.steps).encode()
        return [
            policy,
            request_id,
            lane,
            (b"x-specroute-backend", self.backend.encode()),
            (b"x-specroute-steps", steps),
        ]

    def outcome(self, lease: Lease, status: int, error: str | None) -> Outcome:
        """The attempt on `lease`'s backend as the estimators and the policy learn it."""
        stream = self.reply.stream
        meter = self.reply.measured
        assert self.request is not None
        prompt, completion = meter.prompt_tokens, meter.completion_tokens
        moved = self.migration.relayed if self.migration is not None else 0
        if moved and prompt is not None and completion is not None:
            # A continuation's backend read the text relayed before the move as prompt.
            prompt, completion = prompt + moved, completion - moved
        return Outcome(
            backend=lease.backend.name,
            steps=self.steps,
            workload_class=self.request.workload_class,
            status=status,
            stream=self.request.stream,
            completion_tokens=completion,
            prompt_tokens=prompt,
            chunks=stream.chunks if stream is not None else 0,
            verify_count=meter.verify_ct,
            accepted_drafts=meter.accepted_drafts,
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

    def arrive(self, request: RouteRequest, lanes: LaneStats) -> None:
        """The request is read: it is in its lane's load until `finish_lane`."""
        self.request = request
        lanes.arrive(request.lane, request.workload_class)

    def finish_lane(self, lanes: LaneStats) -> None:
        """The request leaves its lane's load; what it got: its queue wait and a stream's
        decode speed."""
        if self.request is None:
            return
        lanes.leave(self.request.lane, self.request.workload_class)
        if self.admitted is None or self.reply.status != 200:
            return
        stream = self.reply.stream
        ttft = stream.ttft if stream is not None else None
        end = (self.ended or time.perf_counter()) - self.started
        tokens = self.reply.measured.completion_tokens
        lanes.observe(
            self.request.lane, self.admitted - self.started, decode_speed(tokens, ttft, end)
        )

    def finish(self, metrics: ProxyMetrics, request_log: RequestLogSampler) -> None:
        """The metrics of this request, and its one log line if `request_log` keeps it."""
        self.ended = time.perf_counter()
        duration = self.ended - self.started
        reply, request = self.reply, self.request
        backend = self.backend or "-"
        steps = "" if self.steps is None else str(self.steps)
        meter = reply.measured
        ttft = reply.stream.ttft if reply.stream is not None else None
        if self.migration is not None and self.migration.moves:
            ttft = self.migration.ttft  # the client's, from the backend that began the reply
        metrics.requests.inc((self.route, backend, steps, str(reply.status)))
        if self.backend is not None:
            if request is not None and self.generates:  # forwarded routes have no class
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
