"""`static`: every request to backends of one depth (least loaded among them); when none of
that depth has room, the nearest depth that has."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from specroute.policies.builtin import lowest_load
from specroute.policies.groups import batch, candidates_of
from specroute.policies.predict import with_room
from specroute.policies.types import BackendView, Decision, Outcome, PoolView, RouteRequest

__all__ = ["Static", "StaticOptions", "nearest_depth"]


class StaticOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """steps: the depth every request goes to."""

    steps: int = 3

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError("steps must be >= 0")


def nearest_depth(backends: Sequence[BackendView], steps: int) -> tuple[BackendView, ...]:
    """The backends whose depth is closest to `steps` (deeper wins a tie)."""
    depths = {b.steps or 0 for b in backends}
    best = min(depths, key=lambda k: (abs(k - steps), -k))
    return tuple(b for b in backends if (b.steps or 0) == best)


class Static:
    """Every request to backends of one depth; least loaded among them."""

    name = "static"
    Options = StaticOptions

    def __init__(self, options: StaticOptions | None = None) -> None:
        self.options = options or StaticOptions()
        self._turn = 0

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        wanted = self.options.steps
        # Each configuration's least loaded member speaks for it (the rest are fuller).
        group = nearest_depth(with_room(candidates_of(view).bests(self._turn)), wanted)
        chosen, lowest = lowest_load(group, self._turn)
        self._turn += 1
        steps = group[0].steps or 0
        note = "" if steps == wanted else f", depth {wanted} has no room"
        return Decision(
            backend=chosen.name,
            reason=f"static depth {steps}{note}; lowest load {lowest:.3g} req/slot "
            f"({batch(chosen)} in flight)",
        )

    def observe(self, outcome: Outcome) -> None:
        """A fixed depth learns nothing."""
