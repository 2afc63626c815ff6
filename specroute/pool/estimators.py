"""What the pool learns from outcomes: acceptance per workload class, iteration time per backend,
and how long a backend's streams go quiet (for their stall limits).

Pure and synchronous. Acceptance is kept as a constant per-token rate alpha (solving
`E_k(alpha) = L` for an accept length L seen at depth k, so one estimate serves every depth)
and, where a depth has been seen, as that depth's own accept length, which is more exact when
acceptance decays with draft position.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specroute.speculation import (
    DEFAULT_INTERCEPT_S,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PER_TOKEN_S,
    PRIOR_ALPHA,
    alpha_from_accept_length,
    measured_time,
)

__all__ = [
    "AcceptanceEstimate",
    "AcceptanceEstimator",
    "ClassLengths",
    "DecayingMean",
    "DurationHistogram",
    "FirstTokenWaits",
    "IterationTimeModel",
    "PrefillPauses",
    "StallRule",
]


@dataclass(slots=True)
class DecayingMean:
    """A mean whose older samples weigh less: each update first scales past weight by `keep`."""

    value: float
    weight: float = 0.0

    def update(self, x: float, weight: float, keep: float) -> None:
        self.weight = self.weight * keep + weight
        self.value += (weight / self.weight) * (x - self.value)


@dataclass(slots=True)
class AcceptanceEstimate:
    """One class's acceptance: alpha over all depths, accept length per depth seen."""

    alpha: DecayingMean
    by_steps: dict[int, DecayingMean] = field(default_factory=dict)
    samples: int = 0


class AcceptanceEstimator:
    """Exponentially weighted acceptance per workload class, with a prior for new classes.

    `half_life` is in verifies: older observations count half after that many newer ones, so
    the estimate follows a workload whose acceptance drifts. The prior counts as no weight: the
    first observation replaces it.
    """

    def __init__(self, *, prior_alpha: float = PRIOR_ALPHA, half_life: float = 2000.0) -> None:
        if not 0.0 <= prior_alpha <= 1.0:
            raise ValueError("prior_alpha must be in [0, 1]")
        self.prior_alpha = prior_alpha
        self.half_life = half_life
        self.classes: dict[str, AcceptanceEstimate] = {}

    def get(self, klass: str) -> AcceptanceEstimate:
        return self.classes.get(klass) or AcceptanceEstimate(DecayingMean(self.prior_alpha))

    def observe(self, klass: str, *, steps: int, accept_length: float, verifies: float) -> None:
        """Fold in `verifies` verify passes at depth `steps` that yielded `accept_length` each."""
        if steps <= 0 or verifies <= 0 or accept_length <= 0:
            return
        est = self.classes.setdefault(klass, AcceptanceEstimate(DecayingMean(self.prior_alpha)))
        keep = 0.5 ** (verifies / self.half_life)
        est.alpha.update(alpha_from_accept_length(accept_length, steps), verifies, keep)
        est.by_steps.setdefault(steps, DecayingMean(accept_length)).update(
            accept_length, verifies, keep
        )
        est.samples += 1


