"""`bench sweep` against emulated SGLang backends on loopback: what a user reads off the table
(throughput, token counts, accept length, ITL) matches what the emulator did."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import Server, start_emulator

from specroute.bench import (
    ApiSettings,
    PromptSettings,
    Sampling,
    SweepResult,
    SweepSettings,
    load_result,
    parse_target,
    reference_from_mapping,
    render_csv,
    render_markdown,
    render_table,
    run_sweep,
    save_result,
)
from specroute.bench.profile import encode_profile, load_profile, profile_from_result
from specroute.emulator import get_profile

SCALE = 8.0


@pytest.fixture(scope="module")
def steps3() -> Iterator[Server]:
    with start_emulator(3, "--seed", "11", "--time-scale", str(SCALE)) as server:
        yield server


@pytest.fixture(scope="module")
def steps1() -> Iterator[Server]:
    with start_emulator(1, "--seed", "12", "--time-scale", str(SCALE)) as server:
        yield server


@pytest.fixture(scope="module")
def sweep(steps1: Server, steps3: Server) -> SweepResult:
    settings = SweepSettings(
        targets=[parse_target(f"steps1={steps1.url}"), parse_target(f"steps3={steps3.url}")],
        concurrency=[1, 4],
        mix=[Sampling(max_tokens=48)],
        prompts=PromptSettings(words=32),
    )
    return asyncio.run(run_sweep(settings))


def test_sweep_runs_two_c_requests_per_level_all_complete(sweep: SweepResult) -> None:
    for level in sweep.levels:
        assert level.summary.requests == max(3, 2 * level.concurrency)
        assert level.summary.errors == 0
        assert all(r.completion_tokens == 48 for r in level.records)
        assert all(r.token_source == "continuous" for r in level.records)


def test_deeper_speculation_is_marked_best_at_concurrency_one(sweep: SweepResult) -> None:
    one = {lv.target: lv.summary.per_request_tok_s for lv in sweep.levels if lv.concurrency == 1}
    assert one["steps3"] > one["steps1"]
    table = render_table(sweep)
    line = next(row for row in table.splitlines() if row.startswith("1 "))
    assert line.rstrip().endswith("*")


def test_accept_length_matches_emulator_count_three_ways(sweep: SweepResult) -> None:
    for level in sweep.levels:
        accept = level.summary.accept
        assert accept.sglext is not None
        assert accept.metrics is not None
        assert accept.chunks is not None
        for value in (accept.metrics, accept.chunks):
            assert abs(value - accept.sglext) / accept.sglext < 0.03
        assert not [w for w in level.summary.warnings if "disagrees" in w]


def test_greedy_ignore_eos_sweep_warns_acceptance_is_unrealistic(sweep: SweepResult) -> None:
    assert any("greedy" in w for w in sweep.warnings)
    assert any("ignore_eos" in w for w in sweep.warnings)


def test_reference_figures_print_beside_measured_with_difference(sweep: SweepResult) -> None:
    reference = reference_from_mapping(
        {"per_request_tok_s": {"steps_3": {"1": 234}}, "aggregate_tok_s": {"steps_1": {"4": 500}}}
    )
    table = render_table(sweep, reference)
    assert "(ref 234, " in table
    assert "(ref 500, " in table


def test_results_round_trip_through_json_csv_markdown(sweep: SweepResult, tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    save_result(sweep, path)
    again = load_result(path)
    assert again.settings == sweep.settings
    assert len(again.levels[0].records) == len(sweep.levels[0].records)
    csv_text = render_csv(again)
    assert csv_text.count("\n") == 1 + len(sweep.levels)
    assert "per_request_tok_s" in csv_text.splitlines()[0]
    assert "| C |" in render_markdown(again)


def test_profile_carries_steps_capacity_and_iteration_time(
    sweep: SweepResult, tmp_path: Path
) -> None:
    profile = profile_from_result(sweep)
    by_label = {t.label: t for t in profile.targets}
    assert by_label["steps3"].steps == 3
    assert by_label["steps1"].max_running_requests == 26
    point = by_label["steps3"].points[0]
    assert point.concurrency == 1
    assert point.accept_length is not None
    assert point.accept_length > 3.5
    expected = get_profile("seed-qwen35-122b").iteration_time(1, 3) / SCALE
    assert point.iteration_time_s is not None
    assert abs(point.iteration_time_s - expected) / expected < 0.25
    path = tmp_path / "profile.json"
    path.write_bytes(encode_profile(profile))
    assert load_profile(path) == profile


def test_the_prior_holds_each_level_at_its_concurrency_not_its_drain(sweep: SweepResult) -> None:
    """A prior is the engine at a load: its rate and iteration time are the level's while it
    held its concurrency (`held_*`), not over the drain after its last send."""
    profile = profile_from_result(sweep)
    for level in sweep.levels:
        s = level.summary
        point = next(
            p for t in profile.targets if t.label == level.target for p in t.points
            if p.concurrency == level.concurrency
        )  # fmt: skip
        assert 0 < s.held_s <= s.wall_s
        assert point.aggregate_tok_s == s.held_tok_s
        tokens_per_chunk = s.accept.chunks or s.accept.best()
        assert tokens_per_chunk is not None
        assert point.iteration_time_s == pytest.approx(s.held_itl.mean * tokens_per_chunk)
    at_four = [lv.summary for lv in sweep.levels if lv.concurrency == 4]
    assert all(s.held_s < s.wall_s for s in at_four)  # four at once drain before the end


def test_stream_without_continuous_usage_still_counts_tokens_exactly(steps3: Server) -> None:
    settings = SweepSettings(
        targets=[parse_target(steps3.url)],
        concurrency=[2],
        mix=[Sampling(max_tokens=40)],
        api=ApiSettings(continuous_usage=False, spec_details=False),
        warmup=0,
    )
    result = asyncio.run(run_sweep(settings))
    level = result.levels[0]
    assert {r.token_source for r in level.records} == {"final"}
    assert all(r.completion_tokens == 40 for r in level.records)
    assert level.summary.accept.sglext is None
    assert level.summary.accept.chunks is not None
    assert level.summary.accept.chunks > 3.5
