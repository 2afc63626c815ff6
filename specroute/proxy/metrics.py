"""The proxy's Prometheus metrics (`specroute_` names) and their text exposition."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["Counter", "Histogram", "ProxyMetrics", "render_gauge", "render_labelled_gauge"]

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


def _labels(names: Labels, values: Labels, extra: str = "") -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Counter:
    def __init__(self, name: str, doc: str, labels: Labels) -> None:
        self.name, self.doc, self.label_names = name, doc, labels
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.doc}"
        yield f"# TYPE {self.name} counter"
        for labels, value in self.values.items():
            yield f"{self.name}{_labels(self.label_names, labels)} {value:g}"


class Histogram:
    def __init__(
        self, name: str, doc: str, labels: Labels, buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> None:
        self.name, self.doc, self.label_names, self.buckets = name, doc, labels, buckets
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = {}

    def observe(self, labels: Labels, value: float) -> None:
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.buckets) + 1)
            self.sums[labels] = 0.0
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sums[labels] += value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.doc}"
        yield f"# TYPE {self.name} histogram"
        for labels, counts in self.counts.items():
            running = 0
            for bound, count in zip((*self.buckets, float("inf")), counts, strict=True):
                running += count
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                names = _labels(self.label_names, labels, 'le="' + le + '"')
                yield f"{self.name}_bucket{names} {running}"
            yield f"{self.name}_sum{_labels(self.label_names, labels)} {self.sums[labels]:g}"
            yield f"{self.name}_count{_labels(self.label_names, labels)} {running}"


def render_gauge(name: str, doc: str, label: str, values: Iterable[tuple[str, float]]) -> str:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
    lines += [f'{name}{{{label}="{_escape(k)}"}} {v:g}' for k, v in values]
    return "\n".join(lines)


def render_labelled_gauge(
    name: str, doc: str, labels: Labels, values: Iterable[tuple[Labels, float]]
) -> str:
    """A gauge with several labels per sample."""
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
    lines += [f"{name}{_labels(labels, key)} {v:g}" for key, v in values]
    return "\n".join(lines)


class ProxyMetrics:
    """All counters and histograms of one proxy process."""

    def __init__(self) -> None:
        self.requests = Counter(
            "specroute_requests_total",
            "Requests answered, by route, backend, depth and status.",
            ("route", "backend", "steps", "status"),
        )
        self.duration = Histogram(
            "specroute_request_duration_seconds",
            "Time from request to the end of its reply.",
            ("backend", "steps"),
        )
        self.ttft = Histogram(
            "specroute_time_to_first_token_seconds",
            "Time from request to the first streamed event.",
            ("backend", "steps"),
        )
        self.tokens = Counter(
            "specroute_completion_tokens_total",
            "Completion tokens relayed.",
            ("backend", "steps"),
        )
        self.retries = Counter(
            "specroute_upstream_retries_total",
            "Attempts retried on another backend before the first byte, by reason.",
            ("backend", "reason"),
        )
        self.decisions = Counter(
            "specroute_routing_decisions_total",
            "Routing decisions, by policy and chosen backend.",
            ("policy", "backend"),
        )
        self.routed = Counter(
            "specroute_routed_requests_total",
            "Requests answered, by policy, workload class and the depth they were sent to.",
            ("policy", "workload_class", "steps"),
        )

    def render(self) -> Iterable[str]:
        for metric in (
            self.requests,
            self.duration,
            self.ttft,
            self.tokens,
            self.retries,
            self.decisions,
            self.routed,
        ):
            yield from metric.render()
