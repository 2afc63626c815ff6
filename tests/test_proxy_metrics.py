"""The proxy's own counters and histograms: what `/metrics` shows of what was recorded."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from specroute.prometheus import exposition, read_samples
from specroute.proxy.metrics import Counter, Histogram


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = exposition(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in read_samples(text) or []}


def test_a_value_on_a_bucket_bound_counts_in_that_bucket_and_above_the_last_in_inf() -> None:
    registry = CollectorRegistry()
    latency = Histogram(registry, "specroute_t_seconds", "doc", ("backend",), (0.1, 1.0))
    for value in (0.1, 0.5, 1.0, 7.0):
        latency.observe(("a",), value)
    seen = _samples(registry)
    bucket = "specroute_t_seconds_bucket"
    assert seen[(bucket, (("backend", "a"), ("le", "0.1")))] == 1
    assert seen[(bucket, (("backend", "a"), ("le", "1.0")))] == 3
    assert seen[(bucket, (("backend", "a"), ("le", "+Inf")))] == 4
    assert seen[("specroute_t_seconds_count", (("backend", "a"),))] == 4
    assert seen[("specroute_t_seconds_sum", (("backend", "a"),))] == pytest.approx(8.6)


def test_counters_add_up_per_label_set_and_refuse_to_go_down() -> None:
    registry = CollectorRegistry()
    requests = Counter(registry, "specroute_r_total", "doc", ("route", "status"))
    requests.inc(("chat", "200"))
    requests.inc(("chat", "200"), 2.5)
    requests.inc(("chat", "502"))
    with pytest.raises(ValueError, match="non-negative"):
        requests.inc(("chat", "200"), -1.0)
    assert requests.values == {("chat", "200"): 3.5, ("chat", "502"): 1.0}
    seen = _samples(registry)
    assert seen[("specroute_r_total", (("route", "chat"), ("status", "200")))] == 3.5
    with pytest.raises(ValueError, match="Duplicated"):  # one name, one family
        Counter(registry, "specroute_r_total", "doc", ("route",))
