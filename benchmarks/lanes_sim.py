"""Latency lanes in virtual time: an interactive minority and a batch majority, load from quiet
to saturated, on every fixed pool, the SGLang-adaptive pools, a mixed pool without lanes, the
same pool with lanes, and lanes on a pool the product's depth loop plans (`depth_sim`).

`depth_sim.DepthSim`'s engines, restarts and loop; the phases of scenarios/policy-eval.toml
(durations times `--scale`). A share of the requests is interactive (greedy code and
low-temperature chat, up to 256 tokens), the rest batch (sampled at 0.9, up to 768 tokens).
With lanes, requests carry their lane and target, the view carries the reserve and the
interactive requests queued, the queue admits interactive users first, and `/pool` carries
each lane's load, as the proxy does; the planner reads it there. Without lanes every request
is routed and queued alike. Prints, per pool, the interactive lane's median per-request tok/s
in each phase, its target attainment, the aggregate tok/s over the trace and the batch lane's
p99 queue wait, then the verdicts:

    .venv/bin/python benchmarks/lanes_sim.py --share 0.2 --scale 10
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass, field

import msgspec
from depth_pools import ROOT, SERVERS, PoolSpec, pools, tuned
from depth_sim import DepthSim
from policy_sim import Draw, Req
from sim_results import SimResult

from specroute.bench.stats import percentile
from specroute.bench.trace import Scenario, load_scenario
from specroute.lanes import BATCH, INTERACTIVE, Lane
from specroute.logs import configure_logging
from specroute.planner import Setting
from specroute.policies import Decision, Outcome, Policy, PoolView, RouteRequest
from specroute.reconfigure import ReconfigureOptions
from specroute.wire import LaneSnapshot, PoolSnapshot

INTERACTIVE_DRAWS = (Draw("greedy", 0.0, 256, False), Draw("chat", 0.3, 256, False))
BATCH_DRAW = Draw("sampled", 0.9, 768, False)
SCENARIO = ROOT / "scenarios" / "policy-eval.toml"
LANES_MIX = "1,3,5"
"""The pool the lanes run on without the planner, and where the planned pool starts."""


class WithoutLanes:
    """`policy` as a proxy without lanes runs it: every request is in the default lane."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        return self.policy.choose(msgspec.structs.replace(request, lane=BATCH), view)

    def observe(self, outcome: Outcome) -> None:
        self.policy.observe(msgspec.structs.replace(outcome, lane=BATCH))


