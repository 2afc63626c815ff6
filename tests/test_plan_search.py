"""Which pools a plan values (`planner.search.candidates`): every pool while they are few (the
pools of three servers the evaluation runs, as before), and past `SEARCH_LIMIT` the pools
within the most server changes of the current one that stay in bounds, so that a plan of
eight servers values hundreds of pools, not 6,435; the planner still finds the move that
pays there."""

from __future__ import annotations

import itertools
from collections import Counter

from test_planner import GREEDY, estimates, planner_after

from specroute.planner import ServerState, Setting
from specroute.planner.search import SEARCH_LIMIT, candidates

DEPTHS = [Setting(steps=k) for k in range(8)]


def _changes(current: tuple[Setting, ...], pool: tuple[Setting, ...]) -> int:
    return sum((Counter(current) - Counter(pool)).values())


def test_every_pool_of_a_few_servers_is_valued_in_the_order_as_before() -> None:
    for n in (1, 2, 3, 5):
        current = (Setting(steps=2),) * n
        assert candidates(current, DEPTHS) == list(
            itertools.combinations_with_replacement(DEPTHS, n)
        )


def test_a_large_pool_values_the_pools_within_the_most_changes_that_stay_in_bounds() -> None:
    current = (Setting(steps=2),) * 8
    pools = candidates(current, DEPTHS)
    assert len(pools) <= SEARCH_LIMIT
    assert len(set(pools)) == len(pools)
    changes = Counter(_changes(current, p) for p in pools)
    # Every pool of up to five changes (of the seven other depths: 1 + 7 + 28 + 84 + 210 +
    # 462), none of six (924 more).
    assert changes == {0: 1, 1: 7, 2: 28, 3: 84, 4: 210, 5: 462}
    deep = (Setting(steps=0), *(Setting(steps=2),) * 5, Setting(steps=7), Setting(steps=7))
    assert deep in pools
    # Each pool in the choices' order, as combinations_with_replacement gives them.
    assert all(list(p) == sorted(p, key=DEPTHS.index) for p in pools)


def test_a_mixed_pool_keeps_its_bound_and_a_setting_not_allowed_always_changes() -> None:
    current = tuple(Setting(steps=k) for k in (0, 1, 2, 3, 4, 5, 6, 7))
    pools = candidates(current, DEPTHS)
    assert 0 < len(pools) <= SEARCH_LIMIT
    assert current in pools
    allowed = DEPTHS[:4]  # a server at 4-7 may not stay there
    pools = candidates(current, allowed, limit=200)
    assert pools
    assert all(s in allowed for p in pools for s in p)
    assert min(_changes(current, p) for p in pools) == 4


def test_a_plan_of_eight_servers_still_deepens_for_a_quiet_greedy_regime() -> None:
    planner, now = planner_after([(1200.0, {GREEDY: 6.0})], max_steps=7)
    est = estimates()
    servers = [ServerState(name=f"b{i}", setting=Setting(steps=1), startup_s=60.0,
                           limit=2 * est.depths[1].capacity) for i in range(8)]  # fmt: skip
    plan = planner.plan(now, servers, est)
    assert plan.verdict == "reconfigure"
    assert plan.proposed is not None
    assert max(int(label.removeprefix("k")) for label in plan.proposed.settings) > 1
