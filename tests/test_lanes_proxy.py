"""Latency lanes through the proxy: the lane in a reply header, per-lane attainment, speed and
queue wait in `/metrics` and `/pool`, the lane as the engine's `priority` when configured, and
the admission queue admitting an interactive request before a batch one that came first."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import inprocess
from emulator_support import parse_metrics
from inprocess import Send, Upstream, event

from specroute.proxy import ProxyApp

PROMPT = [{"role": "user", "content": "hi"}]


async def _stream(body: bytes, send: Send) -> None:
    """Five tokens in three chunks, with the usage chunk the proxy asked for."""
    usage = {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    parts = [
        *(event({"id": "r", "choices": [{"index": 0, "delta": {"content": "ab"}}]})
          for _ in range(3)),
        event({"id": "r", "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]  # fmt: skip
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
    for part in parts:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": inprocess.MODEL, "messages": PROMPT, "stream": True, **extra}


async def _lane_traffic() -> tuple[list[str], dict[str, float], dict[str, Any], list[Any]]:
    lanes = {"target_tok_s": 20.0, "engine_priority": True, "interactive_priority": 7}
    async with (
        Upstream(_stream, steps=3).running() as backend,
        inprocess.proxy({"deep": backend}, lanes=lanes) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        headers = []
        for tier in ("priority", "flex", None):
            extra = {} if tier is None else {"service_tier": tier}
            reply = await client.post("/v1/chat/completions", json=_chat(**extra))
            assert reply.status_code == 200, reply.text
            headers.append(reply.headers["x-specroute-lane"])
        metrics = parse_metrics((await client.get("/metrics")).text)
        pool = (await client.get("/pool")).json()
    return headers, metrics, pool, [json.loads(b).get("priority") for b in backend.bodies]


def test_the_lane_is_in_the_reply_metrics_pool_and_engine_priority() -> None:
    headers, metrics, pool, priorities = asyncio.run(_lane_traffic())
    assert headers == ["interactive", "batch", "batch"]
    assert priorities == [7, 0, 0]
    assert metrics['specroute_lane_requests_total{lane="interactive",target="met"}'] == 1
    assert metrics['specroute_lane_requests_total{lane="batch",target="met"}'] == 2
    assert metrics['specroute_lane_request_tokens_per_second_count{lane="interactive"}'] == 1
    assert metrics['specroute_lane_queue_wait_seconds_count{lane="batch"}'] == 2
    assert metrics['specroute_lane_waiting_requests{lane="interactive"}'] == 0
    interactive = pool["lanes"]["interactive"]
    assert interactive["requests"] == 1
    assert interactive["target_tok_s"] == 20.0
    assert interactive["attainment"] == 1.0
    assert interactive["mean_tok_s"] > 20.0
    assert interactive["tok_s_p50"] == interactive["mean_tok_s"]  # one request
    assert (interactive["in_flight"], interactive["waiting"]) == (0, 0)  # all answered
    assert pool["lanes"]["batch"]["requests"] == 2


async def _wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):  # polled: the proxy runs in this event loop
        if condition():
            return
        await asyncio.sleep(0.005)
    raise TimeoutError("condition not reached")


async def _admission_order() -> tuple[list[str], dict[str, Any]]:
    gate = asyncio.Event()
    order: list[str] = []

    async def held(body: bytes, send: Send) -> None:
        order.append(json.loads(body)["messages"][0]["content"])
        if len(order) == 1:
            await gate.wait()  # the first request holds the only slot
        await _stream(body, send)

    one_slot = {"overcommit": 1.0}  # the backend's in-flight limit: its one running request
    async with (
        Upstream(held, steps=3, info={"max_running_requests": 1}).running() as backend,
        inprocess.proxy({"deep": backend}, admission=one_slot) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        sent = [asyncio.create_task(_send(client, "first", None))]
        await _wait_until(lambda: len(order) == 1)
        sent.append(asyncio.create_task(_send(client, "batch", "flex")))
        await _wait_until(lambda: _waiting(app) == 1)
        sent.append(asyncio.create_task(_send(client, "interactive", "priority")))
        await _wait_until(lambda: _waiting(app) == 2)
        lanes = (await client.get("/pool")).json()["lanes"]
        gate.set()
        assert await asyncio.gather(*sent) == [200, 200, 200]
    return order, lanes


def _waiting(app: ProxyApp) -> int:
    return app.state.admission.waiting


async def _send(client: httpx.AsyncClient, text: str, tier: str | None) -> int:
    body = {"model": inprocess.MODEL, "messages": [{"role": "user", "content": text}],
            "stream": True, **({"service_tier": tier} if tier else {})}  # fmt: skip
    return (await client.post("/v1/chat/completions", json=body)).status_code


def test_an_interactive_request_is_admitted_before_a_batch_one_that_waited_longer() -> None:
    order, lanes = asyncio.run(_admission_order())
    assert order == ["first", "interactive", "batch"]
    # While held: each lane's load in /pool, waiting and running, as the planner reads it.
    assert (lanes["interactive"]["in_flight"], lanes["interactive"]["waiting"]) == (1, 1)
    assert (lanes["batch"]["in_flight"], lanes["batch"]["waiting"]) == (2, 1)


async def _queue_order(reserve: int, sends: list[tuple[str, str]]) -> list[str]:
    """The order a one-slot backend sees requests sent while its slot is held, one by one,
    each waiting in the queue before the next is sent."""
    gate = asyncio.Event()
    order: list[str] = []

    async def held(body: bytes, send: Send) -> None:
        order.append(json.loads(body)["messages"][0]["content"])
        if len(order) == 1:
            await gate.wait()
        await _stream(body, send)

    async with (
        Upstream(held, steps=3, info={"max_running_requests": 1}).running() as backend,
        inprocess.proxy({"deep": backend}, admission={"overcommit": 1.0},
                        lanes={"reserve": reserve}) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):  # fmt: skip
        sent = [asyncio.create_task(_send(client, "first", None))]
        await _wait_until(lambda: len(order) == 1)
        for n, (text, tier) in enumerate(sends, 1):
            sent.append(asyncio.create_task(_send(client, text, tier)))
            await _wait_until(lambda n=n: _waiting(app) == n)  # type: ignore[misc]
        gate.set()
        assert set(await asyncio.gather(*sent)) == {200}
    return order


def test_a_waiting_batch_request_lets_at_most_reserve_interactive_ones_ahead() -> None:
    sends = [("batch", "flex"), *((f"i{n}", "priority") for n in range(1, 5))]
    assert asyncio.run(_queue_order(2, sends)) == ["first", "i1", "i2", "batch", "i3", "i4"]
    # Without a reserve, one: the bound on a batch request's wait is its queue plus one.
    assert asyncio.run(_queue_order(0, sends)) == ["first", "i1", "batch", "i2", "i3", "i4"]
