"""Streaming wire contract of the emulator: chunk shapes and order, as SGLang 0.5.23 sends them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from emulator_support import metric, stream_events, wait_for
from servers import Server, start_emulator

SPEC_FIELDS = {
    "spec_accept_rate",
    "spec_accept_length",
    "spec_cap_length",
    "spec_block_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
    "spec_cap_lens_histogram",
}
USAGE_FIELDS = [
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "reasoning_tokens",
    "completion_tokens_details",
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with start_emulator(3, "--time-scale", "8", "--seed", "11") as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def chat_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "my-model",
        "messages": [{"role": "user", "content": "tell me a story about rivers"}],
        "max_tokens": 24,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    return {**body, **extra}


def contents(events: list[Any]) -> list[str]:
    return [
        e["choices"][0]["delta"]["content"]
        for e in events[1:]
        if isinstance(e, dict) and e["choices"] and "content" in e["choices"][0]["delta"]
    ]


def test_chat_stream_sends_role_content_finish_sglext_usage_then_done(
    client: httpx.Client,
) -> None:
    body = chat_body(stream_options={"include_usage": True}, return_spec_tokens_details=True)
    events = stream_events(client, "/v1/chat/completions", body)
    role, *middle, finish, sglext, usage, done = events
    assert done == "[DONE]"
    assert list(role) == ["id", "object", "created", "model", "choices"]
    assert role["object"] == "chat.completion.chunk"
    assert role["model"] == "my-model"
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
            "matched_stop": None,
        }
    ]
    for chunk in middle:
        assert chunk["id"] == role["id"]
        assert list(chunk["choices"][0]["delta"]) == ["reasoning_content", "content"]
        assert chunk["choices"][0]["finish_reason"] is None
        assert "usage" not in chunk
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["choices"][0]["matched_stop"] is None
    assert sglext["choices"] == []
    assert sglext["usage"] is None
    details = sglext["sglext"]["spec_tokens_details"]
    assert set(details) == SPEC_FIELDS
    assert usage["choices"] == []
    assert "sglext" not in usage
    assert list(usage["usage"]) == USAGE_FIELDS
    text = "".join(contents(events))
    assert usage["usage"]["completion_tokens"] == len(text.split()) == 24
    assert usage["usage"]["prompt_tokens"] == 6 + 4 + 3  # words + one message + assistant header
    assert details["spec_verify_ct"] == sum(details["spec_correct_drafts_histogram"])
    assert details["spec_num_proposed_drafts"] == 3 * details["spec_verify_ct"]
    assert details["spec_accept_length"] == pytest.approx(24 / details["spec_verify_ct"])


def test_speculation_puts_several_tokens_in_one_content_chunk(client: httpx.Client) -> None:
    events = stream_events(client, "/v1/chat/completions", chat_body(max_tokens=40))
    sizes = [len(text.split()) for text in contents(events)]
    assert sum(sizes) == 40
    assert sizes[0] == 1  # the prefill yields one token
    assert max(sizes) > 1  # greedy drafts are accepted: a verify emits up to steps + 1 tokens
    assert max(sizes) <= 4


def test_chat_stream_without_options_has_no_usage_or_sglext_chunk(client: httpx.Client) -> None:
    events = stream_events(client, "/v1/chat/completions", chat_body())
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert all(e["choices"] for e in events[:-1])


def test_continuous_usage_stats_puts_running_usage_on_content_chunks(
    client: httpx.Client,
) -> None:
    body = chat_body(stream_options={"include_usage": False, "continuous_usage_stats": True})
    events = stream_events(client, "/v1/chat/completions", body)
    content_chunks = [e for e in events[1:-2] if "content" in e["choices"][0]["delta"]]
    seen = 0
    for chunk in content_chunks:
        seen += len(chunk["choices"][0]["delta"]["content"].split())
        assert chunk["usage"]["completion_tokens"] == seen
        assert chunk["usage"]["total_tokens"] == seen + chunk["usage"]["prompt_tokens"]
    assert "usage" not in events[0]  # the role chunk carries none, as in SGLang
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"]


def test_completion_stream_carries_finish_on_last_text_chunk(client: httpx.Client) -> None:
    body = {
        "prompt": "once upon a time",
        "max_tokens": 10,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True,
    }
    events = stream_events(client, "/v1/completions", body)
    *texts, sglext, usage, done = events
    assert done == "[DONE]"
    for chunk in texts:
        assert chunk["object"] == "text_completion"
        assert chunk["model"] == "default"
        assert chunk["usage"] is None
        assert list(chunk["choices"][0]) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "matched_stop",
        ]
    assert [c["choices"][0]["finish_reason"] for c in texts] == [None] * (len(texts) - 1) + [
        "length"
    ]
    assert sglext["choices"] == []
    assert set(sglext["sglext"]["spec_tokens_details"]) == SPEC_FIELDS
    # The completions usage chunk drops null fields (exclude_none in SGLang).
    assert usage["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 14,
        "completion_tokens": 10,
        "reasoning_tokens": 0,
    }
    assert len("".join(c["choices"][0]["text"] for c in texts).split()) == 10


def test_generate_stream_repeats_the_text_so_far_and_ends_with_meta_info(
    client: httpx.Client,
) -> None:
    body = {
        "text": "one two three",
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
        "stream": True,
        "rid": "gen-stream-1",
    }
    events = stream_events(client, "/generate", body)
    assert events[-1] == "[DONE]"
    outputs = events[:-1]
    for earlier, later in itertools.pairwise(outputs):
        assert later["text"].startswith(earlier["text"])
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
    last = outputs[-1]
    meta = last["meta_info"]
    assert meta["id"] == "gen-stream-1"
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["completion_tokens"] == len(last["output_ids"]) == len(last["text"].split())
    assert meta["prompt_tokens"] == 3
    assert meta["spec_verify_ct"] >= 1
    assert "e2e_latency" in meta
    assert all(o["meta_info"]["finish_reason"] is None for o in outputs[:-1])


def test_natural_stop_reports_eos_as_matched_stop(client: httpx.Client) -> None:
    body = chat_body(max_tokens=5000, ignore_eos=False)
    events = stream_events(client, "/v1/chat/completions", body)
    finish = events[-2]["choices"][0]
    assert finish["finish_reason"] == "stop"
    assert isinstance(finish["matched_stop"], int)
    assert len("".join(contents(events)).split()) < 5000


def test_client_that_disconnects_is_aborted_at_once(client: httpx.Client) -> None:
    aborted_before = metric(client, "sglang:num_aborted_requests_total")
    body = chat_body(max_tokens=20000)
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        next(line for line in lines if '"content":" ' in line)
        wait_for(lambda: metric(client, "sglang:num_running_reqs") == 1)
    # Leaving the block closed the connection mid-stream.
    wait_for(lambda: metric(client, "sglang:num_aborted_requests_total") == aborted_before + 1)
    wait_for(lambda: metric(client, "sglang:num_running_reqs") == 0)
    loads = client.get("/v1/loads").json()["loads"][0]
    assert loads["num_running_reqs"] == 0


def test_non_streaming_client_that_hangs_up_is_aborted(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        aborted_before = metric(client, "sglang:num_aborted_requests_total")
    body = chat_body(max_tokens=20000, stream=False)
    with (
        httpx.Client(base_url=server.url, timeout=httpx.Timeout(5, read=0.3)) as impatient,
        pytest.raises(httpx.ReadTimeout),
    ):
        impatient.post("/v1/chat/completions", json=body)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        wait_for(lambda: metric(client, "sglang:num_aborted_requests_total") == aborted_before + 1)
        wait_for(lambda: metric(client, "sglang:num_running_reqs") == 0)


def test_abort_request_ends_a_stream_with_finish_reason_abort(client: httpx.Client) -> None:
    body = chat_body(max_tokens=20000, rid="to-abort")
    events: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if not line:
                continue
            events.append(line)
            if '"content":" ' in line and len(events) < 4:
                assert client.post("/abort_request", json={"rid": "to-abort"}).status_code == 200
    assert events[-1] == "data: [DONE]"
    assert '"finish_reason":"abort"' in events[-2]
