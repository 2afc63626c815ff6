"""Request migration through the proxy with the official openai client: a stream whose backend
dies or stalls mid-way continues on another backend in the same client stream (contiguous
text, one id, usage that adds up); a request that cannot be continued exactly keeps its error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from inprocess import ADMIN, proxy
from servers import Server, run_server, start_emulator

MODEL = "Qwen/Qwen3.5-122B-A10B"
SEED = ("--time-scale", "50", "--seed", "7")
CONFIG = """
[health]
interval_s = 0.1
timeout_s = 1.0
failure_threshold = 1
success_threshold = 1
[timeouts]
first_byte_s = 10.0
idle_s = 0.5
[retry]
max_attempts = 3
backoff_s = 0.01
[breaker]
failure_threshold = 1000
"""
TOKENS = 40
PROMPT = "tell me about rivers and mountains"
MESSAGES = [{"role": "user", "content": PROMPT}]
WHOLE = {"ignore_eos": True}  # every answer runs to max_tokens: the same length everywhere


@contextlib.contextmanager
def pool(
    tmp: Path, fault: str, after: int, settings: str = CONFIG
) -> Iterator[tuple[Server, Server]]:
    """A proxy in front of a backend that fails after `after` tokens (asked first) and a
    healthy one; yields (proxy, healthy backend)."""
    config = tmp / "proxy.toml"
    config.write_text(settings)
    with (
        start_emulator(3, *SEED, fault, str(after)) as failing,
        start_emulator(1, *SEED) as healthy,
    ):
        args = ["serve", "--config", str(config), "--policy", "round_robin"]
        args += ["--backend", failing.url, "--backend", healthy.url]
        with run_server(args) as proxy:
            both_healthy(proxy)
            yield proxy, healthy


def both_healthy(proxy: Server) -> None:
    """Wait (up to 10 s) until the proxy counts both backends healthy. Its /ready answers once
    one is, and a first request sent before the failing backend's first check goes to the
    healthy one: nothing moves, and the test would fail for a reason it does not test."""
    deadline = time.monotonic() + 10
    while httpx.get(proxy.url + "/ready").json().get("healthy_backends") != 2:
        assert time.monotonic() < deadline, "the proxy never counted both backends healthy"
        time.sleep(0.05)


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def migrations(
    proxy: Server, expect: dict[tuple[str, str], float] | None = None
) -> dict[tuple[str, str], float]:
    """`specroute_migrations_total` by (cause, outcome). The proxy counts a move once its
    continuation has ended, which can be a moment after the client read the last byte: with
    `expect`, read again for up to 5 s until the counts match it."""
    deadline = time.monotonic() + 5
    while True:
        counts = {}
        for line in httpx.get(proxy.url + "/metrics").text.splitlines():
            if line.startswith("specroute_migrations_total{"):
                labels, value = line.rsplit(" ", 1)
                parts = dict(p.split("=") for p in labels[labels.index("{") + 1 : -1].split(","))
                counts[(parts["cause"].strip('"'), parts["outcome"].strip('"'))] = float(value)
        if expect is None or counts == expect or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def expect_migrations(proxy: Server, expect: dict[tuple[str, str], float]) -> None:
    assert migrations(proxy, expect) == expect


def chat_stream(proxy: Server, **extra: object) -> tuple[str, set[str], object, int]:
    """The text, ids, usage and `created` values of one streamed chat through the proxy."""
    stream = client(proxy).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=WHOLE,
        **extra,  # type: ignore[arg-type]
    )
    text, ids, created, usage = [], set(), set(), None
    for chunk in stream:
        ids.add(chunk.id)
        created.add(chunk.created)
        if chunk.usage is not None:
            usage = chunk.usage
        text.extend(choice.delta.content or "" for choice in chunk.choices)
    assert len(created) == 1
    return "".join(text), ids, usage, len(created)


def reference_chat(backend: Server) -> str:
    reply = client(backend).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        extra_body=WHOLE,
    )
    return reply.choices[0].message.content or ""


@pytest.mark.parametrize(
    ("fault", "cause"),
    [("--exit-mid-stream-after-tokens", "interrupted"), ("--stall-after-tokens", "stalled")],
)
def test_chat_stream_continues_on_another_backend(tmp_path: Path, fault: str, cause: str) -> None:
    with pool(tmp_path, fault, 6) as (proxy, healthy):
        text, ids, usage, _ = chat_stream(proxy)
        expected = reference_chat(healthy)
        assert text == expected  # contiguous: the words the unbroken answer has, in order
        assert len(ids) == 1
        assert usage is not None
        assert usage.completion_tokens == TOKENS == len(text.split())
        prompt = client(healthy).chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=1,
        )
        assert prompt.usage is not None
        assert usage.prompt_tokens == prompt.usage.prompt_tokens
        assert usage.total_tokens == usage.prompt_tokens + TOKENS
        expect_migrations(proxy, {(cause, "moved"): 1.0})


def test_completion_stream_continues_on_another_backend(tmp_path: Path) -> None:
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6) as (proxy, healthy):
        stream = client(proxy).completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=WHOLE,
        )
        text, ids, usage = [], set(), None
        for chunk in stream:
            ids.add(chunk.id)
            usage = chunk.usage or usage
            text.extend(choice.text for choice in chunk.choices)
        whole = "".join(text)
        reference = client(healthy).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=TOKENS, extra_body=WHOLE
        )
        # The first words came from the first backend, as the unbroken answer has them.
        assert whole.split()[:6] == reference.choices[0].text.split()[:6]
        assert len(whole.split()) == TOKENS
        assert len(ids) == 1
        assert usage is not None
        assert reference.usage is not None
        assert usage.completion_tokens == TOKENS
        assert usage.prompt_tokens == reference.usage.prompt_tokens
        expect_migrations(proxy, {("interrupted", "moved"): 1.0})


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_stream_cut_after_its_whole_budget_ends_as_the_model_would(
    tmp_path: Path, route: str
) -> None:
    """Every token of `max_tokens` relayed, then the backend stalls before its last event: no
    budget is left to continue with, and the answer is whole. The stream ends with
    finish_reason "length", not an error (a drain in a wall-clock run cut one such stream)."""
    with pool(tmp_path, "--stall-after-tokens", TOKENS) as (proxy, healthy):
        chunks: list[Any]
        if route == "chat":
            chunks = list(
                client(proxy).chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=TOKENS, stream=True,  # type: ignore[arg-type]
                    extra_body=WHOLE,
                )
            )  # fmt: skip
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reference = reference_chat(healthy)
        else:
            chunks = list(
                client(proxy).completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=TOKENS, stream=True, extra_body=WHOLE
                )
            )
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            whole = client(healthy).completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=TOKENS, extra_body=WHOLE
            )
            reference = whole.choices[0].text
        assert text == reference
        assert chunks[-1].choices[0].finish_reason == "length"
        assert {c.id for c in chunks} == {chunks[0].id}
        expect_migrations(proxy, {("stalled", "finished"): 1.0})


def test_request_that_cannot_continue_exactly_keeps_its_error(tmp_path: Path) -> None:
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6) as (proxy, _):
        with pytest.raises(openai.APIError, match="backend stream interrupted"):
            chat_stream(proxy, logprobs=True)
        expect_migrations(proxy, {("interrupted", "refused"): 1.0})


def test_migration_turned_off_keeps_the_error(tmp_path: Path) -> None:
    off = CONFIG + "[migration]\nmax_moves = 0\n"
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6, off) as (proxy, _):
        with pytest.raises(openai.APIError, match="backend stream interrupted"):
            chat_stream(proxy)
        expect_migrations(proxy, {})


LONG = 300  # tokens: seconds of streaming, far longer than the drain's deadline


async def _stream(client: httpx.AsyncClient, prompt: str) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": LONG, "stream_options": {"include_usage": True}, **WHOLE}  # fmt: skip
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        backend = reply.headers["x-specroute-backend"]
        lines = [line async for line in reply.aiter_lines() if line.startswith("data:")]
    payloads = [line.removeprefix("data:").strip() for line in lines]
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return {
        "backend": backend, "done": payloads[-1] == "[DONE]", "text": text,
        "errors": [c for c in chunks if "error" in c], "ids": {c["id"] for c in chunks},
        "usage": [c["usage"] for c in chunks if c.get("usage")],
    }  # fmt: skip


async def _in_flight(client: httpx.AsyncClient, name: str) -> int:
    backends = (await client.get("/pool")).json()["backends"]
    return int(next(b["in_flight"] for b in backends if b["name"] == name))


async def _until(check: Callable[[], Awaitable[bool]], limit_s: float = 30.0) -> None:
    """Poll `check` until it holds (an AssertionError past `limit_s`)."""
    for _ in range(int(limit_s / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def _reference(url: str, prompt: str) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": LONG}
    async with httpx.AsyncClient(timeout=60) as client:
        whole = await client.post(url + "/v1/chat/completions", json={**body, **WHOLE})
    return str(whole.json()["choices"][0]["message"]["content"])


async def _drain_under_load(a: Server, b: Server) -> dict[str, Any]:
    prompts = [f"question number {i}" for i in range(4)]
    async with (
        proxy({"a": a, "b": b}, policy="round_robin", migration={"drain_s": 0.2}) as (url, _),  # type: ignore[dict-item]
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        tasks = [asyncio.create_task(_stream(client, p)) for p in prompts]

        async def a_busy() -> bool:
            return await _in_flight(client, "a") == 2  # both of a's streams under way

        async def a_empty() -> bool:
            return all(t.done() for t in tasks) or await _in_flight(client, "a") == 0

        await _until(a_busy)
        held = await client.put("/pool/backends/a/state", json={"state": "draining"}, headers=ADMIN)
        assert held.status_code == 200, held.text
        await _until(a_empty)
        drained_while_streaming = not any(t.done() for t in tasks)
        results = await asyncio.gather(*tasks)
        metrics = (await client.get("/metrics")).text
    references = await asyncio.gather(*(_reference(b.url, p) for p in prompts))
    return {"results": results, "references": references, "metrics": metrics,
            "drained": drained_while_streaming}  # fmt: skip


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_drain_moves_its_streams_and_cuts_none(engine: str) -> None:
    """On vLLM too: its `/tokenize` counts the text relayed, and the continuation turns the
    generation prompt off (vLLM refuses it beside `continue_final_message`)."""
    flags = ("--seed", "9", "--engine", engine)
    ready = "/ready" if engine == "sglang" else "/health"
    with (
        start_emulator(1, *flags, ready_path=ready) as a,
        start_emulator(3, *flags, ready_path=ready) as b,
    ):
        seen = asyncio.run(_drain_under_load(a, b))
    assert seen["drained"]  # a was empty while every stream still ran: they moved
    results = seen["results"]
    assert {r["backend"] for r in results} == {"a", "b"}
    for result, reference in zip(results, seen["references"], strict=True):
        assert result["done"]
        assert result["errors"] == []
        assert result["text"] == reference  # contiguous across the move
        assert len(result["ids"]) == 1
        assert [u["completion_tokens"] for u in result["usage"]] == [LONG]
    assert 'specroute_migrations_total{cause="drain",outcome="moved"} 2.0' in seen["metrics"]


def test_emulator_continues_a_final_assistant_message_where_it_stopped() -> None:
    """SGLang's `continue_final_message`: the answer goes on from the assistant's text, and
    usage counts that text as prompt, only the new words as completion."""
    with start_emulator(3, *SEED) as backend:
        emulator = client(backend)
        whole = emulator.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=20,
            extra_body=WHOLE,
        )
        text = whole.choices[0].message.content or ""
        head = " " + " ".join(text.split()[:7])
        rest = emulator.chat.completions.create(
            model=MODEL,
            messages=[*MESSAGES, {"role": "assistant", "content": head}],  # type: ignore[list-item]
            max_tokens=13,
            extra_body={**WHOLE, "continue_final_message": True},
        )
    assert head + (rest.choices[0].message.content or "") == text
    assert whole.usage is not None
    assert rest.usage is not None
    assert rest.usage.completion_tokens == 13
    assert rest.usage.prompt_tokens == whole.usage.prompt_tokens + 7


def _native_events(raw: bytes) -> list[dict[str, Any]]:
    payloads = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]
    assert payloads[-1] == b"[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


@pytest.mark.parametrize("prompt", [{"text": PROMPT}, {"input_ids": [1001, 1002, 1003]}])
def test_native_generate_stream_continues_on_another_backend(
    tmp_path: Path, prompt: dict[str, object]
) -> None:
    request = {**prompt, "stream": True,
               "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True}}  # fmt: skip
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6) as (proxy, healthy):
        reply = httpx.post(proxy.url + "/generate", json=request, timeout=30)
        reference = httpx.post(healthy.url + "/generate", json={**request, "stream": False})
        counts = migrations(proxy, {("interrupted", "moved"): 1.0})
    events = _native_events(reply.content)
    assert not [e for e in events if "error" in e]
    last, whole = events[-1], reference.json()
    assert len({e["meta_info"]["id"] for e in events}) == 1
    assert last["text"].split()[:6] == whole["text"].split()[:6]  # the first backend's words
    assert len(last["text"].split()) == len(last["output_ids"]) == TOKENS
    assert last["output_ids"][:6] == whole["output_ids"][:6]
    assert last["meta_info"]["completion_tokens"] == TOKENS
    assert last["meta_info"]["prompt_tokens"] == whole["meta_info"]["prompt_tokens"]
    assert counts == {("interrupted", "moved"): 1.0}
