"""What the planner knows of each depth and each workload class: R(k) and T(b, k) per depth
(bench priors corrected by what the running depths show), E_k per class, measured where seen
and extrapolated past the deepest depth seen."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from specroute.policies import ClassEstimate
from specroute.speculation import PRIOR_ALPHA, alpha_from_accept_length, expected_tokens

__all__ = ["DepthEstimate", "Estimates", "calibrated"]


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


class Estimates(msgspec.Struct, frozen=True, kw_only=True):
    """The estimators the planner reads: every depth it may assign, acceptance per class."""

    depths: dict[int, DepthEstimate]
    classes: dict[str, ClassEstimate] = msgspec.field(default_factory=dict)
    prior_alpha: float = PRIOR_ALPHA

    def accept_length(self, klass: str, steps: int) -> float:
        """E_k for `klass`: measured at that depth if seen; past the deepest seen depth, the
        per-position acceptance goes on decaying as it did; else from the class's alpha (the
        prior's if the class is unseen)."""
        if steps <= 0:
            return 1.0
        est = self.classes.get(klass)
        if est is None:
            return expected_tokens(self.prior_alpha, steps)
        seen = est.accept_length
        if steps in seen:
            return seen[steps]
        deeper = [d for d in seen if d > steps]
        if deeper:
            d = min(deeper)
            return expected_tokens(alpha_from_accept_length(seen[d], d), steps)
        if not seen:
            return expected_tokens(est.alpha, steps)
        return _extrapolate(seen, max(seen), steps)


def _extrapolate(seen: Mapping[int, float], d: int, steps: int) -> float:
    """E_steps from E_d: each further position accepts at the last seen position's rate times
    the ratio of the last two positions' rates (acceptance decays with draft position)."""
    lengths = {-1: 0.0, 0: 1.0, **seen}
    if d - 1 not in lengths:
        return expected_tokens(alpha_from_accept_length(lengths[d], d), steps)

    def rate(j: int) -> float | None:
        """Acceptance of draft position j given j - 1 were accepted, where seen."""
        if j - 2 not in lengths or lengths[j - 1] - lengths[j - 2] <= 0:
            return None
        return (lengths[j] - lengths[j - 1]) / (lengths[j - 1] - lengths[j - 2])

    last, before = rate(d), rate(d - 1) if d > 1 else None
    last = min(1.0, max(0.0, last if last is not None else 0.0))
    decay = min(1.0, last / before) if before else 1.0
    total, term, r = lengths[d], lengths[d] - lengths[d - 1], last
    for _ in range(steps - d):
        r *= decay
        term *= r
        total += term
    return total
