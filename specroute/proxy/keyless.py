"""Fairness for the work of requests without a key, as the connection reserve gives it for
connections: with API keys, requests that present no valid key (public routes, refusals) may
be in progress only so many at once, past which they get a 503 at once, so that however many
keyless clients ask, the event loop's time goes mostly to the requests with a key. The
liveness and readiness probes are answered in constant time and never counted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from specroute.errors import ServiceUnavailableError, error_body

__all__ = ["KEYED", "KeylessGate"]

KEYED = "specroute.keyed"
"""The scope extension under which the proxy's server protocol says whether the request
presented a valid key (it checked the key already, for the connection reserve)."""

_PROBES = frozenset({"/health", "/ready"})
_Scope = MutableMapping[str, Any]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_Call = Callable[[], Awaitable[None]]


class KeylessGate:
    """Counts keyless requests in progress and refuses one past `limit`."""

    __slots__ = ("_body", "in_progress", "limit", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_progress = 0
        self.refused = 0
        error = ServiceUnavailableError(
            "too many requests without an API key in progress; retry later", retry_after=1
        )
        self._body = error_body(error)

    def counts(self, scope: _Scope) -> bool:
        """Whether the request is keyless work the gate counts: not keyed, and not a probe (under
        another server, which did not say, a request counts as keyed). The app asks first, so
        that a keyed request goes on with no layer between."""
        extensions = scope.get("extensions")
        if not extensions or KEYED not in extensions or extensions[KEYED]:
            return False
        return scope["path"] not in _PROBES

    async def run(self, scope: _Scope, send: _Send, call: _Call) -> None:
        """`call()` for this request, unless it is keyless and the keyless are at the limit."""
        if not self.counts(scope):
            await call()
            return
        if self.in_progress >= self.limit:
            self.refused += 1
            await self._refuse(send)
            return
        self.in_progress += 1
        try:
            await call()
        finally:
            self.in_progress -= 1

    async def _refuse(self, send: _Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": self._body})
