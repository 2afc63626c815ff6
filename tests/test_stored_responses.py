"""Where a stored response lives: the bounded id -> backend map, and the paths that name one."""

from __future__ import annotations

import asyncio
import json

import httpx
from hypothesis import given
from hypothesis import strategies as st
from inprocess import Send, Upstream, proxy

from specroute.proxy.routes import STORED_RESPONSE, find_route, stored_response_id
from specroute.proxy.stored import ResponseHomes


def test_the_least_recently_used_id_is_forgotten_first() -> None:
    homes = ResponseHomes(limit=2)
    homes.remember("resp_a", "deep")
    homes.remember("resp_b", "shallow")
    assert homes.home("resp_a") == "deep"  # a use keeps it
    homes.remember("resp_c", "deep")
    assert homes.home("resp_b") is None
    assert (homes.home("resp_a"), homes.home("resp_c"), len(homes)) == ("deep", "deep", 2)


@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["a", "b"])), max_size=200))
def test_the_map_never_outgrows_its_limit_and_keeps_the_newest(
    writes: list[tuple[int, str]],
) -> None:
    homes = ResponseHomes(limit=8)
    for number, backend in writes:
        homes.remember(f"resp_{number}", backend)
        assert len(homes) <= 8
    if writes:
        number, backend = writes[-1]
        assert homes.home(f"resp_{number}") == backend


def test_retrieval_and_cancel_paths_name_their_response() -> None:
    assert stored_response_id("GET", "/v1/responses/resp_1") == "resp_1"
    assert stored_response_id("POST", "/v1/responses/resp_1/cancel") == "resp_1"
    for method, path in [
        ("POST", "/v1/responses/resp_1"),
        ("GET", "/v1/responses/resp_1/cancel"),
        ("GET", "/v1/responses/"),
        ("POST", "/v1/responses//cancel"),
        ("GET", "/v1/responses/a/b"),
    ]:
        assert stored_response_id(method, path) is None, (method, path)
    route = find_route("GET", "/v1/responses/resp_1")
    assert route is not None
    assert (route.kind, route.generates) == (STORED_RESPONSE, False)
    assert find_route("GET", "/v1/responses") is None


def test_a_stored_response_waits_out_its_unhealthy_home_and_is_never_sent_elsewhere() -> None:
    asyncio.run(_unhealthy_home())


async def _unhealthy_home() -> None:
    made = {"id": "resp_home", "object": "response", "usage": {"output_tokens": 1}}

    async def answers(_: bytes, send: Send) -> None:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(made).encode()})

    home, other = Upstream(answers, steps=1), Upstream(answers, steps=3)
    async with (
        home.running(),
        other.running(),
        proxy({"home": home, "other": other}, policy="static:steps=1") as (url, app),
        httpx.AsyncClient(base_url=url) as client,
    ):
        first = await client.post("/v1/responses", json={"input": "hi"})
        assert first.headers["x-specroute-backend"] == "home"
        del home._info["/ready"]  # its health checks fail from now on
        for _ in range(200):  # polled: the pool marks it unhealthy after its checks fail
            if not app.state.pool.by_name["home"].healthy:
                break
            await asyncio.sleep(0.02)
        body = {"input": "and then", "previous_response_id": "resp_home"}
        waiting = await client.post("/v1/responses", json=body)
        assert waiting.status_code == 503
        assert waiting.headers["retry-after"] == "1"
        assert "resp_home" in waiting.json()["error"]["message"]
        assert len(other.bodies) == 0  # the other backend never got it
        assert len(home.bodies) == 1
