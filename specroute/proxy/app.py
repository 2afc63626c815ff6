"""The proxy's ASGI app: the relay for the hot routes, Litestar for everything else.

`create_app(config)` builds the runtime objects and returns one ASGI callable whose lifespan
starts and stops the pool's background tasks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, put
from litestar.exceptions import HTTPException

from specroute.config import Config
from specroute.errors import (
    BadRequestError,
    NoHealthyBackendError,
    NotFoundError,
    SpecrouteError,
    error_body,
)
from specroute.policies import UnknownPolicyError, available
from specroute.proxy.info import model_list, pool_info, proxied_info, server_info
from specroute.proxy.metrics import render_gauge
from specroute.proxy.relay import RELAY_PATHS, Receive, Relay, Scope, Send
from specroute.proxy.state import ProxyState

__all__ = ["ProxyApp", "create_app"]


class PolicyChange(msgspec.Struct, forbid_unknown_fields=True):
    policy: str


def _error_response(exc: SpecrouteError) -> Response[bytes]:
    headers = {k.decode(): v.decode() for k, v in exc.headers()}
    return Response(
        error_body(exc), status_code=exc.status, media_type="application/json", headers=headers
    )


def _http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    error = NotFoundError(exc.detail) if exc.status_code == 404 else BadRequestError(exc.detail)
    error.status_code = exc.status_code  # type: ignore[misc]  # keep Litestar's status (405...)
    return _error_response(error)


def _json(data: object) -> Response[bytes]:
    return Response(msgspec.json.encode(data), media_type="application/json")


def _auth(state: ProxyState, request: Request[Any, Any, Any]) -> None:
    value = request.headers.get("authorization")
    state.auth.check(value.encode("latin-1") if value else None)


def _handlers(state: ProxyState) -> list[Any]:
    @get("/health", sync_to_thread=False)
    def health() -> Response[bytes]:
        return _json({"status": "ok"})

    @get("/ready", sync_to_thread=False)
    def ready() -> Response[bytes]:
        healthy = len(state.pool.healthy())
        if not healthy:
            raise NoHealthyBackendError("no healthy backend", retry_after=1)
        return _json({"status": "ready", "healthy_backends": healthy})

    @get("/metrics", sync_to_thread=False)
    def metrics() -> Response[str]:
        return Response(_exposition(state), media_type="text/plain; version=0.0.4")

    @get("/v1/models", sync_to_thread=False)
    def models(request: Request[Any, Any, Any]) -> Response[bytes]:
        _auth(state, request)
        return _json(model_list(state))

    @get(["/server_info", "/get_server_info"])
    async def get_server_info(request: Request[Any, Any, Any]) -> Response[bytes]:
        _auth(state, request)
        return _json(await server_info(state))

    @get(["/model_info", "/get_model_info"])
    async def model_info(request: Request[Any, Any, Any]) -> Response[bytes]:
        _auth(state, request)
        return Response(await proxied_info(state, "/model_info"), media_type="application/json")

    @get("/pool", sync_to_thread=False)
    def pool(request: Request[Any, Any, Any]) -> Response[bytes]:
        _auth(state, request)
        return _json(pool_info(state))

    @get("/policy", sync_to_thread=False)
    def get_policy(request: Request[Any, Any, Any]) -> Response[bytes]:
        _auth(state, request)
        return _json({"policy": state.policy.name, "available": sorted(available())})

    @put("/policy")
    async def put_policy(request: Request[Any, Any, Any]) -> Response[bytes]:
        value = request.headers.get("authorization")
        state.auth.check_admin(value.encode("latin-1") if value else None)
        try:
            change = msgspec.json.decode(await request.body(), type=PolicyChange)
            previous = state.policy.name
            state.switch_policy(change.policy)
        except (msgspec.DecodeError, UnknownPolicyError) as exc:
            raise BadRequestError(str(exc), param="policy") from exc
        return _json({"policy": state.policy.name, "previous": previous})

    return [
        health,
        ready,
        metrics,
        models,
        get_server_info,
        model_info,
        pool,
        get_policy,
        put_policy,
    ]


def _exposition(state: ProxyState) -> str:
    backends = state.pool.backends
    parts = [
        *state.metrics.render(),
        render_gauge(
            "specroute_in_flight_requests",
            "Requests in flight per backend.",
            "backend",
            ((b.name, b.in_flight) for b in backends),
        ),
        render_gauge(
            "specroute_backend_healthy",
            "1 when the backend passes its /ready checks.",
            "backend",
            ((b.name, float(b.healthy)) for b in backends),
        ),
        "# HELP specroute_admission_waiting_requests Requests waiting for a free backend.",
        "# TYPE specroute_admission_waiting_requests gauge",
        f"specroute_admission_waiting_requests {state.admission.waiting}",
    ]
    return "\n".join(parts) + "\n"


class ProxyApp:
    """The ASGI entry point: POSTs to the relayed paths skip the framework entirely."""

    def __init__(self, state: ProxyState, framework: Litestar) -> None:
        self.state = state
        self.relay = Relay(state)
        self._framework = framework

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = RELAY_PATHS.get(scope["path"])
            if route is not None:
                await self.relay.handle(route, scope, receive, send)
                return
        await self._framework(scope, receive, send)  # type: ignore[arg-type]  # ASGI types


def create_app(config: Config) -> ProxyApp:
    """Build the proxy for `config`; serve the result with any ASGI server."""
    state = ProxyState(config)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    framework = Litestar(
        route_handlers=_handlers(state),
        lifespan=[lifespan],
        exception_handlers={SpecrouteError: _specroute_error, HTTPException: _http_error},
        openapi_config=None,
        logging_config=None,
    )
    return ProxyApp(state, framework)


def _specroute_error(_: Request[Any, Any, Any], exc: SpecrouteError) -> Response[bytes]:
    return _error_response(exc)
