"""What the pool reads from each engine: vLLM's counters into a windowed accept length, its depth
from the per-position counters, its engine from /server_info or the metric names, and where the
decode chunks of each engine's chat stream begin."""

from __future__ import annotations

import pytest

from specroute.policies import Outcome
from specroute.pool.engines import (
    MIN_WINDOW_DRAFTS,
    STREAM_FRAMING,
    Engine,
    engine_of_metrics,
    engine_of_server_info,
    parse_vllm_metrics,
    vllm_settings,
)
from specroute.pool.telemetry import accept_sample

LABELS = 'engine="{e}",model_name="m"'


def scrape(drafts: float, accepted: float, *, depth: int = 3, engines: int = 1) -> str:
    """vLLM's exposition of the counters the pool reads, split over `engines` DP ranks."""
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
    ]
    lines += [f"vllm:num_requests_running{{{LABELS.format(e=e)}}} 5.0" for e in range(engines)]
    lines += ["# TYPE vllm:num_requests_waiting gauge"]
    lines += [f"vllm:num_requests_waiting{{{LABELS.format(e=e)}}} 1.0" for e in range(engines)]
    for name, value in (("drafts", drafts), ("accepted_tokens", accepted)):
        lines.append(f"# TYPE vllm:spec_decode_num_{name} counter")
        for e in range(engines):
            lines.append(
                f"vllm:spec_decode_num_{name}_total{{{LABELS.format(e=e)}}} {value / engines}"
            )
    lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
    for e in range(engines):
        for pos in range(depth):
            lines.append(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                f'{{{LABELS.format(e=e)},position="{pos}"}} 0.0'
            )
    return "\n".join(lines) + "\n"


def test_vllm_scrape_sums_ranks_and_reads_depth_from_positions() -> None:
    metrics = parse_vllm_metrics(scrape(300, 450, depth=4, engines=2))
    assert (metrics.running, metrics.queued) == (10.0, 2.0)
    assert metrics.steps == 4.0
    assert metrics.verify_calls == 300.0
    assert metrics.accept_length == pytest.approx(2.5)  # lifetime: no window yet


def test_vllm_accept_length_is_over_the_window_since_the_last_scrape() -> None:
    first = parse_vllm_metrics(scrape(1000, 500))  # 1.5 over its life so far
    second = parse_vllm_metrics(scrape(1300, 1400), first)  # 900 accepted over 300 drafts
    assert second.accept_length == pytest.approx(4.0)
    idle = parse_vllm_metrics(scrape(1300, 1400), second)  # nothing verified: keep the last
    assert idle.accept_length == pytest.approx(4.0)
    restarted = parse_vllm_metrics(scrape(300, 300), idle)  # counters began again
    assert restarted.accept_length == pytest.approx(2.0)


def test_vllm_accept_length_waits_for_enough_drafts_and_loses_none() -> None:
    """A scrape a few drafts after the last reads 1 or k + 1 by chance; the window goes on
    until it holds `MIN_WINDOW_DRAFTS`, counted from where the last figure ended."""
    first = parse_vllm_metrics(scrape(1000, 1500))  # 2.5
    few = parse_vllm_metrics(scrape(1002, 1508), first)  # 2 drafts, all 3 accepted + 1 = 4.0
    assert few.accept_length == pytest.approx(2.5)
    more = parse_vllm_metrics(scrape(1001 + MIN_WINDOW_DRAFTS, 1508 + MIN_WINDOW_DRAFTS), few)
    # The window began at the last figure's end (1000, 1500): the lucky two drafts count in it.
    assert more.accept_length == pytest.approx(
        1.0 + (8 + MIN_WINDOW_DRAFTS) / (1 + MIN_WINDOW_DRAFTS)
    )
    young = parse_vllm_metrics(scrape(20, 60))  # just started: too few drafts to say
    assert young.accept_length is None
    restarted = parse_vllm_metrics(scrape(5, 5), more)  # a restart forgets the old depth's
    assert restarted.accept_length is None


def test_vllm_without_speculation_is_depth_zero_and_junk_is_nothing() -> None:
    plain = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2.0\n"
    metrics = parse_vllm_metrics(plain)
    assert (metrics.steps, metrics.running, metrics.accept_length) == (0.0, 2.0, None)
    assert parse_vllm_metrics("vllm:num_requests_running{ not text") == type(metrics)()


def test_engine_is_recognised_from_server_info_or_metric_names() -> None:
    assert engine_of_server_info({"speculative_num_steps": 3}) == "sglang"
    assert engine_of_server_info({"vllm_config": "...", "vllm_env": {}}) == "vllm"
    assert engine_of_metrics("# HELP x\nvllm:num_requests_running 1\n") == "vllm"
    assert engine_of_metrics("sglang:num_running_reqs 1\n") == "sglang"
    assert engine_of_metrics("process_cpu_seconds_total 1\n") is None


def test_vllm_developer_mode_config_gives_depth_method_and_capacity() -> None:
    info = {
        "vllm_config": {
            "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
            "scheduler_config": {"max_num_seqs": 128},
        }
    }
    settings = vllm_settings(info)
    assert (settings.steps, settings.method, settings.capacity) == (2, "mtp", 128)
    plain = vllm_settings({"vllm_config": {"speculative_config": None}})
    assert (plain.steps, plain.capacity) == (0, None)
    dynamic = vllm_settings(
        {
            "vllm_config": {
                "speculative_config": {
                    "num_speculative_tokens": 3,
                    "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 256, 1]],
                }
            }
        }
    )
    assert (dynamic.steps, dynamic.dynamic, settings.dynamic) == (3, True, False)
    text = vllm_settings({"vllm_config": "VllmConfig(...)"})  # the default text dump
    assert (text.steps, text.capacity) == (None, None)


@pytest.mark.parametrize(("engine", "events"), [("sglang", 23), ("vllm", 22)])
def test_tokens_per_chunk_counts_only_decode_chunks_of_each_engine(
    engine: Engine, events: int
) -> None:
    """20 verifies of 3 tokens after the prefill's one: SGLang's stream has a role event, the
    first token and a finish event around them; vLLM's finish rides on the last content."""
    outcome = Outcome(
        backend="b", steps=3, workload_class="m:greedy", status=200, stream=True,
        completion_tokens=61, chunks=events,
    )  # fmt: skip
    assert accept_sample(outcome, None, STREAM_FRAMING[engine]) == (3.0, 20.0, "chunks")
