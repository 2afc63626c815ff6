"""Relaying a stream: events pass byte for byte however the network splits them; only the
extras the proxy asked for are removed; the request fields decode without touching the rest."""

from __future__ import annotations

import itertools
import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specroute.config import LearnConfig
from specroute.errors import BadRequestError
from specroute.proxy.chunks import EventFilter, ReplyMeter, strip_reply
from specroute.proxy.fields import Extras, decode_fields, route_request, upstream_body


def _event(data: object) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _event({"id": "r", "object": "chat.completion.chunk", "choices": [choice]})


CONTENT = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "a b c"}),
    _chunk({}, "stop"),
]
DETAILS = {"spec_verify_ct": 2, "spec_accept_length": 1.5}
SGLEXT = _event(
    {"id": "r", "choices": [], "usage": None, "sglext": {"spec_tokens_details": DETAILS}}
)
USAGE = _event(
    {
        "id": "r",
        "choices": [],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }
)
DONE = b"data: [DONE]\n\n"
STREAM = b"".join([*CONTENT, SGLEXT, USAGE, DONE])


def _relay(pieces: list[bytes], extras: Extras) -> tuple[bytes, EventFilter]:
    relay = EventFilter(extras, started=0.0)
    out = b"".join(relay.feed(p, float(i)) for i, p in enumerate(pieces)) + relay.rest()
    return out, relay


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    out, relay = _relay(pieces, Extras(strip_usage=True, strip_sglext=True))
    assert out == b"".join([*CONTENT, DONE])
    assert relay.saw_done
    assert relay.chunks == 3
    assert relay.meter.completion_tokens == 3
    assert relay.meter.verify_ct == 2


def test_extras_the_client_asked_for_are_kept() -> None:
    out, _ = _relay([STREAM], Extras(strip_usage=False, strip_sglext=True))
    assert out == b"".join([*CONTENT, USAGE, DONE])
    out, _ = _relay([STREAM], Extras())
    assert out == STREAM


def test_upstream_error_event_passes_through() -> None:
    error = b'data: {"error":{"message":"boom","type":"x","param":null,"code":500}}\n\n'
    out, relay = _relay([CONTENT[0], error, DONE], Extras(strip_usage=True))
    assert out == CONTENT[0] + error + DONE
    assert relay.meter.error is not None


def test_whole_reply_loses_only_sglext_when_not_asked() -> None:
    body = json.dumps(
        {
            "id": "r",
            "usage": {"prompt_tokens": 1, "completion_tokens": 2},
            "sglext": {"spec_tokens_details": {"spec_verify_ct": 1}},
        }
    ).encode()
    meter = ReplyMeter()
    stripped = json.loads(strip_reply(body, Extras(strip_sglext=True), meter))
    assert "sglext" not in stripped
    assert stripped["usage"]["completion_tokens"] == 2
    assert meter.verify_ct == 1
    assert strip_reply(body, Extras(), ReplyMeter()) == body


def test_upstream_body_appends_learning_fields_to_client_bytes() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}\n'
    fields = decode_fields("chat", body)
    forwarded, extras = upstream_body(body, fields, LearnConfig())
    assert forwarded.startswith(body.rstrip()[:-1])
    assert json.loads(forwarded)["stream_options"] == {"include_usage": True}
    assert json.loads(forwarded)["return_spec_tokens_details"] is True
    assert extras == Extras(strip_usage=True, strip_sglext=True)


def test_upstream_body_merges_into_client_stream_options() -> None:
    body = b'{"model":"m","prompt":"x","stream":true,'
    body += b'"stream_options":{"continuous_usage_stats":false}}'
    forwarded, extras = upstream_body(body, decode_fields("completions", body), LearnConfig())
    assert json.loads(forwarded)["stream_options"] == {
        "continuous_usage_stats": False,
        "include_usage": True,
    }
    assert extras.strip_usage


def test_upstream_body_is_untouched_when_client_asked_for_everything() -> None:
    body = b'{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true},'
    body += b'"return_spec_tokens_details":true}'
    forwarded, extras = upstream_body(body, decode_fields("completions", body), LearnConfig())
    assert forwarded is body
    assert extras == Extras()


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b'{"model":"m"', "not valid JSON"),
        (b'{"model":3,"messages":[]}', "model"),
        (b'{"model":"m"}', "messages"),
        (b'{"model":"m","messages":[],"temperature":"hot"}', "temperature"),
    ],
)
def test_malformed_requests_are_bad_requests(body: bytes, match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        decode_fields("chat", body)


def test_a_request_without_model_decodes_as_sglang_takes_it_but_not_a_null_one() -> None:
    assert decode_fields("chat", b'{"messages":[]}').model is msgspec.UNSET
    assert decode_fields("completions", b'{"prompt":"x"}').model is msgspec.UNSET
    with pytest.raises(BadRequestError, match="model"):
        decode_fields("chat", b'{"model":null,"messages":[]}')


def test_workload_class_from_sampling_or_header() -> None:
    greedy = decode_fields("chat", b'{"model":"m","messages":[],"temperature":0}')
    assert route_request("chat", greedy, None).workload_class == "m:greedy"
    sampled = decode_fields("chat", b'{"model":"m","messages":[],"max_completion_tokens":9}')
    request = route_request("chat", sampled, None)
    assert (request.workload_class, request.max_tokens) == ("m:sampled", 9)
    assert route_request("chat", sampled, "code").workload_class == "code"


@pytest.mark.parametrize(
    ("sampling", "klass"),
    [
        (b'"temperature":0.0000001', "greedy"),  # under SGLang's epsilon: it decodes greedily
        (b'"temperature":0.7,"top_k":1', "greedy"),
        (b'"temperature":0.01', "sampled"),
        (b'"top_k":1', "greedy"),
    ],
)
def test_greedy_as_sglang_decides_it(sampling: bytes, klass: str) -> None:
    fields = decode_fields("chat", b'{"model":"m","messages":[],' + sampling + b"}")
    assert route_request("chat", fields, None).workload_class == f"m:{klass}"
    generate = b'{"sampling_params":{' + sampling + b"}}"
    assert route_request("generate", decode_fields("generate", generate), None).workload_class == (
        f"-:{klass}"
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model":"m","messages":[],"max_tokens":"64"}', "max_tokens"),
        (b'{"model":3,"messages":[]}', "model"),
        (
            b'{"model":"m","messages":[],"stream_options":{"include_usage":3}}',
            "stream_options.include_usage",
        ),
    ],
)
def test_a_wrongly_typed_field_is_named_as_openai_param(body: bytes, param: str) -> None:
    from specroute.errors import BadRequestError
    from specroute.proxy.fields import decode_fields

    with pytest.raises(BadRequestError) as caught:
        decode_fields("chat", body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"status_code":413,"detail":"Request Entity Too Large"}', "Request Entity Too Large"),
        (b"Request Entity Too Large\r\n", "backend answered 413: Request Entity Too Large"),
        (b'{"object":"error","message":"prompt too long","code":413}', "prompt too long"),
        (b"", "backend answered 413"),
    ],
)
def test_a_backend_refusal_reaches_the_client_with_the_backend_reason(
    body: bytes, reason: str
) -> None:
    from specroute.proxy.upstream_errors import upstream_error

    error = upstream_error(413, body)
    assert (str(error), error.status) == (reason, 413)
