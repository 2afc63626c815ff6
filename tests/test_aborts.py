"""A backend that aborts a request (SGLang's `/abort_request`, a stop at a drain's end) ends it
with finish_reason "abort": through the proxy, with the official openai client, that is a
failure, not an empty success. A stream continues on another backend (one contiguous stream,
usage adding up) or, with migration off, ends with the clean mid-stream error; a non-streamed
request is sent again."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from servers import Server, run_server, start_emulator
from test_migration import (
    CONFIG,
    MESSAGES,
    MODEL,
    SEED,
    TOKENS,
    WHOLE,
    client,
    expect_migrations,
    migrations,
)

from specroute.proxy.aborts import aborted

SLOW = ("--time-scale", "0.2", "--seed", "7")  # tokens slow enough to abort mid-way


@contextlib.contextmanager
def pool(tmp: Path, settings: str = CONFIG) -> Iterator[tuple[Server, Server, Server]]:
    """A proxy in front of a slow backend (asked first) and a fast one; yields (proxy, slow,
    fast)."""
    config = tmp / "proxy.toml"
    config.write_text(settings)
    with start_emulator(3, *SLOW) as slow, start_emulator(1, *SEED) as fast:
        args = ["serve", "--config", str(config), "--policy", "round_robin"]
        args += ["--backend", slow.url, "--backend", fast.url]
        with run_server(args) as proxy:
            yield proxy, slow, fast


def abort_all(backend: Server) -> None:
    reply = httpx.post(backend.url + "/abort_request", json={"abort_all": True})
    assert reply.status_code == 200, reply.text


def reference(backend: Server) -> str:
    reply = client(backend).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=TOKENS,
        extra_body=WHOLE,  # type: ignore[arg-type]
    )
    return reply.choices[0].message.content or ""


def aborted_stream(proxy: Server, slow: Server) -> tuple[str, set[str], list[str | None], object]:
    """A streamed chat whose backend aborts it after its sixth content chunk: its text, ids,
    finish reasons and usage as the client read them."""
    stream = client(proxy).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=WHOLE,
    )
    text: list[str] = []
    ids: set[str] = set()
    reasons: list[str | None] = []
    usage = None
    for chunk in stream:
        ids.add(chunk.id)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
        if sum(1 for t in text if t) == 6 and reasons[-1] is None:
            abort_all(slow)
    return "".join(text), ids, reasons, usage


def test_an_aborted_stream_continues_on_another_backend(tmp_path: Path) -> None:
    with pool(tmp_path) as (proxy, slow, fast):
        text, ids, reasons, usage = aborted_stream(proxy, slow)
        assert text == reference(fast)  # contiguous: the unbroken answer's words, in order
        assert "abort" not in reasons
        assert reasons[-1] == "length"
        assert len(ids) == 1
        assert usage is not None
        assert usage.completion_tokens == TOKENS == len(text.split())  # type: ignore[attr-defined]
        expect_migrations(proxy, {("aborted", "moved"): 1.0})


def test_an_aborted_stream_without_migration_ends_with_an_error(tmp_path: Path) -> None:
    off = CONFIG + "[migration]\nmax_moves = 0\n"
    with pool(tmp_path, off) as (proxy, slow, _):
        with pytest.raises(openai.APIError, match=r"backend stream interrupted.*abort"):
            aborted_stream(proxy, slow)
        expect_migrations(proxy, {})


def aborted_whole(proxy: Server, slow: Server) -> list[object]:
    """A non-streamed chat whose backend aborts it while it generates: the reply, or the
    error the client got."""
    result: list[object] = []

    def ask() -> None:
        try:
            result.append(
                client(proxy).chat.completions.create(
                    model=MODEL,
                    messages=MESSAGES,  # type: ignore[arg-type]
                    max_tokens=TOKENS,
                    extra_body=WHOLE,
                )
            )
        except openai.APIError as exc:
            result.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    for _ in range(1500):  # until the slow backend is generating it
        if _running(httpx.get(slow.url + "/metrics").text) > 0:
            break
        asker.join(0.02)
    abort_all(slow)
    asker.join(30)
    assert len(result) == 1, "no reply"
    return result


def test_an_aborted_whole_reply_is_sent_again(tmp_path: Path) -> None:
    with pool(tmp_path) as (proxy, slow, fast):
        (reply,) = aborted_whole(proxy, slow)
        assert isinstance(reply, openai.types.chat.ChatCompletion)
        assert reply.choices[0].finish_reason == "length"
        assert reply.choices[0].message.content == reference(fast)
        assert reply.usage is not None
        assert reply.usage.completion_tokens == TOKENS
        expect_migrations(proxy, {("aborted", "moved"): 1.0})


def test_an_aborted_whole_reply_with_no_attempt_left_is_an_error(tmp_path: Path) -> None:
    once = CONFIG.replace("max_attempts = 3", "max_attempts = 1") + "[migration]\nmax_moves = 0\n"
    with pool(tmp_path, once) as (proxy, slow, _):
        (reply,) = aborted_whole(proxy, slow)
        assert isinstance(reply, openai.APIStatusError)
        assert reply.status_code == 502
        assert "abort" in reply.message
        expect_migrations(proxy, {})


def _running(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("sglang:num_running_reqs"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"choices":[{"index":0,"delta":{},"finish_reason":"abort"}]}', True),
        (b'{"choices":[{"index":0,"text":"","finish_reason":"abort"}]}', True),
        (b'{"text":"","meta_info":{"finish_reason":{"type":"abort","message":"x"}}}', True),
        (b'{"choices":[{"delta":{"content":"\\"abort\\""},"finish_reason":null}]}', False),
        (b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}', False),
        (b'{"text":"","meta_info":{"finish_reason":{"type":"length","length":3}}}', False),
        (b'{"choices":[{"finish_reason":"abort"', False),
    ],
)
def test_only_an_abort_reads_as_one(payload: bytes, expected: bool) -> None:
    assert aborted(payload) is expected


def test_an_aborted_native_generate_stream_continues(tmp_path: Path) -> None:
    request = {"text": "tell me about rivers and mountains", "stream": True,
               "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True}}  # fmt: skip
    with pool(tmp_path) as (proxy, slow, _):
        events = []
        with httpx.stream("POST", proxy.url + "/generate", json=request, timeout=30) as reply:
            for line in reply.iter_lines():
                if not line.startswith("data: {"):
                    continue
                events.append(json.loads(line.removeprefix("data: ")))
                if len(events) == 6:
                    abort_all(slow)
        counts = migrations(proxy, {("aborted", "moved"): 1.0})
    assert not [e for e in events if "error" in e]
    reasons = [(e["meta_info"].get("finish_reason") or {}).get("type") for e in events]
    assert "abort" not in reasons
    assert reasons[-1] == "length"
    last = events[-1]
    assert len({e["meta_info"]["id"] for e in events}) == 1
    assert len(last["text"].split()) == len(last["output_ids"]) == TOKENS
    assert last["meta_info"]["completion_tokens"] == TOKENS
    assert counts == {("aborted", "moved"): 1.0}