class LanesSim(DepthSim):
    """A pool whose users' requests are interactive with probability `share`; with `lanes`
    they say so, else every request is routed and queued alike."""

    def __init__(self, profile: str, spec: PoolSpec, *, share: float, lanes: bool,
                 target: float, reserve: int, seed: int,
                 reconfigure: ReconfigureOptions | None = None) -> None:  # fmt: skip
        super().__init__(profile, spec, seed=seed, reconfigure=reconfigure)
        if not lanes:
            self.policy = WithoutLanes(self.policy)
        self.share, self.lanes = share, lanes
        self.target_tok_s = target if lanes else 0.0
        self.reserve = reserve if lanes else 0
        self.overtakes = max(1, reserve)  # the proxy's `Admission.overtakes`
        self.interactive_admitted = 0
        self.batch_since: dict[int, int] = {}  # waiting batch users: interactive admitted then
        self.pending: dict[int, Draw] = {}  # a user's next request, drawn once
        self.asked: dict[int, float] = {}  # when a waiting user first found no room
        self.waits: dict[Lane, list[tuple[float, float]]] = {INTERACTIVE: [], BATCH: []}
        self.speeds: dict[Lane, list[tuple[float, float]]] = {INTERACTIVE: [], BATCH: []}
        self.ran: list[tuple[float, str]] = []  # each interactive request: when, which server
        self.kinds: list[tuple[float, str, float]] = []  # each interactive one: when, class, tok/s

    def _next(self, user: int) -> Draw:
        if user not in self.pending:
            lane: Lane
            if self.rng.random() < self.share:
                draw, lane = self.rng.choice(INTERACTIVE_DRAWS), INTERACTIVE
            else:
                draw, lane = BATCH_DRAW, BATCH
            self.pending[user] = Draw(
                draw.workload, draw.temperature, draw.max_tokens, draw.ignore_eos, lane
            )
        return self.pending[user]

    def draw_for(self, user: int) -> Draw:
        draw = self._next(user)
        del self.pending[user]
        self.batch_since.pop(user, None)
        self.interactive_admitted += draw.lane == INTERACTIVE
        asked = self.asked.pop(user, None)
        self.waits[draw.lane].append((self.now, 0.0 if asked is None else self.now - asked))
        return draw

    def send(self, user: int) -> None:
        lane = self._next(user).lane
        if not any(map(self.admits, range(len(self.nodes)))):
            self.asked.setdefault(user, self.now)
            if lane == BATCH:
                self.batch_since.setdefault(user, self.interactive_admitted)
        super().send(user)

    def interactive_waiting(self) -> int:
        if not self.lanes:
            return 0
        return sum(self._next(u).lane == INTERACTIVE for u in self.waiting)

    def next_waiting(self) -> int:
        """The proxy's order: a batch user that `overtakes` interactive ones went ahead of,
        else the first interactive one, else the first."""
        if not self.lanes:
            return 0
        for i, user in enumerate(self.waiting):
            since = self.batch_since.get(user)
            if since is not None and self.interactive_admitted - since >= self.overtakes:
                return i
        for i, user in enumerate(self.waiting):
            if self._next(user).lane == INTERACTIVE:
                return i
        return 0

    def _wake(self) -> None:
        self.waiting = [u for u in self.waiting if u < self.users_now]
        while self.waiting and any(self.admits(i) for i in range(len(self.nodes))):
            self.send(self.waiting.pop(self.next_waiting()))

    def record(self, req: Req, generated: int) -> None:
        super().record(req, generated)
        if generated > 1 and len(req.times) > 1:
            speed = (generated - 1) / (req.times[-1] - req.times[0])
            self.speeds[req.lane].append((self.now, speed))
            if req.lane == INTERACTIVE:
                self.kinds.append((self.now, req.klass, speed))
        if req.lane == INTERACTIVE:
            self.ran.append((self.now, self.nodes[req.backend].name))

    def snapshot(self) -> PoolSnapshot:
        """`/pool` with each lane's load, as the proxy's `LaneStats` reports it."""
        snap = super().snapshot()
        if not self.lanes:
            return snap
        counts: dict[Lane, dict[str, int]] = {INTERACTIVE: {}, BATCH: {}}
        for req in self.reqs.values():
            counts[req.lane][req.klass] = counts[req.lane].get(req.klass, 0) + 1
        waiting: dict[Lane, int] = {INTERACTIVE: 0, BATCH: 0}
        for user in self.waiting:
            draw = self._next(user)
            klass = f"{self.model}:{draw.workload}"
            counts[draw.lane][klass] = counts[draw.lane].get(klass, 0) + 1
            waiting[draw.lane] += 1
        lanes = {
            lane: LaneSnapshot(in_flight=sum(c.values()), waiting=waiting[lane], classes=c,
                               target_tok_s=self.target_tok_s if lane == INTERACTIVE else 0.0)
            for lane, c in counts.items()
        }  # fmt: skip
        return msgspec.structs.replace(snap, lanes=lanes)


@dataclass
class Run:
    name: str
    result: SimResult
    speeds: dict[Lane, list[tuple[float, float]]]
    waits: dict[Lane, list[tuple[float, float]]]
    lanes: bool
    ran: list[tuple[float, str]] = field(default_factory=list)
    """Where each interactive request ran: (when it ended, the server)."""
    kinds: list[tuple[float, str, float]] = field(default_factory=list)
    """Each interactive request's workload class (`model:workload`) and speed: (when it ended,
    class, tok/s)."""

    def interactive(self, start: float, end: float) -> list[float]:
        return [v for t, v in self.speeds[INTERACTIVE] if start <= t < end]

    @property
    def aggregate(self) -> float:
        return self.result.window(0.0, self.result.phases[-1][2])[0]

    def batch_p99_wait(self) -> float:
        waits = [w for _, w in self.waits[BATCH]]
        return percentile(waits, 99) if waits else 0.0


def scenario(servers: int = SERVERS) -> Scenario:
    """scenarios/policy-eval.toml, its users scaled from three servers to `servers`."""
    base = load_scenario(SCENARIO)
    phases = [
        msgspec.structs.replace(p, concurrency=max(1, round(p.concurrency * servers / SERVERS)))
        for p in base.phases
    ]
    return msgspec.structs.replace(base, phases=phases)


