"""The emulator's Responses and Messages routes in SGLang 0.5.23's shapes: event names and
order, sequence numbers, no `[DONE]`, usage at the end; the stored-response errors of a server
started without `--enable-response-store`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from servers import Server, start_emulator

from specroute.sse import SSESplitter

MODEL = "emulated/agent-model"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with start_emulator(3, "--time-scale", "20", "--seed", "2", "--model-name", MODEL) as running:
        yield running


def _events(text: str) -> list[tuple[str, dict[str, object]]]:
    """(event name, data) of every event of a stream."""
    out = []
    for event, data in SSESplitter().feed(text.encode()):
        assert data is not None
        name = event.split(b"\n", 1)[0].removeprefix(b"event: ").decode()
        out.append((name, json.loads(data)))
    return out


def test_a_responses_stream_follows_sglangs_event_order(server: Server) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 20, "stream": True}
    reply = httpx.post(server.url + "/v1/responses", json=body, timeout=30)
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in reply.text
    events = _events(reply.text)
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # it ran out of max_output_tokens
    ]
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert 1 < len(deltas) < 20  # one per engine iteration, several tokens each at depth 3
    final = events[-1][1]["response"]
    assert isinstance(final, dict)
    assert final["usage"]["output_tokens"] == len("".join(deltas).split()) == 20  # type: ignore[index]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_messages_stream_follows_anthropics_event_order(server: Server) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 12,
        "stream": True,
        "system": "be terse",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
    }
    reply = httpx.post(server.url + "/v1/messages", json=body, timeout=30)
    events = _events(reply.text)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert isinstance(start, dict)
    assert start["usage"] == {"input_tokens": 15, "output_tokens": 0}  # words + 4 a message + 3
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens"},
        "usage": {"output_tokens": 12},
    }


def test_without_a_response_store_stateful_requests_are_refused_as_sglang_does(
    server: Server,
) -> None:
    made = httpx.post(server.url + "/v1/responses", json={"input": "hi", "max_output_tokens": 2})
    assert made.status_code == 200
    assert made.json()["id"].startswith("resp_")
    again = httpx.post(
        server.url + "/v1/responses",
        json={"input": "more", "previous_response_id": made.json()["id"]},
    )
    assert again.status_code == 400
    assert "--enable-response-store" in again.json()["error"]["message"]
    assert again.json()["error"]["param"] == "previous_response_id"
    fetched = httpx.get(server.url + "/v1/responses/" + made.json()["id"])
    assert fetched.status_code == 400


def test_messages_refuse_a_body_without_max_tokens_in_anthropics_shape(server: Server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(server.url + "/v1/messages", json=body)
    assert reply.status_code == 400
    assert reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in reply.json()["error"]["message"]
