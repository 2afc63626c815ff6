"""The pure side of migration (`proxy.migrate`): which requests may move, the continuation's
body, the text kept from a stream, and a continuation's events rewritten for its client."""

from __future__ import annotations

import json

import pytest

from specroute.proxy.continued import Continued, Tap
from specroute.proxy.fields import Extras
from specroute.proxy.migrate import Migration

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
COMPLETION = {"model": "m", "prompt": "Once upon", "stream": True, "max_tokens": 10}


def body(base: dict[str, object], **extra: object) -> bytes:
    return json.dumps({**base, **extra}).encode()


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, None),
        ({"tools": None, "n": 1, "logprobs": False}, None),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"regex": "a+"}, "response_format"),
        ({"continue_final_message": True}, "continue_final_message"),
    ],
)
def test_chat_requests_that_cannot_continue_exactly_are_refused(
    extra: dict[str, object], reason: str | None
) -> None:
    assert Migration("chat", body(CHAT, **extra), 1).refusal == reason


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, None),
        ({"echo": True}, "echo_or_suffix"),
        ({"suffix": "end"}, "echo_or_suffix"),
        ({"prompt": [1, 2, 3]}, "prompt_not_text"),
        ({"best_of": 2}, "n"),
    ],
)
def test_completions_that_cannot_continue_exactly_are_refused(
    extra: dict[str, object], reason: str | None
) -> None:
    assert Migration("completions", body(COMPLETION, **extra), 1).refusal == reason


def _event(**fields: object) -> bytes:
    return b"data: " + json.dumps(fields).encode() + b"\n\n"


def test_a_chat_continuation_continues_the_final_assistant_message() -> None:
    request = body(CHAT, max_tokens=20, max_completion_tokens=30)
    migration = Migration("chat", request, 1)
    tap = Tap(migration, Extras(), 0.0)
    for word in (" the", " river"):
        delta = {"content": word, "reasoning_content": None}
        tap.feed(_event(id="a", created=1, model="m", choices=[{"delta": delta}]), 0.1)
    continuation = json.loads(migration.body(request, 2) or b"")
    assert continuation["messages"][-1] == {"role": "assistant", "content": " the river"}
    assert continuation["continue_final_message"] is True
    assert (continuation["max_tokens"], continuation["max_completion_tokens"]) == (18, 28)
    assert migration.body(request, 20) is None  # nothing left to generate


def test_a_chat_continuation_on_vllm_turns_the_generation_prompt_off() -> None:
    request = body(CHAT, max_tokens=20)
    migration = Migration("chat", request, 1)
    tap = Tap(migration, Extras(), 0.0)
    tap.feed(_event(id="a", created=1, model="m", choices=[{"delta": {"content": " the"}}]), 0.1)
    continuation = json.loads(migration.body(request, 1, "vllm") or b"")
    assert continuation["continue_final_message"] is True
    assert continuation["add_generation_prompt"] is False  # vLLM refuses both at true
    assert "add_generation_prompt" not in json.loads(migration.body(request, 1, "sglang") or b"")


def test_a_stream_that_relayed_no_text_is_sent_again_as_it_was() -> None:
    request = body(CHAT, max_tokens=20)
    migration = Migration("chat", request, 1)
    tap = Tap(migration, Extras(), 0.0)
    role = {"role": "assistant", "content": ""}  # vLLM's first chunk: the role, no text
    tap.feed(_event(id="a", created=1, model="m", choices=[{"delta": role}]), 0.1)
    assert migration.token_count() == 0  # nothing to ask a tokenizer about
    assert migration.body(request, 0, "vllm") == request


def test_a_completion_continuation_extends_the_prompt() -> None:
    migration = Migration("completions", body(COMPLETION), 1)
    tap = Tap(migration, Extras(), 0.0)
    tap.feed(_event(id="c", choices=[{"text": " a time"}]), 0.1)
    continuation = json.loads(migration.body(body(COMPLETION), 2) or b"")
    assert continuation["prompt"] == "Once upon a time"
    assert continuation["max_tokens"] == 8


