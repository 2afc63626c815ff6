"""Read the routing-relevant numbers out of SGLang's Prometheus text (`sglang:` or the older
`sglang_` prefix), summed over label sets (data-parallel ranks)."""

from __future__ import annotations

import math

import msgspec

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


def _sample(line: str) -> tuple[str, float] | None:
    if not line.startswith(("sglang:", "sglang_")):
        return None
    name_end = len(line)
    for sep in ("{", " "):
        idx = line.find(sep)
        if idx != -1:
            name_end = min(name_end, idx)
    name = line[7:name_end]
    parts = line.rsplit("}", 1)[-1].split() if "{" in line else line.split()[1:]
    if not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return (name, value) if math.isfinite(value) else None


def parse_metrics(text: str) -> BackendMetrics:
    """Sum (or average, for ratios) each wanted sample across its label sets."""
    totals: dict[str, list[float]] = {}
    for raw in text.splitlines():
        sample = _sample(raw.strip())
        if sample is None or sample[0] not in _WANTED:
            continue
        totals.setdefault(_WANTED[sample[0]], []).append(sample[1])
    values = {
        field: (sum(v) / len(v) if field in _MEANS else sum(v)) for field, v in totals.items()
    }
    return BackendMetrics(**values)
