"""The emulated GPU's statistics: acceptance, batching, capacity, lengths, aborts, adaptivity."""

from __future__ import annotations

import statistics

import msgspec
import pytest

from specroute.emulator import Engine, get_profile
from specroute.emulator.adaptive import AdaptiveSteps
from specroute.emulator.seed import (
    SEED_AGGREGATE_TOK_S,
    SEED_MAX_RUNNING_REQUESTS,
    SEED_PER_REQUEST_TOK_S,
)
from specroute.emulator.simulate import run_closed_loop

SEED = get_profile("seed-qwen35-122b")
COSTLY = get_profile("costly-drafts")


@pytest.mark.parametrize("klass", ["greedy", "low", "high"])
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_tokens_per_verify_match_expected_tokens_of_class(klass: str, steps: int) -> None:
    profile = msgspec.structs.replace(COSTLY, spread=1e9)  # every request at the class mean
    result = run_closed_loop(
        profile,
        steps=steps,
        concurrency=8,
        requests=200,
        output_tokens=200,
        prompt_tokens=16,
        klass=klass,
        seed=steps,
    )
    verifies = sum(s.verify_ct for s in result.sequences)
    drafts = sum(s.correct_drafts for s in result.sequences)
    measured = 1 + drafts / verifies
    assert measured == pytest.approx(profile.expected_tokens(klass, steps), rel=0.02)


def test_per_request_spread_keeps_class_mean_and_varies_requests() -> None:
    engine = Engine(COSTLY, steps=3, seed=5)
    firsts = [
        engine.submit(
            f"r{i}", prompt_tokens=1, max_new_tokens=4, klass="low", ignore_eos=True
        ).rates[0]
        for i in range(2000)
    ]
    assert statistics.fmean(firsts) == pytest.approx(COSTLY.acceptance["low"][0], rel=0.01)
    assert statistics.pstdev(firsts) > 0.03


def test_histogram_counts_every_verify() -> None:
    result = run_closed_loop(
        SEED, steps=3, concurrency=4, requests=8, output_tokens=64, prompt_tokens=8, klass="high"
    )
    for seq in result.sequences:
        assert sum(seq.histogram) == seq.verify_ct
        assert sum(i * n for i, n in enumerate(seq.histogram)) == seq.correct_drafts
        assert seq.proposed_drafts == 3 * seq.verify_ct


def test_queueing_starts_exactly_at_capacity() -> None:
    engine = Engine(SEED, steps=3, seed=1)
    capacity = engine.max_running_requests
    for i in range(capacity + 1):
        engine.submit(f"r{i}", prompt_tokens=8, max_new_tokens=50, klass="greedy", ignore_eos=True)
    iteration = engine.step()
    assert iteration is not None
    assert iteration.prefilled == capacity
    assert len(engine.running) == capacity
    assert [s.rid for s in engine.waiting] == [f"r{capacity}"]


@pytest.mark.parametrize(("steps", "capacity"), [*SEED_MAX_RUNNING_REQUESTS.items(), (4, 15)])
def test_seed_capacity_shrinks_with_depth_as_measured(steps: int, capacity: int) -> None:
    assert SEED.capacity(steps) == capacity
    assert Engine(SEED, steps=steps).max_running_requests == capacity


def test_ignore_eos_runs_every_request_to_max_tokens() -> None:
    result = run_closed_loop(
        SEED, steps=2, concurrency=4, requests=12, output_tokens=37, prompt_tokens=8
    )
    assert {s.generated for s in result.sequences} == {37}
    assert {s.finish_reason for s in result.sequences} == {"length"}


def test_without_ignore_eos_lengths_vary_and_stop_naturally() -> None:
    result = run_closed_loop(
        SEED,
        steps=2,
        concurrency=8,
        requests=200,
        output_tokens=4000,
        prompt_tokens=8,
        ignore_eos=False,
    )
    lengths = [s.generated for s in result.sequences]
    assert statistics.fmean(lengths) == pytest.approx(SEED.mean_output_tokens, rel=0.15)
    assert {s.finish_reason for s in result.sequences} == {"stop"}


