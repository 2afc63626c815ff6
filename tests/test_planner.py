"""The depth planner on hand-built pools and traffic: when a restart pays, and every rule that
holds one back (short regime, capacity floor, dwell, max_unavailable, hysteresis)."""

from __future__ import annotations

import itertools
import re

import msgspec
import pytest

from specroute.emulator.profiles import PROFILES
from specroute.planner import (
    DepthEstimate,
    Estimates,
    Planner,
    PlannerOptions,
    RegimeTracker,
    ServerState,
    Setting,
    forecast,
    forecast_seen,
    user_counts,
    user_split,
)
from specroute.planner.forecast import Physics, compositions
from specroute.policies import ClassEstimate
from specroute.profile_format import Point, Target, depth_curves, fit_depths, fit_line
from specroute.speculation import expected_tokens

GREEDY, SAMPLED = "m:greedy", "m:sampled"


def estimates(per_token_s: float = 0.0004) -> Estimates:
    """Drafts nearly free at small batches, capacity shrinking with depth, greedy acceptance
    high and sampled low: deep wins alone, shallow wins crowded."""
    depths = {
        k: DepthEstimate(
            steps=k, capacity=100 // (3 + k), intercept_s=0.02, per_token_s=per_token_s
        )
        for k in range(8)
    }
    classes = {
        GREEDY: ClassEstimate(alpha=0.95, accept_length={1: expected_tokens(0.95, 1)}),
        SAMPLED: ClassEstimate(alpha=0.5, accept_length={1: expected_tokens(0.5, 1)}),
    }
    return Estimates(depths=depths, classes=classes)


def pool(*steps: int, startup_s: float = 60.0, **fields: object) -> list[ServerState]:
    est = estimates()
    return [
        ServerState(name=f"b{i}", setting=Setting(steps=k), startup_s=startup_s,
                    limit=2 * est.depths[k].capacity, **fields)  # type: ignore[arg-type]
        for i, k in enumerate(steps)
    ]  # fmt: skip


def planner_after(
    samples: list[tuple[float, dict[str, float]]], **options: object
) -> tuple[Planner, float]:
    """A planner that has seen `samples` of (duration, users per class) back to back, sampled
    every 2 s; returns it and the time of its last sample."""
    planner = Planner(PlannerOptions(**{"confirm_s": 0.0, **options}))  # type: ignore[arg-type]
    now = 0.0
    for duration, users in samples:
        end = now + duration
        while now < end:
            planner.observe(now, users)
            now += 2.0
    return planner, now - 2.0


QUIET = (1200.0, {GREEDY: 2.0})
CROWDED = (1200.0, {SAMPLED: 60.0})
"""Regimes that have lasted past a restart and the dwell: the first regime is expected to last
as long again as it has lasted."""


def test_a_quiet_greedy_regime_pays_for_deep_drafts_on_an_idle_server() -> None:
    planner, now = planner_after([QUIET])
    plan = planner.plan(now, pool(1, 1, 1), estimates())
    assert plan.verdict == "reconfigure"
    assert len(plan.start) == 1
    assert any(c.after.steps > 1 for c in plan.changes)
    assert plan.proposed is not None
    assert plan.proposed.tok_s > plan.current.tok_s
    assert plan.gain_tokens > plan.restart_cost_tokens
    # The reason names the numbers it compared; the plan renders as JSON for GET /plan.
    assert f"{plan.current.tok_s:.0f} ->" in plan.reason
    doc = msgspec.json.decode(msgspec.json.encode(plan))
    assert doc["verdict"] == "reconfigure"
    assert doc["start"][0]["after"]["steps"] == plan.start[0].after.steps


def _best_for(loads: list[dict[str, float]], size: int) -> tuple[Setting, ...]:
    """The single assignment of `size` servers (depths 0-3) best on average over `loads`."""
    est = estimates()
    combos = itertools.combinations_with_replacement([Setting(steps=k) for k in range(4)], size)

    def mean_tok_s(combo: tuple[Setting, ...]) -> float:
        return sum(forecast(combo, user_counts(sum(u.values()), u), est).tok_s for u in loads)

    return max(combos, key=mean_tok_s)


def test_a_flapping_load_restarts_nothing() -> None:
    # Regimes of 150 s, busy and quiet in turn, against a dwell of 900 s: the pool runs the
    # best single assignment across them, which each regime alone would change.
    busy, quiet = {SAMPLED: 30.0}, {GREEDY: 2.0}
    across = _best_for([busy, quiet], 3)
    options = {"settle_s": 60.0, "max_steps": 3, "peak_concurrency": 30.0}  # sized for busy
    servers = [ServerState(name=f"b{i}", setting=k, startup_s=60.0)
               for i, k in enumerate(across)]  # fmt: skip
    flapping = [(150.0, busy), (150.0, quiet)] * 6
    for end in range(4, len(flapping) + 1):  # every regime once a few were seen
        planner, now = planner_after([*flapping[: end - 1], (130.0, flapping[end - 1][1])],
                                     **options)  # fmt: skip
        plan = planner.plan(now, servers, estimates())
        assert not plan.start, plan.reason
        # Changed in the regime before, inside the dwell: the valuation holds them, not it.
        changed = [msgspec.structs.replace(s, changed_at=now - 200.0) for s in servers]
        plan = planner.plan(now, changed, estimates())
        assert not plan.start, plan.reason
    # Valued at the regime of the moment alone (one that has lasted past the dwell), its
    # restarts charged at the load of the moment, the same pool would restart.
    moves = []
    for load in (busy, quiet):
        alone, now = planner_after([(1200.0, load)], **{**options, "peak_concurrency": 2.0})
        moves.append(alone.plan(now, servers, estimates()).start)
    assert any(moves)


def test_the_capacity_floor_holds_a_restart_the_others_cannot_carry() -> None:
    # Deep servers (capacity 10, limit 20 each) crowded by 50 sampled users: shallow pays,
    # but two servers hold 40 < 50.
    planner, now = planner_after([(600.0, {SAMPLED: 50.0})])
    plan = planner.plan(now, pool(7, 7, 7), estimates())
    assert plan.proposed is not None
    assert plan.proposed.tok_s > plan.current.tok_s
    assert plan.verdict.startswith("hold: capacity floor")
    assert plan.start == ()
    # With room in the rest (limits of 40 each), the same change begins.
    roomy = [msgspec.structs.replace(s, limit=40) for s in pool(7, 7, 7)]
    assert planner.plan(now, roomy, estimates()).verdict == "reconfigure"


def test_a_server_changed_within_the_dwell_time_is_not_changed_again() -> None:
    planner, now = planner_after([QUIET])
    recent = pool(1, 1, 1, changed_at=now - 100.0)
    plan = planner.plan(now, recent, estimates())
    assert plan.verdict.startswith("hold: ")
    assert "dwell" in plan.verdict
    assert plan.start == ()
    settled = pool(1, 1, 1, changed_at=now - 1000.0)
    assert planner.plan(now, settled, estimates()).verdict == "reconfigure"


