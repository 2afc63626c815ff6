"""What a tune recommends from its measurements: best server per load, the gain of each extra
step and where returns diminish, the best fixed depth, and a pool mix with its predicted gain."""

from __future__ import annotations

import pytest

import specroute.recommend as recommend
from specroute.profile_format import Point, Profile, Target
from specroute.recommend import (
    MIX_SEARCH_LIMIT,
    advise,
    best_fixed,
    best_mix,
    diminishing,
    pool_loads,
    pool_values,
    regimes,
    step_gains,
)

# Aggregate tok/s per concurrency: deep speculation wins alone, shallow wins under load
# (the shape of sampled traffic on the costly-drafts profile).
CROSSING = {
    "steps1": {1: 100.0, 4: 380.0, 16: 1200.0, 64: 1500.0},
    "steps2": {1: 130.0, 4: 450.0, 16: 1150.0, 64: 1250.0},
    "steps3": {1: 150.0, 4: 480.0, 16: 1000.0, 64: 1100.0},
}


def _scaled(gains: list[float]) -> dict[str, dict[int, float]]:
    """Depths steps1.. whose every level gains `gains[i]` over the depth before."""
    table, value = {"steps1": {1: 100.0, 64: 1000.0}}, 1.0
    for i, gain in enumerate(gains, 2):
        value *= 1 + gain
        table[f"steps{i}"] = {1: 100.0 * value, 64: 1000.0 * value}
    return table


def test_the_best_server_per_level_falls_with_load_where_the_curves_cross() -> None:
    profile = Profile(
        targets=[
            Target(label=label, steps=int(label[-1]),
                   points=[Point(traffic="sampled", concurrency=c, aggregate_tok_s=v,
                                 per_request_tok_s=v / c) for c, v in curve.items()])
            for label, curve in CROSSING.items()
        ]
    )  # fmt: skip
    advice = advise(profile, "sampled", ["steps1", "steps2", "steps3"], [], servers=2)
    assert advice is not None
    assert advice.best_by_level == {1: "steps3", 4: "steps3", 16: "steps1", 64: "steps1"}
    assert [(r.low, r.high, r.label) for r in advice.regimes] == [
        (1, 4, "steps3"),
        (16, 64, "steps1"),
    ]
    assert advise(profile, "greedy", ["steps1"], [], servers=2) is None


def test_each_extra_step_is_judged_against_the_one_before() -> None:
    table = _scaled([0.50, 0.25, 0.10, 0.02])
    gains = step_gains(table, table, list(table))
    assert [round(g.overall, 3) for g in gains] == [0.50, 0.25, 0.10, 0.02]
    assert [g.verdict for g in gains] == ["first step", "diminishing", "diminishing", "diminishing"]
    assert diminishing(gains) == ("steps3", "steps4")  # steps5 gains under 5%


def test_a_step_that_gains_more_than_the_last_is_not_diminishing_and_a_drop_is_a_loss() -> None:
    table = _scaled([0.20, 0.30, -0.10])
    gains = step_gains(table, table, list(table))
    assert [g.verdict for g in gains] == ["first step", "not diminishing", "a loss"]
    assert diminishing(gains) == ("steps4", "steps3")


def test_the_best_fixed_depth_has_the_best_geometric_mean_and_its_worst_gap() -> None:
    label, gap, at = best_fixed(CROSSING)
    assert label == "steps2"  # never best, never far from it
    assert at == 64
    assert gap == pytest.approx(1 - 1250 / 1500)


def test_a_mix_of_depths_beats_the_best_fixed_depth_when_the_best_depth_swings_with_load() -> None:
    swing = {
        "steps1": {1: 100.0, 4: 390.0, 16: 1400.0, 64: 2400.0},
        "steps3": {1: 200.0, 4: 700.0, 16: 1100.0, 64: 1150.0},
    }
    mix = best_mix(swing, 2, ["steps1", "steps3"], [])
    assert mix is not None
    assert mix.servers == ("steps1", "steps3")
    assert mix.baseline == ("steps3", "steps3")
    assert set(mix.by_load) == set(pool_loads([1, 4, 16, 64], 2)) == {2, 8, 32, 128}
    assert mix.by_load[8] < 0 < mix.by_load[128]  # it gives up some light load for heavy
    assert mix.gain == pytest.approx(0.0577, abs=0.001)


