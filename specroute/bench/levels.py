"""One load level's numbers from its request records (pure): throughput the way the seed
write-up and SGLang's bench_serving define it, latency distributions, and accept length
measured up to three ways, with warnings where they disagree or the workload flatters them.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Sequence

import msgspec

from specroute.bench.client import RequestRecord
from specroute.bench.stats import Summary, mean, summarize
from specroute.bench.timing import chunk_accept_length, inter_token_latencies

__all__ = [
    "ACCEPT_TOLERANCE",
    "AcceptLengths",
    "ClassSummary",
    "LevelSummary",
    "accept_warnings",
    "held_window",
    "summarize_level",
]

ACCEPT_TOLERANCE = 0.05
"""Relative disagreement between accept-length measurements that earns a warning."""


class AcceptLengths(msgspec.Struct, kw_only=True):
    """Tokens per verify step, by source: chunks, the server's per-request figures (`sglext`:
    SGLang's `sglext.spec_tokens_details`, or vLLM's `metrics.speculative_decoding`), `/metrics`
    deltas, and `/server_info`'s lifetime average (None where the source is not available)."""

    chunks: float | None = None
    sglext: float | None = None
    metrics: float | None = None
    server_info: float | None = None

    def best(self) -> float | None:
        for value in (self.sglext, self.metrics, self.chunks, self.server_info):
            if value is not None:
                return value
        return None


class ClassSummary(msgspec.Struct, kw_only=True):
    """One traffic class's share of a level (a trace mixes greedy and sampled requests)."""

    requests: int = 0
    per_request_tok_s: float = 0.0
    accept: AcceptLengths = msgspec.field(default_factory=AcceptLengths)


class LevelSummary(msgspec.Struct, kw_only=True):
    """Per-request tok/s = mean of 1 / TPOT; aggregate tok/s = completion tokens over the
    level's wall time (first scheduled send to last finish). Latencies in seconds.

    `held_*` count only the span the level held its concurrency (`held_window`): the
    steady rate a prior wants, without the drain's tail."""

    requests: int = 0
    succeeded: int = 0
    errors: int = 0
    error_samples: list[str] = []
    wall_s: float = 0.0
    request_per_s: float = 0.0
    completion_tokens: int = 0
    per_request_tok_s: float = 0.0
    aggregate_tok_s: float = 0.0
    ttft: Summary = Summary()
    tpot: Summary = Summary()
    itl: Summary = Summary()
    e2e: Summary = Summary()
    accept: AcceptLengths = msgspec.field(default_factory=AcceptLengths)
    token_source: str = ""
    classes: dict[str, ClassSummary] = {}
    warnings: list[str] = []
    held_s: float = 0.0
    """How long the level held every request it runs at once in flight (`held_window`)."""
    held_tok_s: float = 0.0
    """Completion tokens that arrived within `held_s`, per second."""
    held_itl: Summary = Summary()
    """Inter-token latencies of the tokens that arrived within `held_s`."""