def test_a_new_regime_ends_the_dwell_of_a_server_changed_before_it() -> None:
    # b0..b2 changed 1300 s ago under 8 users, inside an hour's dwell; two greedy users have
    # since settled into a regime of their own, for which a deep server pays.
    planner, now = planner_after([(300.0, {GREEDY: 8.0}), QUIET], min_dwell_s=3600.0)
    assert planner.regimes.view(now).started_at > 200.0
    before = planner.plan(now, pool(1, 1, 1, changed_at=200.0), estimates())
    assert before.verdict == "reconfigure"
    # A change made in this regime still waits out its dwell.
    within = planner.plan(now, pool(1, 1, 1, changed_at=now - 100.0), estimates())
    assert "dwell" in within.verdict
    assert within.start == ()


def test_a_server_is_not_changed_back_within_the_regime_that_changed_it() -> None:
    # Crowded sampled traffic wants b0 back at k1; it left k1 in this very regime.
    planner, now = planner_after([CROWDED])
    moved = [msgspec.structs.replace(s, limit=200) for s in pool(7, 1, 1)]
    plan = planner.plan(now, moved, estimates())
    assert plan.verdict == "reconfigure"
    assert plan.start[0].server == "b0"
    assert plan.start[0].after == Setting(steps=1)
    this_regime = now - 300.0
    moved[0] = msgspec.structs.replace(moved[0], changed_at=this_regime, previous=Setting(steps=1))
    plan = planner.plan(now, moved, estimates())
    assert all(c.server != "b0" or c.after != Setting(steps=1) for c in plan.changes)
    # A regime later, it may.
    later, now = planner_after([(600.0, {GREEDY: 2.0}), CROWDED])
    earlier = msgspec.structs.replace(moved[0], changed_at=100.0)
    plan = later.plan(now, [earlier, *moved[1:]], estimates())
    assert plan.start[0].after == Setting(steps=1)


def test_no_more_than_max_unavailable_servers_restart_at_once() -> None:
    planner, now = planner_after([CROWDED])
    servers = pool(7, 7, 7)
    servers = [msgspec.structs.replace(s, limit=200) for s in servers]
    away = [msgspec.structs.replace(servers[0], state="starting", setting=Setting(steps=1)),
            *servers[1:]]  # fmt: skip
    plan = planner.plan(now, away, estimates())
    assert len(plan.changes) >= 1
    assert plan.verdict == "hold: max_unavailable 1 reached"
    assert plan.start == ()
    two, now = planner_after([CROWDED], max_unavailable=2)
    plan = two.plan(now, away, estimates())
    assert plan.verdict == "reconfigure"
    assert len(plan.start) == 1


def test_a_gain_inside_the_hysteresis_band_is_not_acted_on() -> None:
    # Verifies cost enough that k = 7 beats k = 6 by under 3% for a lone greedy user.
    small, costly = pool(6, 6, 6), estimates(per_token_s=0.005)
    planner, now = planner_after([QUIET])
    plan = planner.plan(now, small, costly)
    assert plan.verdict == "hold: nothing gains enough"
    # (sized for the quiet load: a restart costs what it costs now, not at a peak)
    eager, now = planner_after([QUIET], min_gain=0.0, peak_concurrency=2.0)
    plan = eager.plan(now, small, costly)
    assert plan.verdict == "reconfigure"
    assert plan.proposed is not None
    assert 0 < plan.proposed.value / plan.current.value - 1 < 0.03


def test_a_proposal_must_stand_for_the_confirmation_time() -> None:
    planner, now = planner_after([QUIET], confirm_s=30.0)
    servers = pool(1, 1, 1)
    assert planner.plan(now, servers, estimates()).verdict.startswith("hold: proposed 0s ago")
    planner.observe(now + 20.0, {GREEDY: 2.0})
    assert planner.plan(now + 20.0, servers, estimates()).verdict.startswith("hold: proposed")
    planner.observe(now + 30.0, {GREEDY: 2.0})
    assert planner.plan(now + 30.0, servers, estimates()).verdict == "reconfigure"


def test_a_young_regime_is_not_acted_on() -> None:
    planner, now = planner_after([(100.0, {GREEDY: 2.0})])
    plan = planner.plan(now, pool(1, 1, 1), estimates())
    assert plan.verdict == "hold: regime not settled"
    assert plan.start == ()


def test_a_target_that_could_not_be_left_at_the_peak_is_not_proposed() -> None:
    # Three quiet users run fastest on three deep servers (limit 20 each). Told the load never
    # passes 3, the planner proposes that; after 50 users were seen it keeps a server shallow
    # enough that another can restart at that load, as it does when told 50 (what it proposes
    # then differs: the 50 seen are a load it expects back).
    three = (600.0, {GREEDY: 3.0})
    unaware, now = planner_after([three], peak_concurrency=3.0)
    deep = unaware.plan(now, pool(1, 1, 1), estimates())
    assert deep.proposed is not None
    assert deep.proposed.settings == ("k7", "k7", "k7")
    planner, now = planner_after([(300.0, {SAMPLED: 50.0}), three], peak_concurrency=3.0)
    plan = planner.plan(now, pool(1, 1, 1), estimates())
    assert plan.proposed is not None
    assert plan.proposed.settings != deep.proposed.settings
    limits = sorted(2 * estimates().depths[int(s[1:])].capacity for s in plan.proposed.settings)
    assert sum(limits) - limits[0] >= 50
    told, now = planner_after([three], peak_concurrency=50.0)
    proposed = told.plan(now, pool(1, 1, 1), estimates()).proposed
    assert proposed is not None
    assert "k7" in proposed.settings
    limits = sorted(2 * estimates().depths[int(s[1:])].capacity for s in proposed.settings)
    assert sum(limits) - limits[0] >= 50


def test_by_default_the_pool_stays_reconfigurable_at_the_load_it_was_launched_for() -> None:
    # Launched as three k1 servers (25 slots, 50 admitted each), the pool could restart a
    # server under 100 users (the other two admit 100). A quiet night may not turn it into a
    # pool that could not: load beyond the slots (75) would leave it stuck deep for as long as
    # the load lasts. Told the peak is 75, the planner may go deeper. (The night has lasted
    # half an hour: younger, the first regime leaves much of a change's horizon to loads not
    # seen yet, and no deep pool pays.)
    planner, now = planner_after([(1800.0, {GREEDY: 3.0})])
    plan = planner.plan(now, pool(1, 1, 1), estimates())
    assert plan.proposed is not None
    assert "k7" in plan.proposed.settings
    limits = sorted(2 * estimates().depths[int(s[1:])].capacity for s in plan.proposed.settings)
    assert sum(limits) - limits[0] >= 100
    told, now = planner_after([(1800.0, {GREEDY: 3.0})], peak_concurrency=75.0)
    deeper = told.plan(now, pool(1, 1, 1), estimates()).proposed
    assert deeper is not None
    limits = sorted(2 * estimates().depths[int(s[1:])].capacity for s in deeper.settings)
    assert 75 <= sum(limits) - limits[0] < 100