def test_first_token_comes_from_prefill_and_costs_its_time() -> None:
    engine = Engine(SEED, steps=3)
    engine.submit("a", prompt_tokens=1000, max_new_tokens=10, klass="greedy", ignore_eos=True)
    first = engine.step()
    assert first is not None
    assert [e.tokens for e in first.emissions] == [1]
    assert first.duration == pytest.approx(SEED.prefill_time(1000))
    second = engine.step()
    assert second is not None
    assert second.duration == pytest.approx(SEED.iteration_time(1, 3))


def test_no_speculation_emits_one_token_per_iteration() -> None:
    engine = Engine(SEED, steps=0)
    engine.submit("a", prompt_tokens=4, max_new_tokens=5, klass="greedy", ignore_eos=True)
    counts = []
    while (iteration := engine.step()) is not None:
        counts += [e.tokens for e in iteration.emissions]
    assert counts == [1, 1, 1, 1, 1]
    assert engine.idle


def test_abort_leaves_the_batch_before_the_next_iteration() -> None:
    engine = Engine(SEED, steps=1)
    for rid in ("a", "b"):
        engine.submit(rid, prompt_tokens=4, max_new_tokens=100, klass="greedy", ignore_eos=True)
    engine.step()
    aborted = engine.abort("a")
    assert aborted is not None
    assert aborted.finish_reason == "abort"
    iteration = engine.step()
    assert iteration is not None
    assert [e.seq.rid for e in iteration.emissions] == ["b"]
    assert engine.abort("a") is None


def test_seed_profile_reproduces_seed_table_in_virtual_time() -> None:
    for (steps, concurrency), per_request in SEED_PER_REQUEST_TOK_S.items():
        result = run_closed_loop(
            SEED,
            steps=steps,
            concurrency=concurrency,
            requests=max(3, 2 * concurrency),
            output_tokens=256,
            prompt_tokens=256,
        )
        assert result.per_request_tok_s == pytest.approx(per_request, rel=0.07)
        if (steps, concurrency) in SEED_AGGREGATE_TOK_S:
            expected = SEED_AGGREGATE_TOK_S[steps, concurrency]
            assert result.aggregate_tok_s == pytest.approx(expected, rel=0.07)


def test_costly_profile_best_depth_falls_with_load_for_sampled_traffic() -> None:
    def best_depth(concurrency: int) -> int:
        return max(
            range(4),
            key=lambda k: (
                run_closed_loop(
                    COSTLY,
                    steps=k,
                    concurrency=concurrency,
                    requests=2 * concurrency,
                    output_tokens=256,
                    prompt_tokens=256,
                    klass="high",
                    seed=3,
                ).aggregate_tok_s
            ),
        )

    assert best_depth(1) >= 2
    assert best_depth(64) == 0


def test_adaptive_depth_follows_batch_size_tiers() -> None:
    adaptive = AdaptiveSteps(3)
    for _ in range(20):
        adaptive.observe(batch_size=2, accepted_per_verify=3.0)
    assert adaptive.steps_for(2) in (5, 7)  # all drafts accepted: probe deeper in the 1-7 tier
    for _ in range(20):
        adaptive.observe(batch_size=40, accepted_per_verify=0.5)
    assert adaptive.steps_for(40) in (0, 1)
    for _ in range(10):
        adaptive.observe(batch_size=64, accepted_per_verify=0.5)
    assert adaptive.steps_for(64) == 0


def test_adaptive_drops_a_depth_when_acceptance_falls() -> None:
    adaptive = AdaptiveSteps(5)
    for _ in range(15):
        adaptive.observe(batch_size=1, accepted_per_verify=1.0)
    assert adaptive.steps_for(1) in (1, 3)  # one draft accepted of five: shallower


def test_adaptive_rejects_depth_outside_tiers() -> None:
    with pytest.raises(ValueError, match="not in the adaptive config candidate_steps"):
        AdaptiveSteps(2)
