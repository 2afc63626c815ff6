"""How long each wait on one backend may last for one request, from its first try: predicted
from the backend's iteration-time fit (its prior before anything is learned), its load and the
request's prompt and `max_tokens`, times a margin; widened by the backend's own learned quiet
times once it has shown enough. Pure arithmetic, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specroute.config import TimeoutConfig
from specroute.policies import RouteRequest
from specroute.pool.backend import Backend
from specroute.pool.estimators import DurationHistogram, IterationTimeModel, StallRule
from specroute.pool.telemetry import Telemetry

__all__ = ["BYTES_PER_TOKEN", "AttemptLimits", "Deadlines", "Load", "attempt_limits"]

BYTES_PER_TOKEN = 3.0
"""Request-body bytes per prompt token, on the low side so that the prompt's tokens (and its
prefill) are overestimated: English runs about 4 bytes a token, JSON adds its keys."""


@dataclass(frozen=True, slots=True)
class Load:
    """What the proxy knows of the backend as the request is sent."""

    in_flight: int
    """Requests on it from this proxy, this one included."""
    capacity: int | None
    """Its max_running_requests (None: unknown, so no queue is predicted)."""
    steps: int
    """Its speculative depth (0: none): tokens in the batch per running request, less one."""
    mean_tokens: float
    """Completion tokens a request of this class is expected to generate."""


@dataclass(frozen=True, slots=True)
class AttemptLimits:
    """The limits of one attempt, in seconds."""

    header_s: float
    """Until the reply's status line and headers are in."""
    first_s: float
    """A stream: quiet before its first event."""
    gap_s: float
    """A stream: quiet between events until the backend's gaps are learned."""
    reply_s: float
    """A non-streamed reply: until its last byte."""


class Deadlines:
    """The limits for each attempt. A stream's headers come within `header_s`: SGLang sends
    them before it queues or prefills. Its first event within the predicted prefill of its
    prompt plus the predicted queue wait, times `margin`, plus `first_token_floor_s`; its
    events at most `margin` predicted iterations (at a full batch) apart, never below
    `stall_floor_s`. A non-streamed reply has its headers with its end, so one deadline covers
    both: the first-token limit plus `max_tokens` predicted iterations times `margin`. Learned
    quiet times only widen a limit (a learned p99 includes what the prediction leaves out);
    `first_byte_s`, `idle_s` and `reply_s` bound everything."""

    __slots__ = ("_config", "first_rule", "gap_rule")

    def __init__(self, config: TimeoutConfig) -> None:
        self._config = config
        self.first_rule = StallRule(
            config.stall_factor, config.first_token_floor_s, config.first_byte_s
        )
        self.gap_rule = StallRule(config.stall_factor, config.stall_floor_s, config.idle_s)

    def for_attempt(
        self,
        *,
        stream: bool,
        prompt_bytes: int,
        max_tokens: int | None,
        iteration: IterationTimeModel,
        load: Load,
        first_seen: DurationHistogram,
    ) -> AttemptLimits:
        # Every request computes this: plain arithmetic, with no call it can do without.
        c = self._config
        a, per_token = iteration.intercept, iteration.slope
        tokens_per_request = load.steps + 1
        in_flight = load.in_flight if load.in_flight > 1 else 1
        cap = load.capacity or 0
        full = cap if cap else in_flight
        iteration_full_s = a + per_token * full * tokens_per_request
        prefill_s = a + per_token * prompt_bytes / BYTES_PER_TOKEN
        # Batches that must finish before the request runs: none below capacity.
        over = load.in_flight - cap if cap else 0
        waves = math.ceil(over / cap) if over > 0 else 0
        queue_s = waves * load.mean_tokens * iteration_full_s
        first_s = min(c.first_byte_s, c.first_token_floor_s + c.margin * (prefill_s + queue_s))
        learned = self.first_rule.learned_s(first_seen)
        if learned is not None:
            first_s = max(first_s, learned)
        gap_s = min(c.idle_s, max(c.stall_floor_s, c.margin * iteration_full_s))
        running = full if full < in_flight else in_flight
        decode_s = (max_tokens or c.assumed_max_tokens) * (
            a + per_token * running * tokens_per_request
        )
        reply_s = min(c.reply_s, first_s + c.margin * decode_s)
        header_s = c.header_s if stream else reply_s
        return AttemptLimits(header_s=header_s, first_s=first_s, gap_s=gap_s, reply_s=reply_s)


def attempt_limits(
    deadlines: Deadlines,
    telemetry: Telemetry,
    backend: Backend,
    in_flight: int,
    request: RouteRequest,
    body_bytes: int,
) -> AttemptLimits:
    """The limits of `request` (its body `body_bytes` long) sent to `backend` with `in_flight`
    requests on it, from what `telemetry` knows of the backend and of the request's class."""
    steps = backend.steps or 0
    return deadlines.for_attempt(
        stream=request.stream,
        prompt_bytes=body_bytes,
        max_tokens=request.max_tokens,
        iteration=telemetry.iteration_model(backend.name, steps),
        load=Load(
            in_flight=in_flight,
            capacity=backend.capacity,
            steps=steps,
            mean_tokens=telemetry.lengths.get(request.workload_class),
        ),
        first_seen=telemetry.stream_times(backend.name).first,
    )
