"""The official openai client through the proxy, in front of real emulated SGLang servers:
chat and completions, streaming and not, model listing, and one exception class per error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from servers import Server, run_server, start_emulator

MODEL = "Qwen/Qwen3.5-122B-A10B"
API_KEY = "sk-test-key"
ADMIN_KEY = "admin-test-key"
FAST = ("--time-scale", "50", "--seed", "3", "--decode-log-interval", "1")
CONFIG = """
max_body_bytes = 200000
[health]
interval_s = 0.2
timeout_s = 1.0
failure_threshold = 1
success_threshold = 1
metrics_interval_s = 0.3
[timeouts]
first_byte_s = 2.0
idle_s = 1.0
[retry]
backoff_s = 0.01
"""


def serve(tmp: Path, backends: list[Server], *flags: str, ready: str = "/ready"):  # type: ignore[no-untyped-def]
    config = tmp / "proxy.toml"
    config.write_text(CONFIG)
    args = ["serve", "--config", str(config), *flags]
    for backend in backends:
        args += ["--backend", backend.url]
    return run_server(args, ready_path=ready)


@pytest.fixture(scope="module")
def backends() -> Iterator[list[Server]]:
    with start_emulator(1, *FAST) as shallow, start_emulator(3, *FAST) as deep:
        yield [shallow, deep]


@pytest.fixture(scope="module")
def proxy(backends: list[Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("proxy")
    flags = ("--api-key", API_KEY, "--admin-key", ADMIN_KEY, "--policy", "round_robin")
    with serve(tmp, backends, *flags) as server:
        yield server


@pytest.fixture
def client(proxy: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0)


def _auth() -> dict[str, str]:
    return {"authorization": f"Bearer {API_KEY}"}


def test_chat_completion_through_proxy_carries_routing_headers(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=12
    )
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12
    assert raw.headers["x-specroute-steps"] in {"1", "3"}
    assert raw.headers["x-specroute-backend"]
    assert raw.headers["x-specroute-policy"] == "round_robin"
    assert "sglext" not in json.loads(raw.content)  # the proxy asked for it, the client did not


def test_chat_stream_arrives_without_extras_the_client_did_not_ask_for(
    client: openai.OpenAI,
) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20, stream=True
    )
    chunks = list(stream)
    assert all(c.choices for c in chunks)  # no usage-only or sglext-only chunk
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_keeps_usage_when_the_client_asks(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9


def test_completions_streaming_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="Once", max_tokens=7)
    assert whole.choices[0].text
    pieces = list(client.completions.create(model=MODEL, prompt="Once", max_tokens=7, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices)


def test_models_lists_the_pools_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_models_retrieve_through_the_proxy_as_against_sglang(client: openai.OpenAI) -> None:
    model = client.models.retrieve(MODEL)
    assert (model.id, model.owned_by) == (MODEL, "sglang")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"


def test_a_chat_request_without_model_is_served_by_the_pools_model(proxy: Server) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    reply = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=_auth())
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 5
    assert reply.headers["x-specroute-backend"]


def test_proxied_stream_matches_direct_stream_except_removed_extras(
    proxy: Server, backends: list[Server]
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 16}
    body["stream"] = True
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers=_auth()) as r:
        steps = r.headers["x-specroute-steps"]
        via_proxy = b"".join(r.iter_raw())
    direct_url = next(b.url for b, s in zip(backends, ("1", "3"), strict=True) if s == steps)
    direct = httpx.post(direct_url + "/v1/chat/completions", json=body).content
    assert _shape(via_proxy) == _shape(direct)


def _shape(stream: bytes) -> tuple[list[object], str]:
    """Events without the fields that differ per request (id, created) and the text (chunking
    depends on acceptance draws), plus the whole text."""
    events, text = [], ""
    for event in stream.split(b"\n\n"):
        if not event:
            continue
        assert event.startswith(b"data: ")
        payload = event[6:]
        if payload == b"[DONE]":
            events.append("[DONE]")
            continue
        data = json.loads(payload)
        data.pop("id"), data.pop("created")
        for choice in data["choices"]:
            text += choice["delta"].pop("content", "") or ""
        events.append(data)
    # The text of every content chunk is compared whole, the structure event by event.
    return [e for i, e in enumerate(events) if i in (0, len(events) - 2, len(events) - 1)], text


def test_server_info_and_model_info_answered_for_the_pool(
    client: openai.OpenAI, proxy: Server
) -> None:
    for _ in range(2):  # one request on each backend (round robin)
        client.completions.create(model=MODEL, prompt="x", max_tokens=8)
    info = httpx.get(proxy.url + "/server_info", headers=_auth()).json()
    # What sglang.bench_serving reads: the pool's accept length, no disaggregated `decode` list.
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1
    assert "decode" not in info
    assert info["speculative_algorithm"]
    # The address is the proxy's, not one backend's (nor a backend's launch command).
    assert (info["host"], info["port"]) == ("127.0.0.1", proxy.port)
    assert "launch_command" not in info
    assert httpx.get(proxy.url + "/model_info", headers=_auth()).json()["model_path"]


def test_pool_reports_depth_capacity_and_health(proxy: Server) -> None:
    pool = httpx.get(proxy.url + "/pool", headers=_auth()).json()
    assert sorted(b["steps"] for b in pool["backends"]) == [1, 3]
    assert all(b["healthy"] and b["capacity"] for b in pool["backends"])


def test_policy_switch_needs_the_admin_key(proxy: Server) -> None:
    url = proxy.url + "/policy"
    assert httpx.put(url, json={"policy": "least_loaded"}, headers=_auth()).status_code == 401
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.put(url, json={"policy": "nope"}, headers=admin).status_code == 400
    changed = httpx.put(url, json={"policy": "least_loaded"}, headers=admin)
    assert changed.json() == {"policy": "least_loaded", "previous": "round_robin"}
    assert httpx.get(url, headers=_auth()).json()["policy"] == "least_loaded"
    httpx.put(url, json={"policy": "round_robin"}, headers=admin)


def test_metrics_use_specroute_names(client: openai.OpenAI, proxy: Server) -> None:
    client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    text = httpx.get(proxy.url + "/metrics").text
    assert "specroute_requests_total{" in text
    assert "specroute_request_duration_seconds_bucket{" in text
    assert "specroute_in_flight_requests{" in text


def test_bad_key_is_authentication_error(proxy: Server) -> None:
    bad = openai.OpenAI(base_url=proxy.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])


def test_missing_field_is_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], extra_body={"temperature": "hot"})
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=None)  # type: ignore[arg-type]


def test_malformed_json_is_400_in_openai_shape(proxy: Server) -> None:
    reply = httpx.post(proxy.url + "/v1/chat/completions", content=b'{"model":', headers=_auth())
    assert reply.status_code == 400
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_body_over_the_limit_is_413(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 300_000}]
        )
    assert info.value.status_code == 413


def test_no_healthy_backend_is_503(tmp_path: Path) -> None:
    dead = Server(url="http://127.0.0.1:9", port=9, process=None)  # type: ignore[arg-type]
    with serve(tmp_path, [dead], ready="/health") as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"]
        assert httpx.get(proxy.url + "/ready").status_code == 503


def test_upstream_timeout_is_504(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A non-streamed reply has its headers with its end: `reply_s` bounds both. The environment
    # beats the file.
    monkeypatch.setenv("SPECROUTE_TIMEOUTS__REPLY_S", "0.3")
    with start_emulator(2, "--seed", "1") as slow, serve(tmp_path, [slow]) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2000
            )
        assert info.value.status_code == 504


def test_pool_says_where_a_backends_iteration_fit_was_observed(tmp_path: Path) -> None:
    # One stream at a time, at the emulator's own speed (chunks apart): each iteration
    # verifies k + 1 tokens of one request. The planner scales tune's points through the
    # fit there (`readings._through`).
    with start_emulator(2, "--seed", "1") as server, serve(tmp_path, [server]) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        for _ in range(3):
            messages = [{"role": "user", "content": "count"}]
            list(client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=48, stream=True,  # type: ignore[arg-type]
            ))  # fmt: skip
        (backend,) = httpx.get(proxy.url + "/pool").json()["backends"]
    assert backend["iteration_samples"] == 3
    assert backend["iteration_tokens"] == pytest.approx(3.0, rel=0.1)
