"""The proxy's Prometheus metrics (`specroute_` names) in one `prometheus_client` registry per
app: counters and histograms recorded per request as plain numbers and turned into Prometheus
families when scraped, gauges read from the pool when scraped.

Multiprocess: the registry belongs to this process. With several workers each would serve its
own numbers; the path then is to merge the workers' families at scrape time (as
`prometheus_client.multiprocess` does for SGLang), with the scrape-time gauges below still read
per process.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from specroute.pool.holds import BACKEND_STATES
from specroute.prometheus import exposition

if TYPE_CHECKING:
    from specroute.pool import Pool
    from specroute.proxy.admission import Admission
    from specroute.proxy.bodies import BodyBudget
    from specroute.proxy.process import ProcessMonitor

__all__ = ["LATENCY_BUCKETS", "Counter", "Histogram", "ProxyGauges", "ProxyMetrics"]

Labels = tuple[str, ...]
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


class Counter:
    """A labelled counter taking label tuples, kept as plain numbers and turned into its
    Prometheus family when scraped: a request pays one dict lookup and one addition (a
    `prometheus_client` child's `inc` is five Python calls and a lock)."""

    def __init__(self, registry: CollectorRegistry, name: str, doc: str, labels: Labels) -> None:
        self.name, self.label_names, self._doc = name, labels, doc
        self._counts: dict[Labels, float] = {}
        registry.register(self)

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        counts = self._counts
        counts[labels] = counts.get(labels, 0.0) + amount

    @property
    def values(self) -> dict[Labels, float]:
        """Each label set's count (the dashboard's)."""
        return dict(self._counts)

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self._doc, labels=self.label_names)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self._doc, labels=self.label_names)
        for labels, value in self._counts.items():
            family.add_metric(labels, value)
        yield family


class Histogram:
    """A labelled histogram taking label tuples, kept as plain bucket counts (found by
    bisection) and turned into its Prometheus family when scraped."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        doc: str,
        labels: Labels,
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        self.name, self.label_names, self._doc = name, labels, doc
        self._bounds = tuple(sorted(buckets))
        # The bucket labels as `prometheus_client` writes them (its helper is untyped).
        les = [floatToGoString(b) for b in self._bounds]  # type: ignore[no-untyped-call]
        self._les = [*les, "+Inf"]
        # Per label set: the count in each bucket (not cumulative; the last is +Inf's), then
        # the sum of the values observed.
        self._counts: dict[Labels, list[float]] = {}
        registry.register(self)

    def observe(self, labels: Labels, value: float) -> None:
        counts = self._counts.get(labels)
        if counts is None:
            counts = self._counts[labels] = [0.0] * (len(self._bounds) + 2)
        counts[bisect_left(self._bounds, value)] += 1  # the first bound >= value
        counts[-1] += value

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self._doc, labels=self.label_names)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self._doc, labels=self.label_names)
        for labels, counts in self._counts.items():
            cumulative = list(itertools.accumulate(counts[:-1]))
            family.add_metric(labels, list(zip(self._les, cumulative, strict=True)), counts[-1])
        yield family


class ProxyMetrics:
    """All counters and histograms of one proxy app, and the registry `/metrics` renders."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            r,
            "specroute_requests_total",
            "Requests answered, by route, backend, depth and status.",
            ("route", "backend", "steps", "status"),
        )
        self.duration = Histogram(
            r,
            "specroute_request_duration_seconds",
            "Time from request to the end of its reply.",
            ("backend", "steps"),
        )
        self.ttft = Histogram(
            r,
            "specroute_time_to_first_token_seconds",
            "Time from request to the first streamed event.",
            ("backend", "steps"),
        )
        self.tokens = Counter(
            r,
            "specroute_completion_tokens_total",
            "Completion tokens relayed.",
            ("backend", "steps"),
        )
        self.retries = Counter(
            r,
            "specroute_upstream_retries_total",
            "Attempts retried on another backend before the first byte, by reason.",
            ("backend", "reason"),
        )
        self.decisions = Counter(
            r,
            "specroute_routing_decisions_total",
            "Routing decisions, by policy and chosen backend.",
            ("policy", "backend"),
        )
        self.routed = Counter(
            r,
            "specroute_routed_requests_total",
            "Requests answered, by policy, workload class and the depth they were sent to.",
            ("policy", "workload_class", "steps"),
        )
        self.class_ignored = Counter(
            r,
            "specroute_class_header_ignored_total",
            "X-Specroute-Class headers not honoured, by reason: not_allowed (the key may not "
            "name a class), invalid (not a plain name), too_many (past the cap on classes).",
            ("reason",),
        )
        self.stalls = Counter(
            r,
            "specroute_stream_stalls_total",
            "Requests whose backend stayed quiet past their limit, by backend and phase "
            "(headers, reply: a non-streamed one; first_token, between_chunks: a stream's).",
            ("backend", "phase"),
        )

        self.migrations = Counter(
            r,
            "specroute_migrations_total",
            "Requests whose backend failed after taking them (a stream: after the client's "
            "first byte) or drained, by cause (interrupted, stalled, bad_reply, aborted, "
            "drain) and outcome (moved: continued, or a non-streamed request sent again, on "
            "another backend; failed: the continuation could not start; refused: the request "
            "cannot be continued exactly; finished: the whole output budget had been "
            "relayed, and the stream ended with finish_reason length; limit, no_backend, "
            "no_budget).",
            ("cause", "outcome"),
        )

    def render(self) -> bytes:
        """The registry's Prometheus text: these metrics and every collector registered."""
        return exposition(self.registry)


