"""A forecast places users one at a time, and a server keeps its scores until it takes a user
(`_Server.scored`): the forecasts must be those of scoring every server afresh at every
placement, for every objective, pool and load."""

from __future__ import annotations

import itertools

import pytest
from test_planner import GREEDY, SAMPLED, estimates

from specroute.planner import Setting, forecast
from specroute.planner.forecast import Physics, _Server


def _afresh(self: _Server, klass: str, objective: str, floor: float) -> float | None:
    _, tok_s, speeds = self.rates(self.joined(klass))
    if objective == "latency":
        return speeds[klass]
    if objective == "goodput" and min(speeds.values()) < floor:
        return None
    return tok_s - self.tok_s


POOLS = [
    tuple(Setting(steps=k) for k in pool)
    for pool in ((1, 2, 3), (0, 7, 7), (2, 2, 2, 2, 5, 7), (3, 3, 3, 3, 3, 3, 3, 3))
]
LOADS = [{GREEDY: 2.0}, {GREEDY: 5.0, SAMPLED: 19.0}, {GREEDY: 3.4, SAMPLED: 60.6}]


@pytest.mark.parametrize("objective", ["throughput", "latency", "goodput"])
def test_kept_scores_give_the_forecasts_of_scoring_afresh(
    objective: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    est = estimates()
    cases = list(itertools.product(POOLS, LOADS))
    kept = [forecast(p, u, Physics(est), objective, 60.0) for p, u in cases]  # type: ignore[arg-type]
    monkeypatch.setattr(_Server, "score", _afresh)
    afresh = [forecast(p, u, Physics(est), objective, 60.0) for p, u in cases]  # type: ignore[arg-type]
    assert kept == afresh
    assert any(fc.servers[0].running != fc.servers[-1].running for fc in kept)