@dataclass(slots=True)
class IterationTimeModel:
    """Online least squares of one backend's iteration time against the tokens in its batch.

    `T(n) = intercept + slope * n`, n = running requests x (steps + 1); observations decay
    with `forget` per observation so the fit follows the backend. A prior (from a bench profile
    or defaults) acts as `prior_weight` pseudo-observations at two batch sizes, which decay like
    the rest, and as `anchor_weight` more that never do.

    The anchor is what keeps the line defined when every observation is at one batch size: a
    saturated server runs at its capacity for hours, its batch never moves, and once the
    decaying prior is gone the sums leave the slope to rounding (on a 12-hour simulated trace
    the fit at the batch it ran read 0.18 s where every gap was 0.033 s). With the anchor the
    line passes through what was observed and takes its slope from the prior where nothing
    else is known.

    Where the prior has measured points (`curve`, tune's), the prior stands on them around
    where the observations lie (their mean tokens, 10% either side) rather than on its line at
    2 and 64 tokens: iteration time bends, and a line through every point reads a small batch
    slow where expert reads saturate. On the h200 shape a server just restarted at depth 4
    with one request read 34.6 ms after four requests, the line's 36.3 ms pulling at the 30
    ms it ran, and the planner valued the depth 16% slow for minutes
    (`docs/policy-evaluation.md`, item 28, "The prior where a server runs").
    """

    intercept: float = DEFAULT_INTERCEPT_S
    slope: float = DEFAULT_PER_TOKEN_S
    prior_weight: float = 20.0
    forget: float = 0.999
    anchor_weight: float = 0.1
    curve: Sequence[tuple[float, float]] = ()
    _sw: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0
    _pw: float = 0.0
    """The decaying prior's weight now."""
    _line: list[tuple[float, float]] = field(default_factory=list)
    """The prior's line at `_PRIOR_BATCHES`, as given (the fit replaces `intercept`, `slope`)."""
    observations: int = 0
    _ow: float = 0.0
    _ox: float = 0.0
    _os: float = 0.0

    @property
    def stall_s(self) -> float:
        """The mean pause per iteration in what was observed, beyond the decode: other
        requests' prefills (`Telemetry.observe`), weighted as the fit weighs them. The fit
        holds them at the load and depth it saw; the planner takes them out and charges each
        candidate its own (`PrefillPauses`)."""
        return self._os / self._ow if self._ow > 0 else 0.0

    def __post_init__(self) -> None:
        self._pw = self.prior_weight
        self._line = [(n, self.intercept + self.slope * n) for n in _PRIOR_BATCHES]

    @property
    def tokens(self) -> float | None:
        """Where the observations lie: their mean tokens per iteration, weighted as the fit
        weighs them (None before any)."""
        return self._ox / self._ow if self._ow > 0 else None

    def _prior_points(self) -> list[tuple[float, float]]:
        """Where the prior stands: on tune's points around the observations where it has
        them, else on its line."""
        at = self.tokens
        if not self.curve or at is None:
            return self._line
        (_, t0), (_, t1) = self._line  # the line's slope where the curve has one point
        slope = (t1 - t0) / (_PRIOR_BATCHES[1] - _PRIOR_BATCHES[0])
        return [(x, measured_time(self.curve, x, slope)) for x in (0.9 * at, 1.1 * at)]

    def observe(
        self, batch_tokens: float, seconds: float, weight: float = 1.0, stall_s: float = 0.0
    ) -> None:
        """One measured iteration (e.g. the mean gap between a stream's chunks) at
        `batch_tokens`, of which `stall_s` was pauses beyond the decode."""
        if seconds <= 0 or batch_tokens <= 0:
            return
        f = self.forget
        self._sw, self._sx, self._sy = self._sw * f, self._sx * f, self._sy * f
        self._sxx, self._sxy = self._sxx * f, self._sxy * f
        self._sw += weight
        self._sx += weight * batch_tokens
        self._sy += weight * seconds
        self._sxx += weight * batch_tokens * batch_tokens
        self._sxy += weight * batch_tokens * seconds
        self._pw *= f
        self._ow = self._ow * f + weight
        self._ox = self._ox * f + weight * batch_tokens
        self._os = self._os * f + weight * max(0.0, stall_s)
        self.observations += 1
        sw, sx, sy, sxx, sxy = self._sw, self._sx, self._sy, self._sxx, self._sxy
        points = self._prior_points()
        w = (self._pw + self.anchor_weight) / len(points)
        for n, t in points:
            sw, sx, sy, sxx, sxy = sw + w, sx + w * n, sy + w * t, sxx + w * n * n, sxy + w * n * t
        det = sw * sxx - sx * sx
        if det <= 1e-12 * sw * sxx:
            return  # no spread in batch size to tell slope from intercept: keep the line
        slope = max(0.0, (sw * sxy - sx * sy) / det)
        intercept = (sy - slope * sx) / sw
        if intercept < _LEAST_INTERCEPT_S:
            # The least-squares slope with the intercept held at its floor, not the free
            # line's slope under a clipped intercept (which misses every observation).
            intercept = _LEAST_INTERCEPT_S
            slope = max(0.0, (sxy - intercept * sx) / sxx)
        self.slope, self.intercept = slope, intercept


_PRIOR_BATCHES = (2.0, 64.0)
"""Where the prior stands as pseudo-observations (tokens per iteration)."""
_LEAST_INTERCEPT_S = 1e-6


class ClassLengths:
    """Exponentially weighted mean completion tokens per workload class (queue-wait estimates)."""

    def __init__(self, *, prior_tokens: float = DEFAULT_OUTPUT_TOKENS, keep: float = 0.99) -> None:
        self.prior_tokens = prior_tokens
        self.keep = keep
        self.classes: dict[str, DecayingMean] = {}
        self.counts: dict[str, int] = {}
        """Completions per class, whatever server answered (the traffic's class mix)."""

    def observe(self, klass: str, tokens: int) -> None:
        if tokens > 0:
            mean = self.classes.setdefault(klass, DecayingMean(float(tokens)))
            mean.update(float(tokens), 1.0, self.keep)
            self.counts[klass] = self.counts.get(klass, 0) + 1

    def get(self, klass: str) -> float:
        mean = self.classes.get(klass)
        return mean.value if mean is not None else self.prior_tokens


