"""A pool of emulated engines in virtual time, routed by the real policies: seconds per trace.

Discrete events over several `Engine`s; closed-loop users follow the scenario's phases;
every finished request becomes an `Outcome` fed to the pool's `Telemetry` and to the policy,
exactly as the proxy does. Used to tune policies before the slow HTTP evaluation:

    .venv/bin/python benchmarks/policy_sim.py --profile costly-drafts --policy throughput
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from specroute.bench.stats import percentile
from specroute.emulator.adaptive import DEFAULT_ADAPTIVE_CONFIG, AdaptiveConfig
from specroute.emulator.adaptive_config import load_adaptive_config
from specroute.emulator.engine import Engine, Iteration
from specroute.emulator.profiles import get_profile, sampling_class
from specroute.lanes import BATCH, Lane
from specroute.policies import BackendView, Outcome, Policy, PoolView, RouteRequest, create
from specroute.pool.telemetry import Telemetry

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "policy-eval.toml"


PROMPT_TOKENS = 330
"""A synthetic prompt of 256 words, as the bench sends."""
PROMPT_WORDS = 256


def prompt_tokens(words: int) -> int:
    """A synthetic prompt of `words` words in tokens, at `PROMPT_TOKENS` per `PROMPT_WORDS` (the
    traces that send the bench's 256 words keep the 330 tokens every table was run with)."""
    return round(PROMPT_TOKENS * words / PROMPT_WORDS)


@dataclass(frozen=True)
class Draw:
    """One request's traffic class: the proxy's workload bucket and its sampling settings."""

    workload: str
    temperature: float
    max_tokens: int
    ignore_eos: bool
    lane: Lane = BATCH


@dataclass
class Req:
    rid: str
    user: int
    klass: str
    start: float
    backend: int
    times: list[float] = field(default_factory=list)
    area0: float = 0.0
    lane: Lane = BATCH


@dataclass
class Node:
    name: str
    engine: Engine
    in_flight: int = 0
    area: float = 0.0
    since: float = 0.0
    stepping: bool = False

    def load_area(self, now: float) -> float:
        return self.area + self.in_flight * (now - self.since)

    def add(self, delta: int, now: float) -> None:
        self.area = self.load_area(now)
        self.since = now
        self.in_flight += delta


@dataclass
class PhaseStats:
    name: str
    users: int
    tokens: int = 0
    speeds: list[float] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    by_depth: dict[tuple[str, int], int] = field(default_factory=dict)
    lane_speeds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def aggregate(self) -> float:
        return self.tokens / (self.end - self.start) if self.end > self.start else 0.0


class PoolSim:
    reserve = 0
    """Slots kept for the interactive lane on each deepest backend (`lanes.reserve`)."""
    target_tok_s = 0.0
    """The interactive lane's speed target (`lanes.target_tok_s`)."""
    prompt_tokens = PROMPT_TOKENS
    """Every request's prompt (its prefill's cost): the scenario's, where it says."""

    def __init__(
        self,
        profile: str,
        steps: list[int],
        policy: Policy,
        *,
        adaptive: bool = False,
        adaptive_config: AdaptiveConfig = DEFAULT_ADAPTIVE_CONFIG,
        seed: int = 0,
        overcommit: float = 2.0,
    ) -> None:
        self.profile = get_profile(profile)
        # Each engine sizes its own capacity as the emulator does: min(SGLang's cap, memory at
        # the deepest depth it can run; an adaptive one's deepest candidate).
        engines = [
            Engine(self.profile, steps=k, seed=seed + i, adaptive=adaptive,
                   adaptive_config=adaptive_config)
            for i, k in enumerate(steps)
        ]  # fmt: skip
        self.nodes = [Node(f"b{i}-k{e.steps}", e) for i, e in enumerate(engines)]
        self.policy = policy
        self.telemetry = Telemetry()
        self.overcommit = overcommit
        self.rng = random.Random(seed)
        self.now = 0.0
        self.events: list[tuple[float, int, int, int, Iteration | None]] = []
        self.seq = 0
        self.reqs: dict[str, Req] = {}
        self.waiting: list[int] = []  # users waiting for a free backend
        self.phase: PhaseStats | None = None
        self.sending = False
        self.model = self.profile.model_name

    def _push(self, t: float, kind: int, node: int, it: Iteration | None = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, node, it))

    def view(self, nodes: list[int]) -> PoolView:
        backs = []
        for i in nodes:
            n = self.nodes[i]
            k = n.engine.active_steps
            model = self.telemetry.iteration_model(n.name, k)
            cap = n.engine.max_running_requests
            backs.append(
                BackendView(
                    name=n.name, url="sim", model=self.model, steps=k, algorithm="EAGLE",
                    adaptive=n.engine.adaptive is not None, capacity=cap,
                    limit=int(cap * self.overcommit), healthy=True, in_flight=n.in_flight,
                    iteration_intercept_s=model.intercept, iteration_per_token_s=model.slope,
                    iteration_samples=model.observations,
                )
            )  # fmt: skip
        return PoolView(
            backends=tuple(backs),
            classes=self.telemetry.classes(),
            prior_alpha=self.telemetry.acceptance.prior_alpha,
            in_flight_total=sum(n.in_flight for n in self.nodes),
            capacity_total=sum(n.engine.max_running_requests for n in self.nodes),
            reserve=self.reserve,
            interactive_waiting=self.interactive_waiting(),
        )

    def interactive_waiting(self) -> int:
        """Interactive requests in the admission queue (none without lanes)."""
        return 0

    def draw_for(self, user: int) -> Draw:
        """The next request of `user` (without lanes, every user draws from one mix)."""
        return self.draw()

    def next_waiting(self) -> int:
        """Which waiting user is admitted next: the first (the proxy's queue is FIFO)."""
        return 0

    def in_flight_limit(self, i: int) -> int | None:
        """The proxy's in-flight limit for backend `i` (`Backend.limit`: overcommit times its
        capacity); None where the proxy knows no capacity."""
        return int(self.nodes[i].engine.max_running_requests * self.overcommit)

    def admits(self, i: int) -> bool:
        """Whether backend `i` takes a new request now (below its in-flight limit)."""
        limit = self.in_flight_limit(i)
        return limit is None or self.nodes[i].in_flight < limit

    def draw(self) -> Draw:
        """The next request's traffic class: half greedy, half sampled at temperature 0.8."""
        greedy = self.rng.random() < 0.5
        return Draw("greedy", 0.0, 384, False) if greedy else Draw("sampled", 0.8, 384, False)

    def send(self, user: int) -> None:
        free = [i for i in range(len(self.nodes)) if self.admits(i)]
        if not free:
            self.waiting.append(user)
            return
        draw = self.draw_for(user)
        klass = f"{self.model}:{draw.workload}"
        request = RouteRequest(
            route="chat", model=self.model, workload_class=klass, stream=True,
            max_tokens=draw.max_tokens, temperature=draw.temperature, lane=draw.lane,
            target_tok_s=self.target_tok_s,
        )  # fmt: skip
        decision = self.policy.choose(request, self.view(free))
        idx = next(i for i in free if self.nodes[i].name == decision.backend)
        node = self.nodes[idx]
        self.seq += 1
        rid = f"r{self.seq}"
        node.engine.submit(
            rid, prompt_tokens=self.prompt_tokens, max_new_tokens=draw.max_tokens,
            klass=sampling_class(draw.temperature), ignore_eos=draw.ignore_eos,
        )  # fmt: skip
        node.add(1, self.now)
        area0 = node.load_area(self.now)
        self.reqs[rid] = Req(rid, user, klass, self.now, idx, area0=area0, lane=draw.lane)
        if not node.stepping:
            node.stepping = True
            node.engine.clock = max(node.engine.clock, self.now)
            self._push(self.now, 1, idx)

    def learn(self, req: Req, generated: int, verify: int, error: str | None = None) -> None:
        """The request's `Outcome` to the telemetry and the policy, as the proxy reports it."""
        node = self.nodes[req.backend]
        elapsed = self.now - req.start
        mean = (node.load_area(self.now) - req.area0) / elapsed if elapsed > 0 else None
        node.add(-1, self.now)
        gaps = tuple(b - a for a, b in zip(req.times, req.times[1:], strict=False))
        outcome = Outcome(
            backend=node.name, steps=node.engine.steps, workload_class=req.klass, status=200,
            stream=True, completion_tokens=generated, chunks=len(req.times) + 2,
            verify_count=verify, ttft_s=req.times[0] - req.start if req.times else None,
            chunk_gaps_s=gaps, duration_s=elapsed, in_flight_at_start=0, mean_in_flight=mean,
            error=error, lane=req.lane,
        )  # fmt: skip
        self.telemetry.observe(
            outcome,
            capacity=node.engine.max_running_requests,
            acceptance=node.engine.adaptive is None,  # as the pool does for adaptive backends
        )
        self.policy.observe(outcome)

    def record(self, req: Req, generated: int) -> None:
        """Phase statistics of one finished request."""
        ph = self.phase
        if ph is not None:
            ph.tokens += generated
            if generated > 1 and len(req.times) > 1:
                speed = (generated - 1) / (req.times[-1] - req.times[0])
                ph.speeds.append(speed)
                ph.lane_speeds.setdefault(req.lane, []).append(speed)
            key = (req.klass.rsplit(":", 1)[1], self.nodes[req.backend].engine.steps)
            ph.by_depth[key] = ph.by_depth.get(key, 0) + 1

    def resend(self, user: int) -> None:
        """Closed loop: the user whose request ended sends the next; waiting users go first."""
        if self.sending:
            self.send(user)
        # Until no backend admits: `send` puts a user it cannot place back in the queue.
        while self.waiting and self.sending and any(map(self.admits, range(len(self.nodes)))):
            self.send(self.waiting.pop(self.next_waiting()))

    def _finish(self, req: Req, seq_generated: int, verify: int) -> None:
        self.learn(req, seq_generated, verify)
        self.record(req, seq_generated)
        self.resend(req.user)

    def _emit(self, it: Iteration) -> None:
        for em in it.emissions:
            req = self.reqs[em.seq.rid]
            if em.tokens > 0:
                req.times.append(self.now)
            if em.finish_reason is not None:
                del self.reqs[em.seq.rid]
                self._finish(req, em.seq.generated, em.seq.verify_ct)

    def run_phase(self, name: str, users: int, duration: float) -> PhaseStats:
        self.phase = ph = PhaseStats(name, users, start=self.now)
        end = self.now + duration
        self.sending = True
        for u in range(users):
            self.send(u)
        while self.events:
            t, kind, _, idx, it = heapq.heappop(self.events)
            if self.sending and t >= end:
                self.sending = False
                self.waiting.clear()
            self.now = t
            node = self.nodes[idx]
            if kind == 0:
                assert it is not None
                self._emit(it)
                self._push(t, 1, idx)
            else:
                iteration = node.engine.step()
                if iteration is None:
                    node.stepping = False
                    continue
                self._push(node.engine.clock, 0, idx, iteration)
        ph.end = self.now
        return ph


