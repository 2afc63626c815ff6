"""Each fault option of `specroute emulate` does what its help says."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from servers import start_emulator

from specroute.sse import SSEDecoder

FAST = ("--time-scale", "8", "--seed", "3")
EXIT_STATUS = 3


def chat_body(max_tokens: int = 40, *, stream: bool = True) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "count to forty"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }


def content_tokens(payloads: list[bytes]) -> int:
    total = 0
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        choices = json.loads(payload)["choices"]
        if choices:
            total += len((choices[0]["delta"].get("content") or "").split())
    return total


def read_stream(
    client: httpx.Client, payloads: list[bytes], body: dict[str, Any] | None = None
) -> None:
    """Collect event payloads into `payloads` as they arrive (kept if the stream breaks)."""
    decoder = SSEDecoder()
    with client.stream("POST", "/v1/chat/completions", json=body or chat_body()) as response:
        for chunk in response.iter_raw():
            payloads += decoder.feed(chunk)


def test_fail_rate_one_answers_every_generation_with_500() -> None:
    with (
        start_emulator(1, "--fail-rate", "1", *FAST) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        reply = client.post("/v1/chat/completions", json=chat_body(stream=False))
        assert reply.status_code == 500
        body = reply.json()
        assert body["object"] == "error"
        assert body["code"] == 500
        assert body["type"] == "InternalServerError"
        assert client.post("/generate", json={"text": "x"}).status_code == 500
        assert client.get("/v1/models").status_code == 200  # only generation fails


def test_fail_rate_half_fails_about_half_the_requests() -> None:
    with (
        start_emulator(1, "--fail-rate", "0.5", *FAST) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        body = {"prompt": "hi", "max_tokens": 1}
        codes = [client.post("/v1/completions", json=body).status_code for _ in range(40)]
    assert set(codes) == {200, 500}
    assert 8 <= codes.count(500) <= 32


def test_exit_after_requests_dies_on_the_next_request() -> None:
    with (
        start_emulator(1, "--exit-after-requests", "2", *FAST) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        for _ in range(2):
            ok = client.post("/v1/chat/completions", json=chat_body(3, stream=False))
            assert ok.status_code == 200
        with pytest.raises(httpx.TransportError):
            client.post("/v1/chat/completions", json=chat_body(3, stream=False))
        assert server.process.wait(timeout=10) == EXIT_STATUS


def test_exit_mid_stream_cuts_the_connection_after_n_tokens() -> None:
    with (
        start_emulator(3, "--exit-mid-stream-after-tokens", "5", *FAST) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        payloads: list[bytes] = []
        with pytest.raises(httpx.TransportError):
            read_stream(client, payloads)
        assert content_tokens(payloads) == 5
        assert b"[DONE]" not in payloads
        assert server.process.wait(timeout=10) == EXIT_STATUS


def test_stall_keeps_the_connection_open_but_sends_nothing_more() -> None:
    with (
        start_emulator(3, "--stall-after-tokens", "4", *FAST) as server,
        httpx.Client(base_url=server.url, timeout=httpx.Timeout(10, read=1.0)) as client,
    ):
        payloads: list[bytes] = []
        with pytest.raises(httpx.ReadTimeout):
            read_stream(client, payloads)
        assert content_tokens(payloads) == 4
        assert server.process.poll() is None
        assert client.get("/health").status_code == 200


def test_exit_mid_stream_ends_a_non_streamed_request_after_n_tokens_unanswered() -> None:
    with (
        start_emulator(3, "--exit-mid-stream-after-tokens", "5", *FAST) as server,
        httpx.Client(base_url=server.url, timeout=10) as client,
    ):
        with pytest.raises(httpx.TransportError):
            client.post("/v1/chat/completions", json=chat_body(stream=False))
        assert server.process.wait(timeout=10) == EXIT_STATUS


def test_stall_never_answers_a_non_streamed_request_but_stays_up() -> None:
    with (
        start_emulator(3, "--stall-after-tokens", "4", *FAST) as server,
        httpx.Client(base_url=server.url, timeout=httpx.Timeout(10, read=1.0)) as client,
    ):
        short = client.post("/v1/chat/completions", json=chat_body(3, stream=False))
        assert short.status_code == 200  # done before the limit: answered
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/chat/completions", json=chat_body(stream=False))
        assert server.process.poll() is None
        assert client.get("/health").status_code == 200


def test_not_ready_for_answers_503_then_becomes_ready() -> None:
    with (
        start_emulator(1, "--not-ready-for", "1.5", *FAST, ready_path=None) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 503
        deadline = time.monotonic() + 15
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.1)
        assert client.get("/health").status_code == 200


def test_malformed_sse_rate_one_breaks_one_data_line_per_stream() -> None:
    with (
        start_emulator(3, "--malformed-sse-rate", "1", *FAST) as server,
        httpx.Client(base_url=server.url) as client,
    ):
        payloads: list[bytes] = []
        read_stream(client, payloads, chat_body(12))
    broken = []
    for payload in payloads[:-1]:
        try:
            json.loads(payload)
        except json.JSONDecodeError:
            broken.append(payload)
    assert len(broken) == 1
    assert payloads[-1] == b"[DONE]"
    assert payloads.index(broken[0]) > 1  # after the first content, before the end
    good = [p for p in payloads if p not in broken]
    assert content_tokens(good) == 12
