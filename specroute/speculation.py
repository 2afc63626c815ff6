"""Speculation maths and the defaults every part shares: E_k and its inverse, SGLang's greedy
rule, and the priors used before anything is measured. A leaf: stdlib only, no I/O."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "DEFAULT_INTERCEPT_S",
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_PER_TOKEN_S",
    "GREEDY_TEMPERATURE_EPS",
    "PRIOR_ALPHA",
    "alpha_from_accept_length",
    "expected_tokens",
    "expected_tokens_of_rates",
    "is_greedy",
]

DEFAULT_INTERCEPT_S = 0.02
"""Iteration time at an empty batch before any is measured (seconds)."""
DEFAULT_PER_TOKEN_S = 0.0003
"""Extra iteration time per token in the batch before any is measured (seconds)."""
PRIOR_ALPHA = 0.7
"""Per-token draft acceptance of a workload class not seen yet."""
DEFAULT_OUTPUT_TOKENS = 300.0
"""Completion length of a workload class not seen yet (tokens)."""

GREEDY_TEMPERATURE_EPS = 1e-6
"""SGLang samples greedily (top_k = 1) when 0 <= temperature < this: `_SAMPLING_EPS` in
`python/sglang/srt/sampling/sampling_params.py`, `SamplingParams.__post_init__`."""


def is_greedy(temperature: float | None, top_k: int | None = None) -> bool:
    """Whether SGLang decodes these settings greedily; no temperature means its default, 1.0."""
    t = 1.0 if temperature is None else temperature
    return 0.0 <= t < GREEDY_TEMPERATURE_EPS or top_k == 1


def expected_tokens(alpha: float, steps: int) -> float:
    """E_k(alpha) = 1 + alpha + ... + alpha^k: tokens one request gains per verify step."""
    if steps <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(steps + 1)
    return (1.0 - alpha ** (steps + 1)) / (1.0 - alpha)


def expected_tokens_of_rates(rates: Iterable[float]) -> float:
    """E_k with per-position acceptance a_1..a_k: 1 + a_1 + a_1 a_2 + ... + a_1...a_k."""
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


def alpha_from_accept_length(accept_length: float, steps: int) -> float:
    """The alpha with E_k(alpha) = accept_length, clipped to what depth k can show."""
    if steps <= 0:
        raise ValueError("an accept length says nothing about alpha without speculation")
    if accept_length <= 1.0:
        return 0.0
    if accept_length >= steps + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(50):  # E_k is increasing in alpha; bisection to ~1e-15
        mid = (low + high) / 2
        if expected_tokens(mid, steps) < accept_length:
            low = mid
        else:
            high = mid
    return (low + high) / 2