def load_phases(scale: float) -> list[tuple[str, int, float]]:
    data = tomllib.loads(SCENARIO.read_text())
    return [(p["name"], p["concurrency"], p["duration"] * scale) for p in data["phases"]]


def simulate(
    profile: str, steps: list[int], policy: str, *, adaptive: bool = False, seed: int = 0,
    scale: float = 1.0, adaptive_config: AdaptiveConfig = DEFAULT_ADAPTIVE_CONFIG,
) -> list[PhaseStats]:  # fmt: skip
    sim = PoolSim(profile, steps, create(policy), adaptive=adaptive,
                  adaptive_config=adaptive_config, seed=seed)  # fmt: skip
    return [sim.run_phase(n, u, d) for n, u, d in load_phases(scale)]


def summary(phases: list[PhaseStats]) -> tuple[float, float, float]:
    tokens = sum(p.tokens for p in phases)
    time = sum(p.end - p.start for p in phases)
    speeds = [s for p in phases for s in p.speeds]
    p10 = percentile(speeds, 10) if speeds else 0.0
    return tokens / time, statistics.fmean(speeds), p10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--steps", default="1,2,3")
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument("--adaptive", action="store_true")
    parser.add_argument("--adaptive-config", metavar="PATH", help="SGLang's tiers file")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--detail", action="store_true")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    config = DEFAULT_ADAPTIVE_CONFIG
    if args.adaptive_config:  # a tiers file makes the pool adaptive, as it does in SGLang
        config = load_adaptive_config(args.adaptive_config)
    adaptive = args.adaptive or bool(args.adaptive_config)
    for policy in args.policy or ["least_loaded"]:
        phases = simulate(
            args.profile, steps, policy, adaptive=adaptive, seed=args.seed, scale=args.scale,
            adaptive_config=config,
        )  # fmt: skip
        agg, mean, p10 = summary(phases)
        cells = " ".join(f"{p.aggregate:7.0f}" for p in phases)
        print(f"{policy:48} total {agg:7.0f} mean {mean:6.1f} p10 {p10:6.1f} | {cells}")
        if args.detail:
            for p in phases:
                print(f"   {p.name:14} {sorted(p.by_depth.items())}")


if __name__ == "__main__":
    main()
