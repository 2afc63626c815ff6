"""When the depth loop's regimes end, and on what: one run of the product's loop in virtual time
(`depth_sim`, the auto pool with launch's defaults), and for every regime that ends, its end,
its length, its load and mix, the class shares each window was compared with (the window it
started on, or the one where its band last moved) and those of the window that ended it. A
regime that ends on a window like its own mix ended on its first window, not on a change of
load:

    .venv/bin/python benchmarks/regime_ends.py --profile h200-qwen35-122b-shape \\
        --trace scenarios/depth-swing.toml --until 5400
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import msgspec
from depth_pools import ROOT, pools
from depth_sim import DepthSim

from specroute.bench.trace import Scenario, load_scenario
from specroute.logs import configure_logging
from specroute.planner import RegimeTracker


def _cut(scenario: Scenario, until: float | None) -> Scenario:
    """`scenario`'s first `until` seconds (all of it when None)."""
    if until is None:
        return scenario
    phases, start = [], 0.0
    for phase in scenario.phases:
        if start < until:
            phases.append(
                msgspec.structs.replace(phase, duration=min(phase.duration, until - start))
            )
        start += phase.duration
    return msgspec.structs.replace(scenario, phases=phases)


def _short(shares: Mapping[str, float]) -> str:
    return ", ".join(f"{c.rsplit(':', 1)[-1]} {s:.0%}" for c, s in sorted(shares.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--trace", default=str(ROOT / "scenarios" / "depth-quiet-3.toml"))
    parser.add_argument("--until", type=float, default=None, help="stop after this many seconds")
    args = parser.parse_args()
    configure_logging("warning")  # the loop's plan lines would drown the ends
    original = RegimeTracker.observe

    def observe(self: RegimeTracker, now: float, by_class: Mapping[str, float]) -> None:
        ended, first = len(self.past), self._ref_shares  # the reference each window meets
        original(self, now, by_class)
        if len(self.past) > ended:
            p = self.past[-1]
            print(f"{now:8.0f} s: a regime of {p.duration_s:.0f} s ended "
                  f"({p.concurrency:.1f} users; its mix {_short(p.shares)}; its first window "
                  f"{_short(first)}; the window that ended it {_short(self.shares)})")  # fmt: skip

    RegimeTracker.observe = observe  # type: ignore[method-assign]
    sim = DepthSim(args.profile, pools(args.profile)["auto"], seed=0)
    try:
        sim.run(_cut(load_scenario(args.trace), args.until), "auto", 1.0, ())
    finally:
        RegimeTracker.observe = original  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
