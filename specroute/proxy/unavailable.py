"""Why no backend could take a request, one reason per backend (down and why, a stalled stream,
an open circuit, full, no room in this replica's share, held by the launcher, another model),
for the 503's message: the reason is the routing rule's own (`specroute.pool.refusal`)."""

from __future__ import annotations

import time
from collections.abc import Collection

from specroute.pool import Backend, BreakerState, Pool, Refusal

__all__ = ["unavailable"]

_SHOWN = 8  # a pool of hundreds (DNS discovery) names a few and counts the rest


def _circuit(backend: Backend) -> str:
    breaker = backend.breaker
    if breaker.stalled:
        return "a stream stalled on it; unhealthy until a request succeeds"
    if breaker.state is BreakerState.HALF_OPEN:
        return "circuit half-open, its trial request in flight"
    return "circuit open after failed requests"


def _reason(pool: Pool, backend: Backend, model: str | None, now: float) -> str:
    why = pool.index.refusal(backend, model, pool.holds.excluding(()), now)
    if why is None:
        return "available"
    if why is Refusal.GONE:
        return "removed from the pool"
    if why is Refusal.EXCLUDED:
        held = pool.holds.get(backend.name)
        to = f" to {held.to}" if held is not None and held.to else ""
        return f"{pool.holds.state(backend.name)}{to} (the launcher is changing its depth)"
    if why is Refusal.DOWN:
        return f"down: {backend.probe_error or 'not ready yet'}"
    if why is Refusal.CIRCUIT:
        return _circuit(backend)
    if why is Refusal.MODEL:
        return "serves " + ", ".join(sorted(backend.models))
    if why is Refusal.FULL:
        return f"full: {backend.in_flight} in flight, limit {backend.limit}"
    replicas = pool.index.share.replicas
    return f"no room left in this proxy's share of it ({replicas} proxy replicas split it)"


def unavailable(pool: Pool, model: str | None, tried: Collection[str] = ()) -> str:
    """`steps1 (tried): down: connection refused; steps2: full: 34 in flight, limit 34; ...`"""
    backends = pool.backends
    if not backends:
        return "no backend is configured or discovered"
    now = time.monotonic()
    parts = [
        f"{b.name}{' (tried)' if b.name in tried else ''}: {_reason(pool, b, model, now)}"
        for b in backends[:_SHOWN]
    ]
    if len(backends) > _SHOWN:
        parts.append(f"and {len(backends) - _SHOWN} more")
    return "; ".join(parts)
