"""Request migration through the proxy with the official openai client: a stream whose backend
dies or stalls mid-way continues on another backend in the same client stream (contiguous
text, one id, usage that adds up); a request that cannot be continued exactly keeps its error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
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
            yield proxy, healthy


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def migrations(proxy: Server) -> dict[tuple[str, str], float]:
    counts = {}
    for line in httpx.get(proxy.url + "/metrics").text.splitlines():
        if line.startswith("specroute_migrations_total{"):
            labels, value = line.rsplit(" ", 1)
            parts = dict(p.split("=") for p in labels[labels.index("{") + 1 : -1].split(","))
            counts[(parts["cause"].strip('"'), parts["outcome"].strip('"'))] = float(value)
    return counts


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
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
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
        assert migrations(proxy) == {(cause, "moved"): 1.0}


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
        assert usage is not None and reference.usage is not None
        assert usage.completion_tokens == TOKENS
        assert usage.prompt_tokens == reference.usage.prompt_tokens
        assert migrations(proxy) == {("interrupted", "moved"): 1.0}


def test_request_that_cannot_continue_exactly_keeps_its_error(tmp_path: Path) -> None:
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6) as (proxy, _):
        with pytest.raises(openai.APIError, match="backend stream interrupted"):
            chat_stream(proxy, logprobs=True)
        assert migrations(proxy) == {("interrupted", "refused"): 1.0}


def test_migration_turned_off_keeps_the_error(tmp_path: Path) -> None:
    off = CONFIG.replace("[retry]\n", "[retry]\nmax_migrations = 0\n")
    with pool(tmp_path, "--exit-mid-stream-after-tokens", 6, off) as (proxy, _):
        with pytest.raises(openai.APIError, match="backend stream interrupted"):
            chat_stream(proxy)
        assert migrations(proxy) == {}
