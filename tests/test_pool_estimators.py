"""Estimators recover known acceptance and iteration-time parameters from synthetic outcomes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specroute.config import AdmissionConfig, BackendConfig, BreakerConfig, HealthConfig
from specroute.emulator.profiles import PROFILES
from specroute.policies import Outcome, PoolView
from specroute.policies.predict import accept_length, iteration_time
from specroute.pool import Backend
from specroute.pool.estimators import AcceptanceEstimator, ClassLengths, IterationTimeModel
from specroute.pool.prior import load_prior, load_profile_priors, priors_from_profile
from specroute.pool.telemetry import Telemetry, iteration_sample
from specroute.speculation import expected_tokens


def _seconds(model: IterationTimeModel, steps: int, batch: float) -> float:
    """The iteration time a policy predicts from `model` (the pool's own view of a backend)."""
    backend = Backend(
        BackendConfig(url="http://127.0.0.1:1"),
        health=HealthConfig(),
        admission=AdmissionConfig(),
        breaker=BreakerConfig(),
    )
    backend.configured_steps = steps
    return iteration_time(backend.view(model), batch)


def _pool_view(telemetry: Telemetry) -> PoolView:
    return PoolView(
        backends=(), classes=telemetry.classes(), prior_alpha=telemetry.acceptance.prior_alpha
    )


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
    telemetry = Telemetry(prior_alpha=0.5)
    estimator = telemetry.acceptance
    for _ in range(300):
        tokens, verifies = simulated_request(rng, 0.8, steps, 200)
        estimator.observe(
            "sampled", steps=steps, accept_length=tokens / verifies, verifies=verifies
        )
    assert estimator.get("sampled").alpha.value == pytest.approx(0.8, abs=0.02)
    view = _pool_view(telemetry)
    assert accept_length(view, "sampled", steps) == pytest.approx(
        expected_tokens(0.8, steps), rel=0.02
    )
    # A depth never seen is predicted from alpha; a class never seen from the prior.
    assert accept_length(view, "sampled", 4) == pytest.approx(expected_tokens(0.8, 4), rel=0.04)
    assert accept_length(view, "unseen", steps) == pytest.approx(expected_tokens(0.5, steps))


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
    assert _seconds(model, 3, 13) == pytest.approx(0.0155 + 0.00027 * 52, rel=0.02)


def test_a_server_held_at_one_batch_size_for_hours_keeps_its_iteration_time() -> None:
    # A saturated server runs at its capacity (21 at depth 2): every gap at one batch size.
    # Once the prior's pseudo-observations decayed, the sums left the slope to rounding and
    # the fit at that very batch read up to 8x the gaps (a 12-hour simulated night-burst).
    rng = random.Random(1)
    model = IterationTimeModel(intercept=0.0167, slope=0.00026)
    worst = 0.0
    for i in range(30_000):
        model.observe(63, 0.0333 * (1 + rng.gauss(0, 0.01)))
        if i >= 1000:
            worst = max(worst, abs(model.intercept + model.slope * 63 - 0.0333) / 0.0333)
    assert worst < 0.01
    assert _seconds(model, 2, 21) == pytest.approx(0.0333, rel=0.01)
    assert 0.0001 < model.slope < 0.0005  # the prior's, not noise
    assert model.tokens == pytest.approx(63)  # where the fit holds: the planner scales there


def test_iteration_time_model_tells_where_it_observed_lately() -> None:
    model = IterationTimeModel(intercept=0.02, slope=0.0004)
    assert model.tokens is None  # the prior's pseudo-observations are nowhere in particular
    for _ in range(3000):
        model.observe(8, 0.025)
    for _ in range(3000):
        model.observe(120, 0.07)
    assert model.tokens is not None
    assert 100 < model.tokens < 120  # the busy hour's weighs more: older ones are forgotten


H200_PRIOR = (
    Path(__file__).parent.parent / "benchmarks/results/depth-bound/tune/h200-qwen35-122b-shape.json"
)


def test_a_new_server_reads_its_first_requests_on_tunes_points_not_its_line() -> None:
    """A server just (re)started at depth 4 of the h200 shape runs one request at a time (5
    tokens an iteration, 30.0 ms): tune's line through every point reads 36.3 ms there, its
    point 29.9. Standing on the line, four requests in the fit still read 34.6 ms, and the
    planner, scaling tune's points through it, valued the depth 16% slow for minutes."""
    prior = load_prior(H200_PRIOR)
    telemetry = prior.telemetry()
    engine = PROFILES["h200-qwen35-122b-shape"]
    truth = engine.iteration_time(1, 4)
    line = prior.iteration[4][0] + prior.iteration[4][1] * 5
    assert line > 1.15 * truth  # what the prior's line alone reads
    model = telemetry.iteration_model("b2", 4)
    for _ in range(4):
        model.observe(5, truth)
    assert model.intercept + model.slope * 5 == pytest.approx(truth, rel=0.02)
    assert model.tokens == pytest.approx(5)
    # Two at a time, 10 tokens: the slope of tune's points where it ran carries it there.
    assert model.intercept + model.slope * 10 == pytest.approx(
        engine.iteration_time(2, 4), rel=0.03
    )
    # Without tune's points the line is all there is: the old reading, as before.
    bare = IterationTimeModel(*prior.iteration[4])
    for _ in range(4):
        bare.observe(5, truth)
    assert bare.intercept + bare.slope * 5 > 1.1 * truth


def test_iteration_time_model_keeps_its_prior_until_observations_arrive() -> None:
    model = IterationTimeModel(intercept=0.02, slope=0.0004)
    assert _seconds(model, 0, 100) == pytest.approx(0.06)
    model.observe(0, 1.0)  # meaningless observations are ignored
    model.observe(10, -1.0)
    assert model.observations == 0


def _outcome(**fields: object) -> Outcome:
    base: dict[str, object] = {
        "backend": "b",
        "steps": 3,
        "workload_class": "m:greedy",
        "status": 200,
        "stream": True,
    }
    return Outcome(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_telemetry_recovers_each_class_from_spec_details_at_any_depth(steps: int) -> None:
    rng = random.Random(steps)
    telemetry = Telemetry(prior_alpha=0.5)
    for _ in range(200):
        for klass, alpha in (("m:greedy", 0.95), ("m:sampled", 0.6)):
            tokens, verifies = simulated_request(rng, alpha, steps, 300)
            outcome = _outcome(
                steps=steps, workload_class=klass, completion_tokens=tokens + 1,
                verify_count=verifies,
            )  # fmt: skip
            telemetry.observe(outcome, capacity=20)
    classes = telemetry.classes()
    assert classes["m:greedy"].alpha == pytest.approx(0.95, abs=0.01)
    assert classes["m:sampled"].alpha == pytest.approx(0.6, abs=0.02)
    assert classes["m:sampled"].accept_length[steps] == pytest.approx(
        expected_tokens(0.6, steps), rel=0.02
    )
    assert classes["m:greedy"].samples == 200
    assert telemetry.sources == {"spec_details": 400}


def test_telemetry_falls_back_to_tokens_per_chunk_then_to_the_scraped_accept_length() -> None:
    telemetry = Telemetry()
    # role chunk, first token, 50 decode chunks of 3 tokens, finish chunk
    telemetry.observe(_outcome(completion_tokens=151, chunks=53), capacity=20)
    assert telemetry.classes()["m:greedy"].accept_length[3] == pytest.approx(3.0)
    telemetry.observe(
        _outcome(workload_class="m:other", stream=False, completion_tokens=10), capacity=20,
        scraped=2.5,
    )  # fmt: skip
    assert telemetry.classes()["m:other"].accept_length[3] == pytest.approx(2.5)
    assert telemetry.sources == {"chunks": 1, "scraped": 1}


def test_telemetry_learns_nothing_about_acceptance_from_failures_or_no_speculation() -> None:
    telemetry = Telemetry()
    telemetry.observe(_outcome(status=500, completion_tokens=10, verify_count=3), capacity=4)
    telemetry.observe(_outcome(steps=0, completion_tokens=10, verify_count=3), capacity=4)
    telemetry.observe(_outcome(error="broken", completion_tokens=10, verify_count=3), capacity=4)
    # The reply at depth 0 is traffic of its class all the same: one completion, no acceptance.
    (klass,) = telemetry.classes().values()
    assert (klass.samples, klass.accept_length, klass.completions) == (0, {}, 1)


def test_telemetry_fits_iteration_time_from_chunk_gaps_at_the_mean_batch() -> None:
    rng = random.Random(2)
    telemetry = Telemetry(priors={1: (0.03, 0.0005)})  # a deliberately wrong prior
    for _ in range(3000):
        batch = rng.uniform(1, 30)
        seconds = 0.016 + 0.00025 * batch * 2
        gaps = tuple(seconds * rng.uniform(0.9, 1.1) for _ in range(40))
        outcome = _outcome(steps=1, chunk_gaps_s=gaps, mean_in_flight=batch)
        telemetry.observe(outcome, capacity=26)
    model = telemetry.iteration_model("b", 1)
    assert model.intercept == pytest.approx(0.016, rel=0.05)
    assert model.slope == pytest.approx(0.00025, rel=0.05)


def test_iteration_samples_clip_the_batch_to_capacity_and_skip_coalesced_events() -> None:
    gaps = (0.02, 0.02, 0.0, 0.02, 0.02)  # the 0.0: a finish event read with the last tokens
    sample = iteration_sample(_outcome(chunk_gaps_s=gaps, mean_in_flight=40.0), capacity=17)
    assert sample == (17.0, pytest.approx(0.02), 4, pytest.approx(0.02))


def test_class_lengths_start_at_the_prior_and_follow_what_finishes() -> None:
    lengths = ClassLengths(prior_tokens=300)
    assert lengths.get("c") == 300
    for _ in range(500):
        lengths.observe("c", 120)
    assert lengths.get("c") == pytest.approx(120)


def test_a_bench_profile_seeds_iteration_time_per_depth(tmp_path: Path) -> None:
    def point(c: int, seconds: float) -> dict[str, object]:
        return {"concurrency": c, "iteration_time_s": seconds, "per_request_tok_s": 1.0}

    targets = [
        {"label": f"steps{k}", "steps": k, "max_running_requests": 17,
         "points": [point(c, 0.015 + 0.0002 * min(c, 17) * (k + 1)) for c in (1, 8, 32)]}
        for k in (1, 3)
    ]  # fmt: skip
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"schema": "specroute.profile/2", "targets": targets}))
    priors = load_profile_priors(path)
    assert set(priors) == {1, 3}
    assert priors[3] == (pytest.approx(0.015), pytest.approx(0.0002))
    telemetry = Telemetry()
    telemetry.seed(priors.items())
    model = telemetry.iteration_model("b", 3)
    assert _seconds(model, 3, 10) == pytest.approx(0.015 + 0.0002 * 40)
    with pytest.raises(ValueError, match="schema"):
        priors_from_profile(b'{"schema": "something-else"}')


