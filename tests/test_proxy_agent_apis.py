"""The APIs coding agents speak, through the real proxy in front of emulated SGLang servers:
the official `openai` client's `responses.create` (streamed and not, continued with
`previous_response_id`, retrieved, cancelled) and the official `anthropic` client's
`messages.create` (streamed and not) give the same results through the proxy as against one
emulated server directly; stored responses go to the server that stores them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from servers import Server, run_server, start_emulator

MODEL = "Qwen/Qwen3.5-122B-A10B"
API_KEY = "sk-agent-key"
# Every server with the same seed: the same prompt gets the same text from any of them.
FAST = ("--time-scale", "50", "--seed", "7", "--enable-response-store")
CONFIG = """
[health]
interval_s = 0.2
failure_threshold = 1
success_threshold = 1
[retry]
backoff_s = 0.01
"""


@pytest.fixture(scope="module")
def pool() -> Iterator[list[Server]]:
    with start_emulator(1, *FAST) as shallow, start_emulator(3, *FAST) as deep:
        yield [shallow, deep]


@pytest.fixture(scope="module")
def direct() -> Iterator[Server]:
    with start_emulator(3, *FAST) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(pool: list[Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = Path(tmp_path_factory.mktemp("agents")) / "proxy.toml"
    config.write_text(CONFIG)
    args = ["serve", "--config", str(config), "--api-key", API_KEY, "--policy", "round_robin"]
    for backend in pool:
        args += ["--backend", backend.url]
    with run_server(args) as server:
        yield server


def _openai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def _anthropic(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)


def _respond(server: Server, stream: bool, previous: str | None = None) -> tuple[str, str, int]:
    """(id, text, output tokens) of one response, streamed or not."""
    client = _openai(server)
    args = {"model": MODEL, "input": "refactor this function", "max_output_tokens": 12}
    if previous is not None:
        args["previous_response_id"] = previous
    if not stream:
        reply = client.responses.create(**args)  # type: ignore[call-overload]
        assert reply.usage is not None
        return reply.id, reply.output_text, reply.usage.output_tokens
    deltas: list[str] = []
    final = None
    with client.responses.create(**args, stream=True) as events:  # type: ignore[call-overload]
        for event in events:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert final is not None
    assert final.usage is not None
    assert "".join(deltas) == final.output_text
    return final.id, final.output_text, final.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_responses_through_the_proxy_match_one_server(
    proxy: Server, direct: Server, stream: bool
) -> None:
    first_id, proxied, tokens = _respond(proxy, stream)
    _, alone, alone_tokens = _respond(direct, stream)
    assert (proxied, tokens) == (alone, alone_tokens)
    assert len(proxied.split()) == tokens == 12
    # Continued: the proxy sends it to the server that stores the first response, whichever
    # the policy would pick, so its history (and so its text) is the one a lone server gives.
    direct_first, _, _ = _respond(direct, stream)
    for _ in range(2):  # round robin would alternate: both land on the first one's home
        _, follow, _ = _respond(proxy, stream, previous=first_id)
        _, follow_alone, _ = _respond(direct, stream, previous=direct_first)
        assert follow == follow_alone


def test_a_stored_response_is_retrieved_and_cancelled_at_its_home(proxy: Server) -> None:
    client = _openai(proxy)
    made = client.responses.create(model=MODEL, input="write a test", max_output_tokens=5)
    for _ in range(3):  # round robin between two servers: only one of them stores it
        assert client.responses.retrieve(made.id).output_text == made.output_text
    assert client.responses.cancel(made.id).id == made.id
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve("resp_0123456789abcdef")
    assert "resp_0123456789abcdef" in str(missing.value)


def test_a_response_id_the_proxy_never_saw_is_found_on_its_server(
    proxy: Server, pool: list[Server]
) -> None:
    """After a proxy restart its memory is empty: the servers are asked who holds an id."""
    made = _openai(pool[1]).responses.create(model=MODEL, input="hello", max_output_tokens=4)
    through = _openai(proxy).responses.create(
        model=MODEL, input="and then", max_output_tokens=4, previous_response_id=made.id
    )
    assert through.previous_response_id == made.id
    assert _openai(proxy).responses.retrieve(made.id).output_text == made.output_text


def _message(server: Server, stream: bool) -> tuple[str, int, int, str | None]:
    client = _anthropic(server)
    messages = [{"role": "user", "content": "fix the bug"}]
    if not stream:
        reply = client.messages.create(model=MODEL, max_tokens=10, messages=messages)  # type: ignore[arg-type]
        text = "".join(block.text for block in reply.content if block.type == "text")
        usage = reply.usage
        return text, usage.input_tokens, usage.output_tokens, reply.stop_reason
    with client.messages.stream(model=MODEL, max_tokens=10, messages=messages) as events:  # type: ignore[arg-type]
        streamed = "".join(events.text_stream)
        final = events.get_final_message()
    text = "".join(block.text for block in final.content if block.type == "text")
    assert streamed == text
    return text, final.usage.input_tokens, final.usage.output_tokens, final.stop_reason


@pytest.mark.parametrize("stream", [False, True])
def test_messages_through_the_proxy_match_one_server(
    proxy: Server, direct: Server, stream: bool
) -> None:
    proxied = _message(proxy, stream)
    assert proxied == _message(direct, stream)
    text, _, output_tokens, stop = proxied
    assert len(text.split()) == output_tokens == 10
    assert stop == "max_tokens"


def test_messages_take_the_key_in_x_api_key_and_refuse_a_wrong_one_in_anthropic_shape(
    proxy: Server,
) -> None:
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    good = httpx.post(proxy.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY})
    assert good.status_code == 200
    assert good.headers["x-specroute-backend"]
    models = httpx.get(proxy.url + "/v1/models", headers={"x-api-key": API_KEY})
    assert models.status_code == 200
    assert httpx.get(proxy.url + "/v1/models", headers={"x-api-key": "nope"}).status_code == 401
    bad = httpx.post(proxy.url + "/v1/messages", json=body, headers={"x-api-key": "nope"})
    assert bad.status_code == 401
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=proxy.url, api_key="nope", max_retries=0).messages.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        )


def test_count_tokens_is_forwarded(proxy: Server, direct: Server) -> None:
    args = {"model": MODEL, "messages": [{"role": "user", "content": "three words here"}]}
    proxied = _anthropic(proxy).messages.count_tokens(**args)  # type: ignore[arg-type]
    assert proxied.input_tokens == _anthropic(direct).messages.count_tokens(**args).input_tokens  # type: ignore[arg-type]


def _post(server: Server, path: str, body: dict[str, object]) -> httpx.Response:
    headers = {"authorization": f"Bearer {API_KEY}"}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=30)


def test_tokenizer_routes_are_forwarded_with_the_same_answers(
    proxy: Server, direct: Server
) -> None:
    words = {"model": MODEL, "prompt": "the model read the token"}
    tokens = _post(proxy, "/v1/tokenize", words)
    assert tokens.status_code == 200
    assert tokens.headers["x-specroute-backend"]
    assert tokens.json() == _post(direct, "/v1/tokenize", words).json()
    assert tokens.json()["count"] == 5
    text = _post(proxy, "/detokenize", {"tokens": tokens.json()["tokens"]})
    assert text.json() == {"text": " the model read the token"}
    unkeyed = httpx.post(proxy.url + "/v1/tokenize", json=words)
    assert unkeyed.status_code == 401
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'route="tokenize"' in metrics
    assert 'workload_class="tokenize"' not in metrics  # not a class of generation


def test_ollamas_api_is_forwarded_and_its_ndjson_stream_passes_through(
    proxy: Server, direct: Server
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "explain this code"}],
        "options": {"num_predict": 9, "temperature": 0},
    }
    whole = _post(proxy, "/api/chat", {**body, "stream": False}).json()
    alone = _post(direct, "/api/chat", {**body, "stream": False}).json()
    assert whole["message"] == alone["message"]
    assert whole["eval_count"] == 9
    lines: list[dict[str, object]] = []
    headers = {"authorization": f"Bearer {API_KEY}"}
    with httpx.stream("POST", proxy.url + "/api/chat", json=body, headers=headers) as reply:
        assert reply.headers["content-type"].startswith("application/x-ndjson")
        lines.extend(json.loads(line) for line in reply.iter_lines() if line)
    assert lines[-1]["done"] is True
    streamed = "".join(line["message"]["content"] for line in lines)  # type: ignore[index]
    assert streamed == whole["message"]["content"]
    tags = httpx.get(proxy.url + "/api/tags", headers=headers).json()
    assert tags["models"][0]["name"] == MODEL


def test_an_embedding_request_gets_the_backends_own_refusal(proxy: Server, direct: Server) -> None:
    body = {"model": MODEL, "input": "a generative model has no embeddings"}
    through = _post(proxy, "/v1/embeddings", body)
    assert through.status_code == 400
    assert through.json() == _post(direct, "/v1/embeddings", body).json()
    assert "--is-embedding" in through.json()["message"]


def test_one_model_is_retrieved_from_the_pool(proxy: Server) -> None:
    client = _openai(proxy)
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