def test_reasoning_in_the_stream_makes_it_unmovable() -> None:
    migration = Migration("chat", body(CHAT), 1)
    tap = Tap(migration, Extras(), 0.0)
    tap.feed(_event(id="a", choices=[{"delta": {"reasoning_content": "hmm"}}]), 0.1)
    assert migration.refusal == "reasoning_or_tool_calls"


def test_a_long_stream_keeps_its_text_in_order_across_the_batches_it_is_read_in() -> None:
    """Events are held unread up to `_HELD_BYTES`, then read in a batch: the text and the
    first envelope come out the same as one event at a time, whatever the batch bounds."""
    migration = Migration("chat", body(CHAT), 1)
    tap = Tap(migration, Extras(), 0.0)
    words = [f" w{i}" for i in range(2000)]  # about 150 kB of events: several batches
    for i, word in enumerate(words):
        delta = {"content": word, "reasoning_content": None}
        tap.feed(_event(id=f"id{i}", created=i, model="m", choices=[{"delta": delta}]), 0.1)
        if i == 1000:
            assert migration.text == "".join(words[:1001])  # read in the middle of a batch
    assert migration.text == "".join(words)
    assert migration.envelope() == ("id0", 0, "m")
    assert migration.refusal is None


def test_reasoning_held_unread_still_makes_the_stream_unmovable_when_asked() -> None:
    migration = Migration("chat", body(CHAT), 1)
    tap = Tap(migration, Extras(), 0.0)
    tap.feed(_event(id="a", choices=[{"delta": {"reasoning_content": "hmm"}}]), 0.1)
    for _ in range(3):
        tap.feed(_event(id="a", choices=[{"delta": {"content": "x"}}]), 0.1)
    assert migration.refusal == "reasoning_or_tool_calls"
    assert migration.text == "xxx"


def test_a_continuation_speaks_as_the_first_reply_and_sums_its_usage() -> None:
    migration = Migration("chat", body(CHAT), 1)
    Tap(migration, Extras(), 0.0).feed(_event(id="first", created=7, model="asked", choices=[]), 0)
    continued = Continued(migration, 5, Extras(), 0.0)
    usage = {"prompt_tokens": 15, "completion_tokens": 3, "total_tokens": 18}
    content = [{"delta": {"content": " x"}}]
    out = continued.feed(
        _event(id="second", created=9, model="other", choices=content)
        + _event(id="second", created=9, model="other", choices=[], usage=usage)
        + b"data: [DONE]\n\n",
        0.2,
    )
    events = [e.removeprefix(b"data: ") for e in out.split(b"\n\n") if e]
    first, last = json.loads(events[0]), json.loads(events[1])
    assert (first["id"], first["created"], first["model"]) == ("first", 7, "asked")
    assert last["usage"] == {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}
    assert events[2] == b"[DONE]"
    assert continued.meter.completion_tokens == 8
    assert migration.text == " x"


@pytest.mark.parametrize(
    ("request_body", "reason"),
    [
        ({"text": "hi", "stream": True}, None),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}, None),
        ({"text": ["a", "b"]}, "batch_or_undecodable"),
        ({"input_ids": [[1], [2]]}, "batch_or_undecodable"),
        ({"text": "hi", "return_logprob": True}, "logprobs"),
        ({"text": "hi", "sampling_params": {"n": 2}}, "n"),
        ({"text": "hi", "sampling_params": {"regex": "a+"}}, "response_format"),
        ({"text": "hi", "image_data": "x.png"}, "embeds_or_images"),
    ],
)
def test_native_requests_that_cannot_continue_exactly_are_refused(
    request_body: dict[str, object], reason: str | None
) -> None:
    assert Migration("generate", body(request_body), 1).refusal == reason


def test_a_native_continuation_appends_the_ids_so_far() -> None:
    request = body({"input_ids": [1, 2], "stream": True})
    migration = Migration("generate", request, 1)
    tap = Tap(migration, Extras(), 0.0)
    for ids in ([7], [7, 8]):
        tap.feed(_event(text=" a b"[: 2 * len(ids)], output_ids=ids, meta_info={"id": "g"}), 0)
    assert migration.token_count() == 2
    continuation = json.loads(migration.body(request, 2) or b"")
    assert continuation["input_ids"] == [1, 2, 7, 8]
    assert continuation["sampling_params"]["max_new_tokens"] == 126  # SGLang's default 128
