"""Non-streaming wire contract, validation errors, info endpoints and auth of the emulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from servers import Server, start_emulator

MODEL = "emulated/test-model"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    args = ("--time-scale", "8", "--seed", "5", "--model-name", MODEL, "--decode-log-interval", "2")
    with start_emulator(2, *args) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def chat(client: httpx.Client, **extra: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "what is a river"}]},
        ],
        "max_completion_tokens": 9,
        "ignore_eos": True,
        **extra,
    }
    return client.post("/v1/chat/completions", json=body)


def test_chat_completion_has_sglang_shape_and_exact_token_counts(client: httpx.Client) -> None:
    reply = chat(client)
    assert reply.status_code == 200
    body = reply.json()
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    choice = body["choices"][0]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["reasoning_content"] is None
    assert choice["finish_reason"] == "length"
    assert choice["matched_stop"] is None
    assert len(choice["message"]["content"].split()) == 9
    # 2 + 4 words, 4 tokens of template per message, 3 for the assistant header.
    assert body["usage"] == {
        "prompt_tokens": 17,
        "total_tokens": 26,
        "completion_tokens": 9,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    assert body["metadata"] == {"weight_version": "default"}


def test_spec_tokens_details_are_top_level_sglext_when_asked(client: httpx.Client) -> None:
    body = chat(client, return_spec_tokens_details=True, max_completion_tokens=30).json()
    details = body["sglext"]["spec_tokens_details"]
    verifies = details["spec_verify_ct"]
    assert verifies == sum(details["spec_correct_drafts_histogram"])
    assert details["spec_num_proposed_drafts"] == 2 * verifies
    assert details["spec_accept_length"] == pytest.approx(30 / verifies)
    rate = details["spec_num_correct_drafts"] / details["spec_num_proposed_drafts"]
    assert details["spec_accept_rate"] == pytest.approx(rate)
    assert len(details["spec_correct_drafts_histogram"]) <= 3


def test_same_seed_and_prompt_give_the_same_text(client: httpx.Client) -> None:
    first = chat(client).json()["choices"][0]["message"]["content"]
    again = chat(client).json()["choices"][0]["message"]["content"]
    other = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "something else"}], "max_tokens": 9},
    ).json()["choices"][0]["message"]["content"]
    assert first == again
    assert first != other


def test_a_body_past_litestars_10_mb_default_is_served_like_sglang(client: httpx.Client) -> None:
    # SGLang (FastAPI on uvicorn) sets no body limit; the proxy in front allows 32 MB.
    padding = "x" * (12 * 1024 * 1024)
    reply = chat(client, user=padding)
    assert reply.status_code == 200
    assert reply.json()["usage"]["prompt_tokens"] == chat(client).json()["usage"]["prompt_tokens"]


def test_completion_defaults_to_sixteen_tokens_and_echoes_model(client: httpx.Client) -> None:
    body = {"model": "whatever-name", "prompt": "a b c d e", "ignore_eos": True}
    reply = client.post("/v1/completions", json=body).json()
    assert reply["object"] == "text_completion"
    assert reply["model"] == "whatever-name"
    choice = reply["choices"][0]
    assert list(choice) == ["index", "text", "logprobs", "finish_reason", "matched_stop"]
    assert len(choice["text"].split()) == reply["usage"]["completion_tokens"] == 16
    assert reply["usage"]["prompt_tokens"] == 5
    assert "sglext" not in reply


def test_completion_accepts_token_id_prompts(client: httpx.Client) -> None:
    reply = client.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 3})
    assert reply.json()["usage"]["prompt_tokens"] == 4


def test_generate_returns_text_ids_and_meta_info(client: httpx.Client) -> None:
    body = {
        "text": "the quick brown fox",
        "sampling_params": {"max_new_tokens": 7, "temperature": 0, "ignore_eos": True},
        "rid": "native-1",
    }
    out = client.post("/generate", json=body).json()
    assert list(out) == ["text", "output_ids", "meta_info"]
    meta = out["meta_info"]
    assert meta["id"] == "native-1"
    assert meta["finish_reason"] == {"type": "length", "length": 7}
    assert meta["prompt_tokens"] == 4
    assert meta["completion_tokens"] == 7
    assert len(out["output_ids"]) == len(out["text"].split()) == 7
    assert meta["e2e_latency"] > 0
    assert meta["spec_accept_length"] == pytest.approx(7 / meta["spec_verify_ct"])
    for key in ("spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts"):
        assert key in meta


def test_generate_defaults_to_128_new_tokens(client: httpx.Client) -> None:
    body = {"text": "hello", "sampling_params": {"ignore_eos": True}}
    assert client.post("/generate", json=body).json()["meta_info"]["completion_tokens"] == 128


@pytest.mark.parametrize(
    ("content", "kind", "fragment"),
    [
        (b"{not json", "Bad Request", "JSON"),
        (b'{"model": "x"}', "Bad Request", "messages"),
        (b'{"messages": "hello"}', "Bad Request", "array"),
        (b'{"messages": [], "model": "x"}', "BadRequestError", "Messages cannot be empty."),
        (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', "BadRequestError", "n=2"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "model": "base:adapter"}',
         "BadRequestError", "LoRA adapter 'adapter'"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 999999999}',
         "BadRequestError", "max_completion_tokens is too large"),
    ],
)  # fmt: skip
def test_bad_chat_requests_get_400_in_sglang_error_shape(
    client: httpx.Client, content: bytes, kind: str, fragment: str
) -> None:
    headers = {"content-type": "application/json"}
    reply = client.post("/v1/chat/completions", content=content, headers=headers)
    assert reply.status_code == 400
    body = reply.json()
    assert list(body) == ["object", "message", "type", "param", "code"]
    assert body["object"] == "error"
    assert body["type"] == kind
    assert body["param"] is None
    assert body["code"] == 400
    assert fragment in body["message"]


def test_non_json_content_type_is_rejected_like_sglang(client: httpx.Client) -> None:
    reply = client.post("/v1/completions", content=b'{"prompt": "x"}')
    assert reply.status_code == 400
    assert "application/json" in reply.json()["message"]


def test_generate_errors_use_the_native_shape(client: httpx.Client) -> None:
    reply = client.post("/generate", json={"sampling_params": {"max_new_tokens": 3}})
    assert reply.status_code == 400
    assert reply.json() == {
        "error": {"message": "Either text, input_ids or input_embeds should be provided."}
    }


def test_models_list_and_lookup(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == card["root"] == MODEL
    assert card["owned_by"] == "sglang"
    assert card["parent"] is None
    assert card["max_model_len"] == 262144
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    missing = client.get("/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_model_info_names_the_served_model(client: httpx.Client) -> None:
    info = client.get("/model_info").json()
    assert info["model_path"] == info["served_model_name"] == MODEL
    assert info["is_generation"] is True


def test_server_info_reports_resolved_speculative_arguments(client: httpx.Client) -> None:
    chat(client, max_completion_tokens=20)  # enough decode iterations for a metrics window
    for path in ("/server_info", "/get_server_info"):
        info = client.get(path).json()
        assert info["speculative_algorithm"] == "EAGLE"  # NEXTN resolves to EAGLE
        assert info["speculative_num_steps"] == 2
        assert info["speculative_eagle_topk"] == 1
        assert info["speculative_num_draft_tokens"] == 3
        assert info["speculative_adaptive"] is False
        assert info["max_running_requests"] == 21  # the seed profile's capacity at depth 2
        assert info["served_model_name"] == MODEL
        assert info["version"] == "0.5.23"
        assert info["max_total_num_tokens"] > 0
        (state,) = info["internal_states"]
        assert state["effective_max_running_requests_per_dp"] == 21
        assert 1.0 <= state["avg_spec_accept_length"] <= 3.0
        assert state["last_gen_throughput"] > 0  # the last window's, kept after going idle


def test_loads_report_capacity_and_acceptance(client: httpx.Client) -> None:
    chat(client, max_completion_tokens=40)
    loads = client.get("/v1/loads").json()
    assert loads["version"] == "0.5.23"
    (load,) = loads["loads"]
    assert load["dp_rank"] == 0
    assert load["max_running_requests"] == 21
    assert load["num_running_reqs"] == 0
    assert load["num_waiting_reqs"] == 0
    assert 1.0 <= load["speculative"]["accept_length"] <= 3.0


def test_loads_filter_sections_and_speak_prometheus(client: httpx.Client) -> None:
    chat(client, max_completion_tokens=20)
    core = client.get("/v1/loads", params={"include": "core"}).json()["loads"][0]
    assert "speculative" not in core
    assert "num_running_reqs" in core
    assert client.get("/v1/loads", params={"include": "bogus"}).status_code == 400
    text = client.get("/v1/loads", params={"format": "prometheus"}).text
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in text
    assert 'sglang_spec_accept_length{dp_rank="0"}' in text


def test_ready_health_and_flush_cache_answer_when_idle(client: httpx.Client) -> None:
    assert client.get("/ready").status_code == 200
    assert client.get("/health").status_code == 200
    flushed = client.post("/flush_cache")
    assert flushed.status_code == 200
    assert flushed.text.startswith("Cache flushed.")


def test_steps_zero_runs_without_speculation() -> None:
    with start_emulator(0, "--time-scale", "8") as plain, httpx.Client(base_url=plain.url) as c:
        info = c.get("/server_info").json()
        assert info["speculative_algorithm"] is None
        assert info["speculative_num_steps"] is None
        assert "avg_spec_accept_length" not in info["internal_states"][0]
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "return_spec_tokens_details": True,
        }
        reply = c.post("/v1/chat/completions", json=body).json()
        assert "sglext" not in reply  # no spec statistics without speculation
        meta = c.post("/generate", json={"text": "hi"}).json()["meta_info"]
        assert "spec_verify_ct" not in meta


def test_api_key_guards_everything_but_health_ready_and_metrics() -> None:
    with (
        start_emulator(1, "--api-key", "sekret", "--time-scale", "8") as guarded,
        httpx.Client(base_url=guarded.url) as c,
    ):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        denied = c.post("/v1/chat/completions", json=body)
        assert denied.status_code == 401
        assert denied.json() == {"error": "Unauthorized"}
        wrong = c.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert c.get("/server_info").status_code == 401
        ok = c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
        for path in ("/health", "/ready", "/metrics"):
            assert c.get(path).status_code == 200
