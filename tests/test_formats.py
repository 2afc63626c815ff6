"""Reading the Responses and Messages streams: split at any byte, every event goes on as it
came, and the same tokens, response id, end and ticks (one where the text starts, one per
delta, one at the end) are read from it."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from specroute.errors import StreamInterruptedError
from specroute.proxy.chunks import ReplyMeter
from specroute.proxy.fields import Extras
from specroute.proxy.formats import ApiEventFilter, measure_whole, render_error


def _named(kind: str, **data: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def _responses(deltas: int) -> bytes:
    response = {"id": "resp_7", "usage": None}
    done = {"id": "resp_7", "usage": {"input_tokens": 9, "output_tokens": 2 * deltas}}
    events = [
        _named("response.created", sequence_number=0, response=response),
        _named("response.in_progress", sequence_number=1, response=response),
        _named("response.output_item.added", sequence_number=2, output_index=0),
        _named("response.content_part.added", sequence_number=3, output_index=0),
    ]
    events += [
        _named("response.output_text.delta", sequence_number=4 + i, delta=" a b")
        for i in range(deltas)
    ]
    events.append(_named("response.completed", sequence_number=4 + deltas, response=done))
    return b"".join(events)


def _messages(deltas: int) -> bytes:
    start = {"id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 0}}
    text = {"type": "text_delta", "text": " a b"}
    events = [
        _named("message_start", message=start),
        _named("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        *(_named("content_block_delta", index=0, delta=text) for _ in range(deltas)),
        _named("content_block_stop", index=0),
        _named("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 7}),
        _named("message_stop"),
    ]
    return b"".join(events)


@given(
    api=st.sampled_from(["responses", "messages"]),
    deltas=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
)
def test_a_stream_split_anywhere_reads_the_same(api: str, deltas: int, cuts: list[int]) -> None:
    whole = _responses(deltas) if api == "responses" else _messages(deltas)
    relay = ApiEventFilter(api, Extras(), started=0.0)
    points = sorted({min(c, len(whole)) for c in cuts} | {0, len(whole)})
    out = b"".join(
        relay.feed(whole[a:b], float(i)) for i, (a, b) in enumerate(itertools.pairwise(points))
    )
    assert out + relay.rest() == whole
    assert relay.saw_done
    assert relay.chunks == deltas + 2
    meter = relay.meter
    if api == "responses":
        assert (meter.prompt_tokens, meter.completion_tokens) == (9, 2 * deltas)
        assert meter.response_id == "resp_7"
    else:
        assert (meter.prompt_tokens, meter.completion_tokens) == (5, 7)


def test_a_stream_without_its_last_event_has_not_ended() -> None:
    relay = ApiEventFilter("messages", Extras(), started=0.0)
    relay.feed(_messages(2).rsplit(b"event: message_stop", 1)[0], 1.0)
    assert not relay.saw_done


def test_error_events_and_bodies_are_in_each_apis_own_shape() -> None:
    relay = ApiEventFilter("responses", Extras(), started=0.0)
    relay.feed(_responses(1).split(b"event: response.completed")[0], 1.0)
    tail = relay.error_tail(StreamInterruptedError("backend went away"))
    assert tail.startswith(b"event: error\ndata: ")
    error = json.loads(tail.split(b"data: ", 1)[1])
    assert (error["type"], error["sequence_number"]) == ("error", 5)
    assert error["message"] == error["error"]["message"] == "backend went away"
    anthropic = json.loads(render_error("messages", StreamInterruptedError("gone")))
    assert anthropic == {"type": "error", "error": {"type": "api_error", "message": "gone"}}
    assert "error" in json.loads(render_error("responses", StreamInterruptedError("gone")))


def test_a_whole_reply_gives_its_tokens_and_id() -> None:
    meter = ReplyMeter()
    body = {"id": "resp_2", "usage": {"input_tokens": 4, "output_tokens": 11}}
    measure_whole(json.dumps(body).encode(), meter)
    assert (meter.prompt_tokens, meter.completion_tokens, meter.response_id) == (4, 11, "resp_2")
