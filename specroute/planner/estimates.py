"""What the planner knows of each depth and each workload class: R(k) and T(b, k) per depth
(as the proxy's fits of the depths that run show them), and E_k per class from a two-number
curve of per-position acceptance fitted to the depths measured."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from specroute.policies import ClassEstimate
from specroute.speculation import PRIOR_ALPHA, alpha_from_accept_length

__all__ = ["Curve", "DepthEstimate", "Estimates", "fit_curve"]


class DepthEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """What is known of one depth: R(k) and `T(b) = intercept_s + per_token_s * b * (k + 1)`."""

    steps: int
    capacity: int
    intercept_s: float
    per_token_s: float

    def iteration_time(self, batch: float) -> float:
        return self.intercept_s + self.per_token_s * batch * (self.steps + 1)


class Curve(msgspec.Struct, frozen=True, kw_only=True):
    """Per-position acceptance `a_j = first * decay ** (j - 1)` (at most 1): E_k at every
    depth from two numbers, least-squares fitted to the depths measured. Planning compares
    depths with each other, so one smooth curve beats a thinly sampled depth's own mean."""

    first: float
    decay: float

    def at(self, steps: int) -> float:
        total, run, rate = 1.0, 1.0, self.first
        for _ in range(max(0, steps)):
            run *= min(1.0, rate)
            total += run
            rate *= self.decay
        return total


def _least(f: Callable[[float], float], low: float, high: float) -> float:
    """The x in [low, high] where the unimodal `f` is least (golden-section search)."""
    ratio = (5**0.5 - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(24):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_curve(seen: Mapping[int, float], alpha: float) -> Curve:
    """The curve closest to the measured accept lengths (a constant rate when one depth or
    none was measured: that depth's, else `alpha`)."""
    depths = [k for k in sorted(seen) if k > 0]
    if len(depths) < 2:
        rate = alpha_from_accept_length(seen[depths[0]], depths[0]) if depths else alpha
        return Curve(first=rate, decay=1.0)

    def error(first: float, decay: float) -> float:
        curve = Curve(first=first, decay=decay)
        return sum((curve.at(k) - seen[k]) ** 2 for k in depths)

    def first_for(decay: float) -> float:
        return _least(lambda a: error(a, decay), 0.0, 1.0)

    decay = _least(lambda q: error(first_for(q), q), 0.05, 1.0)
    return Curve(first=first_for(decay), decay=decay)


class Estimates(msgspec.Struct, frozen=True, kw_only=True):
    """The estimators the planner reads: every depth it may assign, acceptance per class."""

    depths: dict[int, DepthEstimate]
    classes: dict[str, ClassEstimate] = msgspec.field(default_factory=dict)
    prior_alpha: float = PRIOR_ALPHA

    def curve(self, klass: str) -> Curve:
        """`klass`'s acceptance by depth; an unseen class at the prior's constant rate."""
        est = self.classes.get(klass)
        if est is None:
            return Curve(first=self.prior_alpha, decay=1.0)
        return fit_curve(est.accept_length, est.alpha)

    def accept_length(self, klass: str, steps: int) -> float:
        """E_k for `klass`, from its fitted curve."""
        return self.curve(klass).at(steps)
