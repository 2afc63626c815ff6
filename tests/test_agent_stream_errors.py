"""A Responses or Messages stream that breaks after its first events ends, through the proxy,
with that API's own error event (not chat's `data: {"error"}` and `[DONE]`), which its official
client raises; a break before the first byte is retried on another backend unseen."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from inprocess import MODEL, Handler, Send, Upstream, proxy, stream_of

from specroute.sse import SSEDecoder


def _named(kind: str, data: dict[str, object]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


RESPONSE_START = [
    _named("response.created", {"sequence_number": 0, "response": {"id": "resp_1"}}),
    _named("response.output_item.added", {"sequence_number": 1, "output_index": 0}),
    _named("response.output_text.delta", {"sequence_number": 2, "delta": " hello"}),
]
MESSAGE_START = [
    _named("message_start", {"message": {"id": "msg_1", "usage": {"input_tokens": 3}}}),
    _named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " hi"}}),
]


def _body(api: str) -> dict[str, object]:
    if api == "responses":
        return {"model": MODEL, "input": "go", "stream": True}
    return {"model": MODEL, "max_tokens": 5, "stream": True, "messages": []}


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_stream_broken_midway_ends_with_the_apis_own_error_event(api: str) -> None:
    events = RESPONSE_START if api == "responses" else MESSAGE_START
    text = asyncio.run(_through(api, stream_of(events)))  # ends without its terminal event
    payloads = [json.loads(p) for p in SSEDecoder().feed(text.encode())]
    assert [p["type"] for p in payloads[: len(events)]] == [
        json.loads(e.split(b"data: ", 1)[1])["type"] for e in events
    ]
    assert "[DONE]" not in text
    if api == "responses":
        assert text.endswith("\n\n")
        error = payloads[-1]
        assert error["type"] == "error"
        assert error["sequence_number"] == 3
        assert error["code"] == "stream_interrupted"
        assert "event: error\n" in text
    else:
        assert payloads[-2]["type"] == "error"
        assert payloads[-2]["error"]["type"] == "api_error"
        assert payloads[-1] == {"type": "message_stop"}


RESPONSE_END = _named("response.completed", {"sequence_number": 3, "response": {"id": "resp_1"}})
MESSAGE_END = _named("message_stop", {})


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_what_a_backend_sends_after_the_terminal_event_is_not_relayed(api: str) -> None:
    """After `response.completed` or `message_stop` the answer is whole: garbage after it is
    neither passed on nor turned into an error event."""
    events = (
        [*RESPONSE_START, RESPONSE_END] if api == "responses" else [*MESSAGE_START, MESSAGE_END]
    )
    text = asyncio.run(_through(api, stream_of([*events, b"data: not json\n\n", b"data: torn"])))
    assert text == b"".join(events).decode()


def test_the_official_clients_raise_on_those_error_events() -> None:
    import anthropic
    import openai

    async def both() -> tuple[str, str]:
        return (
            await _through("responses", stream_of(RESPONSE_START)),
            await _through("messages", stream_of(MESSAGE_START)),
        )

    responses, messages = asyncio.run(both())
    with pytest.raises(openai.APIError):
        _replay_openai(responses)
    with pytest.raises(anthropic.APIStatusError):
        _replay_anthropic(messages)


def _replay_openai(text: str) -> None:
    import openai

    transport = httpx.MockTransport(
        lambda _: httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
    )
    client = openai.OpenAI(
        base_url="http://x/v1", api_key="k", http_client=httpx.Client(transport=transport)
    )
    for _ in client.responses.create(model=MODEL, input="go", stream=True):
        pass


def _replay_anthropic(text: str) -> None:
    import anthropic

    try:  # the HTTP library the anthropic SDK is built on: httpx2 from its 2.x releases
        import httpx2 as http
    except ImportError:
        http = httpx  # type: ignore[no-redef]

    transport = http.MockTransport(
        lambda _: http.Response(200, text=text, headers={"content-type": "text/event-stream"})
    )
    client = anthropic.Anthropic(
        base_url="http://x", api_key="k", http_client=http.Client(transport=transport)
    )
    stream = client.messages.create(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    for _ in stream:
        pass


def test_a_failure_before_the_first_byte_is_retried_on_another_backend() -> None:
    async def refuses(_: bytes, send: Send) -> None:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"error":"engine died"}'})

    ok = stream_of([*MESSAGE_START, _named("message_stop", {})])

    async def run() -> httpx.Response:
        async with (
            Upstream(refuses).running() as bad,
            Upstream(ok).running() as good,
            proxy({"a": bad, "b": good}, policy="round_robin") as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            return await client.post("/v1/messages", json=_body("messages"))

    reply = asyncio.run(run())
    assert reply.status_code == 200
    assert reply.headers["x-specroute-backend"] == "b"
    assert reply.text.endswith('data: {"type": "message_stop"}\n\n')


async def _through(api: str, handler: Handler) -> str:
    async with (
        Upstream(handler).running() as upstream,
        proxy({"a": upstream}) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        reply = await client.post(f"/v1/{api}", json=_body(api))
        assert reply.status_code == 200
        return reply.text


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_stream_ended_by_shutdown_gets_the_apis_error_event(api: str) -> None:
    events = RESPONSE_START if api == "responses" else MESSAGE_START

    async def run() -> str:
        sent, release = asyncio.Event(), asyncio.Event()

        async def holds(_: bytes, send: Send) -> None:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"".join(events), "more_body": True})
            sent.set()
            await release.wait()  # the rest never comes before the shutdown
            await send({"type": "http.response.body", "body": b""})

        async with (
            Upstream(holds).running() as upstream,
            proxy({"a": upstream}) as (url, app),
            httpx.AsyncClient(base_url=url) as client,
            client.stream("POST", f"/v1/{api}", json=_body(api)) as reply,
        ):
            chunks = reply.aiter_bytes()
            first = await anext(chunks)  # the stream is under way at the client
            await sent.wait()
            await app.drain(0.0)
            release.set()
            return (first + b"".join([chunk async for chunk in chunks])).decode()

    text = asyncio.run(run())
    payloads = [json.loads(p) for p in SSEDecoder().feed(text.encode())]
    error = payloads[-1] if api == "responses" else payloads[-2]
    assert error["type"] == "error"
    message = error["message"] if api == "responses" else error["error"]["message"]
    assert message == "proxy is shutting down"


def test_a_responses_stream_that_dies_in_prefill_is_retried_unseen() -> None:
    """SGLang sends `response.created` before any token: held back, it does not commit the
    reply, so a backend that fails before its first token is still retried."""
    in_progress = {"sequence_number": 1, "response": {"id": "resp_1"}}
    lifecycle = [RESPONSE_START[0], _named("response.in_progress", in_progress)]
    completed = _named(
        "response.completed",
        {"sequence_number": 3, "response": {"id": "resp_2", "usage": {"output_tokens": 1}}},
    )
    good = [*RESPONSE_START, completed]

    async def run() -> httpx.Response:
        async with (
            Upstream(stream_of(lifecycle)).running() as dies,
            Upstream(stream_of(good)).running() as works,
            proxy({"a": dies, "b": works}, policy="round_robin") as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            return await client.post("/v1/responses", json=_body("responses"))

    reply = asyncio.run(run())
    assert reply.status_code == 200
    assert reply.headers["x-specroute-backend"] == "b"
    assert reply.text == b"".join(good).decode()
