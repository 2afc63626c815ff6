"""vLLM backends through the proxy: the official openai client, streamed and not, in front of
emulated vLLM servers and of a mixed SGLang + vLLM pool; depth discovered from vLLM's counters
or configured; and per-class acceptance learned from each signal vLLM offers (tokens per stream
chunk, and its spec-decode counters) within 5% of what the emulated servers really accepted."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from emulator_support import parse_metrics, wait_for
from servers import Server, run_server, start_emulator

MODEL = "Qwen/Qwen3.5-122B-A10B"
API_KEY = "sk-test-key"
FAST = ("--time-scale", "50", "--decode-log-interval", "1")
VLLM = ("--engine", "vllm")
CONFIG = """
[health]
interval_s = 0.2
timeout_s = 1.0
failure_threshold = 1
success_threshold = 1
metrics_interval_s = 0.3
[replicas]
scrape_min_interval_s = 0.1
"""


def vllm_emulator(steps: int, seed: int) -> Any:
    return start_emulator(steps, *VLLM, *FAST, "--seed", str(seed), ready_path="/health")


def serve(tmp: Path, backends: list[tuple[Server, str]]):  # type: ignore[no-untyped-def]
    """A proxy over `backends`, each written `[[backends]]` with its extra TOML lines."""
    text = CONFIG
    for server, extra in backends:
        text += f'[[backends]]\nurl = "{server.url}"\n{extra}\n'
    config = tmp / "proxy.toml"
    config.write_text(text)
    args = ["serve", "--config", str(config), "--api-key", API_KEY, "--policy", "round_robin"]
    return run_server(args)


def pool_of(proxy: Server) -> list[dict[str, Any]]:
    reply = httpx.get(proxy.url + "/pool", headers={"authorization": f"Bearer {API_KEY}"})
    backends: list[dict[str, Any]] = reply.json()["backends"]
    return backends


def client_of(proxy: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def vllm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two vLLM servers: one recognised and measured (engine auto, depth from its counters),
    one configured (engine, depth and `--max-num-seqs` written by the operator)."""
    with vllm_emulator(1, 3) as shallow, vllm_emulator(3, 4) as deep:
        backends = [(shallow, ""), (deep, 'engine = "vllm"\nsteps = 3\ncapacity = 64')]
        with serve(tmp_path_factory.mktemp("vllm"), backends) as proxy:
            wait_for(lambda: sorted(str(b["steps"]) for b in pool_of(proxy)) == ["1", "3"])
            yield proxy


def test_openai_client_chat_and_completions_through_the_proxy_to_vllm(
    vllm_pool: Server,
) -> None:
    client = client_of(vllm_pool)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=12
    )
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12
    assert raw.headers["x-specroute-steps"] in {"1", "3"}
    for _ in range(2):  # both backends, round robin
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=20,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 20
        assert all(c.usage is None for c in chunks[:-1])
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(text.split()) == 20
    plain = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=9, stream=True
        )
    )
    assert all(c.choices and c.usage is None for c in plain)  # the proxy's usage chunk removed
    whole = client.completions.create(model=MODEL, prompt="Once", max_tokens=7)
    assert len(whole.choices[0].text.split()) == 7
    pieces = client.completions.create(model=MODEL, prompt="Once", max_tokens=7, stream=True)
    assert len("".join(p.choices[0].text for p in pieces if p.choices).split()) == 7
    assert [m.id for m in client.models.list()] == [MODEL]


def test_vllm_depth_comes_from_its_counters_or_the_config_and_capacity_from_the_config(
    vllm_pool: Server,
) -> None:
    by_steps = {b["steps"]: b for b in pool_of(vllm_pool)}
    assert by_steps[3]["capacity"] == 64  # configured: vLLM does not report --max-num-seqs
    assert by_steps[1]["capacity"] is None
    assert all(b["healthy"] for b in by_steps.values())


