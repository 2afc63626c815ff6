"""The relay against scripted backends in the test's own event loop: what a third-party
policy's failure leaves intact, and upstream streams framed with CRLF or CR line ends relayed
event by event as they arrive."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import inprocess
import pytest
from inprocess import Send, Upstream, event, stream_of
from structlog.testing import capture_logs

from specroute.policies import Decision, Outcome, PoolView, RouteRequest

CHAT = {"model": inprocess.MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
CLASS = f"{inprocess.MODEL}:sampled"


def _chunk(content: str) -> dict[str, Any]:
    return {"id": "r", "choices": [{"index": 0, "delta": {"content": content}}]}


class ForgetfulPolicy:
    """A third-party policy with a bug in `observe`."""

    name = "forgetful"

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        return Decision(backend=view.backends[0].name, reason="the only one")

    def observe(self, outcome: Outcome) -> None:
        raise RuntimeError("forgot how to learn")


def test_a_policy_whose_observe_fails_is_logged_and_the_estimators_still_learn() -> None:
    details = {"spec_tokens_details": {"spec_verify_ct": 4, "spec_accept_length": 2.5}}
    usage = {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}
    events = [
        event(_chunk("a b c")),
        event({"id": "r", "choices": [], "usage": usage, "sglext": details}),
        b"data: [DONE]\n\n",
    ]
    with capture_logs() as logs:
        estimates, reply = asyncio.run(_one_request(stream_of(events), ForgetfulPolicy()))
    assert reply.status_code == 200
    assert reply.text == events[0].decode() + "data: [DONE]\n\n"
    failed = [e for e in logs if e["event"] == "policy_observe_failed"]
    assert [(e["policy"], e["log_level"]) for e in failed] == [("forgetful", "error")]
    assert estimates["classes"][CLASS]["samples"] == 1
    assert set(estimates["classes"][CLASS]["accept_length"]) == {"1"}  # learned at depth 1


async def _one_request(
    handler: inprocess.Handler, policy: ForgetfulPolicy
) -> tuple[dict[str, Any], httpx.Response]:
    async with (
        Upstream(handler).running() as backend,
        inprocess.proxy({"only": backend}) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        app.state.policy = policy  # as a policy registered under `specroute.policies` would be
        reply = await client.post("/v1/chat/completions", json=CHAT)
        estimates = (await client.get("/pool")).json()["estimates"]
    return estimates, reply


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_events_framed_with_crlf_or_cr_are_relayed_one_by_one_as_they_arrive(eol: bytes) -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    events = [
        b": keep-alive" + eol + eol,
        event(_chunk("a"), eol),
        event(_chunk("b"), eol),
        event({"id": "r", "choices": [], "usage": usage}, eol),  # asked for by the proxy
        b"data: [DONE]" + eol + eol,
    ]
    received = asyncio.run(_relayed_in_step(events))
    # Each event reached the client before the backend sent the next; the usage the client
    # did not ask for is gone, and every other byte is the backend's.
    assert received == [events[0], events[1], events[2], events[4]]


async def _relayed_in_step(events: list[bytes]) -> list[bytes]:
    """The backend sends each event only once the client holds everything sent before it."""
    turn = asyncio.Queue[None]()

    async def in_step(_: bytes, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in events:
            await send({"type": "http.response.body", "body": part, "more_body": True})
            if not part.startswith(b'data: {"id":"r","choices":[],'):
                await turn.get()  # the usage event is never forwarded: no turn to wait for
        await send({"type": "http.response.body", "body": b""})

    received: list[bytes] = []
    async with (
        Upstream(in_step).running() as backend,
        inprocess.proxy({"only": backend}) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
        client.stream("POST", "/v1/chat/completions", json=CHAT) as reply,
    ):
        assert reply.status_code == 200
        async with asyncio.timeout(10):  # a relay that held events back would hang here
            async for data in reply.aiter_raw():
                received.append(data)
                turn.put_nowait(None)
    return received


def test_a_body_too_slow_for_the_protocol_is_recorded_as_408_not_as_a_client_that_left() -> None:
    statuses = asyncio.run(_slow_body())
    assert statuses["reply"] == 408
    assert statuses["recorded"] == ["408"]


async def _slow_body() -> dict[str, Any]:
    async with (
        Upstream(stream_of([])).running() as backend,
        inprocess.proxy({"only": backend}, limits={"body_timeout_s": 0.3}) as (url, app),
    ):
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
        writer.write(head + b'{"model":')  # and the rest never comes
        reply = await reader.read(65536)
        writer.close()
        requests = app.state.metrics.requests
        for _ in range(200):  # the relay records the request once its handler has ended
            if requests.values:
                break
            await asyncio.sleep(0.01)
        recorded = [labels[3] for labels in requests.values]
    return {"reply": int(reply.split(b" ", 2)[1]), "recorded": recorded}