class FirstTokenWaits:
    """Exponentially weighted mean wait for a reply's first token beyond one iteration of its
    server, per workload class: the prefill of its prompt and the wait for the step it joins,
    which a class of long prompts (coding agents) pays on every request. The planner adds it
    to each request's time (`planner.forecast`); the gaps between chunks, which T(b, k) is
    fitted to, never hold it."""

    def __init__(self, *, keep: float = 0.99) -> None:
        self.keep = keep
        self.classes: dict[str, DecayingMean] = {}

    def observe(self, klass: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.classes.setdefault(klass, DecayingMean(seconds)).update(seconds, 1.0, self.keep)

    def get(self, klass: str) -> float | None:
        mean = self.classes.get(klass)
        return mean.value if mean is not None else None


class PrefillPauses:
    """How long each other request's start pauses a running request, per workload class of
    the request paused: its stream's pauses beyond the decode (gaps over the median gap)
    over the requests in flight beside it, each of whom starts about one request in its
    time (closed-loop users of like durations). SGLang runs a prefill before the decode
    batch it joins, and every request running waits for it (`get_next_batch_to_run` in
    `python/sglang/srt/managers/scheduler.py`: "Run prefill first if possible"); the
    emulator charges it to the iteration. The planner charges a request (b - 1) pauses on a
    server of b (`planner.forecast`), which a deeper server's shorter requests pay in a
    larger share of their time."""

    def __init__(self, *, keep: float = 0.99) -> None:
        self.keep = keep
        self.classes: dict[str, DecayingMean] = {}

    def observe(self, klass: str, stall_s: float, others: float) -> None:
        """One request's pauses beyond the decode, with `others` requests beside it."""
        if others <= 0:
            return
        per = max(0.0, stall_s) / others
        self.classes.setdefault(klass, DecayingMean(per)).update(per, others, self.keep)

    def get(self, klass: str) -> float | None:
        mean = self.classes.get(klass)
        return mean.value if mean is not None else None


_LOWEST_S = 0.001
_GROWTH = 1.25
_BUCKETS = 64  # 1 ms up to 1 ms x 1.25^64 = 1,600 s, each bucket 25% wide
_LOG_GROWTH = math.log(_GROWTH)


def _bucket(seconds: float) -> int:
    if seconds <= _LOWEST_S:
        return 0
    return min(_BUCKETS - 1, int(math.log(seconds / _LOWEST_S) / _LOG_GROWTH) + 1)


class DurationHistogram:
    """Quantiles of a stream of durations in fixed memory: 64 log-spaced buckets, each 25% wide.

    A quantile is read as its bucket's upper edge (at most 25% high, never low). Past `window`
    samples every count is halved (or more, back under it), so the estimate follows a backend
    whose pace changes with its load, at one pass over the buckets per `window / 2` samples.
    """

    __slots__ = ("_cache", "_counts", "_window", "total")

    def __init__(self, window: float = 4096.0) -> None:
        self._counts = [0.0] * _BUCKETS
        self._window = window
        self._cache: dict[float, float] = {}
        self.total = 0.0

    def add_all(self, durations: Iterable[float]) -> None:
        counts, added = self._counts, 0
        for seconds in durations:
            counts[_bucket(seconds)] += 1.0
            added += 1
        if not added:
            return
        self.total += added
        self._cache.clear()
        if self.total > self._window:
            keep = 0.5
            while self.total * keep > self._window:
                keep /= 2
            self._counts = [c * keep for c in counts]
            self.total *= keep

    def quantile(self, q: float, extra: Sequence[float] = ()) -> float:
        """The `q` quantile of what was added plus `extra` (not kept); 0 when both are empty."""
        if not extra and q in self._cache:
            return self._cache[q]
        counts = self._counts
        total = self.total + len(extra)
        if extra:
            counts = list(counts)
            for seconds in extra:
                counts[_bucket(seconds)] += 1.0
        value = 0.0
        if total > 0:
            rank, seen = q * total, 0.0
            for index, count in enumerate(counts):
                seen += count
                if seen >= rank and count:
                    value = _LOWEST_S * _GROWTH**index
                    break
        if not extra:
            self._cache[q] = value
        return value


@dataclass(frozen=True, slots=True)
class StallRule:
    """How long a stream may stay quiet: `factor` times the `quantile` of the backend's own
    quiet times, never below `floor_s` nor above `ceiling_s`. Until `min_samples` have been
    seen, the a priori limit the caller predicted (`unlearned_s`), else `ceiling_s`."""

    factor: float
    floor_s: float
    ceiling_s: float
    quantile: float = 0.99
    min_samples: int = 16

    def limit_s(
        self,
        seen: DurationHistogram,
        extra: Sequence[float] = (),
        unlearned_s: float | None = None,
    ) -> float:
        learned = self.learned_s(seen, extra)
        if learned is not None:
            return learned
        return self.ceiling_s if unlearned_s is None else min(self.ceiling_s, unlearned_s)

    def learned_s(self, seen: DurationHistogram, extra: Sequence[float] = ()) -> float | None:
        """The learned limit; None until `min_samples` have been seen."""
        if seen.total + len(extra) < self.min_samples:
            return None
        learned = self.factor * seen.quantile(self.quantile, extra)
        return min(self.ceiling_s, max(self.floor_s, learned))
