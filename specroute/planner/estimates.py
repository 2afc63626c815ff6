"""What the planner knows of each depth and each workload class: R(k) and T(b, k) per depth
(bench priors corrected by what the running depths show), E_k per class, measured where seen
and elsewhere from a two-number curve of per-position acceptance fitted to what was seen."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from specroute.policies import ClassEstimate
from specroute.speculation import PRIOR_ALPHA, alpha_from_accept_length

__all__ = ["Curve", "DepthEstimate", "Estimates", "calibrated", "fit_curve"]


class DepthEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """What is known of one depth: R(k) and `T(b) = intercept_s + per_token_s * b * (k + 1)`."""

    steps: int
    capacity: int
    intercept_s: float
    per_token_s: float

    def iteration_time(self, batch: float) -> float:
        return self.intercept_s + self.per_token_s * batch * (self.steps + 1)


def calibrated(
    priors: Mapping[int, DepthEstimate], fitted: Mapping[int, DepthEstimate]
) -> dict[int, DepthEstimate]:
    """Every depth of `priors`, as fitted where it has run; a depth that has not keeps its prior
    scaled by how far the fitted depths sit from theirs at half capacity. A bench prior leaves
    out what slows every depth alike (other requests' prefills in the batch, the host), and
    judging running depths by measurement but idle ones by the prior would favour idle ones."""
    ratios = [
        fit.iteration_time(half) / prior.iteration_time(half)
        for k, fit in fitted.items()
        if (prior := priors.get(k)) is not None and (half := max(1, prior.capacity // 2))
    ]
    scale = sum(ratios) / len(ratios) if ratios else 1.0
    return {
        k: fitted.get(k)
        or msgspec.structs.replace(
            p, intercept_s=p.intercept_s * scale, per_token_s=p.per_token_s * scale
        )
        for k, p in priors.items()
    }


class Curve(msgspec.Struct, frozen=True, kw_only=True):
    """Per-position acceptance `a_j = first * decay ** (j - 1)` (at most 1): E_k from two
    numbers, fitted to the shallowest and deepest depths measured; measured depths as seen."""

    first: float
    decay: float
    seen: dict[int, float] = msgspec.field(default_factory=dict)

    def at(self, steps: int) -> float:
        if steps <= 0:
            return 1.0
        measured = self.seen.get(steps)
        return measured if measured is not None else _curve(self.first, self.decay, steps)


def _curve(first: float, decay: float, steps: int) -> float:
    total, run, rate = 1.0, 1.0, first
    for _ in range(steps):
        run *= min(1.0, rate)
        total += run
        rate *= decay
    return total


def _bisect(f: Callable[[float], float], low: float, high: float) -> float:
    """The x in [low, high] where the increasing `f` crosses 0 (an end if it does not)."""
    if f(low) >= 0:
        return low
    if f(high) <= 0:
        return high
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) < 0 else (low, mid)
    return (low + high) / 2


def fit_curve(seen: Mapping[int, float], alpha: float) -> Curve:
    """The curve through the shallowest and deepest measured accept lengths (a constant rate,
    `alpha`'s if nothing was measured, when only one depth was)."""
    depths = sorted(k for k in seen if k > 0)
    if not depths:
        return Curve(first=alpha, decay=1.0)
    lo, hi = depths[0], depths[-1]
    if lo == hi:
        return Curve(first=alpha_from_accept_length(seen[lo], lo), decay=1.0, seen=dict(seen))

    def first_for(decay: float) -> float:
        return _bisect(lambda a: _curve(a, decay, lo) - seen[lo], 0.0, 1.0)

    decay = _bisect(lambda q: _curve(first_for(q), q, hi) - seen[hi], 0.05, 1.0)
    return Curve(first=first_for(decay), decay=decay, seen=dict(seen))


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
        """E_k for `klass`: measured at that depth if seen, else from its fitted curve."""
        return self.curve(klass).at(steps)
