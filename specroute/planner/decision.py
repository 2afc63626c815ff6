"""What the planner is given and what it decides: its options, the servers as the actuator
reports them, the changes, and the plan with its numbers (rendered for `GET /plan`)."""

from __future__ import annotations

from typing import Literal

import msgspec

from specroute.planner.forecast import Forecast, Objective, Setting, Tier
from specroute.planner.regime import Regime

__all__ = ["DEFAULT_DWELL_S", "Change", "Plan", "PlannerOptions", "ServerPhase", "ServerState"]

ServerPhase = Literal["serving", "draining", "starting"]


DEFAULT_DWELL_S = 900.0
"""Least time between two depth changes of one server, unless the operator says otherwise."""


class PlannerOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """objective and floor_tok_s: as the `throughput` policy's. A change commits the pool for
    its restarts plus `min_dwell_s`, and is held after that while the regime lasts; over that
    horizon, under the regimes the pool has seen (the current one for as long as it is
    expected to last, the next ones for what the commit has left once it ends), it must gain
    `min_gain` (a fraction of the objective) and exceed `margin` times the objective lost
    while it restarts.
    `adaptive`: SGLang adaptive configurations (tiers) that may be assigned besides the fixed
    depths 0..max_steps; `tables`: vLLM's K per batch size likewise, the planner's own table
    for the regime's class mix at each depth (`planner.tables`)."""

    objective: Objective = "throughput"
    floor_tok_s: float = 0.0
    max_steps: int = 7
    """Deepest fixed depth assigned (the draft head's own limit, or memory's)."""
    adaptive: tuple[tuple[Tier, ...], ...] = ()
    tables: bool = False
    margin: float = 1.5
    min_gain: float = 0.03
    """Hysteresis: a proposal gaining less than this fraction of the objective is no change."""
    min_dwell_s: float = DEFAULT_DWELL_S
    """Least time between two changes of one server within one load regime (a regime that
    settled since its last change may change it sooner)."""
    max_unavailable: int = 1
    """Servers draining or starting at once, at most."""
    settle_s: float = 120.0
    """A regime younger than this is not acted on (longer than a restart takes)."""
    confirm_s: float = 30.0
    """A proposal must stand this long, plan after plan, before its first restart: the
    estimators' noise (acceptance follows the last few thousand verifies) does not restart."""
    drain_s: float = 30.0
    """Expected drain time before a restart, counted before the gain arrives."""
    overcommit: float = 2.0
    """A server's admission limit as a multiple of its capacity, when it did not say."""
    peak_concurrency: float | None = None
    """The peak load: restarts are charged at it when their regime may end first, and every
    proposed pool must stay reconfigurable under it (a pool all deep would be stuck there,
    since no server could restart while the others hold that load). None: for the charge,
    the slots of the pool as the planner first saw it (what the operator launched); for
    reconfigurability, every load that launched pool could restart a server under (its
    admission limits less its largest server's); either way the highest load seen if more."""
    regime_prior_s: float = 1800.0
    """The operator's prior for how long a load regime lasts, before any has been seen."""
    regime_prior_weight: float = 1.0
    """How many seen regimes the prior counts as."""
    regime_min_s: float = 0.0
    """How long the operator knows a load regime lasts at the least (0: nothing known, the
    lengths are learned): a regime younger than this is expected to last until it is this
    old, whatever has been seen. Where load changes by the hour, 3600 lets the first quiet
    spell take the pool deep minutes in, not tens of minutes; where it changes faster, the
    loop restarts for regimes that end before the restart pays."""
    band: float = 1.5
    """A regime ends when concurrency moves by this ratio..."""
    mix_shift: float = 0.25
    """...or the class mix by this much (total variation distance)."""
    window_s: float = 60.0
    """Load is averaged over this window to tell regimes apart."""
    regret_cap: float = 0.3
    """The most that changes which did not pay may add to `min_gain`."""

    def __post_init__(self) -> None:
        if self.max_unavailable < 1 or self.max_steps < 0:
            raise ValueError("max_unavailable must be >= 1 and max_steps >= 0")
        if self.margin < 0 or self.min_gain < 0 or self.band <= 1:
            raise ValueError("margin and min_gain must be >= 0, band > 1")
        if self.regime_min_s < 0:
            raise ValueError("regime_min_s must be >= 0")


class ServerState(msgspec.Struct, frozen=True, kw_only=True):
    """One server as the actuator reports it. A server draining or starting carries the
    setting it is restarting into; `changed_at` is when its depth last changed."""

    name: str
    setting: Setting
    startup_s: float
    state: ServerPhase = "serving"
    limit: int | None = None
    """Its admission limit (None: `overcommit` x its capacity at its setting)."""
    changed_at: float | None = None
    previous: Setting | None = None
    """Its setting before that change: it is not changed back within the same regime."""


class Change(msgspec.Struct, frozen=True, kw_only=True):
    server: str
    before: Setting
    after: Setting
    cost_tokens: float
    """Objective lost while it drains and restarts (its tok/s less what the others absorb)."""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner compared and decided; rendered as JSON for `GET /plan`."""

    at: float
    verdict: str
    """`reconfigure` or `hold: <why>`."""
    reason: str
    regime: Regime
    current: Forecast
    proposed: Forecast | None = None
    expected: Forecast | None = None
    """The pool once the changes begun now are done, at this regime: what they are held to."""
    gain: float = 0.0
    """Proposed minus current objective (tok/s; mean tok/s per user for `latency`)."""
    gain_tokens: float = 0.0
    """The gain over the horizon once the restarts are done (the objective's unit times
    seconds: tokens for `throughput` and `goodput`), under the load the pool has seen."""
    restart_cost_tokens: float = 0.0
    horizon_s: float = 0.0
    """What a change commits the pool to: its restarts plus the dwell."""
    bar: float = 0.0
    """The gain a change had to promise, as a fraction of the objective (regret raises it)."""
    changes: tuple[Change, ...] = ()
    """Every change the proposal needs."""
    start: tuple[Change, ...] = ()
    """The changes to begin now."""
