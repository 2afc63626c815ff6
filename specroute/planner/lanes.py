"""Latency lanes in the plan: an assignment serves the interactive lane at its per-request speed
target first, then the objective. Enough slots must run at the target for the interactive
requests the proxy has in flight; each request short of one costs more than any assignment
gains in throughput, so the planner trades throughput only among pools that serve the lane."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from specroute.planner.forecast import Forecast, Physics, Setting

__all__ = [
    "MARGIN",
    "LaneDemand",
    "at_target_slots",
    "lane_reason",
    "served_first",
    "shortfall",
]

MARGIN = 1.2
"""A slot counts for the lane where the forecast's mean per-request speed is this many times
the target: requests' speeds spread around the mean (each its own acceptance), and a slot
planned at the mean leaves half of its requests below the target."""


class LaneDemand(msgspec.Struct, frozen=True, kw_only=True):
    """The interactive lane as the planner plans for it, from the proxy's `/pool`: its share of
    the requests in flight, its per-request speed target and its workload classes' mix."""

    share: float
    """Interactive requests over all requests in flight (waiting included)."""
    target_tok_s: float
    classes: dict[str, float] = {}
    """The lane's requests by workload class, as shares (empty: the pool's mix)."""


def _accept_length(phys: Physics, steps: int, mix: Mapping[str, float]) -> float:
    """Mean tokens per verify of the lane's classes at `steps`."""
    total = sum(mix.values())
    return sum(n * phys.e(c, steps) for c, n in mix.items()) / total


def _room(phys: Physics, steps: int, capacity: int, accept: float, target: float) -> int:
    """The most requests a server at `steps` runs while each still decodes at `target`
    (0: not even one does): the per-request speed `accept / T(b, steps)` falls with `b`."""
    low, high = 0, capacity
    while low < high:
        mid = (low + high + 1) // 2
        if accept / phys.time(steps, mid) >= target:
            low = mid
        else:
            high = mid - 1
    return low


def at_target_slots(
    settings: Sequence[Setting],
    fc: Forecast,
    phys: Physics,
    demand: LaneDemand,
    users: Mapping[str, float],
) -> float:
    """Slots where an interactive request decodes at the target (its mean speed `MARGIN`
    times it) under the forecast's load: on each server whose forecast batch keeps it, as many
    as it can run and still keep it (its free slots too); none on a server already past it."""
    mix: Mapping[str, float] = demand.classes or users
    if not mix:
        return 0.0
    slots = 0.0
    for setting, server in zip(settings, fc.servers, strict=True):
        steps = server.steps if server.steps in phys.depths else setting.deepest
        capacity = phys.depths[setting.deepest].capacity
        accept = _accept_length(phys, steps, mix)
        room = _room(phys, steps, capacity, accept, MARGIN * demand.target_tok_s)
        if server.running <= room:
            slots += room
    return slots


def shortfall(
    settings: Sequence[Setting],
    fc: Forecast,
    phys: Physics,
    demand: LaneDemand,
    users: Mapping[str, float],
) -> float:
    """Interactive requests (of `users`, at the lane's share) without a slot at the target."""
    wanted = demand.share * sum(users.values())
    if wanted <= 0 or demand.target_tok_s <= 0:
        return 0.0
    return max(0.0, wanted - at_target_slots(settings, fc, phys, demand, users))


def served_first(
    settings: Sequence[Setting],
    fc: Forecast,
    phys: Physics,
    demand: LaneDemand | None,
    users: Mapping[str, float],
) -> Forecast:
    """`fc` with its value lowered by the interactive lane's shortfall: each request short of
    a slot at the target costs `target_tok_s` times every user, more than the throughput any
    assignment of the same servers gains over another, so meeting the target comes first."""
    if demand is None:
        return fc
    short = shortfall(settings, fc, phys, demand, users)
    if short <= 0:
        return fc
    penalty = short * demand.target_tok_s * sum(users.values())
    return msgspec.structs.replace(fc, value=fc.value - penalty, lane_charge=penalty)


def lane_reason(
    demand: LaneDemand | None,
    phys: Physics,
    users: Mapping[str, float],
    now: tuple[Sequence[Setting], Forecast],
    then: tuple[Sequence[Setting], Forecast],
) -> str:
    """The interactive lane's part of a plan's reason: requests wanted at the target and how
    many lack a slot at it now and with the proposal ("" without a lane target)."""
    if demand is None or demand.target_tok_s <= 0:
        return ""
    wanted = demand.share * sum(users.values())
    short_now = shortfall(*now, phys, demand, users)
    short_then = shortfall(*then, phys, demand, users)
    return (
        f"; interactive {wanted:.1f} at {demand.target_tok_s:.0f} tok/s: "
        f"{short_now:.1f} short now, {short_then:.1f} with the proposal"
    )