def test_once_the_load_has_moved_the_pool_stays_reconfigurable_at_twice_the_peak_seen() -> None:
    # Launched as three k1 (a server restarts under 100 users), twenty greedy users run
    # fastest on three k7, which could restart a server only under 40. While the pool has
    # seen one load only, nothing says how busy it may get, and the launched pool's 100 hold
    # it back; once a quiet spell has given way to the 20 users, twice the peak seen (40)
    # is the floor, and the 20 users get the pool they run fastest on.
    steady, now = planner_after([(3000.0, {GREEDY: 20.0})])
    held = steady.plan(now, pool(1, 1, 1), estimates())
    assert "the peak rule holds back k7/k7/k7" in held.reason
    assert "must stay able to under 100" in held.reason
    moved, now = planner_after([(1200.0, {GREEDY: 3.0}), (1800.0, {GREEDY: 20.0})])
    plan = moved.plan(now, pool(1, 1, 1), estimates())
    assert plan.proposed is not None
    assert plan.proposed.settings == ("k7", "k7", "k7")
    assert "peak rule" not in plan.reason
    # At 30 users the floor is 60, and the plan names where it comes from.
    busier, now = planner_after([(1200.0, {GREEDY: 3.0}), (1800.0, {GREEDY: 30.0})])
    held = busier.plan(now, pool(1, 1, 1), estimates())
    assert "the peak rule holds back k7/k7/k7" in held.reason
    assert "must stay able to under 60 (twice the highest load seen, 30 users)" in held.reason


def test_a_regime_ended_by_the_class_mix_alone_keeps_the_launched_peak() -> None:
    # At launch the first answer's mix is the prior's; the traffic's mix, read next, ends the
    # first regime at the same load. That is no sign of how busy the pool may get: the floor
    # stays where the launched pool put it, and three k7 stay held back at three users.
    planner, now = planner_after([(600.0, {SAMPLED: 3.0}), (1800.0, {GREEDY: 3.0})])
    assert planner.regimes.view(now).regimes_seen == 1
    plan = planner.plan(now, pool(1, 1, 1), estimates())
    assert "must stay able to under 100 (as the launched pool could" in plan.reason
    assert plan.proposed is None or plan.proposed.settings != ("k7", "k7", "k7")


def test_a_pool_the_rising_floor_has_passed_leaves_while_it_can_even_at_a_loss() -> None:
    # Three k7 (a server restartable under 40) were chosen at 8 users, when the floor was 16.
    # At 16 users (floor 32) they stay. At 24 (floor 48) they are still the fastest pool, but
    # one more step of the rise would leave no server able to restart: a server moves to a
    # depth that keeps the pool reconfigurable at 48, at a loss under the load now.
    rising = [(1200.0, {GREEDY: 3.0}), (1800.0, {GREEDY: 8.0})]
    for users, leaves in ((16.0, False), (24.0, True)):
        planner, now = planner_after([*rising, (1200.0, {GREEDY: users})])
        planner.plan(0.0, pool(1, 1, 1), estimates())  # launched as three k1
        plan = planner.plan(now, pool(7, 7, 7), estimates())
        if not leaves:
            assert plan.verdict == "hold: nothing gains enough"
            continue
        assert plan.verdict == "reconfigure"
        assert "could restart a server only under 40 users, and must stay able to under 48" in (
            plan.reason
        )
        assert plan.proposed is not None
        assert plan.proposed.value < plan.current.value  # a loss now, for the rise to come
        limits = sorted(2 * estimates().depths[int(s[1:])].capacity for s in plan.proposed.settings)
        assert sum(limits) - limits[0] >= 48
        assert len(plan.start) == 1


def test_where_regimes_pass_faster_than_a_change_commits_the_pool_it_does_not_leave() -> None:
    # The rise above in regimes of eight minutes, shorter than a restart and the dwell (990 s):
    # a move made under the higher load would be held past it, so leaving now buys nothing
    # the loop would use, and three k7 stay. In regimes of 25 minutes the same pool leaves.
    for minutes, leaves in ((8.0, False), (25.0, True)):
        span = 60.0 * minutes
        rising = [(span, {GREEDY: 3.0}), (span, {GREEDY: 8.0}), (span, {GREEDY: 24.0})]
        planner, now = planner_after(rising)
        planner.plan(0.0, pool(1, 1, 1), estimates())  # launched as three k1
        plan = planner.plan(now, pool(7, 7, 7), estimates())
        assert (plan.verdict == "reconfigure") is leaves, (minutes, plan.verdict, plan.reason)
        assert ("leaves while it can" in plan.reason) is leaves
        stays = re.search(r"under 48: it stays, as regimes last \d+s \(their median\), less "
                          r"than a restart and the dwell \(990s\)", plan.reason)  # fmt: skip
        assert (stays is not None) is not leaves, plan.reason


def test_a_plan_says_what_the_peak_rule_holds_back_and_how_to_lift_it() -> None:
    # The quiet night above: a deeper pool would run it faster, but could not restart a server
    # under the 100 users the launched pool could. The plan says so, and names the option
    # that lifts it; told the peak is 3, the planner goes there and the note is gone.
    planner, now = planner_after([(1800.0, {GREEDY: 3.0})])
    plan = planner.plan(now, pool(1, 1, 1), estimates())
    assert "the peak rule holds back k" in plan.reason
    assert "must stay able to under 100 (as the launched pool could; `peak_concurrency`" in (
        plan.reason
    )
    held = plan.reason.split("holds back ")[1].split(" ")[0].split("/")
    limits = sorted(2 * estimates().depths[int(s[1:])].capacity for s in held)
    assert sum(limits) - limits[0] < 100
    assert plan.proposed is not None
    assert plan.proposed.settings != tuple(held)
    told, now = planner_after([(1800.0, {GREEDY: 3.0})], peak_concurrency=3.0)
    lifted = told.plan(now, pool(1, 1, 1), estimates())
    assert "peak rule" not in lifted.reason
    assert lifted.proposed is not None
    assert lifted.proposed.value > plan.proposed.value


def test_a_pool_on_its_way_to_its_target_is_never_stuck_half_way() -> None:
    # Launched k3/k3/k3 (32 admitted each: a server can restart under 64 users) and already
    # k3/k3/k7, a quiet hour's target is a shallow server and two k7. Moving b1 to k7 first
    # would leave k3/k7/k7, which no server could leave at 64 users (the others admit 52 at
    # most): the server that makes room goes first.
    planner, now = planner_after([(1200.0, {GREEDY: 3.0})])
    planner.plan(now, pool(3, 3, 3), estimates())
    plan = planner.plan(now, pool(3, 3, 7), estimates())
    assert plan.proposed is not None
    first, *deep = plan.proposed.settings
    assert deep == ["k7", "k7"]
    assert int(first[1:]) < 3
    assert [c.server for c in plan.changes] == ["b0", "b1"]
    assert [c.server for c in plan.start] == ["b0"]


