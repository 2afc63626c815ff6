"""Pure statistics for bench results: percentiles and distribution summaries, no I/O."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import msgspec

__all__ = ["Summary", "mean", "percentile", "summarize"]


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """A distribution in a few numbers; NaN-free: an empty sample gives count 0 and zeros."""

    count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    min: float = 0.0
    max: float = 0.0


_RESOLUTION = 100_000  # q is taken to the nearest thousandth of a percent


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100): `statistics.quantiles(method="inclusive")`, linear
    interpolation between closest ranks as numpy's default. NaN for an empty sample."""
    if not values:
        return math.nan
    ordered = sorted(values)
    low, high = float(ordered[0]), float(ordered[-1])
    cut = round(min(100.0, max(0.0, q)) * _RESOLUTION / 100)
    if len(ordered) == 1 or cut == 0:
        return low
    if cut == _RESOLUTION:
        return high
    step = math.gcd(cut, _RESOLUTION)
    cuts = statistics.quantiles(ordered, n=_RESOLUTION // step, method="inclusive")
    # Its weighted sum can round one ulp outside the sample; a percentile stays inside it.
    return min(high, max(low, float(cuts[cut // step - 1])))


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for an empty sample."""
    return math.fsum(values) / len(values) if values else math.nan


def summarize(values: Sequence[float]) -> Summary:
    """Count, mean, median, p90, p99, min and max of a sample."""
    if not values:
        return Summary()
    ordered = sorted(values)
    return Summary(
        count=len(ordered),
        mean=mean(ordered),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        min=float(ordered[0]),
        max=float(ordered[-1]),
    )
