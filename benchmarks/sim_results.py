"""What one simulated run of a pool gives (`depth_sim.py`): tokens per time bin, each finished
request's speed, the restarts, the loop's decisions and its changes' accounts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specroute.bench.stats import mean, percentile
from specroute.wire import Account

BIN_S = 5.0
"""Tokens are counted in bins of this many seconds, by the time they were emitted."""


@dataclass
class Restart:
    server: str
    before: str
    after: str
    began: float
    ready: float | None = None
    aborted: int = 0
    reason: str = ""


@dataclass
class SimResult:
    pool: str
    phases: list[tuple[str, float, float]]
    bins: list[float]
    finished: list[tuple[float, float]]
    """(finish time, per-request tok/s = 1 / TPOT) of every request with two tokens or more."""
    restarts: list[Restart] = field(default_factory=list)
    plans: dict[str, int] = field(default_factory=dict)
    decisions: list[tuple[float, str, str, tuple[str, ...]]] = field(default_factory=list)
    """(time, verdict, reason, the servers its changes begin) of every plan the loop made."""
    accounts: list[Account] = field(default_factory=list)

    def window(self, start: float, end: float) -> tuple[float, float, float]:
        """(aggregate tok/s, mean and p10 per-request tok/s) over [start, end)."""
        first, last = int(start // BIN_S), math.ceil(end / BIN_S)
        tokens = sum(self.bins[first:last])
        speeds = [v for t, v in self.finished if start <= t < end]
        p10 = percentile(speeds, 10) if speeds else 0.0
        return tokens / max(end - start, 1e-9), mean(speeds) if speeds else 0.0, p10