def test_a_server_whose_turn_comes_after_one_in_its_dwell_waits_for_it() -> None:
    # The pool above on its way to a shallow server and two k7, but b0, the server that makes
    # room, was changed 100 s ago in this regime and is in its dwell. b1 may not go first in its
    # place: k3/k7/k7 could not restart a server under the 64 users the launched pool could,
    # and once there the rest of the target no longer pays, so the pool would stay stuck.
    planner, now = planner_after([(1200.0, {GREEDY: 3.0})])
    planner.plan(now, pool(3, 3, 3), estimates())
    servers = pool(3, 3, 7)
    servers[0] = msgspec.structs.replace(
        servers[0], previous=Setting(steps=5), changed_at=now - 100.0
    )
    plan = planner.plan(now, servers, estimates())
    assert plan.proposed is not None
    assert [c.server for c in plan.changes] == ["b0", "b1"]
    assert plan.start == ()
    assert plan.verdict.startswith("hold: b0 changed 100s ago, in dwell")


def test_a_step_that_makes_room_is_not_begun_for_a_rest_that_would_not_pay_from_there() -> None:
    # Ten minutes of six greedy users, the peak named 60: the target is a k1 server (to make
    # room) and two k7, the k1 step first, gaining nothing on its own. Planned again from
    # k1/k3/k7, the unseen load's charge and the bar count from there and the k7 step no
    # longer pays: begun, the k1 restart would have been for nothing.
    mix = {GREEDY: 6.0}
    planner, now = planner_after([(600.0, mix)], peak_concurrency=60.0)
    plan = planner.plan(now, pool(3, 3, 7), estimates())
    assert plan.proposed is not None
    assert plan.proposed.settings == ("k1", "k7", "k7")
    assert [c.server for c in plan.changes] == ["b0", "b1"]
    assert plan.start == ()
    assert plan.verdict == "hold: the rest of the target would not pay from half-way"
    halfway = [
        msgspec.structs.replace(s, setting=Setting(steps=1), previous=s.setting, changed_at=now)
        if s.name == "b0" else s
        for s in pool(3, 3, 7)
    ]  # fmt: skip
    assert planner.plan(now, halfway, estimates()).start == ()
    # Half an hour of the same load: from half-way the rest still pays, and the step begins.
    planner, now = planner_after([(1800.0, mix)], peak_concurrency=60.0)
    plan = planner.plan(now, pool(3, 3, 7), estimates())
    assert [c.server for c in plan.start] == ["b0"]


def test_regime_lengths_teach_the_expected_remaining_time() -> None:
    tracker = RegimeTracker(prior_s=1800.0, window_s=20.0)
    now = 0.0
    for users in [2.0, 40.0] * 5:  # regimes of 300 s
        for _ in range(150):
            tracker.observe(now, {GREEDY: users})
            now += 2.0
    durations = list(tracker.durations)
    assert len(durations) == 9
    assert all(abs(d - 300.0) < 25.0 for d in durations)
    regime = tracker.view(now)
    assert regime.concurrency == pytest.approx(40.0)
    assert regime.expected_remaining_s < 400.0  # learned, well under the 1800 s prior


def test_a_ramp_is_one_change_of_regime_not_many() -> None:
    tracker = RegimeTracker(window_s=60.0)
    now = 0.0
    for _ in range(300):
        tracker.observe(now, {GREEDY: 2.0})
        now += 2.0
    for step in range(30):  # 2 -> 64 users over one minute
        tracker.observe(now, {GREEDY: 2.0 + 62.0 * step / 29})
        now += 2.0
    for _ in range(300):
        tracker.observe(now, {GREEDY: 64.0})
        now += 2.0
    assert len(tracker.durations) == 1
    assert tracker.view(now).steady


def test_a_step_inside_the_band_is_steady_only_once_the_mean_has_caught_up() -> None:
    # A regime at 43 users, then 64, then 32, none of them 1.5 times from 43 (as on
    # costly-drafts' ramp): one regime throughout, but the load moved at the step down, and a
    # rate read from before the window's mean caught up is of the 64 users' last replies.
    tracker = RegimeTracker(window_s=60.0)
    now = 0.0
    for users in [43.0] * 60 + [64.0] * 240:
        tracker.observe(now, {GREEDY: users})
        now += 2.0
    started, drop = tracker.view(now).started_at, now
    for _ in range(60):
        tracker.observe(now, {GREEDY: 32.0})
        now += 2.0
    regime = tracker.view(now)
    assert regime.started_at == started
    assert regime.steady
    assert drop + 10.0 < regime.steady_since < drop + 60.0


def test_a_quiet_regime_after_a_busy_one_has_the_quiet_mix_from_its_start() -> None:
    # Eight sampled users for two minutes, then one greedy user: the window still holds the
    # busy samples when the regime moves; they are not the quiet regime's mix.
    tracker = RegimeTracker(window_s=60.0)
    now = 0.0
    for users in [{SAMPLED: 8.0}] * 60 + [{GREEDY: 1.0}] * 90:
        tracker.observe(now, users)
        now += 2.0
    regime = tracker.view(now)
    assert regime.regimes_seen == 1
    assert regime.concurrency == pytest.approx(1.0)
    assert regime.shares[GREEDY] > 0.95


def test_a_few_users_split_by_class_keep_their_fractions() -> None:
    assert user_split(2.2, {GREEDY: 0.82, SAMPLED: 0.18}) == pytest.approx(
        {GREEDY: 1.64, SAMPLED: 0.36}
    )
    assert user_split(0.4, {GREEDY: 1.0}) == {}
    # The whole-user mixes that make them: their weights sum to one and their mean is them.
    users = {GREEDY: 1.64, SAMPLED: 0.36, "m:hot": 2.0}
    mixes = compositions(users)
    assert sum(w for w, _ in mixes) == pytest.approx(1.0)
    for c, n in users.items():
        assert sum(w * mix.get(c, 0) for w, mix in mixes) == pytest.approx(n)
    assert all(sum(mix.values()) == 4 for _, mix in mixes)
    assert compositions({GREEDY: 2.0, SAMPLED: 1.0}) == [(1.0, {GREEDY: 2, SAMPLED: 1})]


def test_two_users_of_whom_a_part_run_a_slow_class_are_not_forecast_as_two_fast_ones() -> None:
    # Two users, 1.6 of them greedy on average: a pool that sorts the classes runs both on
    # the deep server 60% of the time and one on each 40%. Rounded to two greedy users,
    # the forecast was the first mix's rate all the time.
    est = estimates()
    settings = [Setting(steps=1), Setting(steps=1), Setting(steps=7)]
    both = forecast(settings, {GREEDY: 2}, est)
    split = forecast(settings, {GREEDY: 1, SAMPLED: 1}, est)
    assert split.tok_s < 0.9 * both.tok_s
    mean = forecast(settings, {GREEDY: 1.6, SAMPLED: 0.4}, est)
    assert mean.tok_s == pytest.approx(0.6 * both.tok_s + 0.4 * split.tok_s)
    assert mean.class_speed[SAMPLED] == pytest.approx(split.class_speed[SAMPLED])