def _gauge(
    name: str, doc: str, labels: Labels, values: Iterable[tuple[Labels, float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in values:
        family.add_metric(key, value)
    return family


class ProxyGauges:
    """A collector of what the proxy's `/metrics` reads at scrape time: load and health per
    backend, the pool's estimates, the admission queue and the process's own health."""

    def __init__(
        self, pool: Pool, admission: Admission, bodies: BodyBudget, process: ProcessMonitor
    ) -> None:
        self._pool = pool
        self._admission = admission
        self._bodies = bodies
        self._process = process

    def collect(self) -> Iterator[Metric]:
        backends = self._pool.backends
        yield _gauge(
            "specroute_in_flight_requests",
            "Requests in flight per backend.",
            ("backend",),
            (((b.name,), b.in_flight) for b in backends),
        )
        yield _gauge(
            "specroute_backend_healthy",
            "1 when the backend passes its /ready checks (0 during a planned restart too: "
            "specroute_backend_state tells that from an outage).",
            ("backend",),
            (((b.name,), float(b.healthy)) for b in backends),
        )
        states = {b.name: self._pool.state_of(b) for b in backends}
        yield _gauge(
            "specroute_backend_state",
            "1 for the state each backend is in (serving, draining, restarting, down), else 0: "
            "a depth change drains then restarts a server on purpose, which is not down.",
            ("backend", "state"),
            (((name, s), float(s == now)) for name, now in states.items() for s in BACKEND_STATES),
        )
        yield from self._estimates()
        yield GaugeMetricFamily(
            "specroute_admission_waiting_requests",
            "Requests waiting for a free backend.",
            value=self._admission.waiting,
        )
        interactive = self._admission.interactive_waiting
        yield _gauge(
            "specroute_lane_waiting_requests",
            "Requests waiting for a free backend, per latency lane.",
            ("lane",),
            ((("interactive",), interactive), (("batch",), self._admission.waiting - interactive)),
        )
        yield GaugeMetricFamily(
            "specroute_request_body_bytes",
            "Request-body bytes held now, all requests together (capped by "
            "limits.max_body_bytes_in_flight).",
            value=self._bodies.in_use,
        )
        yield from self._process.collect()

    def _estimates(self) -> Iterator[Metric]:
        """Acceptance per workload class, the iteration-time fit per backend and depth."""
        telemetry = self._pool.telemetry
        classes = telemetry.classes()
        yield _gauge(
            "specroute_class_accept_alpha",
            "Estimated per-token draft acceptance of each workload class.",
            ("workload_class",),
            (((name,), est.alpha) for name, est in classes.items()),
        )
        yield _gauge(
            "specroute_class_accept_length",
            "Estimated tokens per verify of each workload class at each depth seen.",
            ("workload_class", "steps"),
            (
                ((name, str(k)), length)
                for name, est in classes.items()
                for k, length in est.accept_length.items()
            ),
        )
        yield _gauge(
            "specroute_class_acceptance_samples",
            "Requests the class's acceptance estimate is made of.",
            ("workload_class",),
            (((name,), float(est.samples)) for name, est in classes.items()),
        )
        yield _gauge(
            "specroute_backend_iteration_seconds",
            "Fitted iteration time: `intercept` at an empty batch, `per_token` per batch token.",
            ("backend", "steps", "term"),
            (
                (key, value)
                for (name, k), model in telemetry.iteration.items()
                for key, value in (
                    ((name, str(k), "intercept"), model.intercept),
                    ((name, str(k), "per_token"), model.slope),
                )
            ),
        )
