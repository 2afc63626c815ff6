"""`threshold`: an operator's table from pool load (requests in flight per slot of capacity)
to the preferred depth. Each backend scores its own load plus `spread` per depth away from
the preferred one, so the preferred depth gets the traffic until it is `spread` fuller than
its neighbours: a preference, not a pile-up."""

from __future__ import annotations

import math

import msgspec

from specroute.policies.groups import batch, candidates_of
from specroute.policies.predict import loads, with_room
from specroute.policies.types import Decision, Outcome, PoolView, RouteRequest

__all__ = ["Threshold", "ThresholdOptions", "parse_table"]


def parse_table(text: str) -> tuple[tuple[float, int], ...]:
    """`"0.25:3 0.6:2 inf:1"`: up to load 0.25 depth 3, up to 0.6 depth 2, beyond depth 1."""
    rows: list[tuple[float, int]] = []
    for item in text.replace(";", " ").split():
        load, sep, depth = item.partition(":")
        if not sep:
            raise ValueError(f"threshold row {item!r} is not load:depth")
        rows.append((float(load), int(depth)))
    if not rows:
        raise ValueError("threshold table is empty")
    rows.sort()
    return tuple(rows)


class ThresholdOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """table: `load:depth` pairs, load = pool in-flight / pool capacity; the first row whose
    load is at or above the pool's decides (`"0.25:3 0.6:2 inf:1"`)."""

    table: str = "0.25:3 0.6:2 inf:1"
    spread: float = 0.1
    """Load (in flight per slot) one depth step away from the preferred depth is worth."""

    def __post_init__(self) -> None:
        parse_table(self.table)
        if self.spread < 0:
            raise ValueError("spread must be >= 0")


class Threshold:
    """An operator's table from pool load to preferred depth."""

    name = "threshold"
    Options = ThresholdOptions

    def __init__(self, options: ThresholdOptions | None = None) -> None:
        self.options = options or ThresholdOptions()
        self.table = parse_table(self.options.table)
        self._turn = 0

    def depth_for(self, load: float) -> int:
        for limit, depth in self.table:
            if load <= limit:
                return depth
        return self.table[-1][1]

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        in_flight = view.in_flight_total
        capacity = view.capacity_total
        if in_flight is None:
            in_flight = sum(batch(b) for b in view.backends)
        if not capacity:
            capacity = sum(b.capacity or 0 for b in view.backends)
        pool_load = (in_flight + 1) / capacity if capacity else math.inf
        wanted = self.depth_for(pool_load)
        spread = self.options.spread
        # A configuration's least loaded member has its lowest score: one score per group; a
        # full backend only when every one is full (the depth preference never queues a
        # request behind a full server while another has room).
        bests = with_room(candidates_of(view).bests(self._turn))
        scores = [
            x + spread * abs((b.steps or 0) - wanted)
            for b, x in zip(bests, loads(bests), strict=True)
        ]
        best = min(scores)
        tied = [b for b, x in zip(bests, scores, strict=True) if x <= best + 1e-12]
        chosen = tied[self._turn % len(tied)]
        self._turn += 1
        return Decision(
            backend=chosen.name,
            reason=(
                f"pool load {pool_load:.2f} req/slot -> depth {wanted}; {chosen.name} "
                f"(k={chosen.steps}) score {best:.3g} = own load (req/slot) + {spread:g} x depth "
                "distance (steps)"
            ),
        )

    def observe(self, outcome: Outcome) -> None:
        """The table is fixed; outcomes teach it nothing."""
