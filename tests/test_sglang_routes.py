"""Every route SGLang 0.5.23 registers (`data/sglang_0_5_23_routes.txt`, read from its own
`http_server.py`) is relayed, forwarded, answered by the proxy, or refused on purpose, as
docs/operators.md lists: no administrative route reaches a backend through the client port.
Where sglang is installed (the sglang-check environment) the list is checked against its app."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import httpx
import pytest
from inprocess import ADMIN, Receive, Send, Upstream, proxy, stream_of

from specroute.config import load_config
from specroute.proxy import create_app
from specroute.proxy.routes import find_route

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data" / "sglang_0_5_23_routes.txt"
HANDLING = {"relay", "forward", "proxy", "admin", "absent"}


class SGLangRoute(NamedTuple):
    method: str
    path: str
    handling: str


def _routes() -> list[SGLangRoute]:
    routes = []
    for line in DATA.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            method, path, handling = fields
            assert handling in HANDLING, line
            routes.append(SGLangRoute(method, path, handling))
    return routes


ROUTES = _routes()


def _concrete(path: str) -> str:
    """A request path for a route pattern (`/v1/responses/{response_id}` -> `.../resp_x`)."""
    return re.sub(r"\{([a-z_]+)(:[a-z]+)?\}", lambda m: f"resp_{m.group(1)}", path)


def test_the_route_list_covers_the_routes_this_issue_names() -> None:
    listed = {(r.method, r.path): r.handling for r in ROUTES}
    assert len(listed) == len(ROUTES) > 100
    assert listed["POST", "/v1/responses"] == listed["POST", "/v1/messages"] == "relay"
    assert listed["GET", "/v1/responses/{response_id}"] == "forward"
    assert listed["POST", "/api/chat"] == listed["POST", "/v1/embeddings"] == "forward"
    for admin in ("/update_weights_from_disk", "/flush_cache", "/pause_generation"):
        assert listed["POST", admin] == "admin"


def test_the_proxy_relays_forwards_or_serves_each_route_as_listed() -> None:
    config = load_config(environ={}, overrides={"backends": [{"url": "http://127.0.0.1:9"}]})
    own = {(method, path) for method, path, _ in create_app(config).routes()}
    for route in ROUTES:
        found = find_route(route.method, _concrete(route.path))
        passed_on = None if found is None else ("relay" if found.generates else "forward")
        served = (route.method, route.path) in own
        handling = passed_on or ("proxy" if served else "refused")
        expected = "refused" if route.handling in ("admin", "absent") else route.handling
        assert handling == expected, route


def test_admin_and_absent_routes_never_reach_a_backend_even_with_the_admin_key() -> None:
    refused = [r for r in ROUTES if r.handling in ("admin", "absent") and r.method != "WS"]
    seen, statuses = asyncio.run(_send_all(refused))
    assert all(status in (404, 405) for status in statuses), statuses
    reached = {path for _, path in seen} & {_concrete(r.path) for r in refused}
    assert not reached
    assert len(statuses) == 2 * len(refused)


async def _send_all(routes: list[SGLangRoute]) -> tuple[list[tuple[str, str]], list[int]]:
    backend = Recording()
    statuses = []
    async with (
        backend.running(),
        proxy({"a": backend}) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        for route in routes:
            for headers in (ADMIN, {}):
                reply = await client.request(
                    route.method, _concrete(route.path), headers=headers, json={}
                )
                statuses.append(reply.status_code)
    return backend.seen, statuses


class Recording(Upstream):
    """A backend that notes every request it gets."""

    def __init__(self) -> None:
        super().__init__(stream_of([]))
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: dict[str, object], receive: Receive, send: Send) -> None:  # type: ignore[override]
        if scope["type"] == "http":
            self.seen.append((str(scope["method"]), str(scope["path"])))
        await super().__call__(scope, receive, send)


def test_the_operators_guide_lists_every_route_the_client_port_passes_on_or_refuses() -> None:
    guide = (ROOT / "docs" / "operators.md").read_text()
    for route in ROUTES:
        if route.handling != "proxy":
            assert f"`{route.path}`" in guide, route


def test_the_list_matches_sglangs_own_app_where_sglang_is_installed() -> None:
    pytest.importorskip("sglang")
    try:
        from fastapi.routing import APIRoute, APIWebSocketRoute
        from sglang.srt.entrypoints import http_server
    except Exception as exc:  # a server module that cannot load here: say why
        pytest.skip(f"sglang's http_server does not import here: {exc!r}")

    registered = {
        (method, route.path)
        for route in http_server.app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
        if method != "HEAD"
    }
    sockets = [r for r in http_server.app.routes if isinstance(r, APIWebSocketRoute)]
    registered |= {("WS", route.path) for route in sockets}
    listed = {(r.method, r.path) for r in ROUTES if r.method != "HEAD"}
    conditional = {("POST", "/dumper/{method}")}  # only with DUMPER_SERVER_PORT=reuse
    assert registered - conditional == listed - conditional


def test_a_response_id_cannot_steer_a_request_to_another_backend_path() -> None:
    """Ids go into upstream paths (`/v1/responses/{id}`): only plain ones are looked for."""
    crafted = ["../../flush_cache", "..", "a?b=1", "x%2F..%2Fflush_cache", "resp_1/../../x"]

    async def run() -> tuple[list[tuple[str, str]], list[int]]:
        backend = Recording()
        statuses = []
        async with (
            backend.running(),
            proxy({"a": backend}) as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            for given in crafted:
                body = {"input": "hi", "previous_response_id": given}
                reply = await client.post("/v1/responses", json=body)
                statuses.append(reply.status_code)
                path = f"/v1/responses/{quote(given, safe='')}"  # all of it in the id
                statuses.append((await client.get(path)).status_code)
        return backend.seen, statuses

    seen, statuses = asyncio.run(run())
    assert set(statuses) == {404}
    assert not [path for _, path in seen if "responses" in path or "flush" in path]
