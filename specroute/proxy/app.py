"""The proxy's ASGI app: the relay for the hot routes, Litestar for everything else.

`create_app(config)` builds the runtime objects and returns one ASGI callable whose lifespan
starts and stops the pool's background tasks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Litestar, Request, Response, get, put
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler
from litestar.params import PathParameter

from specroute.config import Config
from specroute.errors import (
    BadRequestError,
    ModelNotFoundError,
    NoHealthyBackendError,
    NotFoundError,
    SpecrouteError,
    error_body,
)
from specroute.policies import UnknownPolicyError, available, create
from specroute.prometheus import CONTENT_TYPE
from specroute.proxy.auth import ADMIN, PUBLIC, access_of, presented_key
from specroute.proxy.dashboard import Dashboard
from specroute.proxy.info import model_list, pool_info, proxied_info, server_info
from specroute.proxy.keyless import KeylessGate
from specroute.proxy.openapi import openapi_config, relay_docs
from specroute.proxy.plan_routes import PlanBoard, PlanGauges, plan_handlers
from specroute.proxy.relay import Receive, Relay, Scope, Send
from specroute.proxy.routes import FORWARDED, GENERATION, find_route
from specroute.proxy.state import ProxyState
from specroute.raw_path import path_after

__all__ = ["ProxyApp", "create_app"]

log = structlog.get_logger()


class PolicyChange(msgspec.Struct, forbid_unknown_fields=True):
    """PUT /policy: a name or spec (`throughput:objective=goodput`), with optional options."""

    policy: str
    options: dict[str, Any] | None = None


def _policy_info(state: ProxyState) -> dict[str, Any]:
    """The current policy's name, and its options when it takes any."""
    info: dict[str, Any] = {"policy": state.policy.name}
    options = getattr(state.policy, "options", None)
    if isinstance(options, msgspec.Struct):
        info["options"] = msgspec.to_builtins(options)
    return info


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


def _key(headers: Any) -> bytes | None:
    """The key the client presents (`Authorization`, or Anthropic's `x-api-key`)."""
    value, api_key = headers.get("authorization"), headers.get("x-api-key")
    return presented_key(
        value.encode("latin-1") if value else None,
        api_key.encode("latin-1") if api_key else None,
    )


def _auth(state: ProxyState, request: Request[Any, Any, Any]) -> None:
    state.auth.check(_key(request.headers))


def _handlers(state: ProxyState) -> list[Any]:
    @get("/health", sync_to_thread=False, opt=PUBLIC)
    def health() -> Response[bytes]:
        return _json({"status": "ok"})

    @get("/ready", sync_to_thread=False, opt=PUBLIC)
    def ready() -> Response[bytes]:
        healthy = len(state.pool.healthy())
        if not healthy:
            raise NoHealthyBackendError("no healthy backend", retry_after=1)
        return _json({"status": "ready", "healthy_backends": healthy})

    @get("/metrics", opt=PUBLIC)
    async def metrics() -> Response[bytes]:
        await state.vllm_counters.refresh()  # fresh, as `vllm bench serve` diffs them
        # As a header, not a media type: Litestar would append a second `; charset=utf-8`.
        return Response(await state.metrics_text.get(), headers={"content-type": CONTENT_TYPE})

    @get("/v1/models", sync_to_thread=False)
    def models(request: Request[Any, Any, Any]) -> Response[bytes]:
        _auth(state, request)
        return _json(model_list(state))

    @get("/v1/models/{model:path}", sync_to_thread=False)
    def model(
        request: Request[Any, Any, Any], model: Annotated[str, PathParameter()]
    ) -> Response[bytes]:
        """One model card (the OpenAI client's `models.retrieve`), as SGLang answers it."""
        _auth(state, request)
        name = path_after(request.scope, "/v1/models/") or model.lstrip("/")
        for card in model_list(state)["data"]:
            if card["id"] == name:
                return _json(card)
        raise ModelNotFoundError(f"The model '{name}' does not exist", param="model")

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

    @get("/pool/estimates", sync_to_thread=False)
    def pool_estimates(request: Request[Any, Any, Any]) -> Response[bytes]:
        """This replica's own estimates with their weights, for its peers to blend."""
        _auth(state, request)
        return _json(state.pool.local_estimates())

    @get("/policy", sync_to_thread=False)
    def get_policy(request: Request[Any, Any, Any]) -> Response[bytes]:
        _auth(state, request)
        return _json({**_policy_info(state), "available": sorted(available())})

    @put("/policy", opt=ADMIN)
    async def put_policy(request: Request[Any, Any, Any]) -> Response[bytes]:
        value = request.headers.get("authorization")
        state.auth.check_admin(value.encode("latin-1") if value else None)
        try:
            change = msgspec.json.decode(await request.body(), type=PolicyChange)
            previous = state.policy.name
            # The next request is routed by the new policy; those in flight keep theirs.
            state.policy = create(change.policy, change.options)
        except (msgspec.DecodeError, UnknownPolicyError) as exc:
            raise BadRequestError(str(exc), param="policy") from exc
        log.info("policy_switched", policy=state.policy.name, previous=previous)
        return _json({**_policy_info(state), "previous": previous})

    return [
        health,
        ready,
        metrics,
        models,
        model,
        get_server_info,
        model_info,
        pool,
        pool_estimates,
        get_policy,
        put_policy,
    ]


