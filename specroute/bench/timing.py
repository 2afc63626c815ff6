"""Token-exact timing of one streamed reply: tokens per chunk, TTFT, TPOT, inter-token latency.

A speculative server sends every token one iteration accepted in one chunk, so the gap between
chunks is an iteration, not a token. Inter-token latency spreads each chunk's gap evenly over
the tokens it carries. Token counts come, best first, from `continuous_usage_stats` (exact per
chunk), the final `usage` spread over chunks in proportion to their text, or a text estimate.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "chunk_accept_length",
    "estimate_tokens",
    "inter_token_latencies",
    "spread_total",
    "tokens_from_cumulative",
]

_PIECES = re.compile(r"\w+|[^\w\s]")
_CHARS_PER_TOKEN = 6  # long words split into several tokens in every BPE vocabulary


def estimate_tokens(text: str) -> int:
    """Tokenizer-free token count: words and punctuation marks, long words counted as several."""
    return sum(1 + (len(piece) - 1) // _CHARS_PER_TOKEN for piece in _PIECES.findall(text))


def tokens_from_cumulative(cumulative: Sequence[int]) -> list[int]:
    """Per-chunk tokens from the running `completion_tokens` each chunk reported."""
    tokens: list[int] = []
    previous = 0
    for total in cumulative:
        tokens.append(max(0, total - previous))
        previous = max(previous, total)
    return tokens


def spread_total(weights: Sequence[int], total: int) -> list[int]:
    """Split `total` tokens over chunks in proportion to `weights` (largest remainders)."""
    if not weights or total <= 0:
        return [0] * len(weights)
    clipped = [max(0, w) for w in weights]
    if not any(clipped):
        clipped = [1] * len(weights)
    weight_sum = sum(clipped)
    shares = [w * total / weight_sum for w in clipped]
    parts = [int(s) for s in shares]
    order = sorted(range(len(parts)), key=lambda i: shares[i] - parts[i], reverse=True)
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def inter_token_latencies(times: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """Gaps between token arrivals after the first chunk: each chunk's gap from the previous
    token-bearing chunk, divided evenly over its tokens (one value per token)."""
    latencies: list[float] = []
    previous: float | None = None
    for at, count in zip(times, tokens, strict=True):
        if count <= 0:
            continue
        if previous is not None:
            latencies.extend([(at - previous) / count] * count)
        previous = at
    return latencies


def chunk_accept_length(tokens: Sequence[int]) -> tuple[int, int]:
    """(tokens, verify steps) as seen from chunks: the first token-bearing chunk is the prefill's
    token, every later one a verify; SGLang's accept length is tokens / verifies."""
    bearing = [n for n in tokens if n > 0]
    if len(bearing) < 2:
        return sum(bearing), 0
    return sum(bearing), len(bearing) - 1
