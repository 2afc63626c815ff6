"""`bench sweep` against an emulated vLLM server with `--per-request-spec-decode-metrics`: the
bench reads vLLM's acceptance three ways (the usage chunk's per-request figures, the counters,
tokens per chunk), and they agree."""

from __future__ import annotations

import asyncio

from servers import start_emulator

from specroute.bench import PromptSettings, Sampling, SweepSettings, parse_target, run_sweep


def test_bench_reads_vllm_acceptance_from_request_metrics_counters_and_chunks() -> None:
    args = ("--engine", "vllm", "--seed", "13", "--time-scale", "10")
    flag = ("--per-request-spec-decode-metrics", "summary")
    with start_emulator(3, *args, *flag, ready_path="/health") as server:
        settings = SweepSettings(
            targets=[parse_target(f"k3={server.url}")],
            concurrency=[4],
            requests=24,
            mix=[Sampling(max_tokens=97, temperature=1.0)],
            prompts=PromptSettings(words=32),
        )
        (level,) = asyncio.run(run_sweep(settings)).levels
    assert level.summary.errors == 0
    assert all(r.spec_verify_ct and r.spec_accepted_drafts is not None for r in level.records)
    accept = level.summary.accept
    assert accept.sglext is not None
    assert accept.metrics is not None
    assert accept.chunks is not None
    # Per-request figures and the counters count the same verifies: equal, not just close.
    assert abs(accept.sglext - accept.metrics) < 1e-9
    assert abs(accept.chunks - accept.metrics) / accept.metrics < 0.05
    # vLLM's figure is 1 + accepted / verifies, from the per-request counters.
    steps = sum(r.spec_verify_ct or 0 for r in level.records)
    accepted = sum(r.spec_accepted_drafts or 0 for r in level.records)
    assert abs(accept.sglext - (1 + accepted / steps)) < 1e-9
    # Tokens per verify (SGLang's reading) is another figure on vLLM: it counts the prefill
    # token and the cut last verify. Summed over requests the two can meet by chance (cuts
    # adding up to one per request), so the difference shows request by request.
    assert any(
        r.completion_tokens != (r.spec_verify_ct or 0) + (r.spec_accepted_drafts or 0)
        for r in level.records
    )