def test_the_planner_values_the_pool_now_for_the_fractions_of_users_it_has_seen() -> None:
    # Two users, a fifth of whose time goes to sampled requests: the plan's forecast of the
    # pool it runs is the fractional users', not two greedy users' on the deep server.
    planner, now = planner_after([(1200.0, {GREEDY: 1.6, SAMPLED: 0.4})])
    est = estimates()
    plan = planner.plan(now, pool(1, 1, 7), est)
    settings = [Setting(steps=1), Setting(steps=1), Setting(steps=7)]
    assert plan.current.tok_s == pytest.approx(
        forecast(settings, {GREEDY: 1.6, SAMPLED: 0.4}, est).tok_s, rel=1e-6
    )
    assert plan.current.tok_s < 0.97 * forecast(settings, {GREEDY: 2}, est).tok_s


def accept_lengths(rates: list[float], depth: int) -> float:
    """E_depth for per-position acceptance `rates` (the last repeats)."""
    total, run = 1.0, 1.0
    for j in range(depth):
        run *= rates[min(j, len(rates) - 1)]
        total += run
    return total


def test_acceptance_between_and_past_the_depths_seen_follows_a_fitted_decay() -> None:
    # Rates 0.8, 0.6, 0.45, ... (each 3/4 of the last): seen at depths 1 and 3, exact anywhere.
    # A thinly sampled depth off the curve is smoothed, not taken as it is.
    decaying = [0.8 * 0.75**j for j in range(8)]
    seen = {1: accept_lengths(decaying, 1), 3: accept_lengths(decaying, 3)}
    est = Estimates(depths={}, classes={SAMPLED: ClassEstimate(alpha=0.6, accept_length=seen)})
    for depth in (2, 5, 7):
        truth = accept_lengths(decaying, depth)
        assert est.accept_length(SAMPLED, depth) == pytest.approx(truth, rel=1e-4)
    # Hot sampling on the seed profile (0.84, 0.60, 0.39, 0.27): depths 1 and 7 seen, the rest
    # within 2%; a constant rate stays constant; an unseen class takes the prior alpha.
    hot = [0.84, 0.60, 0.39, 0.27]
    seen = {1: accept_lengths(hot, 1), 7: accept_lengths(hot, 7)}
    est = Estimates(depths={}, classes={SAMPLED: ClassEstimate(alpha=0.6, accept_length=seen)})
    for depth in range(2, 7):
        assert est.accept_length(SAMPLED, depth) == pytest.approx(
            accept_lengths(hot, depth), rel=0.02
        )
    # Depth 2 measured 6% low among depths 1, 3 and 7: the fit takes about half of that.
    noisy = {**seen, 3: accept_lengths(hot, 3), 2: 0.94 * accept_lengths(hot, 2)}
    est = Estimates(depths={}, classes={SAMPLED: ClassEstimate(alpha=0.6, accept_length=noisy)})
    assert est.accept_length(SAMPLED, 2) > 0.965 * accept_lengths(hot, 2)
    flat = {1: expected_tokens(0.9, 1), 2: expected_tokens(0.9, 2)}
    est = Estimates(depths={}, classes={GREEDY: ClassEstimate(alpha=0.9, accept_length=flat)})
    assert est.accept_length(GREEDY, 6) == pytest.approx(expected_tokens(0.9, 6), rel=1e-4)
    assert est.accept_length("unseen", 2) == pytest.approx(expected_tokens(0.7, 2))


def test_a_saturated_pool_runs_the_overall_class_mix_on_every_server() -> None:
    # With every slot taken no routing can sort classes: each freed slot takes the next request.
    est = estimates()
    deep_and_shallow = [Setting(steps=7), Setting(steps=1)]
    room = forecast(deep_and_shallow, {GREEDY: 5, SAMPLED: 5}, est)
    assert room.queued == 0
    full = forecast(deep_and_shallow, {GREEDY: 30, SAMPLED: 30}, est)
    assert full.queued == 60 - est.depths[7].capacity - est.depths[1].capacity
    assert [s.running for s in full.servers] == [est.depths[7].capacity, est.depths[1].capacity]
    e7 = (est.accept_length(GREEDY, 7) + est.accept_length(SAMPLED, 7)) / 2
    t7 = est.depths[7].iteration_time(est.depths[7].capacity)
    assert full.servers[0].tok_s == pytest.approx(est.depths[7].capacity * e7 / t7)


def test_a_deeper_pool_holds_fewer_users_in_flight_in_the_class_it_speeds_most() -> None:
    """Closed-loop users whose requests mix greedy and sampled: a deeper server speeds greedy
    requests more than sampled ones, so at any moment fewer of its users are in a greedy
    request than on a shallow one. The forecast of a deep server from users seen in flight on
    a shallow one counts them as the same mix of requests holds them there: each class in
    flight as long as its tokens take."""
    phys = Physics(estimates())
    shallow, deep = [Setting(steps=1)], [Setting(steps=7)]
    seen = {GREEDY: 6, SAMPLED: 4}  # 10 users, as many as the deep server's slots
    fc = forecast_seen(deep, seen, shallow, phys)
    # One server: a class's speed is its tokens per verify over the step time.
    weights = {c: n * phys.e(c, 1) / phys.e(c, 7) for c, n in seen.items()}
    held = {c: 10 * w / sum(weights.values()) for c, w in weights.items()}
    assert held[GREEDY] < seen[GREEDY]
    truth = sum(n * phys.e(c, 7) for c, n in held.items()) / phys.time(7, 10)
    assert fc.tok_s == pytest.approx(truth)
    assert forecast(deep, seen, phys).tok_s > 1.1 * truth  # the users' mix held: overstated
    assert forecast_seen(shallow, seen, shallow, phys) == forecast(shallow, seen, phys)


def test_forecast_places_users_where_the_policy_would_and_queues_past_capacity() -> None:
    est = estimates()
    quiet = forecast([Setting(steps=7), Setting(steps=1)], {GREEDY: 1}, est)
    assert [s.running for s in quiet.servers] == [1, 0]
    full = forecast([Setting(steps=7)], {SAMPLED: 15}, est)
    assert full.servers[0].running == est.depths[7].capacity
    assert full.queued == 15 - est.depths[7].capacity
    assert user_counts(10.4, {GREEDY: 0.75, SAMPLED: 0.25}) == {GREEDY: 8, SAMPLED: 2}


def test_an_adaptive_server_sizes_memory_for_its_deepest_candidate_and_follows_its_tier() -> None:
    tiers = ((1, (1, 3, 5, 7)), (8, (0, 1, 3)))
    adaptive = Setting(steps=3, tiers=tiers)
    est = estimates()
    alone = forecast([adaptive], {GREEDY: 1}, est)
    assert alone.servers[0].steps == 7  # greedy accepts nearly every draft
    crowded = forecast([adaptive], {SAMPLED: 40}, est)
    assert crowded.servers[0].running == est.depths[7].capacity
    assert crowded.servers[0].steps == 3  # 0.875 drafts of 3 accepted: above 1 - 0.5
    hot = msgspec.structs.replace(est, classes={"m:hot": ClassEstimate(alpha=0.2)})
    assert forecast([adaptive], {"m:hot": 40}, hot).servers[0].steps == 0