def test_a_class_learns_its_first_token_wait_beyond_one_iteration_where_a_slot_was_free() -> None:
    telemetry = Telemetry()
    gaps = (0.05,) * 20
    reply = {"chunk_gaps_s": gaps, "completion_tokens": 100}
    for _ in range(200):  # long prompts: 0.45 s of prefill before the first token
        telemetry.observe(
            _outcome(workload_class="m:agent", mean_in_flight=4.0, ttft_s=0.5, **reply),
            capacity=17,
        )
        # a full server: the wait is its queue's, which the forecast counts as queued users
        telemetry.observe(
            _outcome(workload_class="m:agent", mean_in_flight=17.0, ttft_s=9.0, **reply),
            capacity=17,
        )
        telemetry.observe(_outcome(workload_class="m:chat", ttft_s=0.06, **reply), capacity=17)
    classes = telemetry.classes()
    assert classes["m:agent"].first_token_s == pytest.approx(0.45)
    assert classes["m:chat"].first_token_s == pytest.approx(0.01)
    telemetry.observe(_outcome(workload_class="m:new", **reply), capacity=17)  # no first chunk
    assert telemetry.classes()["m:new"].first_token_s is None


def test_other_requests_prefills_are_learned_as_pauses_apart_from_the_decode() -> None:
    """A stream whose server starts others' long prompts beside it: a few gaps hold a prefill
    of 0.1 s on a 0.03 s decode. The router's fit keeps the mean gap; the decode, the pause
    per request beside it and the fit's share of pauses are learned apart."""
    telemetry = Telemetry()
    # 100 gaps, 7 of them with another request's prefill in: the 7 others beside it each
    # started one request in its time.
    gaps = (0.03,) * 93 + (0.13,) * 7
    reply = {"chunk_gaps_s": gaps, "completion_tokens": 301, "steps": 2}
    for _ in range(300):
        telemetry.observe(
            _outcome(workload_class="m:agent", mean_in_flight=8.0, ttft_s=0.2, **reply),
            capacity=17,
        )
    agent = telemetry.classes()["m:agent"]
    assert agent.prefill_pause_s == pytest.approx(0.1)
    assert agent.first_token_s == pytest.approx(0.17)  # beyond one decode iteration
    model = telemetry.iteration_model("b", 2)
    assert model.tokens == pytest.approx(24.0)
    mean = 0.03 + 0.7 / 100
    assert model.intercept + model.slope * 24.0 == pytest.approx(mean, rel=0.02)  # the router's
    assert model.stall_s == pytest.approx(0.007)
    # alone on its server, nothing pauses it, and nothing is learned of the pause
    alone = Telemetry()
    alone.observe(_outcome(workload_class="m:solo", mean_in_flight=1.0, **reply), capacity=17)
    assert alone.classes()["m:solo"].prefill_pause_s is None
