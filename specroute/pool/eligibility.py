"""The one rule for whether a backend may take a request now, as a reason it may not: routing
tests it for each backend a policy reads, and the 503 renders the same reason in prose."""

from __future__ import annotations

import enum
from collections.abc import Collection

from specroute.pool.backend import Backend

__all__ = ["Refusal", "refusal"]


class Refusal(enum.Enum):
    """Why a backend may not take a request, in the order the rule tests them."""

    GONE = "gone"
    """No longer in the pool (DNS discovery removed it)."""
    EXCLUDED = "excluded"
    """Held by the launcher, or tried already by this request."""
    DOWN = "down"
    """Failing its /ready checks."""
    CIRCUIT = "circuit"
    """Its circuit is open (failures or a stall) or its one half-open trial is out."""
    MODEL = "model"
    """It does not serve the requested model."""
    FULL = "full"
    """At its in-flight limit."""
    NO_SHARE = "no_share"
    """With several proxy replicas: no free slot in this replica's share of its room."""


def refusal(
    backend: Backend | None,
    headroom: int | None,
    *,
    model: str | None,
    exclude: Collection[str],
    shared: bool,
    now: float,
) -> Refusal | None:
    """None when `backend` may take the request now, else the first reason it may not.
    `headroom` is its view's room (this replica's share of it when `shared`)."""
    if backend is None:
        return Refusal.GONE
    if backend.name in exclude:
        return Refusal.EXCLUDED
    if not backend.reachable:
        return Refusal.DOWN
    if not backend.breaker.allows(now):
        return Refusal.CIRCUIT
    if model is not None and backend.model != model:
        models = backend.models
        if models and model not in models:
            return Refusal.MODEL
    limit = backend.limit
    if limit is not None and backend.in_flight >= limit:
        return Refusal.FULL
    if shared and headroom is not None and headroom <= 0:
        return Refusal.NO_SHARE
    return None