def test_a_first_regime_is_expected_to_last_as_long_again_as_it_has() -> None:
    # Nothing yet says how long regimes last: as long again (at most the prior); once some
    # have ended, a few short ones outweigh the prior.
    tracker = RegimeTracker(prior_s=1800.0)
    for t in range(0, 300, 2):
        tracker.observe(float(t), {GREEDY: 2.0})
    assert 290.0 <= tracker.view(298.0).expected_remaining_s <= 300.0
    for t in range(300, 4000, 2):
        tracker.observe(float(t), {GREEDY: 2.0})
    assert tracker.view(3998.0).expected_remaining_s == 1800.0
    planner, now = planner_after([(150.0, {GREEDY: 2.0}), (150.0, {SAMPLED: 30.0})] * 4)
    assert planner.regimes.view(now).expected_remaining_s < 600.0


def test_a_first_regime_older_than_the_prior_leaves_no_load_unseen() -> None:
    # A quiet night of two users from launch: the part of the horizon past what the regime is
    # expected to last is load not seen yet (charged at the peak) until it has lasted
    # `prior_s`; then the load the pool was started into is the load seen.
    tracker = RegimeTracker(prior_s=1800.0)
    for t in range(0, 1200, 2):
        tracker.observe(float(t), {GREEDY: 2.0})
    assert sum(w for w, _ in tracker.mixture(1198.0, 2000.0)) < 0.9
    for t in range(1200, 1900, 2):
        tracker.observe(float(t), {GREEDY: 2.0})
    ((weight, load),) = tracker.mixture(1898.0, 2000.0)
    assert weight == 1.0
    assert load.concurrency == pytest.approx(2.0)


def test_a_regime_is_expected_to_last_as_regimes_of_its_load_did() -> None:
    # Short quiet spells between long busy hours: the third quiet spell is expected to be as
    # short as the first two, not as long as the hours between them.
    quiet, busy = (150.0, {GREEDY: 2.0}), (1200.0, {SAMPLED: 30.0})
    planner, now = planner_after([quiet, busy, quiet, busy, (100.0, {GREEDY: 2.0})])
    assert planner.regimes.view(now).concurrency < 5
    assert planner.regimes.view(now).expected_remaining_s < 150.0
    # ...and a busy hour after short quiet spells as long as the busy ones.
    planner, now = planner_after([quiet, busy, quiet, busy, quiet, (600.0, {SAMPLED: 30.0})])
    assert planner.regimes.view(now).expected_remaining_s > 300.0


def test_a_regime_of_a_load_not_seen_before_is_expected_to_last_at_least_as_long_again() -> None:
    # A quiet quarter of an hour, then a busy regime: the busy one is expected to last as
    # long again as it has at least, not to end when the quiet one would have...
    planner, now = planner_after([(900.0, {GREEDY: 2.0}), (700.0, {SAMPLED: 30.0})])
    regime = planner.regimes.view(now)
    assert regime.regimes_seen == 1
    assert regime.expected_remaining_s == pytest.approx(regime.elapsed_s)
    # ...and while it is young, about as long as the quiet one lasted.
    planner, now = planner_after([(900.0, {GREEDY: 2.0}), (200.0, {SAMPLED: 30.0})])
    assert planner.regimes.view(now).expected_remaining_s > 400.0


def test_a_regime_older_than_every_one_like_it_is_not_expected_to_last_as_long_again() -> None:
    # One quiet spell of 900 s, a busy half hour, and a quiet spell now 1048 s old: it has
    # outlived the one like it. Expected to last as long again (1048 s), it drew a move to
    # deep drafts 152 s before it ended (costly-drafts' depth-live). The prior (weight 1/2)
    # weighs against the spell that ended younger, counted 900/1048: about a third as long
    # again. And the estimate does not jump where the regime passes the longest like it: just
    # before, what that one had left.
    quiet, busy = {GREEDY: 2.0}, {SAMPLED: 48.0}
    older, now = planner_after([(900.0, quiet), (1800.0, busy), (1048.0, quiet)])
    assert older.regimes.view(now).alike_seen == 1
    third = 0.5 * 1048.0 / (0.5 + 900.0 / 1048.0)
    assert older.regimes.view(now).expected_remaining_s == pytest.approx(third, rel=0.05)
    assert older.regimes.view(now).expected_remaining_s < 0.4 * 1048.0
    # A quiet regime that has outlived a short one like it many times over (a spell at
    # start-up, then an hour) is expected to last nearly as long again as it has (at most
    # the prior's 30 minutes), not to end within minutes.
    long, now = planner_after([(200.0, quiet), (600.0, busy), (3600.0, quiet)])
    assert long.regimes.view(now).alike_seen == 1
    assert long.regimes.view(now).expected_remaining_s > 0.8 * 1800.0
    before, at = planner_after([(900.0, quiet), (1800.0, busy), (880.0, quiet)])
    after, later = planner_after([(900.0, quiet), (1800.0, busy), (920.0, quiet)])
    near = before.regimes.view(at).expected_remaining_s
    past = after.regimes.view(later).expected_remaining_s
    assert past == pytest.approx(near, rel=0.15)


def test_a_few_users_drawing_another_class_for_a_while_are_no_new_regime() -> None:
    # Two greedy users for twenty minutes, then for a minute and a half one of them runs a
    # sampled request: the window's mix is half sampled, which among two users is chance, not
    # a new regime, and the regime's mix is what it has been since it began.
    planner, now = planner_after([(1200.0, {GREEDY: 2.0}), (90.0, {GREEDY: 1.0, SAMPLED: 1.0})])
    regime = planner.regimes.view(now)
    assert regime.regimes_seen == 0
    assert regime.shares[SAMPLED] < 0.1
    # At 24 users the same swing of the mix is a new regime.
    crowd, now = planner_after([(1200.0, {GREEDY: 24.0}), (90.0, {GREEDY: 12.0, SAMPLED: 12.0})])
    assert crowd.regimes.view(now).regimes_seen == 1


def test_a_regime_as_old_as_the_commit_may_end_within_it_and_the_next_load_weighs() -> None:
    # A quiet spell has outlasted the one quiet spell seen (600 s), after a busy half hour: it
    # is expected to last about half as long again (the prior, as long again, weighs half
    # against the spell seen, which ended younger, counted 600/1300), under the commit
    # (restart and dwell, 990 s). It ends within the commit more often than not, and a change
    # made for it is held under the busy load that follows: that load weighs on the change.
    # Read as filling the whole commit, it weighed nothing.
    planner, now = planner_after(
        [(600.0, {GREEDY: 2.0}), (1800.0, {SAMPLED: 48.0}), (1300.0, {GREEDY: 2.0})]
    )
    servers = pool(2, 2, 2)
    plan = planner.plan(now, servers, estimates())
    commit = servers[0].startup_s + planner.options.drain_s + planner.options.min_dwell_s
    rest = plan.regime.expected_remaining_s
    assert rest == pytest.approx(0.5 * 1300.0 / (0.5 + 600.0 / 1300.0), rel=0.05)
    assert rest < commit
    # Held for the commit, then on while the regime lasts: longer than either.
    assert plan.horizon_s > max(commit, rest)
    (stay, _), *after = planner.regimes.mixture(now, plan.horizon_s)
    assert stay == pytest.approx(rest / plan.horizon_s)
    assert sum(w for w, past in after if past.concurrency > 10) > 0.1
    # A regime that has gone on for hours fills nearly all of what a change is held for.
    long, now = planner_after([(600.0, {GREEDY: 2.0}), (7200.0, {SAMPLED: 48.0})])
    plan = long.plan(now, servers, estimates())
    assert plan.regime.expected_remaining_s / plan.horizon_s > 0.85


