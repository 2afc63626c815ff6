"""The issue's targets for one run of every pool on one trace (`depth_bound.py`): auto against
the best fixed pool, the launched pool never reconfigured and the envelope, the headroom it
captures and its forecasts' error; and the one-line-per-trace table the docs quote."""

from __future__ import annotations

from dataclasses import dataclass

from sim_results import SimResult

from specroute.bench.stats import percentile

NEVER_BEHIND = 0.005
"""Auto may trail the best fixed pool and the launched one by this fraction at most."""
KEEP = 0.85
"""Share of the envelope's headroom over the best alternative auto must capture."""


@dataclass(frozen=True)
class Verdict:
    profile: str
    trace: str
    auto: float
    best_fixed: str
    fixed: float
    launched: float
    envelope: float
    best_alternative: float
    """The best of the fixed pools and the launched one (the envelope's choices)."""
    restarts: int
    forecast_errors: tuple[float, ...]
    from_launched: float | None = None
    """The envelope from the launched pool (`depth_bound.envelope(start="launched")`): the
    most a loop `launch` starts could give over the fixed pools (None: no launched pool run);
    a mixed pool may give more."""

    @property
    def reachable(self) -> bool | None:
        """Whether never behind is within the bound from the launched pool: an oracle over
        the fixed pools that starts there and pays only its restarts' start-ups is within
        `NEVER_BEHIND` of the best fixed pool (None: no bound)."""
        if self.from_launched is None:
            return None
        return self.from_launched / self.fixed >= 1 - NEVER_BEHIND

    @property
    def capture(self) -> float | None:
        """auto's share of the envelope's headroom over the best alternative (None: under
        `NEVER_BEHIND`, too little to be a share of)."""
        room = self.envelope - self.best_alternative
        meaningful = room > NEVER_BEHIND * self.best_alternative
        return (self.auto - self.best_alternative) / room if meaningful else None

    @property
    def forecast_error(self) -> float | None:
        """Median |forecast - realized| / realized over the changes that settled."""
        errors = self.forecast_errors
        return percentile(list(errors), 50) if errors else None

    def met(self) -> bool:
        """Never behind: within `NEVER_BEHIND` of the best fixed pool and of the launched one."""
        return min(self.auto / self.fixed, self.auto / self.launched) >= 1 - NEVER_BEHIND

    def row(self) -> str:
        capture = "-" if self.capture is None else f"{self.capture:.0%}"
        error = self.forecast_error
        errors = "-" if error is None else f"{error:.1%} ({len(self.forecast_errors)})"
        mark = "" if self.met() else " **behind**"
        bound = "-"
        if self.from_launched is not None:
            bound = f"{self.from_launched:.0f}: {self.from_launched / self.fixed - 1:+.1%}"
            bound += "" if self.reachable else " **out of reach over the fixed pools**"
        return (
            f"| {self.profile} | {self.trace} | {self.auto:.0f}{mark} | {self.best_fixed} "
            f"{self.fixed:.0f}: {self.auto / self.fixed - 1:+.1%} | {self.launched:.0f}: "
            f"{self.auto / self.launched - 1:+.1%} | {self.envelope:.0f} "
            f"({self.envelope / self.best_alternative - 1:+.1%}) | {capture} | {self.restarts} "
            f"| {errors} | {bound} |"
        )


HEADER = [
    "| profile | trace | auto | best fixed (k0-k7) | launched, never reconfigured | "
    "envelope (over the best alternative) | headroom captured | restarts | forecast error | "
    "bound from the launched pool (against the best fixed) |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def forecast_errors(result: SimResult) -> tuple[float, ...]:
    """|forecast - realized| / realized of each change with a verdict."""
    return tuple(abs(a.forecast_error) for a in result.accounts if a.forecast_error is not None)


def verdict(
    profile: str,
    trace: str,
    results: dict[str, SimResult],
    envelope: float,
    bounded: list[str],
    from_launched: float | None = None,
) -> Verdict:
    """The targets for one trace; `bounded`: the pools the envelope chooses among;
    `from_launched`: the envelope from the launched pool, where it ran."""
    total = results["auto"].phases[-1][2]
    rate = {p: r.window(0, total)[0] for p, r in results.items()}
    fixed = max((p for p in rate if p.startswith("k")), key=lambda p: rate[p])
    auto = results["auto"]
    errors = forecast_errors(auto)
    return Verdict(
        profile=profile,
        trace=trace,
        auto=rate["auto"],
        best_fixed=fixed,
        fixed=rate[fixed],
        launched=rate.get("launched", rate.get("mix-1-2-3", rate["auto"])),
        envelope=envelope,
        best_alternative=max(rate[p] for p in bounded),
        restarts=len(auto.restarts),
        forecast_errors=errors,
        from_launched=from_launched,
    )