def held_window(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """(start, end) of the span a closed-loop level held its concurrency: from its first send
    to the first finish after its last send (the finish that sent it is not after it). Until
    then every finish was followed by a send; after it the level drains, fewer requests run,
    and iterations are shorter and the rate lower than its concurrency gives. With the tune's
    two requests per slot the drain is a large share of a level: counted, it put an emulated
    vLLM server's rates at 16 and 32 requests 3% to 12% under what 32 requests per slot
    measured (within 2.3% once left out) and its slope per token 15% under
    (`docs/operators.md`, "How long a tune measures"). None for no records."""
    if not records:
        return None
    start = min(r.scheduled for r in records)
    last_send = max(max(r.scheduled, r.sent) for r in records)
    end = min((r.finished for r in records if r.finished > last_send), default=last_send)
    return start, max(start, end)


def _held(
    good: Sequence[RequestRecord], window: tuple[float, float] | None
) -> tuple[float, float, list[float]]:
    """(span, tokens per second, inter-token latencies) within `window`."""
    if window is None or window[1] <= window[0]:
        return 0.0, 0.0, []
    start, end = window
    tokens = 0
    gaps: list[float] = []
    for record in good:
        times = [t for t in record.chunk_times if t <= end]
        counts = record.chunk_tokens[: len(times)]
        tokens += sum(counts)
        gaps.extend(inter_token_latencies(times, counts))
    return end - start, tokens / (end - start), gaps


def _ratio(tokens: int, steps: int) -> float | None:
    return tokens / steps if steps > 0 else None


def _accept(records: Sequence[RequestRecord]) -> AcceptLengths:
    chunk_tokens = chunk_steps = sg_tokens = sg_steps = 0
    for record in records:
        tokens, steps = chunk_accept_length(record.chunk_tokens)
        chunk_tokens, chunk_steps = chunk_tokens + tokens, chunk_steps + steps
        if record.spec_verify_ct and record.spec_accepted_drafts is not None:
            # vLLM's per-request figures: each verify's bonus token plus its accepted drafts.
            sg_tokens += record.spec_verify_ct + record.spec_accepted_drafts
            sg_steps += record.spec_verify_ct
        elif record.spec_verify_ct:
            sg_tokens += record.completion_tokens
            sg_steps += record.spec_verify_ct
    return AcceptLengths(
        chunks=_ratio(chunk_tokens, chunk_steps), sglext=_ratio(sg_tokens, sg_steps)
    )


def _per_request_speed(records: Sequence[RequestRecord]) -> float:
    tpots = [t for t in (r.tpot for r in records) if t is not None and t > 0]
    return mean([1.0 / t for t in tpots]) if tpots else 0.0


def _classes(good: Sequence[RequestRecord]) -> dict[str, ClassSummary]:
    names = sorted({r.klass for r in good})
    if len(names) < 2:
        return {}
    return {
        name: ClassSummary(
            requests=len(members),
            per_request_tok_s=_per_request_speed(members),
            accept=_accept(members),
        )
        for name in names
        if (members := [r for r in good if r.klass == name])
    }


def accept_warnings(accept: AcceptLengths) -> list[str]:
    """One warning per measurement that strays more than 5% from the most exact one."""
    reference = accept.best()
    if reference is None or reference <= 0:
        return []
    warnings = []
    for name in ("sglext", "metrics", "chunks"):
        value = getattr(accept, name)
        if value is not None and abs(value - reference) / reference > ACCEPT_TOLERANCE:
            warnings.append(
                f"accept length disagrees: {name} {value:.2f} vs {reference:.2f} "
                "(chunks merge under client or proxy load; counters include other traffic)"
            )
    return warnings


def summarize_level(
    records: Sequence[RequestRecord],
    *,
    metrics_accept: float | None = None,
    server_info_accept: float | None = None,
) -> LevelSummary:
    """The level's row of the results table, from its records and the server's counters."""
    good = [r for r in records if r.ok]
    bad = [r for r in records if not r.ok]
    if not records:
        return LevelSummary()
    start = min(r.scheduled for r in records)
    wall = max(r.finished for r in records) - start
    tokens = sum(r.completion_tokens for r in good)
    tpots = [t for t in (r.tpot for r in good) if t is not None and t > 0]
    itl = [gap for r in good for gap in inter_token_latencies(r.chunk_times, r.chunk_tokens)]
    accept = _accept(good)
    accept.metrics, accept.server_info = metrics_accept, server_info_accept
    sources = Tally(r.token_source for r in good)
    held_s, held_tok_s, held_itl = _held(good, held_window(records))
    return LevelSummary(
        requests=len(records),
        succeeded=len(good),
        errors=len(bad),
        error_samples=sorted({r.error or "empty reply" for r in bad})[:3],
        wall_s=wall,
        request_per_s=len(good) / wall if wall > 0 else 0.0,
        completion_tokens=tokens,
        per_request_tok_s=_per_request_speed(good),
        aggregate_tok_s=tokens / wall if wall > 0 else 0.0,
        ttft=summarize([t for t in (r.ttft for r in good) if t is not None]),
        tpot=summarize(tpots),
        itl=summarize(itl),
        e2e=summarize([r.e2e for r in good]),
        accept=accept,
        token_source=sources.most_common(1)[0][0] if sources else "",
        classes=_classes(good),
        warnings=accept_warnings(accept),
        held_s=held_s,
        held_tok_s=held_tok_s,
        held_itl=summarize(held_itl),
    )
