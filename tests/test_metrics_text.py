"""Prometheus text, written and read through prometheus_client: what the pool and the bench read
from SGLang's `/metrics`, and what the proxy's registry writes."""

from __future__ import annotations

import asyncio
import math

import httpx
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter

from specroute.bench.probes import Counters, parse_counters
from specroute.config import load_config
from specroute.pool import BackendMetrics, parse_metrics
from specroute.prometheus import exposition, read_samples, sglang_values
from specroute.proxy import create_app
from specroute.proxy.metrics import ProxyMetrics

TIMESTAMP_MS = 1_700_000_000_000
TRICKY = """\
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen {v2}",note="a} b"} 120 1700000000000
sglang:generation_tokens_total{model_name="qwen {v2}",note="}"} 30
sglang:spec_verify_calls_total{model_name="qwen {v2}"} 50 1700000000000
sglang:num_running_reqs{model_name="x} 9"} 3 1700000000000
"""


def test_label_values_with_braces_and_timestamped_samples_read_as_values() -> None:
    assert parse_counters(TRICKY) == Counters(generation_tokens=150.0, verify_calls=50.0)
    metrics = parse_metrics(TRICKY)
    assert (metrics.running, metrics.generation_tokens, metrics.verify_calls) == (3, 150, 50)
    # the timestamp stays a timestamp, the label value keeps its brace
    sample = next(s for s in read_samples(TRICKY) or [] if s.labels.get("note") == "a} b")
    assert (sample.value, sample.timestamp) == (120, TIMESTAMP_MS / 1000)


def test_text_that_breaks_the_format_reports_nothing_rather_than_part() -> None:
    half = 'sglang:num_running_reqs 3\nsglang:num_queue_reqs{model_name="m"} four\n'
    assert read_samples(half) is None
    assert parse_metrics(half) == BackendMetrics()
    assert (
        parse_counters("sglang:generation_tokens_total 5\nsglang:spec_verify_calls_total{") is None
    )


def test_values_keep_both_prefixes_and_drop_non_finite_samples() -> None:
    text = "sglang_num_queue_reqs 4\nsglang:token_usage NaN\nsglang:num_queue_reqs_x 9\n"
    values = sglang_values(text, {"num_queue_reqs", "token_usage"})
    assert values == {"num_queue_reqs": [4.0]}


def test_a_broken_line_of_a_series_not_read_does_not_spoil_the_scrape() -> None:
    text = "sglang:num_running_reqs 3\nsglang:cache_hit_rate{model_name=} oops\n"
    assert parse_metrics(text).running == 3


@given(st.text())
def test_any_text_is_read_or_refused_without_raising(text: str) -> None:
    samples = read_samples(text)
    assert samples is None or isinstance(samples, list)


@given(st.dictionaries(st.sampled_from(["model_name", "backend", "le_x"]), st.text(), max_size=3))
def test_label_values_survive_exposition_and_reading(labels: dict[str, str]) -> None:
    registry = CollectorRegistry()
    counter = Counter("sglang:num_requests", "Requests.", sorted(labels), registry=registry)
    (counter.labels(**labels) if labels else counter).inc(7)
    samples = read_samples(exposition(registry).decode())
    assert samples is not None
    assert [(s.name, s.labels, s.value) for s in samples] == [
        ("sglang:num_requests_total", labels, 7.0)
    ]


def test_proxy_exposition_has_no_created_series_and_reads_back_what_was_recorded() -> None:
    metrics = ProxyMetrics()
    backend = 'k3 "fast" \\ {a}'
    metrics.requests.inc(("chat", backend, "3", "200"))
    metrics.requests.inc(("chat", backend, "3", "200"))
    metrics.tokens.inc((backend, "3"), 256)
    metrics.duration.observe((backend, "3"), 0.7)
    samples = read_samples(metrics.render().decode())
    assert samples is not None
    assert not [s.name for s in samples if s.name.endswith("_created")]
    by_name = {
        s.name: s for s in samples if s.labels.get("backend") == backend and "le" not in s.labels
    }
    assert by_name["specroute_requests_total"].value == 2
    assert by_name["specroute_completion_tokens_total"].value == 256
    assert by_name["specroute_request_duration_seconds_count"].value == 1
    assert math.isclose(by_name["specroute_request_duration_seconds_sum"].value, 0.7)
    assert metrics.tokens.values == {(backend, "3"): 256.0}


def test_proxy_metrics_route_serves_prometheus_text_format() -> None:
    config = load_config(environ={}, overrides={"backends": [{"url": "http://127.0.0.1:9"}]})
    transport = httpx.ASGITransport(app=create_app(config))

    async def scrape() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get("/metrics")

    reply = asyncio.run(scrape())
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE specroute_requests_total counter" in reply.text
    assert "# TYPE specroute_in_flight_requests gauge" in reply.text
    assert read_samples(reply.text) is not None
