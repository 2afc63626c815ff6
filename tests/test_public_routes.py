"""Public routes cost little to hammer: `/metrics` rendered at most once per interval for any
number of callers, a bound on requests pipelined on one connection, and requests without a key
in progress only so many at once (with API keys), the probes and keyed requests unaffected."""

from __future__ import annotations

import asyncio

import httpx
import inprocess
from inprocess import Upstream, stream_of, until

from specroute.proxy.paced import PacedRender

KEY = {"authorization": "Bearer sk-client"}


def test_metrics_asked_by_many_at_once_is_rendered_once_for_all_of_them() -> None:
    # Read by the first call and its rendering, by the next call, by the next rendering.
    clock = iter([0.0, 0.0, 0.99, 1.0])

    async def many() -> tuple[list[bytes], int]:
        renders = iter([b"first", b"second"])
        paced = PacedRender(lambda: next(renders), 1.0, clock=lambda: next(clock))
        assert await paced.get() == b"first"  # nothing rendered yet: at once
        # Asked again 0.99 s later: all wait for one rendering, due 0.01 s on.
        waiting = asyncio.gather(*(paced.get() for _ in range(40)))
        return list(await asyncio.wait_for(waiting, 10)), paced.renders

    bodies, renders = asyncio.run(many())
    assert bodies == [b"second"] * 40
    assert renders == 2


def test_a_caller_that_gives_up_does_not_cancel_the_rendering_others_wait_for() -> None:
    async def one_gives_up() -> bytes:
        times = iter([0.0, 0.0, 0.95, 1.0])
        paced = PacedRender(lambda: b"text", 1.0, clock=lambda: next(times))
        await paced.get()
        quitter = asyncio.create_task(paced.get())
        stayer = asyncio.create_task(paced.get())
        await asyncio.sleep(0)  # both waiting
        quitter.cancel()
        return await asyncio.wait_for(stayer, 10)

    assert asyncio.run(one_gives_up()) == b"text"


def test_the_proxys_metrics_route_is_served_through_its_paced_rendering() -> None:
    async def scrape() -> tuple[int, int]:
        async with (
            Upstream(stream_of([])).running() as backend,
            inprocess.proxy({"only": backend}) as (url, app),
            httpx.AsyncClient(base_url=url, timeout=10) as client,
        ):
            before = app.state.metrics_text.renders
            reply = await client.get("/metrics")
            return reply.status_code, app.state.metrics_text.renders - before

    assert asyncio.run(scrape()) == (200, 1)


def test_a_connection_that_pipelines_past_the_bound_is_closed_and_one_at_it_is_answered() -> None:
    at_bound, past_bound = asyncio.run(_pipelined(5, 6))  # one answered, four sent ahead
    assert at_bound.count(b"HTTP/1.1 200 OK") == 5
    assert b"HTTP/1.1" not in past_bound  # closed: no answer to a request it did not wait for


async def _pipelined(*counts: int) -> list[bytes]:
    request = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    last = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    got = []
    async with (
        Upstream(stream_of([])).running() as backend,
        inprocess.proxy({"only": backend}, limits={"max_pipelined": 4}) as (url, _),
    ):
        port = int(url.rsplit(":", 1)[1])
        for count in counts:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request * (count - 1) + last)
            got.append(await reader.read())  # to the end: the last asks to close
            writer.close()
    return got


def test_keyless_requests_past_their_limit_get_503_while_keyed_ones_and_probes_go_on() -> None:
    refused, keyed, probe, parked = asyncio.run(_keyless_flood())
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "service_unavailable"
    assert refused.headers["retry-after"] == "1"
    assert keyed.status_code == 200
    assert probe.status_code == 200
    assert [r.status_code for r in parked] == [200, 200]


async def _keyless_flood() -> tuple[
    httpx.Response, httpx.Response, httpx.Response, list[httpx.Response]
]:
    overrides = {
        "api_keys": ["sk-client"],
        "limits": {"metrics_render_s": 3.0, "keyless_in_progress": 2},
    }
    async with (
        Upstream(stream_of([])).running() as backend,
        inprocess.proxy({"only": backend}, **overrides) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        await client.get("/metrics")  # rendered now: the next ones wait for the next rendering
        parked = [asyncio.create_task(client.get("/metrics")) for _ in range(2)]
        await until(lambda: app.keyless.in_progress == 2, "both keyless requests inside")
        refused = await client.get("/metrics")
        keyed = await client.get("/v1/models", headers=KEY)
        probe = await client.get("/health")
        return refused, keyed, probe, list(await asyncio.gather(*parked))
