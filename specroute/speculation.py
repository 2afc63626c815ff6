"""The one performance model the router and the planner share, and the defaults every part
uses: E_k, its inverse and the per-position acceptance curve fitted to the depths measured;
T(b, k), the iteration time; SGLang's greedy rule; the priors used before anything is measured.
A leaf: stdlib only, no I/O."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_INTERCEPT_S",
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_PER_TOKEN_S",
    "GREEDY_TEMPERATURE_EPS",
    "PRIOR_ALPHA",
    "SPECULATIVE_DEFAULT_MAX_RUNNING",
    "Curve",
    "accept_length",
    "alpha_from_accept_length",
    "expected_tokens",
    "expected_tokens_of_rates",
    "fit_curve",
    "is_greedy",
    "iteration_time",
    "measured_time",
]

SPECULATIVE_DEFAULT_MAX_RUNNING = 48
"""SGLang's `--max-running-requests` when a speculative server is started without it: every
speculative algorithm resets an unset value to 48 (`ServerArgs._handle_speculative_decoding`
in `python/sglang/srt/server_args.py`, 0.5.23). The launcher passes it explicitly."""

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


def iteration_time(intercept_s: float, per_token_s: float, batch: float, steps: int) -> float:
    """T(b, k) = intercept + per_token * b * (k + 1): one engine iteration with `batch` running
    requests at depth `steps` (each verifies k + 1 tokens)."""
    return intercept_s + per_token_s * batch * (max(0, steps) + 1)


def measured_time(
    points: Sequence[tuple[float, float]], tokens: float, per_token_s: float
) -> float:
    """T at `tokens` verified per iteration from measured (tokens, seconds) points sorted by
    tokens: a monotone cubic through them (`_tangent`), past either end along the nearest
    segment's slope (`per_token_s` with one point), never below 1e-6.

    The line through every point misses where iteration time bends: a sparse model's expert
    reads saturate as the batch grows, and the h200 shape's line put 16 users at depth 1 at
    63.5 ms where tune measured 71.9 ms, which made depth 1 look faster than depth 2 there.
    A straight segment between two points still misses the bend between them: tune measures
    1, 4, 16 and 32 users, and on the h200 shape the chord from 4 to 16 users at depth 2 read
    7 users' iteration 8% fast, so every forecast of a pool near that load 8% high
    (`benchmarks/prior_time_error.py --by-depth`)."""
    n = len(points)
    if n == 1:
        x, y = points[0]
        return max(1e-6, y + per_token_s * (tokens - x))
    i = bisect.bisect_left(points, tokens, key=lambda p: p[0])
    i = min(max(i, 1), n - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    width = x1 - x0
    slope = max(0.0, (y1 - y0) / width) if width > 0 else per_token_s
    if n == 2 or width <= 0 or not x0 < tokens < x1:
        anchor_x, anchor_y = (x1, y1) if tokens > x1 else (x0, y0)
        return max(1e-6, anchor_y + slope * (tokens - anchor_x))
    d0, d1 = _tangent(points, i - 1), _tangent(points, i)
    t = (tokens - x0) / width
    # Cubic Hermite on [x0, x1] with the end slopes d0, d1.
    h00, h10 = (1 + 2 * t) * (1 - t) ** 2, t * (1 - t) ** 2
    h01, h11 = t * t * (3 - 2 * t), t * t * (t - 1)
    return max(1e-6, h00 * y0 + h10 * width * d0 + h01 * y1 + h11 * width * d1)


def _tangent(points: Sequence[tuple[float, float]], j: int) -> float:
    """The slope at point `j` of the monotone cubic through `points` (Fritsch and Carlson's
    weighted harmonic mean of the secants beside it, the ends from three points, as SciPy's
    `PchipInterpolator`): never over- or undershooting the points, so T never falls as the
    batch grows. Written here rather than imported: SciPy would be the only numerical
    dependency of the planner, for a dozen points read through a cache (`forecast.Physics`)."""
    n = len(points)

    def secant(a: int) -> tuple[float, float]:
        (xa, ya), (xb, yb) = points[a], points[a + 1]
        width = xb - xa
        return width, (max(0.0, (yb - ya) / width) if width > 0 else 0.0)

    if 0 < j < n - 1:
        (h0, s0), (h1, s1) = secant(j - 1), secant(j)
        if s0 <= 0 or s1 <= 0:
            return 0.0
        w0, w1 = 2 * h1 + h0, h1 + 2 * h0
        return (w0 + w1) / (w0 / s0 + w1 / s1)
    (h0, s0), (h1, s1) = (secant(0), secant(1)) if j == 0 else (secant(n - 2), secant(n - 3))
    # SciPy also caps an end's slope at three times its secant where the secants beside it
    # differ in sign: the secants here never fall below zero, so that cap never binds.
    d = ((2 * h0 + h1) * s0 - h0 * s1) / (h0 + h1) if h0 + h1 > 0 else s0
    return d if d > 0 and s0 > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Curve:
    """Per-position acceptance `a_j = first * decay ** (j - 1)` (at most 1): E_k at every depth
    from two numbers. Comparing depths needs one smooth curve: a thinly sampled depth's own mean
    would skew the comparison."""

    first: float
    decay: float

    def at(self, steps: int) -> float:
        total, run, rate = 1.0, 1.0, self.first
        for _ in range(max(0, steps)):
            run *= min(1.0, rate)
            total += run
            rate *= self.decay
        return total


def _curve_terms(first: float, decay: float, steps: int) -> tuple[float, float, float]:
    """E_k(first, decay) = 1 + sum_m first^m decay^(m(m-1)/2) and its two partial derivatives
    (no clipping is needed: both numbers stay in [0, 1])."""
    value, d_first, d_decay = 1.0, 0.0, 0.0
    for m in range(1, steps + 1):
        power = m * (m - 1) / 2
        term = first**m * decay**power
        value += term
        d_first += m * term / first if first > 0 else (1.0 if m == 1 else 0.0)
        d_decay += power * term / decay if decay > 0 else 0.0
    return value, d_first, d_decay


def _clip(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


_DECAY_FLOOR = 0.05


def _least_squares(lengths: Mapping[int, float], start: float) -> Curve:
    """Levenberg-Marquardt on (first, decay) within [0, 1] x [0.05, 1]: two parameters and a
    handful of depths, so a few dozen cheap steps (the router asks for a class's curve on the
    request path; a derivative-free search cost milliseconds)."""

    def cost(f: float, d: float) -> float:
        return sum((_curve_terms(f, d, k)[0] - v) ** 2 for k, v in lengths.items())

    first, decay, damping = _clip(start, 0.0, 1.0), 1.0, 1e-3
    current = cost(first, decay)
    for _ in range(60):
        jff = jfd = jdd = gf = gd = 0.0
        for k, v in lengths.items():
            e, df, dd = _curve_terms(first, decay, k)
            r = e - v
            jff, jfd, jdd = jff + df * df, jfd + df * dd, jdd + dd * dd
            gf, gd = gf + df * r, gd + dd * r
        a, b, c = jff * (1 + damping), jfd, jdd * (1 + damping)
        det = a * c - b * b
        if det <= 1e-18:
            break
        step_f, step_d = (c * gf - b * gd) / det, (a * gd - b * gf) / det
        f2, d2 = _clip(first - step_f, 0.0, 1.0), _clip(decay - step_d, _DECAY_FLOOR, 1.0)
        trial = cost(f2, d2)
        if trial < current:
            moved = abs(f2 - first) + abs(d2 - decay)
            first, decay, current, damping = f2, d2, trial, max(damping / 10, 1e-9)
            if moved < 1e-10:
                break
        else:
            damping *= 10
            if damping > 1e9:
                break
    return Curve(first=first, decay=decay)


def fit_curve(seen: Mapping[int, float], alpha: float) -> Curve:
    """The curve closest (least squares) to the accept lengths measured at each depth; a
    constant rate when one depth or none was measured (that depth's, else `alpha`)."""
    return _fit(_depths(seen), alpha)


def _depths(seen: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    """`seen` as a cache key: its speculative depths in order."""
    return tuple(sorted((k, v) for k, v in seen.items() if k > 0)) if seen else ()


@functools.lru_cache(maxsize=1024)
def _fit(items: tuple[tuple[int, float], ...], alpha: float) -> Curve:
    """`fit_curve` remembered by its exact inputs: one request's routing asks for the same
    class's curve at every backend, and an estimate changes only when an outcome lands."""
    lengths = dict(items)
    if len(lengths) < 2:
        if not lengths:
            return Curve(first=alpha, decay=1.0)
        ((k, v),) = lengths.items()
        return Curve(first=alpha_from_accept_length(v, k), decay=1.0)
    shallowest = min(lengths)
    return _least_squares(lengths, alpha_from_accept_length(lengths[shallowest], shallowest))


def accept_length(seen: Mapping[int, float], alpha: float, steps: int) -> float:
    """E_k of a workload class at depth `steps`: its fitted curve (`fit_curve`) there. The router
    and the planner both value a depth with this."""
    if steps <= 0:
        return 1.0
    return _accept(_depths(seen), alpha, steps)


@functools.lru_cache(maxsize=4096)
def _accept(items: tuple[tuple[int, float], ...], alpha: float, steps: int) -> float:
    """`accept_length` remembered by its exact inputs: the router values the same class at the
    same depth for every request until an outcome changes the class's estimate."""
    return _fit(items, alpha).at(steps)
