"""Pool membership has one owner: a backend removed while a request is on it (DNS said it
left) finishes that request and stays gone, however its last lease or watch ends."""

from __future__ import annotations

import asyncio

import httpx
import inprocess
from inprocess import Send, Upstream, event

CHAT = {"model": inprocess.MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}


def test_a_backend_removed_during_a_request_finishes_it_and_does_not_come_back() -> None:
    first, second, pool_after = asyncio.run(_remove_during_request())
    assert first.status_code == 200
    assert first.text.endswith("data: [DONE]\n\n")
    # Before: the lease's release put "gone" back in the routing index and the next admission
    # raised KeyError, a text/plain 500 without the request id.
    assert second.status_code == 503
    assert second.json()["error"]["type"] == "service_unavailable"
    assert second.headers["x-request-id"]
    assert "gone" not in [b["name"] for b in pool_after["backends"]]


async def _remove_during_request() -> tuple[httpx.Response, httpx.Response, dict[str, object]]:
    entered, release = asyncio.Event(), asyncio.Event()

    async def held(_: bytes, send: Send) -> None:
        entered.set()
        await release.wait()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = {"id": "r", "choices": [{"index": 0, "delta": {"content": "a"}}]}
        for part in (event(chunk), b"data: [DONE]\n\n"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with (
        Upstream(held).running() as backend,
        inprocess.proxy({"gone": backend}) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        request = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
        await entered.wait()
        app.state.pool.remove_backend("gone")  # as DNS discovery does when the address goes
        release.set()
        first = await request
        second = await client.post("/v1/chat/completions", json=CHAT)
        pool_after = (await client.get("/pool", headers=inprocess.ADMIN)).json()
    return first, second, pool_after
