"""The baseline policies: `round_robin` and `least_loaded`."""

from __future__ import annotations

from collections.abc import Sequence

from specroute.policies.groups import batch, candidates_of
from specroute.policies.predict import loads
from specroute.policies.types import BackendView, Decision, Outcome, PoolView, RouteRequest

__all__ = ["LeastLoaded", "RoundRobin", "lowest_load"]


def lowest_load(backends: Sequence[BackendView], turn: int) -> tuple[BackendView, float]:
    """The backend with the lowest load of `backends` (ties: the `turn`-th), and that load."""
    each = loads(backends)
    lowest = min(each)
    tied = [b for b, x in zip(backends, each, strict=True) if x == lowest]
    return tied[turn % len(tied)], lowest


class RoundRobin:
    """Each backend in turn, skipping those the view leaves out."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        found = None if view.candidates is None else view.candidates.next_from(self._next)
        if found is None:
            chosen = view.backends[self._next % len(view.backends)]
            self._next += 1
        else:
            at, chosen = found
            self._next = at + 1
        return Decision(backend=chosen.name, reason="next in turn")

    def observe(self, outcome: Outcome) -> None:
        """Round robin learns nothing."""


class LeastLoaded:
    """The backend with the fewest requests per slot of capacity; ties go round robin."""

    name = "least_loaded"

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        # Within a configuration the least loaded member wins; across them, the lowest load.
        chosen, lowest = lowest_load(candidates_of(view).bests(self._turn), self._turn)
        self._turn += 1
        return Decision(
            backend=chosen.name,
            reason=f"lowest load {lowest:.3g} req/slot ({batch(chosen)} in flight)",
        )

    def observe(self, outcome: Outcome) -> None:
        """Least loaded reads load from the view; outcomes teach it nothing."""
