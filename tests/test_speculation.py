"""The shared speculation maths and SGLang's greedy rule, as every part applies them."""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specroute import speculation
from specroute.bench.workload import Sampling
from specroute.emulator.profiles import PROFILES, sampling_class
from specroute.planner import Estimates
from specroute.policies import ClassEstimate, PoolView
from specroute.policies.predict import accept_length
from specroute.speculation import (
    alpha_from_accept_length,
    expected_tokens,
    expected_tokens_of_rates,
    is_greedy,
)


@given(alpha=st.floats(0.0, 0.999), steps=st.integers(0, 8))
def test_expected_tokens_is_the_sum_of_acceptance_powers(alpha: float, steps: int) -> None:
    assert expected_tokens(alpha, steps) == pytest.approx(sum(alpha**i for i in range(steps + 1)))


def test_expected_tokens_at_full_acceptance_is_every_draft_plus_the_bonus_token() -> None:
    assert expected_tokens(1.0, 3) == 4.0


@given(alpha=st.floats(0.0, 0.999), steps=st.integers(1, 8))
def test_alpha_from_accept_length_inverts_expected_tokens(alpha: float, steps: int) -> None:
    length = expected_tokens(alpha, steps)
    assert expected_tokens(alpha_from_accept_length(length, steps), steps) == pytest.approx(
        length, abs=1e-9
    )


def test_accept_length_outside_what_depth_can_show_is_clipped() -> None:
    assert alpha_from_accept_length(0.5, 3) == 0.0
    assert alpha_from_accept_length(4.0, 3) == 1.0
    assert alpha_from_accept_length(9.0, 3) == 1.0
    with pytest.raises(ValueError, match="without speculation"):
        alpha_from_accept_length(2.0, 0)


@pytest.mark.parametrize(
    ("temperature", "top_k", "greedy"),
    [
        (0.0, None, True),
        (5e-7, None, True),  # below SGLang's _SAMPLING_EPS (1e-6)
        (1e-6, None, False),
        (5e-6, None, False),
        (0.7, None, False),
        (None, None, False),  # SGLang's default temperature is 1.0
        (1.0, 1, True),  # top_k 1 is greedy at any temperature
        (None, 1, True),
        (0.7, 40, False),
    ],
)
def test_greedy_follows_sglang_rule(
    temperature: float | None, top_k: int | None, greedy: bool
) -> None:
    assert is_greedy(temperature, top_k) is greedy


@pytest.mark.parametrize("temperature", [0.0, 5e-7, 5e-6, 0.5])
def test_emulator_and_bench_agree_with_sglang_on_greedy(temperature: float) -> None:
    expected = temperature < 1e-6
    assert (sampling_class(temperature) == "greedy") is expected
    assert Sampling(temperature=temperature).greedy is expected


def test_per_position_e_k_equals_the_constant_rate_form_and_falls_with_a_weak_position() -> None:
    assert expected_tokens_of_rates([0.6] * 3) == pytest.approx(expected_tokens(0.6, 3))
    assert expected_tokens_of_rates([]) == 1.0
    # A rejected second draft caps the run: 1 + 0.9 + 0.9*0 + 0.
    assert expected_tokens_of_rates([0.9, 0.0, 0.9]) == pytest.approx(1.9)


def test_router_and_planner_value_every_depth_of_a_class_alike() -> None:
    """One performance model: what a policy predicts for a class at a depth is what the planner
    forecasts with, at depths measured (noisy) and not."""
    est = ClassEstimate(alpha=0.75, accept_length={1: 1.83, 2: 2.41, 3: 2.86})
    view = PoolView(backends=(), classes={"code": est})
    planner = Estimates(depths={}, classes={"code": est})
    for k in range(8):
        assert accept_length(view, "code", k) == planner.accept_length("code", k)
    unseen = PoolView(backends=())
    assert accept_length(unseen, "other", 3) == Estimates(depths={}).accept_length("other", 3)


@given(
    seen=st.dictionaries(st.integers(-1, 6), st.floats(1.0, 7.0), max_size=4),
    alpha=st.floats(0.0, 0.999),
)
def test_remembered_accept_length_is_the_fitted_curve_at_every_depth(
    seen: dict[int, float], alpha: float
) -> None:
    for steps in range(0, 8):  # the same inputs asked again at each depth, as routing does
        expected = speculation.fit_curve(seen, alpha).at(steps) if steps > 0 else 1.0
        assert speculation.accept_length(seen, alpha, steps) == expected
        assert speculation.accept_length(dict(seen), alpha, steps) == expected


def test_iteration_time_between_tunes_points_follows_a_saturating_bend() -> None:
    """A sparse model's expert reads saturate as the batch grows: the h200 shape at depth 2,
    measured where tune measures (1, 4 and 16 users, and the slots' limit), read at every batch
    between. The chord from 4 to 16 users read 7 users' iteration 8% fast, and every forecast
    of a pool near that load 8% high."""
    engine = PROFILES["h200-qwen35-122b-shape"]
    steps, limit = 2, engine.capacity(2)
    points = [((b * (steps + 1)), engine.iteration_time(b, steps)) for b in (1, 4, 16, limit)]
    for batch in range(1, limit + 1):
        read = speculation.measured_time(points, batch * (steps + 1), 0.0)
        assert read == pytest.approx(engine.iteration_time(batch, steps), rel=0.03), batch


@given(
    steps=st.lists(
        st.tuples(st.floats(0.5, 50.0), st.just(0.0) | st.floats(0.0, 0.05)), min_size=2, max_size=8
    ),
    first=st.floats(0.005, 0.05),
)
def test_iteration_time_passes_every_point_never_falls_and_never_overshoots(
    steps: list[tuple[float, float]], first: float
) -> None:
    """Between measured points T is read without a dip or a bump (a bigger batch is never
    faster, and no batch slower than the point past it), and past either end along the
    nearest segment."""
    points, x, y = [], 1.0, first
    for dx, dy in steps:
        points.append((x, y))
        x, y = x + dx, y + dy
    read = functools.partial(speculation.measured_time, points, per_token_s=0.001)
    for px, py in points:
        assert read(tokens=px) == pytest.approx(py)
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        grid = [x0 + (x1 - x0) * i / 20 for i in range(21)]
        values = [read(tokens=g) for g in grid]
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(values))
        assert all(y0 - 1e-12 <= v <= y1 + 1e-12 for v in values)
    (xa, ya), (xb, yb) = points[-2], points[-1]
    slope = (yb - ya) / (xb - xa)
    assert read(tokens=xb + 10) == pytest.approx(yb + 10 * slope)