def run(
    name: str, spec: PoolSpec, lanes: bool, args: argparse.Namespace, servers: int = SERVERS
) -> Run:
    options = ReconfigureOptions(mode="auto", allowed_steps=tuple(range(8)))
    sim = LanesSim(args.profile, spec, share=args.share, lanes=lanes, target=args.target,
                   reserve=args.reserve, seed=args.seed, reconfigure=options)  # fmt: skip
    result = sim.run(scenario(servers), name, args.scale)
    return Run(name, result, sim.speeds, sim.waits, lanes, sim.ran, sim.kinds)


def configurations(
    mixes: list[str], profile: str, servers: int = SERVERS
) -> list[tuple[str, PoolSpec, bool]]:
    """(name, pool, lanes) of every configuration compared: first lanes with the planner as
    `specroute launch --prior P.json --servers N --reconfigure auto` starts it from the
    profile's tune prior (its pool and depths, the proxy starting from the prior: the product's
    defaults), where one exists; on the first mix lanes with the planner, lanes and no lanes;
    on the others lanes and no lanes; then `servers` servers at each fixed depth and each
    adaptive setting."""
    known = pools()
    out = []
    launched = tuned(profile, servers=servers).get("auto")
    if launched is not None:
        label = "/".join(s.label for s in launched.settings)
        out.append((f"lanes + planner, launched {label}", launched, True))
    for i, text in enumerate(mixes):
        mix = tuple(Setting(steps=int(k)) for k in text.split(","))
        label = "/".join(s.label for s in mix)
        if i == 0:
            spec = PoolSpec(mix, "throughput", planner=True)
            out.append((f"lanes + planner from {label}", spec, True))
        out.append((f"lanes {label}", PoolSpec(mix, "throughput"), True))
        out.append((f"no lanes {label}", PoolSpec(mix, "throughput"), False))
    alike = {f"k{k}": known[f"k{k}"] for k in range(8)}
    alike.update((n, known[n]) for n in ("adaptive<=3", "adaptive<=7"))
    return out + [
        (f"{servers} x {n}", PoolSpec((spec.settings[0],) * servers, spec.policy), False)
        for n, spec in alike.items()
    ]


def _median(values: list[float]) -> float:
    return percentile(values, 50) if values else math.nan


def report(runs: list[Run], target: float) -> list[str]:
    phases = runs[0].result.phases
    lines = [f"{'pool':36} {'agg tok/s':>9} {'met':>5} {'batch p99 wait':>14} | interactive "
             "median tok/s per phase: " + " ".join(n for n, _, _ in phases)]  # fmt: skip
    for r in runs:
        speeds = [v for _, v in r.speeds[INTERACTIVE]]
        met = sum(v >= target for v in speeds) / len(speeds) if speeds else math.nan
        cells = " ".join(f"{_median(r.interactive(s, e)):7.1f}" for _, s, e in phases)
        lines.append(f"{r.name:36} {r.aggregate:9.0f} {met:5.0%} {r.batch_p99_wait():12.2f} s"
                     f" | {cells}")  # fmt: skip
    return lines + (verdicts(runs, target) if len(runs) > 1 else [])


def verdicts(runs: list[Run], target: float) -> list[str]:
    """The issue's three claims for the planned lanes pool (the first run), in numbers."""
    ours, others = runs[0], runs[1:]
    deep = [r for r in others if _alike(r.name) and _deep(r.name)]
    lines = []
    for name, s, e in ours.result.phases if deep else ():
        mine = _median(ours.interactive(s, e))
        best = max(deep, key=lambda r: _nan_low(_median(r.interactive(s, e))))
        theirs = _median(best.interactive(s, e))
        ok = "yes" if mine >= theirs else "NO"
        lines.append(f"{name:14} interactive median {mine:6.1f} vs best deep pool "
                     f"{best.name} {theirs:6.1f}: at least as fast: {ok}")  # fmt: skip
    best_agg = max(others, key=lambda r: r.aggregate)
    gap = ours.aggregate / best_agg.aggregate - 1
    lines.append(f"aggregate {ours.aggregate:.0f} tok/s vs best alternative {best_agg.name} "
                 f"{best_agg.aggregate:.0f}: {gap:+.1%} (within 2%: "
                 f"{'yes' if gap >= -0.02 else 'NO'})")  # fmt: skip
    return lines