def test_a_change_in_a_young_lull_is_charged_its_restart_at_the_peak() -> None:
    # Two and a half minutes into a quiet greedy regime, in a pool sized for 60 users, the
    # regime may well end before a restart is done: the server it takes away is charged much
    # of what it yields at the peak, and deeper drafts do not pay. Charged at the quiet load,
    # the same change would go ahead; once the lull has lasted, the peak weighs less. (The
    # pool knows greedy traffic only, so that no class it knows loses at the peak: the
    # restart's charge alone holds the change.)
    full = estimates()
    known = msgspec.structs.replace(full, classes={GREEDY: full.classes[GREEDY]})
    young = [(150.0, {GREEDY: 2.0})]
    sized, now = planner_after(young, peak_concurrency=60.0)
    plan = sized.plan(now, pool(1, 1, 1), known)
    assert plan.start == ()
    assert plan.verdict == "hold: does not pay"
    assert plan.restart_cost_tokens > plan.gain_tokens / sized.options.margin
    lull, now = planner_after(young, peak_concurrency=2.0)
    assert lull.plan(now, pool(1, 1, 1), known).verdict == "reconfigure"
    lasted, now = planner_after([(1200.0, {GREEDY: 2.0})], peak_concurrency=60.0)
    later = lasted.plan(now, pool(1, 1, 1), known)
    assert later.verdict == "reconfigure"
    assert 0 < later.restart_cost_tokens < plan.restart_cost_tokens / 2


def test_a_first_quiet_spell_is_not_taken_for_all_the_load_to_come() -> None:
    # Ten minutes after launch, two greedy users are all the pool has seen; it was sized for
    # the 75 users its slots hold. Deep drafts would gain while the quiet lasts, but much of
    # what a change is held for is load no regime has shown yet, and at the peak, of sampled
    # traffic (a class the pool knows), deep drafts lose. That part of the horizon is
    # charged the loss and credited no gain: the pool stays as launched. Charged nothing
    # there, it went deep.
    first, now = planner_after([(600.0, {GREEDY: 2.0})])
    plan = first.plan(now, pool(1, 1, 1), estimates())
    assert plan.start == ()
    assert plan.verdict == "hold: nothing gains enough", plan.reason
    assert "46% of it at loads not seen yet, charged the worst at 75 users" in plan.reason
    # Told the pool never sees more than two users, it goes deep at once.
    told, now = planner_after([(600.0, {GREEDY: 2.0})], peak_concurrency=2.0)
    assert told.plan(now, pool(1, 1, 1), estimates()).verdict == "reconfigure"
    # Once a busy regime has been seen, the loads seen fill the horizon instead; a first
    # quiet spell that has lasted half an hour fills most of it.
    seen, now = planner_after([(1200.0, {SAMPLED: 60.0}), (600.0, {GREEDY: 2.0})])
    assert seen.plan(now, pool(1, 1, 1), estimates()).verdict == "reconfigure"
    lasted, now = planner_after([(1800.0, {GREEDY: 2.0})])
    assert lasted.plan(now, pool(1, 1, 1), estimates()).verdict == "reconfigure"


def test_regimes_named_to_last_an_hour_let_a_first_quiet_spell_go_deep_at_once() -> None:
    # Ten minutes after launch, two greedy users: left to learn, the loop holds (the spell is
    # expected to last as long again, and the rest of the horizon is load not seen yet). An
    # operator who knows the load changes by the hour says so, and the same spell is
    # expected to last until it is an hour old: none of the horizon is unseen, the pool goes
    # deep. Past the hour, the lengths are learned as before.
    first, now = planner_after([(600.0, {GREEDY: 2.0})])
    assert first.plan(now, pool(1, 1, 1), estimates()).verdict == "hold: nothing gains enough"
    named, now = planner_after([(600.0, {GREEDY: 2.0})], regime_min_s=3600.0)
    assert named.regimes.view(now).expected_remaining_s == pytest.approx(3000.0, abs=2.0)
    plan = named.plan(now, pool(1, 1, 1), estimates())
    assert plan.verdict == "reconfigure", plan.reason
    assert "not seen yet" not in plan.reason
    tracker = RegimeTracker(prior_s=1800.0, min_s=3600.0)
    for t in range(0, 4000, 2):
        tracker.observe(float(t), {GREEDY: 2.0})
    assert tracker.expected_remaining(600.0, 1000.0) == pytest.approx(1000.0)
    assert tracker.view(3998.0).expected_remaining_s == 1800.0
    with pytest.raises(ValueError, match="regime_min_s"):
        PlannerOptions(regime_min_s=-1.0)


def test_a_change_that_loses_now_waits_until_a_regime_like_this_one_has_ended() -> None:
    # Twelve greedy users for ten minutes, then twelve sampled ones for five. Deep drafts win
    # the greedy load and lose this one: three k7 servers yield 460 tok/s here against 656
    # for the k2 pool. Valued over the horizon, with this regime guessed to last about as
    # long again, the move pays on the greedy load expected after it; but no sampled regime
    # has ended, and how long this one lasts is a guess. The change waits.
    est = estimates(per_token_s=0.001)
    servers = [ServerState(name=f"b{i}", setting=Setting(steps=2), startup_s=60.0,
                           limit=2 * est.depths[2].capacity) for i in range(3)]  # fmt: skip
    greedy, sampled = {GREEDY: 12.0}, {SAMPLED: 12.0}
    first, now = planner_after([(600.0, greedy), (300.0, sampled)], peak_concurrency=24.0)
    plan = first.plan(now, servers, est)
    assert plan.regime.alike_seen == 0
    assert plan.verdict == "hold: loses under the load now, and no regime like it has ended"
    assert plan.start == ()
    assert plan.proposed is not None
    assert plan.proposed.value < plan.current.value
    assert plan.gain_tokens > first.options.margin * plan.restart_cost_tokens  # it would pay
    # Sampled regimes seen to end within minutes: the greedy load is back soon, and the
    # change goes ahead in this one, the best single pool across the two.
    short, now = planner_after(
        [(600.0, greedy), (200.0, sampled), (600.0, greedy), (150.0, sampled)],
        peak_concurrency=24.0,
    )
    plan = short.plan(now, servers, est)
    assert plan.regime.alike_seen == 1
    assert plan.verdict == "reconfigure", plan.reason
    assert plan.start
    assert all(c.after.steps > 2 for c in plan.start)
    # Sampled regimes seen to last twenty minutes: nothing gains enough, for a reason told.
    long, now = planner_after(
        [(600.0, greedy), (1200.0, sampled), (600.0, greedy), (300.0, sampled)],
        peak_concurrency=24.0,
    )
    assert long.plan(now, servers, est).verdict == "hold: nothing gains enough"


