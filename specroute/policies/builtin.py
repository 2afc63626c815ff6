"""The baseline policies: `round_robin` and `least_loaded`."""

from __future__ import annotations

from specroute.policies.predict import load
from specroute.policies.types import Decision, Outcome, PoolView, RouteRequest

__all__ = ["LeastLoaded", "RoundRobin"]


class RoundRobin:
    """Each backend in turn, skipping those the view leaves out."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        backends = view.backends
        chosen = backends[self._next % len(backends)]
        self._next += 1
        return Decision(backend=chosen.name, reason="next in turn")

    def observe(self, outcome: Outcome) -> None:
        """Round robin learns nothing."""


class LeastLoaded:
    """The backend with the fewest requests per slot of capacity; ties go round robin."""

    name = "least_loaded"

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        loads = [load(b) for b in view.backends]
        lowest = min(loads)
        tied = [b for b, x in zip(view.backends, loads, strict=True) if x == lowest]
        chosen = tied[self._turn % len(tied)]
        self._turn += 1
        return Decision(
            backend=chosen.name,
            reason=f"lowest load {lowest:.3g} req/slot ({chosen.in_flight} in flight)",
        )

    def observe(self, outcome: Outcome) -> None:
        """Least loaded reads load from the view; outcomes teach it nothing."""
