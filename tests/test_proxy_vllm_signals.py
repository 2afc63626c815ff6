"""What the proxy takes from vLLM backends beyond routing: per-class acceptance learned from
vLLM's per-request metrics (`--per-request-spec-decode-metrics`) within 5% of the truth, the
backends' spec-decode counters on the proxy's `/metrics` (what `vllm bench serve` reads), and a
clean `/server_info` for a pool without SGLang."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from emulator_support import wait_for
from servers import Server, run_server, start_emulator

from specroute.proxy.vllm_counters import SpecTotals

MODEL = "Qwen/Qwen3.5-122B-A10B"
API_KEY = "sk-test-key"
FAST = ("--engine", "vllm", "--time-scale", "50", "--decode-log-interval", "1")
CONFIG = """
[health]
interval_s = 0.2
timeout_s = 1.0
failure_threshold = 1
success_threshold = 1
metrics_interval_s = 0.3
"""
SPEC = ("drafts", "draft_tokens", "accepted_tokens")


def vllm_emulator(steps: int, seed: int, *extra: str) -> Any:
    return start_emulator(steps, *FAST, "--seed", str(seed), *extra, ready_path="/health")


def serve(tmp: Path, servers: list[Server]) -> Any:
    text = CONFIG + "".join(f'[[backends]]\nurl = "{s.url}"\n' for s in servers)
    config = tmp / "proxy.toml"
    config.write_text(text)
    args = ["serve", "--config", str(config), "--api-key", API_KEY, "--policy", "round_robin"]
    return run_server(args)


def pool_of(proxy: Server) -> dict[str, Any]:
    reply = httpx.get(proxy.url + "/pool", headers={"authorization": f"Bearer {API_KEY}"})
    pool: dict[str, Any] = reply.json()
    return pool


def spec_counters(url: str) -> dict[str, float]:
    """Each spec-decode counter summed over its series (as `vllm bench serve` sums them)."""
    text = httpx.get(url + "/metrics").text
    totals = dict.fromkeys(SPEC, 0.0)
    for line in text.splitlines():
        for name in SPEC:
            if line.startswith(
                (f"vllm:spec_decode_num_{name}_total ", f"vllm:spec_decode_num_{name}_total{{")
            ):
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


@pytest.mark.parametrize("stream", [True, False])
def test_class_acceptance_from_vllm_request_metrics_is_within_5_percent_of_the_truth(
    tmp_path: Path, stream: bool
) -> None:
    """Every reply carries `metrics.speculative_decoding` (streams: on the usage chunk the proxy
    asks for); the pool learns from it first, and the truth is the server's counters."""
    with (
        vllm_emulator(3, 9, "--per-request-spec-decode-metrics", "summary") as server,
        serve(tmp_path, [server]) as proxy,
    ):
        wait_for(lambda: pool_of(proxy)["backends"][0]["steps"] == 3)
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0)
        before = spec_counters(server.url)

        def one(_: int) -> None:
            reply = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "write"}],
                max_tokens=150,
                temperature=1.0,
                stream=stream,
            )
            if stream:
                chunks = list(reply)  # type: ignore[call-overload]
                assert all(c.usage is None for c in chunks)  # the proxy's usage chunk removed

        with ThreadPoolExecutor(8) as workers:
            list(workers.map(one, range(96)))
        after = spec_counters(server.url)
        truth = 1 + (after["accepted_tokens"] - before["accepted_tokens"]) / (
            after["drafts"] - before["drafts"]
        )
        estimates = pool_of(proxy)["estimates"]
        assert set(estimates["acceptance_sources"]) == {"request_metrics"}, estimates
        learned = estimates["local_classes"][f"{MODEL}:sampled"]["accept_length"]["3"]
        assert learned == pytest.approx(truth, rel=0.05), (learned, truth, estimates)


def test_proxy_metrics_carry_the_vllm_backends_spec_counters_fresh(tmp_path: Path) -> None:
    """What `vllm bench serve` sums on the proxy's /metrics (no key needed) is what the two
    backends counted, read when asked rather than at the last scrape."""
    with (
        vllm_emulator(1, 11) as shallow,
        vllm_emulator(3, 12) as deep,
        serve(tmp_path, [shallow, deep]) as proxy,
    ):
        wait_for(lambda: sorted(str(b["steps"]) for b in pool_of(proxy)["backends"]) == ["1", "3"])
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0)
        for _ in range(4):  # round robin: both backends
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=30
            )
        backends = [spec_counters(s.url) for s in (shallow, deep)]
        relayed = spec_counters(proxy.url)
        assert all(b["drafts"] > 0 for b in backends)
        for name in SPEC:
            assert relayed[name] == sum(b[name] for b in backends), name
        text = httpx.get(proxy.url + "/metrics").text
        positions = [
            ln
            for ln in text.splitlines()
            if ln.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{")
        ]
        assert len(positions) == 1 + 3  # one series per backend and position

        def server_info() -> dict[str, Any]:
            reply = httpx.get(
                proxy.url + "/server_info", headers={"authorization": f"Bearer {API_KEY}"}
            )
            assert reply.status_code == 200, reply.text
            info: dict[str, Any] = reply.json()
            return info

        truths = sorted(1 + b["accepted_tokens"] / b["drafts"] for b in backends)

        def described() -> list[float] | None:
            states = server_info()["internal_states"][1:]
            found = [s.get("avg_spec_accept_length") for s in states]
            return sorted(found) if None not in found else None  # type: ignore[type-var]

        wait_for(lambda: described() == pytest.approx(truths))  # once the pool scraped them
        info = server_info()
        assert info["engine"] == "vllm"
        assert info["served_model_name"] == MODEL
        assert info["speculative_num_steps"] in {1, 3}
        assert len(info["specroute"]["backends"]) == 2
        pool_accept = info["internal_states"][0]["avg_spec_accept_length"]
        assert min(truths) <= pool_accept <= max(truths)


def test_relayed_counters_stay_monotonic_across_a_backend_restart() -> None:
    totals = SpecTotals()
    scrape = 'vllm:spec_decode_num_drafts_total{{engine="{e}",model_name="m"}} {v}\n'
    assert not totals.update("a", "vllm:num_requests_running 3\n")
    assert totals.update("a", scrape.format(e=0, v=40) + scrape.format(e=1, v=60))
    assert totals.update("a", scrape.format(e=0, v=5))  # restarted: counting from zero again
    assert totals.update("b", scrape.format(e=0, v=7))
    (family,) = list(totals.families())
    values = {s.labels["backend"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert values == {"a": 105.0, "b": 7.0}


def test_server_info_of_a_mixed_pool_leads_with_sglangs_own_answer(tmp_path: Path) -> None:
    with (
        vllm_emulator(1, 14) as vllm,
        start_emulator(3, "--time-scale", "50", "--seed", "15") as sglang,
        serve(tmp_path, [vllm, sglang]) as proxy,
    ):
        wait_for(lambda: sorted(str(b["steps"]) for b in pool_of(proxy)["backends"]) == ["1", "3"])
        reply = httpx.get(
            proxy.url + "/server_info", headers={"authorization": f"Bearer {API_KEY}"}
        )
        assert reply.status_code == 200, reply.text
        info = reply.json()
        assert "engine" not in info  # SGLang's own arguments, not the vLLM description
        assert info["speculative_num_steps"] == 3
        assert len(info["internal_states"]) == 1 + 2  # the pool, then each backend
        assert set(info["internal_states"][2]) <= {"avg_spec_accept_length"}  # the vLLM server's
