"""What the depth loop reads as the class mix in flight, beside what was in flight: one run of
the product's loop in virtual time (`depth_sim`), and at each `--at` the planner's first plan
from then on: the class shares of its regime, the true shares of the requests in flight over
the `--window` before (counted at each plan), and the planner's forecast of each `--forecast`
pool for the users it planned for and for the same number split as they were in flight.
Compare the forecasts with the same pools held from the start (`depth_sim.py --pool launched
--restart 1:0:k1 ...`).

    .venv/bin/python benchmarks/inflight_split.py --trace scenarios/depth-temperature-swing.toml \\
        --startup 46.4 --at 1510 --forecast 1,7,7 --forecast 3,7,3 --forecast 7,7,7
"""

from __future__ import annotations

import argparse
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from depth_pools import ROOT, pools
from depth_sim import DepthSim

from specroute.bench.trace import load_scenario
from specroute.planner import Planner, Setting
from specroute.planner.estimates import Estimates
from specroute.planner.forecast import forecast, user_split


def _shares(counts: Mapping[str, float]) -> dict[str, float]:
    total = sum(counts.values())
    return {c: n / total for c, n in sorted(counts.items())} if total else {}


def _short(shares: Mapping[str, float]) -> str:
    return ", ".join(f"{c.rsplit(':', 1)[-1]} {s:.1%}" for c, s in shares.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--trace", default=str(ROOT / "scenarios" / "depth-temperature-swing.toml"))
    parser.add_argument("--startup", type=float, default=None, help="seconds (default: profile)")
    parser.add_argument("--at", type=float, action="append", required=True, help="seconds")
    parser.add_argument("--window", type=float, default=300.0, help="seconds of true in-flight")
    parser.add_argument("--forecast", action="append", default=[], metavar="K,K,K")
    args = parser.parse_args()
    pending = sorted(args.at)
    pools_to_show = [tuple(int(k) for k in f.split(",")) for f in args.forecast]
    sim = DepthSim(args.profile, pools(args.profile)["auto"], seed=0, startup_s=args.startup)
    seen: deque[tuple[float, dict[str, float]]] = deque()
    original = Planner.plan

    def plan(self: Planner, now: float, servers: Sequence[Any], est: Estimates) -> Any:
        counts: dict[str, float] = {}
        for req in sim.reqs.values():
            counts[req.klass] = counts.get(req.klass, 0.0) + 1
        seen.append((now, counts))
        while seen and seen[0][0] < now - args.window:
            seen.popleft()
        if pending and now >= pending[0]:
            pending.pop(0)
            _report(self, now, est, seen, pools_to_show)
        return original(self, now, servers, est)

    Planner.plan = plan  # type: ignore[method-assign]
    try:
        sim.run(load_scenario(args.trace), "auto", 1.0, ())
    finally:
        Planner.plan = original  # type: ignore[method-assign]


def _report(
    planner: Planner,
    now: float,
    est: Estimates,
    seen: Sequence[tuple[float, Mapping[str, float]]],
    shown: Sequence[tuple[int, ...]],
) -> None:
    regime = planner.regimes.view(now)
    true: dict[str, float] = {}
    for _, counts in seen:
        for c, n in counts.items():
            true[c] = true.get(c, 0.0) + n
    users = user_split(regime.concurrency, regime.shares)
    flight = user_split(regime.concurrency, true)
    print(f"at {now:.0f} s, {regime.concurrency:.1f} in flight")
    print(f"  the loop's mix:      {_short(regime.shares)}")
    print(f"  in flight, last {seen[-1][0] - seen[0][0]:.0f} s: {_short(_shares(true))}")
    for settings in shown:
        pool = [Setting(steps=k) for k in settings]
        fc, held = forecast(pool, users, est), forecast(pool, flight, est)
        label = "/".join(f"k{k}" for k in settings)
        print(f"  forecast {label}: {fc.tok_s:.0f} tok/s ({held.tok_s:.0f} as in flight)")


if __name__ == "__main__":
    main()
