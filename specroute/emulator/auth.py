"""SGLang's `--api-key` check as ASGI middleware: Bearer auth, 401 `{"error":"Unauthorized"}`.

Like SGLang's `decide_request_auth`, it lets `/health*`, `/ready*` and `/metrics*` through (probes
and Prometheus scrapers carry no secrets) and every OPTIONS request.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

__all__ = ["UNGUARDED_PREFIXES", "bearer_auth"]

UNGUARDED_PREFIXES = ("/health", "/ready", "/metrics")
_DENIED = b'{"error":"Unauthorized"}'


def bearer_auth(api_key: str) -> Callable[..., ASGIApp]:
    """A Litestar middleware factory requiring `Authorization: Bearer <api_key>`."""

    def middleware(app: ASGIApp) -> ASGIApp:
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            path: str = scope.get("path", "")
            if (
                scope["type"] == ScopeType.HTTP
                and scope.get("method") != "OPTIONS"
                and not path.startswith(UNGUARDED_PREFIXES)
                and not _bearer_matches(scope, api_key)
            ):
                headers = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": _DENIED, "more_body": False})
                return
            await app(scope, receive, send)

        return guarded

    return middleware


def _bearer_matches(scope: Scope, api_key: str) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and secrets.compare_digest(token, api_key)
    return False