def test_a_depth_no_server_runs_is_valued_at_what_tune_measured_not_at_its_line() -> None:
    # The h200 shape's iteration time bends as its expert reads saturate. Three k2 servers at
    # 16 busy sampled users each, k2's live fit taken near 16 users: k1's line from tune (63.5
    # ms at 16 users, where tune measured 71.9) made two servers move to k1, which runs slower
    # there. Read between tune's points, k1 is what it is and nothing moves.
    truth = PROFILES["h200-qwen35-122b-shape"]
    targets = [
        Target(label=f"steps{k}", steps=k, max_running_requests=truth.capacity(k), points=[
            Point(traffic="busy", concurrency=c, requests=c,
                  iteration_time_s=truth.iteration_time(min(c, truth.capacity(k)), k))
            for c in (1, 4, 16, 32, 64)])
        for k in range(4)
    ]  # fmt: skip
    tuned = {fit.steps: fit for fit in fit_depths(targets)}
    measured = depth_curves(targets)
    live = fit_line([(b * 3.0, truth.iteration_time(b, 2)) for b in range(12, 21)])
    assert live is not None
    lengths = {k: truth.expected_tokens("high", k) for k in (1, 2, 3)}
    classes = {SAMPLED: ClassEstimate(alpha=0.7, accept_length=lengths, samples=1000)}
    planner, now = planner_after([(1800.0, {SAMPLED: 48.0})], max_steps=3, peak_concurrency=48)
    servers = [ServerState(name=f"b{i}", setting=Setting(steps=2), startup_s=60.0, limit=48)
               for i in range(3)]  # fmt: skip

    def plan(read_between: bool) -> tuple[int, ...]:
        depths = {
            k: DepthEstimate(steps=k, capacity=truth.capacity(k), intercept_s=fit.intercept_s,
                             per_token_s=fit.per_token_s,
                             measured=measured[k] if read_between else ())
            for k, fit in tuned.items()
        }  # fmt: skip
        depths[2] = DepthEstimate(steps=2, capacity=truth.capacity(2), intercept_s=live[0],
                                  per_token_s=live[1])  # fmt: skip
        result = planner.plan(now, servers, Estimates(depths=depths, classes=classes))
        return tuple(c.after.steps for c in result.changes)

    assert plan(read_between=False) == (1, 1)  # the line's mistake, as it was made
    assert plan(read_between=True) == ()
    # Three k1 servers really run slower than three k2 at 16 users each.
    speed = {k: 16 * lengths[k] / truth.iteration_time(16, k) for k in (1, 2)}
    assert speed[1] < speed[2]


def test_a_forecast_missed_under_one_load_does_not_raise_the_bar_under_another() -> None:
    # A quiet regime's change over-promised its gain by 18 points: the next quiet change must
    # promise that much more, a busy regime's only min_gain.
    planner, now = planner_after([QUIET])
    planner.account(0.4, forecast_gain=0.58)
    assert planner.bar == pytest.approx(planner.options.min_gain + 0.18)
    for users in ({SAMPLED: 60.0}, {GREEDY: 2.0}):
        for _ in range(300):
            now += 2.0
            planner.observe(now, users)
        quiet = GREEDY in users
        assert planner.bar == pytest.approx(planner.options.min_gain + (0.18 if quiet else 0.0))


def test_forecasts_that_missed_widen_the_bar() -> None:
    planner, _ = planner_after([QUIET])
    for promised in (0.17, -0.03, 0.15):  # 12 points over, 8 under, 10 over
        planner.account(0.05, forecast_gain=promised)
    assert planner.bar == pytest.approx(planner.options.min_gain + 0.10)
    # Forecasts that promised less than their changes gave do not hold the next change back.
    modest, _ = planner_after([QUIET])
    for promised in (-0.07, -0.03, 0.15):
        modest.account(0.05, forecast_gain=promised)
    assert modest.bar == pytest.approx(modest.options.min_gain)


def test_a_request_s_time_holds_its_first_token_wait_which_shrinks_a_deep_server_s_lead() -> None:
    est = estimates()
    agents = msgspec.structs.replace(
        est,
        classes={
            GREEDY: msgspec.structs.replace(
                est.classes[GREEDY], mean_tokens=300.0, first_token_s=0.4
            ),
            SAMPLED: est.classes[SAMPLED],
        },
    )
    one = {GREEDY: 1.0}
    e, t = est.accept_length(GREEDY, 7), est.depths[7].iteration_time(1)
    assert forecast([Setting(steps=7)], one, est).tok_s == pytest.approx(e / t)
    # 300 tokens: the first after the 0.4 s wait and one iteration, 299 at e per iteration
    waited = forecast([Setting(steps=7)], one, agents)
    assert waited.tok_s == pytest.approx(300 / (0.4 + t + 299 * t / e))
    assert waited.servers[0].per_request_tok_s == pytest.approx(waited.tok_s)

    def lead(estimates: Estimates) -> float:
        deep = forecast([Setting(steps=7)], one, estimates).tok_s
        return deep / forecast([Setting(steps=1)], one, estimates).tok_s

    assert 1.0 < lead(agents) < lead(est) - 0.2  # the wait is the same at every depth
    # a class with no wait seen yet, or no length, runs at E_k per iteration from the first
    assert forecast([Setting(steps=7)], {SAMPLED: 1.0}, agents).tok_s == pytest.approx(
        est.accept_length(SAMPLED, 7) / t
    )


def test_a_request_pays_a_prefill_pause_for_each_other_request_on_its_server() -> None:
    """Each user beside it starts about one request in its time, and every start's prefill
    pauses the batch: whatever the depth, so the pauses take a larger share of a deep
    server's shorter requests and its lead over a shallow one shrinks as users are added."""
    est = estimates()

    def agents(pause: float | None) -> Estimates:
        greedy = msgspec.structs.replace(
            est.classes[GREEDY], mean_tokens=300.0, first_token_s=0.1, prefill_pause_s=pause
        )
        return msgspec.structs.replace(est, classes={GREEDY: greedy})

    paused, unpaused = agents(0.1), agents(None)
    e, t = est.accept_length(GREEDY, 7), est.depths[7].iteration_time(8)
    eight = forecast([Setting(steps=7)], {GREEDY: 8.0}, paused)
    assert eight.servers[0].per_request_tok_s == pytest.approx(
        300 / (0.1 + t + 299 * t / e + 7 * 0.1)
    )
    # alone on its server, nothing pauses it
    alone = forecast([Setting(steps=7)], {GREEDY: 1.0}, paused).tok_s
    assert alone == pytest.approx(forecast([Setting(steps=7)], {GREEDY: 1.0}, unpaused).tok_s)

    def lead(estimates: Estimates) -> float:
        deep = forecast([Setting(steps=7)], {GREEDY: 8.0}, estimates).tok_s
        return deep / forecast([Setting(steps=1)], {GREEDY: 8.0}, estimates).tok_s

    assert 1.0 < lead(paused) < lead(unpaused) - 0.1