def where(phases: list[str], ran: list[tuple[int, str]]) -> str:
    """Each phase's interactive requests by the server they ran on (`ran`: phase index, server),
    as shares: where the routing sent the lane."""
    cells = []
    for i, name in enumerate(phases):
        counts = Counter(server for phase, server in ran if phase == i)
        total = sum(counts.values())
        shares = " ".join(f"{s} {n / total:.0%}" for s, n in sorted(counts.items()))
        cells.append(f"{name} {shares or '-'}")
    return "; ".join(cells)


def by_class(r: Run) -> str:
    """Each phase's interactive requests per class: how many, and their median tok/s. Greedy
    ones decode about twice as fast as chat ones on a deep server, so a phase's median falls on
    one side or the other as the draw goes ("The interactive median across seeds")."""
    cells = []
    for name, s, e in r.result.phases:
        kinds = []
        for draw in INTERACTIVE_DRAWS:
            speeds = [v for t, k, v in r.kinds
                      if k.rsplit(":", 1)[-1] == draw.workload and s <= t < e]  # fmt: skip
            kinds.append(f"{draw.workload} {len(speeds)} at {_median(speeds):.1f}")
        cells.append(f"{name} {', '.join(kinds)}")
    return "interactive by class (requests at median tok/s): " + "; ".join(cells)


def _phase_of(phases: list[tuple[str, float, float]], t: float) -> int:
    return next((i for i, (_, s, e) in enumerate(phases) if s <= t < e), len(phases) - 1)


def _alike(name: str) -> bool:
    """A pool of servers all at one setting (`3 x k7`, `6 x adaptive<=7`)."""
    count, sep, _ = name.partition(" x ")
    return bool(sep) and count.isdigit()


def _deep(name: str) -> bool:
    """The pools the issue calls deep: k3..k7 and the adaptive ones."""
    tail = name.partition(" x ")[2] if _alike(name) else name
    return tail.startswith("adaptive") or int(tail.removeprefix("k")) >= 3


def _nan_low(v: float) -> float:
    return -math.inf if math.isnan(v) else v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--share", type=float, default=0.2, help="interactive share")
    parser.add_argument("--target", type=float, default=100.0, help="interactive tok/s")
    parser.add_argument("--reserve", type=int, default=8)
    parser.add_argument("--scale", type=float, default=10.0, help="multiply phase durations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mix",
        action="append",
        default=[],
        help=f"a mixed pool for lanes (first: the planner's start; {LANES_MIX})",
    )
    parser.add_argument("--only", action="append", default=[], help="pools whose name has this")
    parser.add_argument(
        "--servers", type=int, default=SERVERS,
        help="servers per pool; the trace's users scale with them (3: as run)",
    )  # fmt: skip
    parser.add_argument("--where", action="store_true",
                        help="print where each phase's interactive requests ran")  # fmt: skip
    args = parser.parse_args()
    configure_logging("warning")
    if args.servers < 1:
        parser.error("--servers must be at least 1")
    mixes = args.mix or ([LANES_MIX] if args.servers == SERVERS else [])
    if any(len(m.split(",")) != args.servers for m in mixes):
        parser.error(f"each --mix names {args.servers} depths (--servers)")
    every = configurations(mixes, args.profile, args.servers)
    wanted = [c for c in every if not args.only or any(o in c[0] for o in args.only)]
    print(f"interactive share {args.share:.0%}, target {args.target:.0f} tok/s, reserve "
          f"{args.reserve}, profile {args.profile}, phases x{args.scale:g}, "
          f"{args.servers} servers")  # fmt: skip
    runs = []
    for name, spec, lanes in wanted:
        runs.append(run(name, spec, lanes, args, args.servers))
        print(report(runs[-1:], args.target)[1], flush=True)  # its row, as it comes
    for line in report(runs, args.target):
        print(line)
    for r in runs if args.where else ():
        phases = r.result.phases
        ran = [(_phase_of(phases, t), server) for t, server in r.ran]
        print(f"   {r.name}: interactive requests by server: "
              f"{where([n for n, _, _ in phases], ran)}")  # fmt: skip
        print(f"   {r.name}: {by_class(r)}")
    for r in runs:
        for x in r.result.restarts:
            print(f"   {r.name}: {x.began:6.0f}s {x.server} {x.before} -> {x.after}: {x.reason}")


if __name__ == "__main__":
    main()
