"""Latency lanes in virtual time: an interactive minority and a batch majority on one pool,
routed by the real `throughput` policy with and without lanes, beside fixed deep pools.

`policy_sim.PoolSim`'s engines, users and phases (scenarios/policy-eval.toml); a share of the
requests is interactive (greedy code and low-temperature chat, up to 256 tokens), the rest batch
(sampled at 0.9, up to 768 tokens). With lanes, requests carry their lane and target, the view
carries the reserve and the interactive requests queued, and the queue admits interactive
users first, as the proxy does. Prints, per configuration, the interactive lane's median
per-request tok/s in each phase, its target attainment, the aggregate tok/s over the trace and
the batch lane's p99 queue wait:

    .venv/bin/python benchmarks/lanes_sim.py --share 0.2 --steps 1,3,5
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import msgspec
from policy_sim import Draw, PhaseStats, PoolSim, load_phases

from specroute.bench.stats import percentile
from specroute.lanes import BATCH, INTERACTIVE
from specroute.policies import Decision, Outcome, Policy, PoolView, RouteRequest, create

INTERACTIVE_DRAWS = (Draw("greedy", 0.0, 256, False), Draw("chat", 0.3, 256, False))
BATCH_DRAW = Draw("sampled", 0.9, 768, False)


class LanesSim(PoolSim):
    """A pool whose requests are interactive with probability `share`; with `lanes` they say
    so, else every request is routed and queued alike."""

    def __init__(
        self, profile: str, steps: list[int], policy: Policy, *, share: float, lanes: bool,
        seed: int,
    ) -> None:  # fmt: skip
        super().__init__(profile, steps, policy, seed=seed)
        self.share = share
        self.lanes = lanes
        self.pending: dict[int, Draw] = {}  # a waiting user's next request, drawn once
        self.asked: dict[int, float] = {}  # when a waiting user first found no room
        self.waits: dict[str, list[float]] = {INTERACTIVE: [], BATCH: []}

    def _next(self, user: int) -> Draw:
        if user not in self.pending:
            if self.rng.random() < self.share:
                draw = self.rng.choice(INTERACTIVE_DRAWS)
                lane = INTERACTIVE
            else:
                draw, lane = BATCH_DRAW, BATCH
            self.pending[user] = Draw(
                draw.workload, draw.temperature, draw.max_tokens, draw.ignore_eos, lane
            )
        return self.pending[user]

    def _lane(self, user: int) -> str:
        return self._next(user).lane

    def draw_for(self, user: int) -> Draw:
        draw = self._next(user)
        del self.pending[user]
        asked = self.asked.pop(user, None)
        wait = 0.0 if asked is None else self.now - asked
        if self.phase is not None and self.sending:
            self.waits[draw.lane].append(wait)
        return draw

    def send(self, user: int) -> None:
        self._next(user)
        if not any(map(self.admits, range(len(self.nodes)))):
            self.asked.setdefault(user, self.now)
        super().send(user)

    def interactive_waiting(self) -> int:
        return sum(self._lane(u) == INTERACTIVE for u in self.waiting) if self.lanes else 0

    def next_waiting(self) -> int:
        if self.lanes:
            for i, user in enumerate(self.waiting):
                if self._lane(user) == INTERACTIVE:
                    return i
        return 0


class WithoutLanes:
    """`policy` as a proxy without lanes runs it: every request is in the default lane."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        return self.policy.choose(msgspec.structs.replace(request, lane=BATCH), view)

    def observe(self, outcome: Outcome) -> None:
        self.policy.observe(msgspec.structs.replace(outcome, lane=BATCH))


@dataclass
class Result:
    name: str
    phases: list[PhaseStats]
    waits: dict[str, list[float]]
    interactive: list[list[float]]  # per phase: the interactive requests' speeds


def run(name: str, steps: list[int], policy: str, share: float, lanes: bool, *,
        profile: str, target: float, reserve: int, seed: int, scale: float) -> Result:  # fmt: skip
    routing = create(policy) if lanes else WithoutLanes(create(policy))
    sim = LanesSim(profile, steps, routing, seed=seed, share=share, lanes=lanes)
    sim.target_tok_s = target if lanes else 0.0
    sim.reserve = reserve if lanes else 0
    phases = [sim.run_phase(n, u, d) for n, u, d in load_phases(scale)]
    interactive = [p.lane_speeds.get(INTERACTIVE, []) for p in phases]
    return Result(name, phases, sim.waits, interactive)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--steps", default="1,3,5", help="the pool the lanes run on")
    parser.add_argument("--deep", default="3,4,5,6,7", help="fixed deep pools to compare")
    parser.add_argument("--share", type=float, default=0.2, help="interactive share")
    parser.add_argument("--target", type=float, default=100.0, help="interactive tok/s")
    parser.add_argument("--reserve", type=int, default=8)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    common = {"profile": args.profile, "target": args.target, "reserve": args.reserve,
              "seed": args.seed, "scale": args.scale}  # fmt: skip
    deep = [int(s) for s in args.deep.split(",") if s]
    results = [
        run(f"lanes {args.steps}", steps, "throughput", args.share, True, **common),
        run(f"no lanes {args.steps}", steps, "throughput", args.share, False, **common),
        *(run(f"3 x k{k}", [k] * 3, "least_loaded", args.share, False, **common) for k in deep),
    ]
    names = [p.name for p in results[0].phases]
    print(f"interactive share {args.share:.0%}, target {args.target:.0f} tok/s, "
          f"reserve {args.reserve}, profile {args.profile}")  # fmt: skip
    print(f"{'pool':18} {'agg tok/s':>9} {'met':>5} {'batch p99 wait':>14} | interactive median "
          "tok/s per phase: " + " ".join(names))  # fmt: skip
    for r in results:
        tokens = sum(p.tokens for p in r.phases)
        time = sum(p.end - p.start for p in r.phases)
        speeds = [s for phase in r.interactive for s in phase]
        met = sum(s >= args.target for s in speeds) / len(speeds) if speeds else float("nan")
        waits = r.waits[BATCH]
        p99 = percentile(waits, 99) if waits else 0.0
        cells = " ".join(f"{percentile(s, 50) if s else float('nan'):7.1f}" for s in r.interactive)
        print(f"{r.name:18} {tokens / time:9.0f} {met:5.0%} {p99:12.2f} s | {cells}")


if __name__ == "__main__":
    main()
