"""vLLM's per-request speculative metrics (`--per-request-spec-decode-metrics summary|detailed`)
for one emulated request, shaped as vLLM 0.33 writes them.

From vLLM 0.33's source: the scheduler observes every verify step of a request
(vllm/v1/core/sched/scheduler.py: `RequestSpecDecodeMetrics.observe(num_draft_tokens,
num_accepted)`) and hands the accumulator over when the request finishes;
`RequestSpecDecodeMetrics.to_dict` (vllm/v1/metrics/stats.py) makes the fields of
`SpeculativeDecodingMetrics` (vllm/entrypoints/generate/base/protocol.py), which ride under
`metrics.speculative_decoding` (`PerRequestMetrics`): on a whole reply, dumped with every field
(`model_dump()` in vllm/entrypoints/openai/chat_completion/api_router.py, so the unset timing
fields and, at `summary`, the per-step arrays are null), and in a stream only on the usage chunk
(`model_dump_json(exclude_unset=True, exclude_none=True)` there: the nulls left out).
"""

from __future__ import annotations

from typing import Any, Literal

from specroute.emulator.engine import Req

__all__ = ["SpecMetricsLevel", "request_metrics"]

SpecMetricsLevel = Literal["none", "summary", "detailed"]
"""vLLM's `--per-request-spec-decode-metrics` values (vllm/config/observability.py)."""

_TIMING = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
           "tokens_per_second")  # fmt: skip
"""`PerRequestMetrics`' timing fields: only with vLLM's `--enable-per-request-metrics`."""


def _speculative(seq: Req, num_spec_tokens: int) -> dict[str, Any]:
    """`RequestSpecDecodeMetrics.to_dict`: a dense histogram of accepted drafts per verify
    (length K + 1), the mean accept length with the bonus token, the draft-only rate."""
    histogram = [0] * (num_spec_tokens + 1)
    for accepted, count in enumerate(seq.histogram):
        histogram[min(accepted, num_spec_tokens)] += count
    steps = sum(histogram)
    accepted_total = sum(j * count for j, count in enumerate(histogram))
    result: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted_total / steps if steps else 1.0,
        "draft_acceptance_rate": (
            accepted_total / seq.proposed_drafts if seq.proposed_drafts else 0.0
        ),
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted_total,
        "num_draft_tokens": seq.proposed_drafts,
        "num_spec_tokens": num_spec_tokens,
    }
    if seq.steps_log:  # `detailed`, and at least one verify (an empty list is left out)
        result["per_step_accepted"] = [accepted for _, accepted in seq.steps_log]
        result["per_step_drafted"] = [drafted for drafted, _ in seq.steps_log]
    return result


def request_metrics(
    seq: Req, level: SpecMetricsLevel, num_spec_tokens: int, *, stream: bool
) -> dict[str, Any] | None:
    """The reply's `metrics` object; None where vLLM sends none (the level is `none`, or the
    server does not speculate)."""
    if level == "none" or num_spec_tokens <= 0:
        return None
    speculative = _speculative(seq, num_spec_tokens)
    if stream:
        return {"speculative_decoding": speculative}
    speculative.setdefault("per_step_accepted", None)
    speculative.setdefault("per_step_drafted", None)
    return {**dict.fromkeys(_TIMING), "speculative_decoding": speculative}
