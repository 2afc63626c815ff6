"""Bench statistics and timing helpers: pure functions, checked against hand values and
invariants."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from specroute.bench.selfcheck import judge
from specroute.bench.stats import percentile, summarize
from specroute.bench.timing import (
    chunk_accept_length,
    estimate_tokens,
    inter_token_latencies,
    spread_total,
    tokens_from_cumulative,
)


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert math.isclose(percentile(values, 90), 3.7)


def test_percentile_between_whole_percents_interpolates_too() -> None:
    values = [50.0, 10.0, 40.0, 20.0, 30.0]
    # rank (n - 1) * q / 100 into the sorted sample: 0.5 -> 15, 3.996 -> 40 + 0.996 * 10
    assert math.isclose(percentile(values, 12.5), 15.0)
    assert math.isclose(percentile(values, 99.9), 49.96)
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan_and_summary_is_empty() -> None:
    assert math.isnan(percentile([], 50))
    assert summarize([]).count == 0


@given(st.lists(st.floats(-1e6, 1e6), min_size=1), st.floats(0, 100), st.floats(0, 100))
def test_percentile_stays_in_range_and_grows_with_q(
    values: list[float], a: float, b: float
) -> None:
    low, high = sorted((a, b))
    assert min(values) <= percentile(values, low) <= percentile(values, high) + 1e-6
    assert percentile(values, high) <= max(values) + 1e-6


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(0, 5000))
def test_spread_total_keeps_every_token(weights: list[int], total: int) -> None:
    parts = spread_total(weights, total)
    assert len(parts) == len(weights)
    assert all(p >= 0 for p in parts)
    if weights:
        assert sum(parts) == total


def test_spread_total_follows_text_weights() -> None:
    assert spread_total([1, 3, 4], 8) == [1, 3, 4]


def test_tokens_from_cumulative_usage_gives_per_chunk_counts() -> None:
    assert tokens_from_cumulative([1, 5, 9, 9, 12]) == [1, 4, 4, 0, 3]


def test_inter_token_latency_spreads_a_chunk_gap_over_its_tokens() -> None:
    # First chunk at 0.1 s (1 token), then 4 tokens 40 ms later, then 2 tokens 20 ms later.
    latencies = inter_token_latencies([0.1, 0.14, 0.16], [1, 4, 2])
    assert len(latencies) == 6
    assert all(math.isclose(x, 0.01) for x in latencies)


def test_chunk_accept_length_counts_the_prefill_token_as_no_verify() -> None:
    assert chunk_accept_length([1, 4, 4, 3]) == (12, 3)
    assert chunk_accept_length([5]) == (5, 0)


def test_estimate_counts_emulator_words_exactly() -> None:
    assert estimate_tokens(" alpha beta gamma delta") == 4


def test_self_check_flags_a_busy_client_but_not_a_short_one() -> None:
    assert judge(10.0, 9.5, [0.001] * 100, 1000).limited
    assert judge(10.0, 1.0, [0.05] * 100, 1000).limited  # event-loop lag
    assert not judge(0.1, 0.1, [], 10).limited
    assert not judge(10.0, 2.0, [0.001] * 100, 1000).limited
