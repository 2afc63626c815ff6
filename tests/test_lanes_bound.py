"""The lanes targets' bound (benchmarks/lanes_bound.py): a lanes pool meets a phase only with
the best deep pool's interactive median and, where any pool reaches it, 95% at the target;
the envelope takes the most aggregate among those in every phase, and has none where some
phase has none."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import lanes_bound
from lanes_bound import Cell, Summary


def _run(name: str, lanes: bool, *cells: tuple[float, float, float]) -> Summary:
    """Two phases of 100 s and 300 s: (aggregate, interactive median, met) each."""
    return Summary(name, lanes,
                   [Cell(p, s, *c) for p, s, c in zip(("quiet", "busy"), (100.0, 300.0), cells,
                                                       strict=True)], 0.0)  # fmt: skip


RUNS = [
    _run("3 x k2", False, (100, 150, 0.5), (1000, 80, 0.2)),
    _run("3 x k7", False, (150, 300, 1.0), (600, 200, 0.9)),
    _run("lanes fast r8", True, (160, 310, 1.0), (700, 210, 0.96)),
    _run("lanes wide r8", True, (170, 320, 1.0), (900, 205, 0.90)),
    _run("lanes slow r8", True, (180, 250, 1.0), (990, 120, 0.50)),
]


def test_a_phase_asks_the_best_deep_pools_median_and_the_reachable_share() -> None:
    asked = lanes_bound.phases(RUNS)
    assert [(p.deep, p.deep_median, p.met_reachable) for p in asked] == [
        ("3 x k7", 300, True), ("3 x k7", 200, True)]  # fmt: skip
    assert asked[1].best_alternative == 1000  # 3 x k2 has the most aggregate overall
    busy = asked[1]
    assert lanes_bound.meets(RUNS[2].cells[1], busy)
    assert not lanes_bound.meets(RUNS[3].cells[1], busy)  # fast enough, 90% < 95% at target
    assert not lanes_bound.meets(RUNS[4].cells[1], busy)  # too slow
    assert lanes_bound.meets(RUNS[3].cells[1], busy, (0.95, False))  # the median alone
    assert lanes_bound.meets(RUNS[4].cells[1], busy, (0.6, False))
    assert not lanes_bound.meets(RUNS[4].cells[1], busy, (None, True))  # 50% at the target


def test_the_envelope_takes_the_most_aggregate_that_meets_each_phase() -> None:
    asked = lanes_bound.phases(RUNS)
    bound, picks = lanes_bound.envelope(RUNS, asked)
    assert [p.name if p else None for p in picks] == ["lanes wide r8", "lanes fast r8"]
    assert bound == pytest.approx((170 * 100 + 700 * 300) / 400)
    relaxed, picks = lanes_bound.envelope(RUNS, asked, (0.5, False))
    assert [p.name if p else None for p in picks] == ["lanes slow r8", "lanes slow r8"]
    assert relaxed == pytest.approx((180 * 100 + 990 * 300) / 400)


def test_no_envelope_where_no_lanes_pool_meets_a_phase() -> None:
    runs = [*RUNS[:2], RUNS[4]]
    bound, picks = lanes_bound.envelope(runs, lanes_bound.phases(runs))
    assert math.isnan(bound)
    assert picks[1] is None
    assert any("none meets busy" in line for line in lanes_bound.report(runs, 0.2))


def test_a_phase_without_interactive_requests_asks_nothing() -> None:
    quiet = Cell("quiet", 100.0, 50.0, math.nan, math.nan)
    runs = [Summary("3 x k7", False, [quiet], 0.0), Summary("lanes r8", True, [quiet], 0.0)]
    asked = lanes_bound.phases(runs)
    assert lanes_bound.meets(quiet, asked[0])
    assert lanes_bound.envelope(runs, asked)[0] == 50.0


def test_every_mix_of_three_depths_is_tried_at_each_reserve() -> None:
    jobs = lanes_bound.jobs([0, 8])
    mixes = [j for j in jobs if j[2]]
    assert len(mixes) == 2 * math.comb(8 + 3 - 1, 3)  # 120 mixes of k0..k7
    assert {j[0] for j in jobs if not j[2]} >= {f"3 x k{k}" for k in range(8)}


def test_a_kept_run_with_a_phase_without_interactive_requests_reads_back() -> None:
    quiet = Cell("quiet", 100.0, 50.0, math.nan, math.nan)
    kept = lanes_bound.decode(msgspec.json.encode(Summary("lanes r8", True, [quiet], 0.0)))
    assert math.isnan(kept.cells[0].median)
    assert math.isnan(kept.cells[0].met)
    assert kept.cells[0].aggregate == 50.0
