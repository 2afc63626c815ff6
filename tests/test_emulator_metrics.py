"""`/metrics` of the emulator: SGLang's names and labels, and values that agree with responses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from emulator_support import parse_metrics, stream_events, wait_for
from servers import Server, start_emulator

from specroute.emulator.metrics import Stats
from specroute.prometheus import read_samples

SCHEDULER_LABELS = (
    'engine_type="unified",model_name="Qwen/Qwen3.5-122B-A10B",'
    'moe_ep_rank="0",pp_rank="0",tp_rank="0"'
)


def chat_body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "write a long poem"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        **extra,
    }


def test_counters_and_histograms_agree_with_what_requests_saw() -> None:
    args = ("--time-scale", "8", "--decode-log-interval", "3")
    with start_emulator(3, *args) as server, httpx.Client(base_url=server.url) as client:
        before = parse_metrics(client.get("/metrics").text)
        assert before[f"sglang:num_running_reqs{{{SCHEDULER_LABELS}}}"] == 0
        assert before[f"sglang:spec_num_steps{{{SCHEDULER_LABELS}}}"] == 0  # no window yet
        details = []
        for n in (10, 20, 30):
            body = chat_body(n, return_spec_tokens_details=True)
            reply = client.post("/v1/chat/completions", json=body).json()
            details.append(reply["sglext"]["spec_tokens_details"])
        events = stream_events(client, "/v1/chat/completions", chat_body(7, stream=True))
        assert events[-1] == "[DONE]"
        m = parse_metrics(client.get("/metrics").text)
    assert m["sglang:num_requests_total"] == 4
    # prometheus_client (so SGLang too) writes label names sorted
    stream_key = 'engine_type="unified",is_streaming="true",model_name="Qwen/Qwen3.5-122B-A10B"'
    assert m[f"sglang:num_requests_total{{{stream_key}}}"] == 1
    assert m["sglang:generation_tokens_total"] == 10 + 20 + 30 + 7
    assert m["sglang:prompt_tokens_total"] == 4 * (4 + 4 + 3)
    # The stream's verifies are not in `details`: count them from the difference.
    assert m["sglang:spec_verify_calls_total"] >= sum(d["spec_verify_ct"] for d in details)
    assert m["sglang:e2e_request_latency_seconds_count"] == 4
    assert m["sglang:time_to_first_token_seconds_count"] == 4
    assert m["sglang:inter_token_latency_seconds_count"] == 67 - 4  # every token after the first
    assert m[f"sglang:spec_num_steps{{{SCHEDULER_LABELS}}}"] == 3
    assert m[f"sglang:spec_num_draft_tokens{{{SCHEDULER_LABELS}}}"] == 4
    assert 1 <= m[f"sglang:spec_accept_length{{{SCHEDULER_LABELS}}}"] <= 4
    assert 0 <= m[f"sglang:spec_accept_rate{{{SCHEDULER_LABELS}}}"] <= 1
    assert m.get("sglang:num_aborted_requests_total", 0) == 0


def test_histogram_buckets_are_cumulative_and_end_at_inf() -> None:
    with (
        start_emulator(1, "--time-scale", "8") as server,
        httpx.Client(base_url=server.url) as client,
    ):
        client.post("/v1/chat/completions", json=chat_body(5))
        text = client.get("/metrics").text
    lines = [ln for ln in text.splitlines() if ln.startswith("sglang:e2e_request_latency_seconds")]
    buckets = [ln for ln in lines if "_bucket" in ln]
    counts = [float(ln.rsplit(" ", 1)[1]) for ln in buckets]
    assert counts == sorted(counts)
    assert counts[-1] == 1.0
    assert 'le="+Inf"' in buckets[-1]
    assert "# TYPE sglang:e2e_request_latency_seconds histogram" in text
    assert "# TYPE sglang:num_requests_total counter" in text


def test_running_gauge_follows_load_and_idles_to_zero() -> None:
    args = ("--time-scale", "4", "--decode-log-interval", "1")
    with start_emulator(1, *args) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        body = chat_body(300)

        def post() -> int:
            return c.post("/v1/chat/completions", json=body).status_code

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(post) for _ in range(4)]
            wait_for(lambda: parse_metrics(c.get("/metrics").text)["sglang:num_running_reqs"] == 4)
            assert [f.result() for f in futures] == [200] * 4
        wait_for(lambda: parse_metrics(c.get("/metrics").text)["sglang:num_running_reqs"] == 0)
        m = parse_metrics(c.get("/metrics").text)
        assert m["sglang:gen_throughput"] == 0  # an idle server reports no throughput


def test_adaptive_depth_moves_the_gauge_but_not_server_info() -> None:
    args = ("--speculative-adaptive", "--time-scale", "8", "--decode-log-interval", "1")
    with start_emulator(3, *args) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        c.post("/v1/chat/completions", json=chat_body(200))
        m = parse_metrics(c.get("/metrics").text)
        info = c.get("/server_info").json()
    # One greedy request accepts nearly every draft: the 1-7 tier climbs past 3.
    assert m["sglang:spec_num_steps"] in (5, 7)
    assert m["sglang:spec_num_draft_tokens"] == m["sglang:spec_num_steps"] + 1
    assert info["speculative_num_steps"] == 3
    assert info["speculative_adaptive"] is True
    assert info["emulator"]["active_speculative_num_steps"] in (5, 7)


def stats() -> Stats:
    return Stats(
        model_name='m "q"',
        speculative=True,
        decode_log_interval=3,
        max_total_num_tokens=1000,
        max_running_requests=4,
    )


def test_exposition_is_sglangs_without_created_series_or_empty_families() -> None:
    s = stats()
    before = s.render().decode()
    assert "# TYPE sglang:num_running_reqs gauge" in before
    assert "sglang:num_aborted_requests_total" not in before  # no sample yet, as in SGLang
    s.observe_abort()
    s.observe_inter_token(0.03, 3)
    text = s.render().decode()
    samples = read_samples(text) or []
    assert not [x.name for x in samples if x.name.endswith("_created")]
    aborted = [x for x in samples if x.name == "sglang:num_aborted_requests_total"]
    assert [(x.labels, x.value) for x in aborted] == [
        ({"engine_type": "unified", "model_name": 'm "q"'}, 1.0)
    ]
    assert "# TYPE sglang:num_aborted_requests_total counter" in text
    assert "# TYPE sglang:inter_token_latency_seconds histogram" in text


def test_inter_token_latency_counts_every_token_of_a_chunk_at_its_share_of_the_gap() -> None:
    s = stats()
    s.observe_inter_token(0.03, 3)
    s.observe_inter_token(0.5, 1)
    samples = read_samples(s.render().decode()) or []
    itl = {
        (x.name, x.labels.get("le")): x.value
        for x in samples
        if x.name.startswith("sglang:inter_token_latency_seconds")
    }
    assert itl[("sglang:inter_token_latency_seconds_count", None)] == 4
    assert abs(itl[("sglang:inter_token_latency_seconds_sum", None)] - 0.53) < 1e-9
    assert itl[("sglang:inter_token_latency_seconds_bucket", "0.01")] == 3
    assert itl[("sglang:inter_token_latency_seconds_bucket", "0.4")] == 3
    assert itl[("sglang:inter_token_latency_seconds_bucket", "0.6")] == 4


def test_metrics_route_serves_prometheus_text_format(emulator: Server) -> None:
    reply = httpx.get(emulator.url + "/metrics")
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
