"""Where each stored Responses API response lives: the backend that made it holds it in memory
(SGLang's `--enable-response-store`), so retrieval, cancel and `previous_response_id` must go
there. The proxy remembers response id -> backend (bounded, least recently used forgotten
first), and asks the healthy backends for an id it does not know (one it forgot, or made
before this proxy restarted).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from specroute.errors import NoHealthyBackendError, NotFoundError, SpecrouteError
from specroute.pool import Backend, Pool, UpstreamClient, UpstreamFailure
from specroute.proxy.routes import plain_response_id

__all__ = ["HOMES_MAX", "ResponseHomes", "gone", "locate"]

HOMES_MAX = 100_000
"""Response ids remembered: about 100 bytes each."""
_PROBE_S = 2.0


class ResponseHomes:
    """Response id -> the name of the backend that stores it; pure, bounded."""

    def __init__(self, limit: int = HOMES_MAX) -> None:
        self._limit = limit
        self._homes: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def remember(self, response_id: str, backend: str) -> None:
        self._homes[response_id] = backend
        self._homes.move_to_end(response_id)
        while len(self._homes) > self._limit:
            self._homes.popitem(last=False)

    def home(self, response_id: str) -> str | None:
        backend = self._homes.get(response_id)
        if backend is not None:
            self._homes.move_to_end(response_id)
        return backend


def gone(response_id: str, backend: str | None, pool: Pool) -> SpecrouteError | None:
    """Why `response_id` cannot be reached at `backend`, or None when it can: a 404 when no
    backend holds it or its backend left the pool, a 503 while its backend (or, for an id
    nobody claimed, every backend) is unhealthy (restarting, failing checks): the response may
    be there again after. A backend held for draining is healthy: it still has them."""
    param = "previous_response_id"
    if not plain_response_id(response_id):
        return NotFoundError(f"Response with id '{response_id[:128]}' not found.", param=param)
    if backend is None and not pool.healthy():
        return NoHealthyBackendError(
            f"Response with id '{response_id}' cannot be looked for: no healthy backend.",
            retry_after=1,
        )
    if backend is None:
        return NotFoundError(
            f"Response with id '{response_id}' not found on any healthy backend.", param=param
        )
    found = pool.by_name.get(backend)
    if found is None:
        return NotFoundError(
            f"Response with id '{response_id}' was stored by backend {backend}, which has "
            "left the pool; its stored responses went with it.",
            param=param,
            code="response_backend_gone",
        )
    if found not in pool.healthy():
        return NoHealthyBackendError(
            f"Response with id '{response_id}' is stored by backend {backend}, which is not "
            "healthy now (draining, restarting or failing its checks); retry later.",
            retry_after=1,
        )
    return None


async def locate(response_id: str, pool: Pool, client: UpstreamClient) -> str | None:
    """The healthy backend that answers 200 for `response_id`, asked all at once (only for an
    id that is plain letters, digits, `_` and `-`: it goes into their paths)."""
    backends = pool.healthy()
    if not backends or not plain_response_id(response_id):
        return None
    tasks = [asyncio.ensure_future(_holds(b, response_id, client)) for b in backends]
    try:
        for task in asyncio.as_completed(tasks):
            name = await task
            if name is not None:
                return name
    finally:
        for task in tasks:
            task.cancel()
    return None


async def _holds(backend: Backend, response_id: str, client: UpstreamClient) -> str | None:
    url = f"{backend.url}/v1/responses/{response_id}"
    try:
        async with asyncio.timeout(_PROBE_S):
            upstream = await client.send("GET", url, b"", backend.auth_headers)
            try:
                return backend.name if upstream.status == 200 else None
            finally:
                await upstream.aclose()
    except (UpstreamFailure, TimeoutError):
        return None