def test_a_pool_takes_every_gain_then_every_flat_user_then_the_least_loss() -> None:
    # One server: +10, +5, then -1.5 twice (it slows past 2 users), then flat past 4 users:
    # a user takes a flat place before a losing one. Two: each gain once per server.
    table = {"a": {1: 10.0, 2: 15.0, 4: 12.0}}
    one = pool_values(table, ["a"], [1, 2, 3, 4, 6])
    assert one == {1: 10.0, 2: 15.0, 3: 15.0, 4: 15.0, 6: 12.0}
    assert pool_values(table, ["a", "a"], [1, 2, 3, 4, 8]) == {1: 10, 2: 20, 3: 25, 4: 30, 8: 30}


def test_a_large_pool_is_chosen_among_mixes_of_few_depths(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sixteen servers of eight depths are 245,157 pools; valued every one, `launch --prior
    # --servers 16` spent minutes before anything started. The search keeps to mixes of at
    # most three depths there, and still finds the crossing's mix.
    table = {f"steps{k}": {1: 90.0, 4: 300.0, 16: 900.0, 64: 1000.0} for k in range(1, 7)}
    table["steps0"] = {1: 100.0, 4: 390.0, 16: 1400.0, 64: 2400.0}  # the swing's, above
    table["steps7"] = {1: 200.0, 4: 700.0, 16: 1100.0, 64: 1150.0}
    valued = []
    pool = recommend._pool
    monkeypatch.setattr(recommend, "_pool", lambda *a: valued.append(1) or pool(*a))
    mix = best_mix(table, 16, list(table), [])
    assert mix is not None
    assert len(valued) <= MIX_SEARCH_LIMIT + len(table)
    assert set(mix.servers) == {"steps0", "steps7"}
    assert mix.gain > 0.05
    valued.clear()
    assert best_mix(table, 8, list(table), []) is not None
    assert len(valued) == 6435  # every pool of eight servers, as before


def test_no_mix_is_recommended_where_it_would_gain_little_or_nothing() -> None:
    mix = best_mix(CROSSING, 2, ["steps1", "steps2", "steps3"], [])
    assert mix is not None
    assert mix.servers == mix.baseline == ("steps2", "steps2")
    assert mix.gain == 0.0
    # steps1 + steps3 would gain 0.6% here: not worth running two depths.
    slight = {"steps1": {1: 100.0, 4: 390.0, 16: 1400.0, 64: 2400.0},
              "steps3": {1: 200.0, 4: 700.0, 16: 1100.0, 64: 1575.0}}  # fmt: skip
    mix = best_mix(slight, 2, ["steps1", "steps3"], [])
    assert mix is not None
    assert mix.servers == ("steps3", "steps3")


def test_when_one_depth_is_best_everywhere_the_pool_is_all_that_depth() -> None:
    table = _scaled([0.3, 0.2])
    mix = best_mix(table, 3, list(table), [])
    assert mix is not None
    assert mix.servers == ("steps3", "steps3", "steps3")
    assert mix.gain == 0.0


def test_an_adaptive_server_fills_a_pool_only_on_its_own() -> None:
    table = {**CROSSING, "adaptive": {1: 150.0, 4: 480.0, 16: 1200.0, 64: 1500.0}}
    mix = best_mix(table, 2, ["steps1", "steps2", "steps3"], ["adaptive"])
    assert mix is not None
    assert mix.servers == ("adaptive", "adaptive")
    assert mix.baseline == ("steps2", "steps2")


def test_regimes_merge_adjacent_levels_with_the_same_best() -> None:
    best = {1: "steps3", 4: "steps3", 16: "steps2", 32: "steps3"}
    assert [(r.low, r.high, r.label) for r in regimes(best)] == [
        (1, 4, "steps3"),
        (16, 16, "steps2"),
        (32, 32, "steps3"),
    ]


def test_the_best_fixed_depth_is_a_fixed_depth_even_when_an_adaptive_server_beats_it() -> None:
    table = {**CROSSING, "adaptive": {1: 160.0, 4: 500.0, 16: 1250.0, 64: 1600.0}}
    profile = Profile(
        targets=[
            Target(label=label, points=[Point(traffic="t", concurrency=c, aggregate_tok_s=v,
                                              per_request_tok_s=v / c) for c, v in curve.items()])
            for label, curve in table.items()
        ]
    )  # fmt: skip
    advice = advise(profile, "t", ["steps1", "steps2", "steps3"], ["adaptive"], servers=2)
    assert advice is not None
    assert advice.best_fixed == "steps2"
    assert set(advice.best_by_level.values()) == {"adaptive"}  # the best server at every level
