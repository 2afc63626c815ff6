"""Request bodies held at once are capped across requests: a body past the cap waits briefly in
line, else gets a 503 with `Retry-After`; bytes are reserved as they are read and always given
back, however the request ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import inprocess
import pytest
from emulator_support import parse_metrics
from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess import Send, Upstream

from specroute.errors import ServiceUnavailableError
from specroute.proxy.bodies import BODY_MEMORY_FULL, BodyBudget

CAP = 1_000_000
GAUGE = "specroute_request_body_bytes"


def test_bodies_past_the_cap_wait_in_line_and_get_in_as_room_frees() -> None:
    async def scenario() -> list[str]:
        budget = BodyBudget(100, wait_s=10)
        order: list[str] = []
        first = budget.hold()
        await first.take(60)

        async def later(name: str, size: int) -> None:
            hold = budget.hold()
            await hold.take(size)
            order.append(name)

        big = asyncio.create_task(later("big", 50))
        await asyncio.sleep(0)
        small = asyncio.create_task(later("small", 10))  # fits, but waits behind the big one
        await asyncio.sleep(0)
        assert (budget.in_use, budget.waiting, order) == (60, 2, [])
        first.release()
        first.release()  # twice is harmless
        await asyncio.gather(big, small)
        assert budget.in_use == 60
        return order

    assert asyncio.run(scenario()) == ["big", "small"]


def test_a_wait_that_runs_out_is_a_503_with_retry_after_and_holds_nothing() -> None:
    async def scenario() -> tuple[ServiceUnavailableError, int, int]:
        budget = BodyBudget(100, wait_s=0.01, retry_after_s=2)
        held = budget.hold()
        await held.take(90)
        late = budget.hold()
        with pytest.raises(ServiceUnavailableError) as info:
            await late.take(20)
        held.release()
        late.release()
        return info.value, budget.in_use, budget.waiting

    error, in_use, waiting = asyncio.run(scenario())
    assert (error.status, error.code, error.headers()) == (
        503,
        BODY_MEMORY_FULL,
        [(b"retry-after", b"2")],
    )
    assert (in_use, waiting) == (0, 0)


REQUEST = st.tuples(st.integers(1, 120), st.sampled_from(["finish", "cancel", "late"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(REQUEST, min_size=1, max_size=12))
def test_held_bytes_never_pass_the_cap_and_return_to_zero(requests: list[tuple[int, str]]) -> None:
    async def scenario() -> tuple[int, int, int]:
        budget = BodyBudget(100, wait_s=0.02)
        highest = 0

        async def one(size: int, end: str) -> None:
            nonlocal highest
            hold = budget.hold()
            try:
                for part in (size // 2, size - size // 2):  # a chunked body, as it arrives
                    await hold.take(part)
                    highest = max(highest, budget.in_use)
                    await asyncio.sleep(0)
                if end == "late":
                    await asyncio.sleep(0.03)  # holds on while others time out
            except ServiceUnavailableError:
                pass
            finally:
                hold.release()

        tasks = [asyncio.create_task(one(size, end)) for size, end in requests]
        await asyncio.sleep(0)
        for task, (_, end) in zip(tasks, requests, strict=True):
            if end == "cancel":
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return highest, budget.in_use, budget.waiting

    highest, in_use, waiting = asyncio.run(scenario())
    assert highest <= 100
    assert (in_use, waiting) == (0, 0)


# Through the proxy --------------------------------------------------------------------------


async def _answer(_: bytes, send: Send) -> None:
    body = json.dumps({"id": "c", "object": "chat.completion", "choices": []}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def _body(size: int) -> bytes:
    head = b'{"model":"%s","messages":[{"role":"user","content":"' % inprocess.MODEL.encode()
    tail = b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 65536):
        yield body[start : start + 65536]


async def _past_the_cap() -> dict[str, object]:
    limits = {"max_body_bytes_in_flight": CAP, "body_wait_s": 0.2}
    seen: dict[str, object] = {}
    async with (
        Upstream(_answer).running() as backend,
        inprocess.proxy({"only": backend}, max_body_bytes=CAP, limits=limits) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        host, port = url.removeprefix("http://").split(":")
        _, slow = await asyncio.open_connection(host, int(port))
        slow.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                   b"content-length: 900000\r\n\r\n{")  # fmt: skip
        await slow.drain()
        for _ in range(200):
            seen["held"] = parse_metrics((await client.get("/metrics")).text)[GAUGE]
            if seen["held"]:
                break
            await asyncio.sleep(0.01)
        refused = await client.post("/v1/chat/completions", content=_body(200_000))
        chunked = await client.post("/v1/chat/completions", content=_chunks(_body(200_000)))
        seen["refused"] = (refused.status_code, refused.headers.get("retry-after"),
                           refused.json()["error"]["code"], chunked.status_code)  # fmt: skip
        slow.close()  # the slow body's client leaves: its bytes come back
        for _ in range(200):
            seen["after"] = parse_metrics((await client.get("/metrics")).text)[GAUGE]
            if not seen["after"]:
                break
            await asyncio.sleep(0.01)
        seen["then"] = (
            await client.post("/v1/chat/completions", content=_body(200_000))
        ).status_code
    return seen


def test_a_body_past_the_cap_gets_503_with_retry_after_and_held_bytes_return_to_zero() -> None:
    seen = asyncio.run(_past_the_cap())
    assert seen["held"] == 900_000  # reserved at its declared length, before it is read
    assert seen["refused"] == (503, "1", BODY_MEMORY_FULL, 503)
    assert seen["after"] == 0
    assert seen["then"] == 200
