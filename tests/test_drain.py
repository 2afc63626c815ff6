"""Draining a backend (the actuator's `PUT /pool/backends/{name}/state`): the policy sends it
nothing new, the stream it already serves runs to its end, and readmission routes to it again.
Real emulated backends on loopback, the proxy in this test's event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from inprocess import ADMIN, proxy
from servers import Server, start_emulator

CHAT = {"model": "emulated", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Server, Server]]:
    with start_emulator(1, "--seed", "3") as a, start_emulator(3, "--seed", "4") as b:
        yield a, b


async def _hold(client: httpx.AsyncClient, name: str, state: str) -> dict[str, Any]:
    answer = await client.put(f"/pool/backends/{name}/state", json={"state": state}, headers=ADMIN)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def _routed_to(client: httpx.AsyncClient, count: int) -> list[str]:
    replies = await asyncio.gather(
        *(client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4}) for _ in range(count))
    )
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return [r.headers["x-specroute-backend"] for r in replies]


async def _drain_during_a_stream(pair: tuple[Server, Server]) -> dict[str, Any]:
    a, b = pair
    async with (
        proxy({"a": a, "b": b}, policy="least_loaded") as (url, _),  # type: ignore[dict-item]
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        body = {**CHAT, "max_tokens": 400, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            busy = stream.headers["x-specroute-backend"]
            other = "b" if busy == "a" else "a"
            held = await _hold(client, busy, "draining")
            during = await _routed_to(client, 6)
            events = [line async for line in stream.aiter_lines() if line.startswith("data:")]
        after_stream = await _hold(client, busy, "draining")
        await _hold(client, other, "draining")
        readmitted = await _hold(client, busy, "serving")
        back = await _routed_to(client, 2)
        plan = (await client.get("/plan")).json()
    return {
        "busy": busy, "other": other, "held": held, "during": during, "events": events,
        "after_stream": after_stream, "readmitted": readmitted, "back": back, "plan": plan,
    }  # fmt: skip


def test_a_draining_backend_gets_nothing_new_and_its_stream_runs_to_the_end(
    pair: tuple[Server, Server],
) -> None:
    seen = asyncio.run(_drain_during_a_stream(pair))
    assert seen["held"]["state"] == "draining"
    assert seen["held"]["in_flight"] == 1
    assert seen["during"] == [seen["other"]] * 6
    payloads = [e.removeprefix("data:").strip() for e in seen["events"]]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert not [c for c in chunks if "error" in c]
    assert chunks[-1]["usage"]["completion_tokens"] == 400
    assert seen["after_stream"]["in_flight"] == 0


def test_readmission_routes_to_the_backend_again(pair: tuple[Server, Server]) -> None:
    seen = asyncio.run(_drain_during_a_stream(pair))
    assert seen["readmitted"]["state"] == "serving"
    # the other one is held now: everything goes to the readmitted one
    assert seen["back"] == [seen["busy"]] * 2


def test_holds_need_the_admin_key_and_a_known_backend(pair: tuple[Server, Server]) -> None:
    async def scenario() -> tuple[int, int, int]:
        a, b = pair
        async with (
            proxy({"a": a, "b": b}) as (url, _),  # type: ignore[dict-item]
            httpx.AsyncClient(base_url=url) as client,
        ):
            keyless = await client.put("/pool/backends/a/state", json={"state": "draining"})
            unknown = await client.put(
                "/pool/backends/zz/state", json={"state": "draining"}, headers=ADMIN
            )
            bad = await client.put(
                "/pool/backends/a/state", json={"state": "asleep"}, headers=ADMIN
            )
        return keyless.status_code, unknown.status_code, bad.status_code

    assert asyncio.run(scenario()) == (401, 404, 400)
