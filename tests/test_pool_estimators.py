"""Estimators recover known acceptance and iteration-time parameters from synthetic outcomes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specroute.pool.estimators import (
    AcceptanceEstimator,
    IterationTimeModel,
    alpha_from_accept_length,
    expected_tokens,
)


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


def simulated_request(rng: random.Random, alpha: float, steps: int, tokens: int) -> tuple[int, int]:
    """(completion tokens, verifies) of one request drafting at constant acceptance."""
    made = verifies = 0
    while made < tokens:
        accepted = 0
        while accepted < steps and rng.random() < alpha:
            accepted += 1
        made += accepted + 1
        verifies += 1
    return made, verifies


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_acceptance_estimator_recovers_class_alpha_from_any_depth(steps: int) -> None:
    rng = random.Random(steps)
    estimator = AcceptanceEstimator(prior_alpha=0.5)
    for _ in range(300):
        tokens, verifies = simulated_request(rng, 0.8, steps, 200)
        estimator.observe(
            "sampled", steps=steps, accept_length=tokens / verifies, verifies=verifies
        )
    estimate = estimator.get("sampled")
    assert estimate.alpha.value == pytest.approx(0.8, abs=0.02)
    assert estimate.accept_length(steps) == pytest.approx(expected_tokens(0.8, steps), rel=0.02)
    # A depth never seen is predicted from alpha.
    assert estimate.accept_length(4) == pytest.approx(expected_tokens(0.8, 4), rel=0.04)


def test_classes_are_learned_separately_and_new_classes_start_at_the_prior() -> None:
    estimator = AcceptanceEstimator(prior_alpha=0.6)
    estimator.observe("greedy", steps=3, accept_length=3.95, verifies=500)
    estimator.observe("creative", steps=3, accept_length=1.8, verifies=500)
    assert estimator.get("greedy").alpha.value > 0.95
    assert estimator.get("creative").alpha.value < 0.5
    assert estimator.get("unseen").alpha.value == 0.6
    assert estimator.get("unseen").samples == 0


def test_acceptance_estimate_follows_a_drifting_workload() -> None:
    estimator = AcceptanceEstimator(half_life=1000)
    for _ in range(100):
        estimator.observe("c", steps=2, accept_length=expected_tokens(0.9, 2), verifies=100)
    for _ in range(100):
        estimator.observe("c", steps=2, accept_length=expected_tokens(0.4, 2), verifies=100)
    assert estimator.get("c").alpha.value == pytest.approx(0.4, abs=0.01)


def test_iteration_time_model_recovers_intercept_and_slope_from_noisy_gaps() -> None:
    rng = random.Random(1)
    model = IterationTimeModel(intercept=0.05, slope=0.001)  # a deliberately wrong prior
    for _ in range(5000):
        tokens = rng.randint(2, 120)
        model.observe(tokens, 0.0155 + 0.00027 * tokens + rng.gauss(0, 0.001))
    assert model.intercept == pytest.approx(0.0155, rel=0.05)
    assert model.slope == pytest.approx(0.00027, rel=0.05)
    assert model.predict(52) == pytest.approx(0.0155 + 0.00027 * 52, rel=0.02)


def test_iteration_time_model_keeps_its_prior_until_observations_arrive() -> None:
    model = IterationTimeModel(intercept=0.02, slope=0.0004)
    assert model.predict(100) == pytest.approx(0.06)
    model.observe(0, 1.0)  # meaningless observations are ignored
    model.observe(10, -1.0)
    assert model.observations == 0
