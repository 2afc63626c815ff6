"""Which pools a plan values: every multiset of the allowed settings while they are few, else
those within the most server changes of the current pool that keep their number in bounds.

Valuing a pool forecasts it at every load of the horizon, and the multisets grow as
C(settings + servers - 1, servers): with eight depths, 120 pools of three servers, 792 of
five, 1,716 of six, 6,435 of eight. Valuing every one, a plan of six servers takes about 1.3 s
on the two-core machine this was written on and eight 6.6 s, run every 10 s on the launcher's
event loop; bounded, 0.5 s and 0.6 s (`benchmarks/plan_time.py` prints it). A pool further
than the bound from the current one is reached through pools within it: the plan after each
restart searches again from where the pool then is. Pure."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from specroute.planner.forecast import Setting

__all__ = ["SEARCH_LIMIT", "candidates"]

SEARCH_LIMIT = 1000
"""The most pools one plan values: every pool of up to five servers of eight depths (792)."""


def candidates(
    current: Sequence[Setting], choices: Sequence[Setting], limit: int | None = None
) -> list[tuple[Setting, ...]]:
    """The pools of `len(current)` servers a plan values, each a multiset of `choices` in
    their order: all of them while they number at most `limit`; else those that change at
    most `d` servers of `current`, for the largest `d` that keeps them within `limit` (at
    least one change: a server whose setting is not among `choices` always changes). `limit`
    defaults to `SEARCH_LIMIT` as it is when called."""
    limit = SEARCH_LIMIT if limit is None else limit
    n = len(current)
    if math.comb(len(choices) + n - 1, n) <= limit:
        return list(itertools.combinations_with_replacement(choices, n))
    order = {c: i for i, c in enumerate(choices)}
    keep = sorted((s for s in current if s in order), key=order.__getitem__)
    forced = n - len(keep)
    pools: dict[tuple[Setting, ...], None] = {}
    for d in range(max(1, forced), n + 1):
        found: dict[tuple[Setting, ...], None] = {}
        for removed in dict.fromkeys(itertools.combinations(keep, d - forced)):
            rest = list(keep)
            for s in removed:
                rest.remove(s)
            for added in itertools.combinations_with_replacement(choices, d):
                pool = tuple(sorted((*rest, *added), key=order.__getitem__))
                if pool not in pools:
                    found[pool] = None
        if pools and len(pools) + len(found) > limit:
            break
        pools.update(found)
    return list(pools)
