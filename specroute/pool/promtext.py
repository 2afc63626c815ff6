"""Read the routing-relevant numbers out of SGLang's Prometheus text (`sglang:` or the older
`sglang_` prefix), summed over label sets (data-parallel ranks)."""

from __future__ import annotations

import msgspec

from specroute.prometheus import sglang_values

__all__ = ["BackendMetrics", "parse_metrics"]

_WANTED = {
    "num_running_reqs": "running",
    "num_queue_reqs": "queued",
    "spec_accept_length": "accept_length",
    "spec_num_steps": "steps",
    "gen_throughput": "gen_throughput",
    "token_usage": "token_usage",
    "generation_tokens_total": "generation_tokens",
    "spec_verify_calls_total": "verify_calls",
}
# Averaged over ranks rather than summed.
_MEANS = {"accept_length", "steps", "token_usage"}


class BackendMetrics(msgspec.Struct, kw_only=True):
    """One scrape; a field stays None when the backend did not report it."""

    running: float | None = None
    queued: float | None = None
    accept_length: float | None = None
    steps: float | None = None
    gen_throughput: float | None = None
    token_usage: float | None = None
    generation_tokens: float | None = None
    verify_calls: float | None = None
    """SGLang's verify calls; vLLM's drafts (one per request per verify pass, the same count)."""
    accepted_tokens: float | None = None
    """vLLM's accepted draft tokens (a counter; SGLang reports a gauge of accept length)."""
    window_drafts: float | None = None
    """vLLM's drafts where the window of the next accept length begins."""
    window_accepted: float | None = None
    """vLLM's accepted tokens where that window begins."""


def parse_metrics(text: str) -> BackendMetrics:
    """Sum (or average, for ratios) each wanted sample across its label sets; nothing at all
    when those samples are not Prometheus text (half a scrape would miss some ranks)."""
    values = sglang_values(text, _WANTED.keys()) or {}
    found: dict[str, float] = {}
    for name, field in _WANTED.items():
        series = values.get(name)
        if series:
            found[field] = sum(series) / len(series) if field in _MEANS else sum(series)
    return BackendMetrics(**found)