def test_sglang_tokenizer_routes_reach_vllm_servers_under_their_vllm_names(
    vllm_pool: Server,
) -> None:
    # vLLM serves /tokenize and /detokenize only: the proxy sends SGLang's /v1/ names there
    # (round-robin: both servers answer, each in vLLM's own shape).
    headers = {"authorization": f"Bearer {API_KEY}"}
    for path in ("/v1/tokenize", "/tokenize", "/v1/tokenize"):
        reply = httpx.post(vllm_pool.url + path, json={"model": MODEL, "prompt": "a b c"},
                           headers=headers)  # fmt: skip
        assert reply.status_code == 200, (path, reply.text)
        assert reply.json()["count"] == 3
    tokens = httpx.post(vllm_pool.url + "/v1/tokenize", json={"prompt": "one two"},
                        headers=headers).json()["tokens"]  # fmt: skip
    for _ in range(2):
        back = httpx.post(vllm_pool.url + "/v1/detokenize", json={"tokens": tokens},
                          headers=headers)  # fmt: skip
        assert back.status_code == 200, back.text
        assert back.json()["prompt"].split() == ["one", "two"]


def test_mixed_sglang_and_vllm_pool_routes_as_one(tmp_path: Path) -> None:
    with (
        vllm_emulator(1, 5) as vllm,
        start_emulator(3, *FAST, "--seed", "6") as sglang,
        serve(tmp_path, [(vllm, ""), (sglang, "")]) as proxy,
    ):
        wait_for(lambda: sorted(str(b["steps"]) for b in pool_of(proxy)) == ["1", "3"])
        client = client_of(proxy)
        seen = set()
        for stream in (False, True, False, True):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=10,
                stream=stream,
            )
            seen.add(raw.headers["x-specroute-steps"])
            if stream:
                chunks = list(raw.parse())
                assert chunks[-1].choices[0].finish_reason == "length"
                words = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert len(words.split()) == 10
            else:
                assert raw.parse().usage.completion_tokens == 10  # type: ignore[union-attr]
        assert seen == {"1", "3"}


def _accepted(server: Server) -> tuple[float, float]:
    values = parse_metrics(httpx.get(server.url + "/metrics").text)
    return (
        values["vllm:spec_decode_num_drafts_total"],
        values["vllm:spec_decode_num_accepted_tokens_total"],
    )


@pytest.mark.parametrize(
    ("stream", "temperature", "klass", "source"),
    [(True, 0.0, "greedy", "chunks"), (False, 1.0, "sampled", "scraped")],
)
def test_class_acceptance_learned_from_vllm_is_within_5_percent_of_the_truth(
    tmp_path: Path, stream: bool, temperature: float, klass: str, source: str
) -> None:
    """The truth is what the emulated server accepted (1 + accepted / drafts over the run);
    streams teach by tokens per chunk, whole replies by the server's counters."""
    with vllm_emulator(3, 8) as server, serve(tmp_path, [(server, "")]) as proxy:
        wait_for(lambda: pool_of(proxy)[0]["steps"] == 3)
        client = client_of(proxy)
        drafts0, accepted0 = _accepted(server)

        def one(_: int) -> None:
            reply = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "write"}],
                max_tokens=160,
                temperature=temperature,
                stream=stream,
                extra_body={"ignore_eos": True},
            )
            if stream:
                list(reply)  # type: ignore[call-overload]

        with ThreadPoolExecutor(8) as workers:
            list(workers.map(one, range(96)))
        drafts1, accepted1 = _accepted(server)
        truth = 1 + (accepted1 - accepted0) / (drafts1 - drafts0)
        estimates = httpx.get(
            proxy.url + "/pool", headers={"authorization": f"Bearer {API_KEY}"}
        ).json()["estimates"]
        assert set(estimates["acceptance_sources"]) == {source}, estimates
        learned = estimates["local_classes"][f"{MODEL}:{klass}"]["accept_length"]["3"]
        assert learned == pytest.approx(truth, rel=0.05), (learned, truth, estimates)
