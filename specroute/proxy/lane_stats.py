"""What each latency lane gets: its load now (requests in flight, by workload class), target
attainment, and the per-request decode speeds and queue waits of its recent requests, for
`/metrics`, `/pool` (the depth planner reads the load there) and the dashboard."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from specroute.lanes import INTERACTIVE, LANES, Lane
from specroute.proxy.metrics import LATENCY_BUCKETS, Counter, Histogram
from specroute.wire import LaneSnapshot

__all__ = ["QUANTILES", "RECENT", "SPEED_BUCKETS", "LaneStats", "quantile"]

SPEED_BUCKETS = (5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 125.0, 150.0, 200.0, 300.0, 500.0)
"""Per-request decode speeds, tokens per second."""
RECENT = 1000
"""Requests per lane whose speed and wait the percentiles are taken over."""
QUANTILES = (50, 90, 99)


def quantile(values: list[float], q: int) -> float | None:
    """The q-th percentile of `values` by linear interpolation between closest ranks (the
    method of `specroute.bench.stats.percentile`, which the proxy may not import); None when
    there are none."""
    if not values:
        return None
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class _Lane:
    """One lane's counts since start, its load now and its recent requests."""

    __slots__ = ("classes", "max_wait", "met", "missed", "requests", "speed_n", "speed_sum",
                 "speeds", "wait_sum", "waits")  # fmt: skip

    def __init__(self) -> None:
        self.requests = self.met = self.missed = self.speed_n = 0
        self.speed_sum = self.wait_sum = self.max_wait = 0.0
        self.classes: dict[str, int] = {}
        self.speeds: collections.deque[float] = collections.deque(maxlen=RECENT)
        self.waits: collections.deque[float] = collections.deque(maxlen=RECENT)

    @property
    def in_flight(self) -> int:
        return sum(self.classes.values())


class LaneStats:
    """Per lane: requests by whether their decode speed met the target, the speed and the
    queue wait (from arrival to the first attempt) as Prometheus histograms, totals and
    recent percentiles, and the requests in flight now (`arrive` .. `leave`, in `finally`)."""

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
        self._lanes = {lane: _Lane() for lane in LANES}
        registry.register(_LaneGauges(self))

    def target(self, lane: Lane) -> float:
        return self.target_tok_s if lane == INTERACTIVE else 0.0

    def arrive(self, lane: Lane, klass: str) -> None:
        """A request of `lane` came in (it is in flight until `leave`)."""
        classes = self._lanes[lane].classes
        classes[klass] = classes.get(klass, 0) + 1

    def leave(self, lane: Lane, klass: str) -> None:
        """The request `arrive` counted has ended, however it ended."""
        classes = self._lanes[lane].classes
        left = classes.get(klass, 0) - 1
        if left > 0:
            classes[klass] = left
        else:
            classes.pop(klass, None)

    def observe(self, lane: Lane, wait_s: float, speed: float | None) -> None:
        """One answered request: its queue wait and its decode speed (None: not measured)."""
        totals = self._lanes[lane]
        totals.requests += 1
        totals.wait_sum += wait_s
        if wait_s > totals.max_wait:
            totals.max_wait = wait_s
        totals.waits.append(wait_s)
        self.wait.observe((lane,), wait_s)
        if speed is None:
            self.requests.inc((lane, "unmeasured"))
            return
        self.speed.observe((lane,), speed)
        totals.speeds.append(speed)
        totals.speed_n += 1
        totals.speed_sum += speed
        met = speed >= (self.target_tok_s if lane == INTERACTIVE else 0.0)  # `target`
        totals.met += met
        totals.missed += not met
        self.requests.inc((lane, "met" if met else "missed"))

    def report(self, waiting: Mapping[str, int] | None = None) -> dict[str, LaneSnapshot]:
        """Each lane as `/pool` shows it; `waiting`: its requests in the admission queue."""
        waiting = waiting or {}
        return {lane: self.snapshot(lane, waiting.get(lane, 0)) for lane in LANES}

    def recent(self, lane: Lane) -> tuple[list[float], list[float]]:
        """The decode speeds and queue waits of the lane's last `RECENT` requests."""
        t = self._lanes[lane]
        return list(t.speeds), list(t.waits)

    def snapshot(self, lane: Lane, waiting: int = 0) -> LaneSnapshot:
        """One lane now; `waiting`: its requests in the admission queue."""
        t = self._lanes[lane]
        judged = t.met + t.missed
        speeds, waits = self.recent(lane)
        return LaneSnapshot(
            requests=t.requests,
            in_flight=t.in_flight,
            waiting=waiting,
            classes=dict(t.classes),
            target_tok_s=self.target(lane),
            met=t.met,
            missed=t.missed,
            attainment=t.met / judged if judged else None,
            mean_tok_s=t.speed_sum / t.speed_n if t.speed_n else None,
            tok_s_p50=quantile(speeds, 50),
            tok_s_p90=quantile(speeds, 90),
            tok_s_p99=quantile(speeds, 99),
            mean_wait_s=t.wait_sum / t.requests if t.requests else None,
            wait_p50_s=quantile(waits, 50),
            wait_p99_s=quantile(waits, 99),
            max_wait_s=t.max_wait,
        )


class _LaneGauges:
    """The lanes' scrape-time gauges: in flight, attainment, recent speed and wait quantiles."""

    def __init__(self, stats: LaneStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        snaps = {lane: self._stats.snapshot(lane) for lane in LANES}
        in_flight = GaugeMetricFamily(
            "specroute_lane_in_flight_requests",
            "Requests of each lane in this proxy now, waiting or running.",
            labels=("lane",),
        )
        attainment = GaugeMetricFamily(
            "specroute_lane_target_attainment_ratio",
            "Share of each lane's timed requests since start whose decode speed met its target.",
            labels=("lane",),
        )
        speed = GaugeMetricFamily(
            "specroute_lane_recent_tokens_per_second",
            f"Per-request decode speed percentiles over each lane's last {RECENT} requests.",
            labels=("lane", "quantile"),
        )
        wait = GaugeMetricFamily(
            "specroute_lane_recent_queue_wait_seconds",
            f"Queue wait percentiles over each lane's last {RECENT} requests.",
            labels=("lane", "quantile"),
        )
        for lane, s in snaps.items():
            in_flight.add_metric((lane,), s.in_flight)
            if s.attainment is not None:
                attainment.add_metric((lane,), s.attainment)
            lane_speeds, lane_waits = self._stats.recent(lane)
            for q in QUANTILES:
                label = (lane, str(q / 100))
                if (v := quantile(lane_speeds, q)) is not None:
                    speed.add_metric(label, v)
                if (w := quantile(lane_waits, q)) is not None:
                    wait.add_metric(label, w)
        yield from (in_flight, attainment, speed, wait)
