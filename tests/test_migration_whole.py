"""Migration of non-streamed requests through the proxy with the official openai client: a
backend that dies or stalls while it generates, or drains past its deadline, costs the client
nothing: the whole request is answered by another backend (its text and usage), counted as a
move; a request that brought down two backends ends with a clean error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from inprocess import ADMIN, Handler, Send, Upstream, proxy
from servers import Server, run_server, start_emulator
from test_migration import (
    CONFIG,
    MESSAGES,
    MODEL,
    PROMPT,
    SEED,
    TOKENS,
    WHOLE,
    client,
    migrations,
    pool,
)

FAULTS = [("--exit-mid-stream-after-tokens", "interrupted"), ("--stall-after-tokens", "stalled")]
# A stall shows as a non-streamed attempt's deadline: first-token limit plus `margin` times
# the predicted decode; these keep it near a second for 40 tokens.
QUICK = CONFIG.replace("idle_s = 0.5\n", "idle_s = 0.5\nfirst_token_floor_s = 0.2\nmargin = 1.0\n")


def chat(server: Server) -> openai.types.chat.ChatCompletion:
    return client(server).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        extra_body=WHOLE,
    )


@pytest.mark.parametrize(("fault", "cause"), FAULTS)
def test_whole_chat_is_answered_by_another_backend(tmp_path: Path, fault: str, cause: str) -> None:
    with pool(tmp_path, fault, 6, QUICK) as (proxy_server, healthy):
        reply = chat(proxy_server)
        reference = chat(healthy)
        counts = migrations(proxy_server)
    assert reply.choices[0].message.content == reference.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reference.usage is not None
    assert reply.usage.completion_tokens == TOKENS
    assert reply.usage.prompt_tokens == reference.usage.prompt_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + TOKENS
    assert counts == {(cause, "moved"): 1.0}


@pytest.mark.parametrize(("fault", "cause"), FAULTS)
def test_whole_completion_is_answered_by_another_backend(
    tmp_path: Path, fault: str, cause: str
) -> None:
    with pool(tmp_path, fault, 6, QUICK) as (proxy_server, healthy):
        reply = client(proxy_server).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=TOKENS, extra_body=WHOLE
        )
        reference = client(healthy).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=TOKENS, extra_body=WHOLE
        )
        counts = migrations(proxy_server)
    assert reply.choices[0].text == reference.choices[0].text
    assert reply.usage is not None
    assert reference.usage is not None
    assert reply.usage.completion_tokens == TOKENS
    assert reply.usage.prompt_tokens == reference.usage.prompt_tokens
    assert counts == {(cause, "moved"): 1.0}


def test_whole_generate_is_answered_by_another_backend(tmp_path: Path) -> None:
    request = {"text": PROMPT, "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True}}
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6) as (proxy_server, healthy):
        reply = httpx.post(proxy_server.url + "/generate", json=request, timeout=30)
        reference = httpx.post(healthy.url + "/generate", json=request, timeout=30)
        counts = migrations(proxy_server)
    assert reply.status_code == 200, reply.text
    assert reply.json()["text"] == reference.json()["text"]
    assert reply.json()["meta_info"]["completion_tokens"] == TOKENS
    assert counts == {("interrupted", "moved"): 1.0}


def test_a_request_that_brought_down_two_backends_ends_with_a_clean_error(
    tmp_path: Path,
) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text(CONFIG)
    fault = ("--exit-mid-stream-after-tokens", "6")
    with (
        start_emulator(3, *SEED, *fault) as first,
        start_emulator(1, *SEED, *fault) as second,
        start_emulator(2, *SEED) as third,
    ):
        args = ["serve", "--config", str(config), "--policy", "round_robin"]
        args += ["--backend", first.url, "--backend", second.url, "--backend", third.url]
        with run_server(args) as proxy_server:
            with pytest.raises(openai.APIStatusError) as failed:
                chat(proxy_server)
            counts = migrations(proxy_server)
        assert third.process.poll() is None  # never sent the request that kills backends
    assert failed.value.status_code == 502
    assert counts == {("interrupted", "moved"): 1.0, ("interrupted", "limit"): 1.0}


def test_whole_requests_with_migration_off_are_retried_as_before(tmp_path: Path) -> None:
    off = CONFIG + "[migration]\nmax_moves = 0\n"
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6, off) as (proxy_server, healthy):
        reply = chat(proxy_server)
        reference = chat(healthy)
        counts = migrations(proxy_server)
        metrics = httpx.get(proxy_server.url + "/metrics").text
    assert reply.choices[0].message.content == reference.choices[0].message.content
    assert counts == {}
    assert 'reason="StreamBroken"' in metrics  # a retry, as before migration


LONG = 300  # tokens: seconds of generation, far longer than the drain's deadline


async def _whole(client: httpx.AsyncClient, prompt: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": LONG, **WHOLE}  # fmt: skip
    return await client.post("/v1/chat/completions", json=body)


async def _in_flight(client: httpx.AsyncClient, name: str) -> int:
    backends = (await client.get("/pool")).json()["backends"]
    return int(next(b["in_flight"] for b in backends if b["name"] == name))


async def _until(check: Any, limit_s: float = 30.0) -> None:
    for _ in range(int(limit_s / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def _drain_under_load(a: Server, b: Server) -> dict[str, Any]:
    prompts = [f"question number {i}" for i in range(4)]
    async with (
        proxy({"a": a, "b": b}, policy="round_robin", migration={"drain_s": 0.2}) as (url, _),  # type: ignore[dict-item]
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        tasks = [asyncio.create_task(_whole(client, p)) for p in prompts]

        async def a_busy() -> bool:
            return await _in_flight(client, "a") == 2

        async def a_empty() -> bool:
            return all(t.done() for t in tasks) or await _in_flight(client, "a") == 0

        await _until(a_busy)
        held = await client.put("/pool/backends/a/state", json={"state": "draining"}, headers=ADMIN)
        assert held.status_code == 200, held.text
        await _until(a_empty)
        drained_while_running = not any(t.done() for t in tasks)
        replies = await asyncio.gather(*tasks)
        metrics = (await client.get("/metrics")).text
    return {"replies": replies, "metrics": metrics, "drained": drained_while_running}


def test_a_drain_moves_its_whole_requests_and_cuts_none() -> None:
    with start_emulator(1, "--seed", "9") as a, start_emulator(3, "--seed", "9") as b:
        seen = asyncio.run(_drain_under_load(a, b))
    assert seen["drained"]  # a was empty while every request still ran: they moved
    for reply in seen["replies"]:
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-specroute-backend"] == "b"
        assert reply.json()["usage"]["completion_tokens"] == LONG
    assert 'specroute_migrations_total{cause="drain",outcome="moved"} 2.0' in seen["metrics"]


ANSWER = {"id": "chatcmpl-b", "object": "chat.completion", "created": 1, "model": MODEL,
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "from b"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}  # fmt: skip


def _answers(status: int, body: bytes, length: int | None = None) -> Handler:
    """A backend that answers every POST with `status` and `body` (`length` in its header)."""

    async def handler(_: bytes, send: Send) -> None:
        headers = [(b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(body) if length is None else length).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return handler


async def _first_answers(first: Handler) -> tuple[httpx.Response, dict[tuple[str, str], float]]:
    """One non-streamed chat through a proxy whose first backend answers with `first` and
    whose second answers well; the reply and the migrations counted."""
    second = _answers(200, json.dumps(ANSWER).encode())
    async with (
        Upstream(first).running() as a,
        Upstream(second).running() as b,
        proxy({"a": a, "b": b}, policy="round_robin") as (url, _),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
        reply = await client.post("/v1/chat/completions", json=body)
        text = (await client.get("/metrics")).text
    counts = {}
    for line in text.splitlines():
        if line.startswith("specroute_migrations_total{"):
            labels, value = line.rsplit(" ", 1)
            cause = labels.split('cause="')[1].split('"')[0]
            outcome = labels.split('outcome="')[1].split('"')[0]
            counts[(cause, outcome)] = float(value)
    return reply, counts


@pytest.mark.parametrize(
    ("first", "cause"),
    [
        (_answers(200, b'{"id": "chatcmpl-a", "choices": [{"index"'), "bad_reply"),
        (_answers(200, b'{"id": "chatcmpl-a"', length=400), "interrupted"),
    ],
    ids=["not_json", "truncated"],
)
def test_a_broken_whole_reply_is_answered_by_another_backend(first: Handler, cause: str) -> None:
    reply, counts = asyncio.run(_first_answers(first))
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "from b"
    assert reply.headers["x-specroute-backend"] == "b"
    assert counts == {(cause, "moved"): 1.0}


def test_a_5xx_is_a_retry_not_a_move() -> None:
    reply, counts = asyncio.run(_first_answers(_answers(500, b'{"error": "boom"}')))
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-specroute-backend"] == "b"
    assert counts == {}
