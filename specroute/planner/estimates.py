"""What the planner knows of each depth and each workload class: R(k) and T(b, k) per depth
(as the proxy's fits of the depths that run show them), and E_k per class from the shared
model's acceptance curve (`specroute.speculation`), as the router values it."""

from __future__ import annotations

import msgspec

from specroute.policies import ClassEstimate
from specroute.speculation import PRIOR_ALPHA, Curve, fit_curve, iteration_time, measured_time

__all__ = ["DepthEstimate", "Estimates"]


class DepthEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """What is known of one depth: R(k) and `T(b) = intercept_s + per_token_s * b * (k + 1)`,
    or, where `measured` has points (tune's; for a depth a server runs, scaled through its live
    fit), T read between them at b * (k + 1) tokens (`speculation.measured_time`)."""

    steps: int
    capacity: int
    intercept_s: float
    per_token_s: float
    measured: tuple[tuple[float, float], ...] = ()

    def iteration_time(self, batch: float) -> float:
        if self.measured:
            tokens = batch * (max(0, self.steps) + 1)
            return measured_time(self.measured, tokens, self.per_token_s)
        return iteration_time(self.intercept_s, self.per_token_s, batch, self.steps)


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
