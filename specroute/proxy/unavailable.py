"""Why no backend could take a request, one reason per backend (down and why, a stalled stream,
an open circuit, full, held by the launcher, another model), for the 503's message."""

from __future__ import annotations

from collections.abc import Collection

from specroute.pool import Backend, BreakerState, Pool

__all__ = ["unavailable"]

_SHOWN = 8  # a pool of hundreds (DNS discovery) names a few and counts the rest


def _reason(pool: Pool, backend: Backend, model: str | None) -> str:
    held = pool.holds.get(backend.name)
    if held is not None:
        to = f" to {held.to}" if held.to else ""
        return f"{held.state}{to} (the launcher is changing its depth)"
    if not backend.reachable:
        return f"down: {backend.probe_error or 'not ready yet'}"
    if backend.breaker.stalled:
        return "a stream stalled on it; unhealthy until a request succeeds"
    models = backend.models
    if model is not None and models and model not in models:
        return "serves " + ", ".join(sorted(models))
    state = backend.breaker.state
    if state is BreakerState.OPEN:
        return "circuit open after failed requests"
    if state is BreakerState.HALF_OPEN:
        return "circuit half-open, its trial request in flight"
    limit = backend.limit
    if limit is not None and backend.in_flight >= limit:
        return f"full: {backend.in_flight} in flight, limit {limit}"
    return "available"


def unavailable(pool: Pool, model: str | None, tried: Collection[str] = ()) -> str:
    """`steps1 (tried): down: connection refused; steps2: full: 34 in flight, limit 34; ...`"""
    backends = pool.backends
    if not backends:
        return "no backend is configured or discovered"
    parts = [
        f"{b.name}{' (tried)' if b.name in tried else ''}: {_reason(pool, b, model)}"
        for b in backends[:_SHOWN]
    ]
    if len(backends) > _SHOWN:
        parts.append(f"and {len(backends) - _SHOWN} more")
    return "; ".join(parts)
