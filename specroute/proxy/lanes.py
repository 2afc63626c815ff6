"""The proxy's side of latency lanes: each request's lane from its key, its headers and its
`service_tier`; the engine `priority` it is forwarded with; and what each lane got (speed
against its target, queue wait) for `/metrics` and `/pool`."""

from __future__ import annotations

from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from specroute.lanes import BATCH, INTERACTIVE, LANES, Lane, LanesConfig, lane_of
from specroute.proxy.auth import Auth, bearer, matches
from specroute.proxy.metrics import LATENCY_BUCKETS, Counter, Histogram

__all__ = [
    "LANE_HEADER",
    "LaneReport",
    "LaneResolver",
    "LaneStats",
    "decode_speed",
    "with_priority",
]

LANE_HEADER = b"x-specroute-lane"
"""The request header a trusted key names its lane with, and the reply header that says it."""

SPEED_BUCKETS = (5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 125.0, 150.0, 200.0, 300.0, 500.0)
"""Per-request decode speeds, tokens per second."""


class LaneResolver:
    """Picks each request's lane (`specroute.lanes.lane_of`): the header only from a key that
    may name its class, as `x-specroute-class`; a key's configured lane; `service_tier`."""

    __slots__ = ("_auth", "_batch", "_interactive", "config")

    def __init__(self, config: LanesConfig, auth: Auth) -> None:
        self.config = config
        self._auth = auth
        self._interactive = tuple(k.encode() for k in config.interactive_keys)
        self._batch = tuple(k.encode() for k in config.batch_keys)

    def resolve(
        self, authorization: bytes | None, lane_header: bytes | None, tier: str | None
    ) -> Lane:
        trusted = lane_header is not None and self._auth.may_name_class(authorization)
        return lane_of(
            self.config,
            header=lane_header,
            trusted=trusted,
            key_lane=self._key_lane(authorization),
            tier=tier,
        )

    def _key_lane(self, authorization: bytes | None) -> Lane | None:
        if not (self._interactive or self._batch):
            return None
        token = bearer(authorization)
        if token is None:
            return None
        if matches(token, self._interactive):
            return INTERACTIVE
        return BATCH if matches(token, self._batch) else None


def with_priority(body: bytes, given: object, priority: int) -> bytes:
    """`body` with its top-level `priority` set to `priority`: appended when the client sent
    none (`given` unset), re-encoded when it sent another (the lane decides, not the client)."""
    if given == priority:
        return body
    if given is msgspec.UNSET:
        head = body.rstrip()[:-1].rstrip()
        sep = b"" if head.endswith(b"{") else b","
        return b"".join((head, sep, b'"priority":', str(priority).encode(), b"}"))
    data = msgspec.json.decode(body)
    data["priority"] = priority
    return msgspec.json.encode(data)


class LaneReport(msgspec.Struct, frozen=True, kw_only=True):
    """One lane in `/pool`: requests, how many met the lane's target, mean decode speed and
    mean and longest queue wait since start."""

    requests: int = 0
    target_tok_s: float = 0.0
    met: int = 0
    missed: int = 0
    attainment: float | None = None
    mean_tok_s: float | None = None
    mean_wait_s: float | None = None
    max_wait_s: float = 0.0


class _Totals:
    __slots__ = ("max_wait", "met", "missed", "requests", "speed_n", "speed_sum", "wait_sum")

    def __init__(self) -> None:
        self.requests = self.met = self.missed = self.speed_n = 0
        self.speed_sum = self.wait_sum = self.max_wait = 0.0


class LaneStats:
    """Per lane: requests by whether their decode speed met the target, the speed and the
    queue wait (from arrival to the first attempt) as Prometheus histograms and as totals."""

    def __init__(self, registry: CollectorRegistry, target_tok_s: float) -> None:
        self.target_tok_s = target_tok_s
        self.requests = Counter(
            registry,
            "specroute_lane_requests_total",
            "Requests answered per lane, by whether their decode speed met the lane's target "
            "(met, missed; unmeasured: too few tokens to time).",
            ("lane", "target"),
        )
        self.speed = Histogram(
            registry,
            "specroute_lane_request_tokens_per_second",
            "Per-request decode speed (completion tokens after the first over their time).",
            ("lane",),
            SPEED_BUCKETS,
        )
        self.wait = Histogram(
            registry,
            "specroute_lane_queue_wait_seconds",
            "Time from a request's arrival to its first attempt on a backend.",
            ("lane",),
            LATENCY_BUCKETS,
        )
        self._totals = {lane: _Totals() for lane in LANES}

    def target(self, lane: Lane) -> float:
        return self.target_tok_s if lane == INTERACTIVE else 0.0

    def observe(self, lane: Lane, wait_s: float, speed: float | None) -> None:
        """One answered request: its queue wait and its decode speed (None: not measured)."""
        totals = self._totals[lane]
        totals.requests += 1
        totals.wait_sum += wait_s
        totals.max_wait = max(totals.max_wait, wait_s)
        self.wait.observe((lane,), wait_s)
        if speed is None:
            self.requests.inc((lane, "unmeasured"))
            return
        self.speed.observe((lane,), speed)
        totals.speed_n += 1
        totals.speed_sum += speed
        met = speed >= self.target(lane)
        totals.met += met
        totals.missed += not met
        self.requests.inc((lane, "met" if met else "missed"))

    def report(self) -> dict[str, Any]:
        """Each lane's `LaneReport`, as `/pool` shows it."""
        return {lane: msgspec.to_builtins(self._report(lane)) for lane in LANES}

    def _report(self, lane: Lane) -> LaneReport:
        t = self._totals[lane]
        judged = t.met + t.missed
        return LaneReport(
            requests=t.requests,
            target_tok_s=self.target(lane),
            met=t.met,
            missed=t.missed,
            attainment=t.met / judged if judged else None,
            mean_tok_s=t.speed_sum / t.speed_n if t.speed_n else None,
            mean_wait_s=t.wait_sum / t.requests if t.requests else None,
            max_wait_s=t.max_wait,
        )


def decode_speed(tokens: int | None, first_token_s: float | None, end_s: float) -> float | None:
    """Completion tokens after the first over the time from the first token to the end, both
    from the request's arrival: a stream's own decode speed (None: too little to time)."""
    if tokens is None or tokens < 2 or first_token_s is None or end_s <= first_token_s:
        return None
    return (tokens - 1) / (end_s - first_token_s)
