"""How long one plan takes as the pool grows: the planner `specroute launch --reconfigure auto`
runs every `plan_every` ticks (10 s by default) on its event loop, valuing pools over the
horizon's loads. Estimates as the loop reads them at start from the profile's tune prior
(`rule_bound.Rule`'s way), servers at the prior's recommended depth, after twenty minutes of a
busy sampled regime and twenty of a quiet mostly-greedy one (20 and 0.7 users per server):
the plan that moves the most. Prints, per pool size, the pools valued and the time of a plan
with the search bounded (`planner.search.SEARCH_LIMIT`, what runs) and, up to `--every-up-to`
servers, of every pool valued (what ran before the bound):

    .venv/bin/python benchmarks/plan_time.py --servers 3,4,5,6,8,12,16
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from depth_pools import pools
from depth_sim import LAUNCH_LIMIT, DepthSim

from specroute.planner import Estimates, Planner, PlannerOptions, ServerState, search
from specroute.reconfigure.readings import estimates


def plan_seconds(planner: Planner, now: float, servers: list[ServerState], est: Estimates) -> float:
    """The median of three plans' wall time (each a fresh search: nothing is kept between)."""
    times = []
    for i in range(3):
        started = time.perf_counter()
        planner.plan(now + 10.0 * i, servers, est)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--servers", default="3,4,5,6,8,12,16", help="pool sizes")
    parser.add_argument(
        "--every-up-to", type=int, default=8,
        help="value every pool too, up to this many servers (slow past 8)",
    )  # fmt: skip
    args = parser.parse_args()
    auto = pools(args.profile)["auto"]
    allowed = auto.allowed or (0, 1, 2, 3)
    sim = DepthSim(args.profile, auto)
    est = estimates(sim.snapshot(), allowed, lambda k: LAUNCH_LIMIT)
    if est is None:
        raise SystemExit(f"{args.profile}: the prior gives the planner no estimates")
    setting = auto.settings[0]
    greedy, sampled = f"{sim.model}:greedy", f"{sim.model}:sampled"
    options = PlannerOptions(max_steps=max(allowed), confirm_s=0.0)
    print(f"profile {args.profile}, depths {min(allowed)}-{max(allowed)}, servers at "
          f"{setting.label}, search bound {search.SEARCH_LIMIT} pools")  # fmt: skip
    print(f"{'servers':>7} {'every pool':>10} {'valued':>7} {'plan s':>8} {'every pool s':>13}")
    for n in (int(x) for x in args.servers.split(",")):
        planner = Planner(options)
        now = 0.0
        for duration, users in ((1200.0, {sampled: 20.0 * n}),
                                (1200.0, {greedy: 0.7 * n, sampled: 0.3 * n})):  # fmt: skip
            end = now + duration
            while now < end:
                planner.observe(now, users)
                now += 2.0
        limit = est.depths[setting.deepest].capacity
        servers = [ServerState(name=f"b{i}", setting=setting, startup_s=60.0, limit=2 * limit)
                   for i in range(n)]  # fmt: skip
        choices = len(planner.choices)
        every = math.comb(choices + n - 1, n)
        valued = len(search.candidates(tuple(s.setting for s in servers), planner.choices))
        bounded = plan_seconds(planner, now, servers, est)
        whole = "-"
        if n <= args.every_up_to and every > valued:
            kept = search.SEARCH_LIMIT
            search.SEARCH_LIMIT = every
            try:
                whole = f"{plan_seconds(planner, now, servers, est):13.2f}"
            finally:
                search.SEARCH_LIMIT = kept
        print(f"{n:7d} {every:10d} {valued:7d} {bounded:8.2f} {whole:>13}", flush=True)


if __name__ == "__main__":
    main()
