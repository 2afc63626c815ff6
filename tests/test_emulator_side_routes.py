"""The emulator's Ollama and tokenizer routes in SGLang 0.5.23's shapes: newline-delimited JSON
streams ending in a `done` line, the model in `/api/tags` and `/api/show`, token ids that
detokenize back to the words."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from servers import Server, start_emulator

MODEL = "emulated/Side-Model-Instruct"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with start_emulator(2, "--time-scale", "20", "--seed", "3", "--model-name", MODEL) as running:
        yield running


def test_ollama_generate_streams_lines_then_done(server: Server) -> None:
    body = {"model": "any", "prompt": "say something", "options": {"num_predict": 10}}
    with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=30) as reply:
        assert reply.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["done_reason"] == "stop"
    assert all(line["model"] == MODEL for line in lines)
    text = "".join(line["response"] for line in lines)
    assert len(text.split()) == 10
    whole = httpx.post(server.url + "/api/generate", json={**body, "stream": False}).json()
    assert whole["response"] == text  # the same prompt and seed: the same words
    assert (whole["eval_count"], whole["prompt_eval_count"]) == (10, 2)


def test_ollama_lists_and_shows_the_served_model(server: Server) -> None:
    tags = httpx.get(server.url + "/api/tags").json()["models"]
    assert [(t["name"], t["details"]["family"]) for t in tags] == [(MODEL, "Side-Model-Instruct")]
    shown = httpx.post(server.url + "/api/show", json={"model": MODEL}).json()
    assert shown["details"]["family"] == "Side-Model"
    assert shown["parameters"].startswith("num_ctx ")


def test_tokenize_and_detokenize_round_trip_the_vocabulary(server: Server) -> None:
    words = "the model and the data"
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": words}).json()
    assert tokens["count"] == 5
    assert tokens["tokens"][0] == tokens["tokens"][3]
    back = httpx.post(server.url + "/v1/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert back == {"text": " " + words}
    batch = httpx.post(server.url + "/v1/tokenize", json={"prompt": ["a b", "c"]}).json()
    assert batch["count"] == [2, 1]
