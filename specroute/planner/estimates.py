"""What the planner knows of each depth and each workload class: R(k) and T(b, k) per depth
(bench priors corrected by what the running depths show), and E_k per class from the shared
model's acceptance curve (`specroute.speculation`), as the router values it."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from specroute.policies import ClassEstimate
from specroute.speculation import PRIOR_ALPHA, Curve, fit_curve, iteration_time

__all__ = ["DepthEstimate", "Estimates", "calibrated"]


class DepthEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """What is known of one depth: R(k) and `T(b) = intercept_s + per_token_s * b * (k + 1)`."""

    steps: int
    capacity: int
    intercept_s: float
    per_token_s: float

    def iteration_time(self, batch: float) -> float:
        return iteration_time(self.intercept_s, self.per_token_s, batch, self.steps)


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

    def curve(self, klass: str) -> Curve:
        """`klass`'s acceptance by depth; an unseen class at the prior's constant rate."""
        est = self.classes.get(klass)
        if est is None:
            return Curve(first=self.prior_alpha, decay=1.0)
        return fit_curve(est.accept_length, est.alpha)

    def accept_length(self, klass: str, steps: int) -> float:
        """E_k for `klass`, from its fitted curve (the router's value too)."""
        return self.curve(klass).at(steps)
