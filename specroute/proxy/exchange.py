"""One proxied request's record: what was routed where, what came back, and its single log
line, metrics and `Outcome` once it ends."""

from __future__ import annotations

import time

import structlog

from specroute.policies import Decision, Outcome, RouteRequest
from specroute.pool import Lease
from specroute.proxy.metrics import ProxyMetrics
from specroute.proxy.streaming import ReplyMeter, StreamRelay

__all__ = ["Exchange"]

log = structlog.get_logger()


class Exchange:
    """Mutable per-request state, filled in as the request goes through the relay."""

    def __init__(self, route: str, request_id: str, policy: str) -> None:
        self.route = route
        self.request_id = request_id
        self.policy = policy
        self.started = time.perf_counter()
        self.request: RouteRequest | None = None
        self.model: str | None = None
        self.decision: Decision | None = None
        self.backend: str | None = None
        self.steps: int | None = None
        self.attempts = 0
        self.status = 0
        self.error: str | None = None
        self.committed = False
        self.finished = False
        self.client_gone = False
        self.meter = ReplyMeter()
        self.stream: StreamRelay | None = None
        self.attempt_started = self.started

    def begin_attempt(self, lease: Lease, decision: Decision) -> None:
        self.attempts += 1
        self.decision = decision
        self.backend = lease.backend.name
        self.steps = lease.backend.steps
        self.attempt_started = time.perf_counter()
        self.meter = ReplyMeter()
        self.stream = None

    def backend_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"x-specroute-policy", self.policy.encode()),
            (b"x-request-id", self.request_id.encode()),
        ]
        if self.backend is not None:
            headers.append((b"x-specroute-backend", self.backend.encode()))
            steps = "" if self.steps is None else str(self.steps)
            headers.append((b"x-specroute-steps", steps.encode()))
        return headers

    def outcome(self, lease: Lease, status: int, error: str | None) -> Outcome:
        """The attempt on `lease`'s backend, as the policy learns it; the pool's estimators
        learn it here too, so every attempt teaches them exactly once."""
        outcome = self._outcome(lease, status, error)
        lease.observe(outcome)
        return outcome

    def _outcome(self, lease: Lease, status: int, error: str | None) -> Outcome:
        stream = self.stream
        meter = stream.meter if stream is not None else self.meter
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
            ttft_s=stream.ttft if stream is not None else None,
            chunk_gaps_s=tuple(stream.gaps) if stream is not None else (),
            duration_s=time.perf_counter() - self.attempt_started,
            in_flight_at_start=lease.in_flight_at_start,
            mean_in_flight=lease.mean_in_flight,
            error=error,
        )

    def finish(self, metrics: ProxyMetrics) -> None:
        """The one log line and the metrics of this request."""
        duration = time.perf_counter() - self.started
        backend = self.backend or "-"
        steps = "" if self.steps is None else str(self.steps)
        meter = self.stream.meter if self.stream is not None else self.meter
        ttft = self.stream.ttft if self.stream is not None else None
        metrics.requests.inc((self.route, backend, steps, str(self.status)))
        if self.request is not None and self.backend is not None:
            metrics.routed.inc((self.policy, self.request.workload_class, steps))
        if self.backend is not None:
            metrics.duration.observe((backend, steps), duration)
            if ttft is not None:
                metrics.ttft.observe((backend, steps), ttft)
            if meter.completion_tokens:
                metrics.tokens.inc((backend, steps), meter.completion_tokens)
        request = self.request
        log.info(
            "request_finished",
            request_id=self.request_id,
            route=self.route,
            model=self.model,
            workload_class=request.workload_class if request else None,
            stream=request.stream if request else None,
            backend=self.backend,
            steps=self.steps,
            policy=self.policy,
            reason=self.decision.reason if self.decision else None,
            attempts=self.attempts,
            status=self.status,
            prompt_tokens=meter.prompt_tokens,
            completion_tokens=meter.completion_tokens,
            ttft_s=None if ttft is None else round(ttft, 6),
            duration_s=round(duration, 6),
            error=self.error,
        )