class ProxyApp:
    """The ASGI entry point: the relayed routes (`routes.find_route`) skip the framework."""

    def __init__(self, state: ProxyState, framework: Litestar) -> None:
        self.state = state
        self.relay = Relay(state)
        self._framework = framework
        self.keyless = KeylessGate(state.config.limits.keyless_in_progress)

    async def drain(self, grace_s: float) -> None:
        """On SIGTERM: requests in flight get `grace_s` seconds, then an error (see Relay)."""
        await self.relay.drain(grace_s)

    def routes(self) -> list[tuple[str, str, str]]:
        """Every (method, path, access) served; access is `public`, `client` or `admin`."""
        found = {("POST", path, "client") for path in GENERATION}
        found |= {(method, path, "client") for method, path in FORWARDED}
        found |= {("GET", "/v1/responses/{response_id}", "client")}
        found |= {("POST", "/v1/responses/{response_id}/cancel", "client")}
        found |= {("PUT", "/generate", "client")}
        for route in self._framework.routes:
            for handler in getattr(route, "route_handlers", ()):
                for method in sorted(getattr(handler, "http_methods", ())):
                    found.add((method, route.path, access_of(handler.opt)))
        return sorted(found)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._framework(scope, receive, send)  # type: ignore[arg-type]  # ASGI types
        elif self.keyless.counts(scope):
            await self.keyless.run(scope, send, partial(self._dispatch, scope, receive, send))
        else:
            await self._dispatch(scope, receive, send)

    def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The relay's handling of a proxied route, else the framework's (a plain function
        returning the coroutine: no frame of its own to resume on every await)."""
        route = find_route(scope["method"], scope["path"])
        if route is not None:
            return self.relay.handle(route, scope, receive, send)
        return self._framework(scope, receive, send)  # type: ignore[arg-type]  # ASGI types


def create_app(config: Config) -> ProxyApp:
    """Build the proxy for `config`; serve the result with any ASGI server."""
    state = ProxyState(config)
    board = PlanBoard()
    state.metrics.registry.register(PlanGauges(board))
    dashboard = Dashboard(state)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    framework = Litestar(
        route_handlers=[
            *_handlers(state),
            *plan_handlers(state, board),
            *dashboard.handlers(),
            *relay_docs(),
        ],
        guards=[_guard(state)],
        lifespan=[lifespan, dashboard.lifespan],
        exception_handlers={
            SpecrouteError: _specroute_error,
            HTTPException: _http_error,
            RecursionError: _too_deep,
            Exception: _unexpected,
        },
        openapi_config=openapi_config(),
        logging_config=None,
    )
    return ProxyApp(state, framework)


def _guard(state: ProxyState) -> Any:
    """Keys on every route: client keys unless the route says `PUBLIC` or `ADMIN`, so a new
    route is protected by default."""

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        state.auth.require(access_of(handler.opt), _key(connection.headers))

    return guard


def _specroute_error(_: Request[Any, Any, Any], exc: SpecrouteError) -> Response[bytes]:
    return _error_response(exc)


def _too_deep(_: Request[Any, Any, Any], exc: RecursionError) -> Response[bytes]:
    """A body nested past the decoder's depth limit is the client's error, not ours."""
    return _error_response(BadRequestError("request body is nested too deeply"))


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """The last resort: a bug, logged with its traceback, answered in OpenAI's shape."""
    log.error("request_failed", path=request.url.path, exc_info=exc)
    return _error_response(SpecrouteError("internal error"))
