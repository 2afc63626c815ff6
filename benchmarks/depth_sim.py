"""Depth follows load, in virtual time: `policy_sim`'s pool of emulated engines, routed by the
real policies and reconfigured mid-trace by the planner, every restart's drain and start-up
charged. The planner reads the proxy's `Telemetry`, never the emulator's truth.

    .venv/bin/python benchmarks/depth_sim.py --profile seed-qwen35-122b \\
        --trace scenarios/depth-swing.toml --pool auto --pool k2

A restarting server takes no new requests, finishes those it has (up to `--drain-limit`, then
aborts the rest, whose users send again), is away for the profile's start-up time, then serves
at its new depth. Users are closed loops that follow the scenario's phases without a pause.
"""

from __future__ import annotations

import argparse
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
from depth_pools import MAX_STEPS, ROOT, PoolSpec, adaptive_configs, pools, setting_of, tune
from policy_sim import Draw, Node, PoolSim, Req

from specroute.bench.stats import mean, percentile
from specroute.bench.trace import Scenario, load_scenario
from specroute.bench.workload import Sampling
from specroute.emulator.engine import Engine, Iteration
from specroute.planner import (
    DepthEstimate,
    Estimates,
    Planner,
    PlannerOptions,
    ServerState,
    Setting,
    calibrated,
)
from specroute.policies import create
from specroute.reconfigure.options import planner_fields
from specroute.speculation import is_greedy

BIN_S = 5.0
"""Tokens are counted in bins of this many seconds, by the time they were emitted."""
EMIT, STEP, TICK, PHASE, DRAIN_DEADLINE, READY, RESTART = range(7)
Manual = tuple[float, int, Setting]
"""An operator's restart: at this time, this server (index) to this setting."""


@dataclass
class Slot:
    """A server's configuration and where it is in a restart."""

    setting: Setting
    state: str = "serving"
    pending: Setting | None = None
    previous: Setting | None = None
    changed_at: float | None = None
    generation: int = 0


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

    def window(self, start: float, end: float) -> tuple[float, float, float]:
        """(aggregate tok/s, mean and p10 per-request tok/s) over [start, end)."""
        first, last = int(start // BIN_S), math.ceil(end / BIN_S)
        tokens = sum(self.bins[first:last])
        speeds = [v for t, v in self.finished if start <= t < end]
        p10 = percentile(speeds, 10) if speeds else 0.0
        return tokens / max(end - start, 1e-9), mean(speeds) if speeds else 0.0, p10


class DepthSim(PoolSim):
    """A pool whose servers can be restarted at another depth while the trace runs."""

    def __init__(
        self,
        profile: str,
        spec: PoolSpec,
        *,
        seed: int = 0,
        startup_s: float | None = None,
        drain_limit_s: float = 120.0,
        tick_s: float = 2.0,
        plan_every: int = 5,
        options: PlannerOptions | None = None,
        planner: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(profile, [s.steps for s in spec.settings], create(spec.policy), seed=seed)
        configs = adaptive_configs().values()
        self.configs = {setting_of(c).tiers: c for c in configs}
        self.seed = seed
        self.slots = [Slot(s) for s in spec.settings]
        self.nodes = [Node(f"b{i}", self._engine(s, i)) for i, s in enumerate(spec.settings)]
        self.startup_s = self.profile.startup_s if startup_s is None else startup_s
        self.drain_limit_s = drain_limit_s
        self.tick_s = tick_s
        self.plan_every = plan_every
        self.ticks = 0
        priors, self.capacity = tune(self.profile)
        self.telemetry.seed(priors.items())
        # The operator sized the launch pool for its peak: keep it reconfigurable there.
        sized_for = sum(n.engine.max_running_requests for n in self.nodes)
        base = options or PlannerOptions(adaptive=tuple(self.configs), peak_concurrency=sized_for)
        if planner:  # `--planner-option K=V`, as `specroute launch` takes them
            given = msgspec.convert(dict(planner), PlannerOptions, strict=False)
            base = msgspec.structs.replace(base, **{k: getattr(given, k) for k in planner})
        self.planner = Planner(base) if spec.planner else None
        self.users_now = 0
        self.mix: list[Sampling] = []
        self.bins: list[float] = []
        self.finished: list[tuple[float, float]] = []
        self.restarts: list[Restart] = []
        self.plans: dict[str, int] = {}

    def _engine(self, setting: Setting, salt: int) -> Engine:
        seed = self.seed * 1000 + salt
        config = self.configs.get(setting.tiers)
        if config is None:
            return Engine(self.profile, steps=setting.steps, seed=seed)
        return Engine(self.profile, steps=setting.steps, seed=seed, adaptive=True,
                      adaptive_config=config)  # fmt: skip

    def _push(self, t: float, kind: int, node: int, it: object = None) -> None:
        # A server's events carry its generation: those of an engine since replaced are dropped.
        gen = self.slots[node].generation if node >= 0 else 0
        super()._push(t, kind, node, (gen, it))  # type: ignore[arg-type]

    def admits(self, i: int) -> bool:
        return self.slots[i].state == "serving" and super().admits(i)

    def draw(self) -> Draw:
        weights = [s.weight for s in self.mix]
        s = self.rng.choices(self.mix, weights=weights)[0]
        workload = "greedy" if is_greedy(s.temperature) else "sampled"
        return Draw(workload, s.temperature, s.max_tokens, s.ignore_eos)

    def resend(self, user: int) -> None:
        # Users past the phase's count stop once their request ends.
        if user < self.users_now:
            self.send(user)
        self._wake()

    def _wake(self) -> None:
        self.waiting = [u for u in self.waiting if u < self.users_now]
        while self.waiting and any(self.admits(i) for i in range(len(self.nodes))):
            self.send(self.waiting.pop(0))

    def record(self, req: Req, generated: int) -> None:
        if generated > 1 and len(req.times) > 1:
            self.finished.append((self.now, (generated - 1) / (req.times[-1] - req.times[0])))

    def _finish(self, req: Req, seq_generated: int, verify: int) -> None:
        self.learn(req, seq_generated, verify)
        self.record(req, seq_generated)
        i = req.backend
        if self.slots[i].state == "draining" and self.nodes[i].in_flight == 0:
            self._down(i)
        self.resend(req.user)

    def _emit(self, it: Iteration) -> None:
        b = int(self.now // BIN_S)
        if b >= len(self.bins):
            self.bins.extend([0.0] * (b + 1 - len(self.bins)))
        for em in it.emissions:
            req = self.reqs.get(em.seq.rid)
            if req is None:  # aborted by a drain deadline
                continue
            self.bins[b] += em.tokens
            if em.tokens > 0:
                req.times.append(self.now)
            if em.finish_reason is not None:
                del self.reqs[em.seq.rid]
                self._finish(req, em.seq.generated, em.seq.verify_ct)

    # -- restarts ---------------------------------------------------------------------------

    def begin(self, i: int, after: Setting, reason: str) -> None:
        slot = self.slots[i]
        self.restarts.append(Restart(self.nodes[i].name, slot.setting.label, after.label,
                                     self.now, reason=reason))  # fmt: skip
        slot.state, slot.pending, slot.changed_at = "draining", after, self.now
        slot.previous = slot.setting
        if self.nodes[i].in_flight == 0:
            self._down(i)
        else:
            self._push(self.now + self.drain_limit_s, DRAIN_DEADLINE, i)

    def _abort_rest(self, i: int) -> None:
        node = self.nodes[i]
        stuck = [r for r in self.reqs.values() if r.backend == i]
        for req in stuck:
            seq = node.engine.abort(req.rid)
            del self.reqs[req.rid]
            self.learn(req, seq.generated if seq else 0, seq.verify_ct if seq else 0, "aborted")
        self.restarts[-1].aborted += len(stuck)
        self._down(i)
        for req in stuck:
            self.resend(req.user)

    def _down(self, i: int) -> None:
        slot = self.slots[i]
        slot.state = "starting"
        slot.generation += 1
        self.nodes[i].stepping = False
        self._push(self.now + self.startup_s, READY, i)

    def _ready(self, i: int) -> None:
        slot, node = self.slots[i], self.nodes[i]
        assert slot.pending is not None
        slot.setting, slot.pending, slot.state = slot.pending, None, "serving"
        slot.generation += 1
        node.engine = self._engine(slot.setting, len(self.restarts) * 7 + i)
        node.engine.clock = self.now
        node.stepping = False
        for r in reversed(self.restarts):
            if r.server == node.name:
                r.ready = self.now
                break
        self._wake()

    # -- the planner ------------------------------------------------------------------------

    def estimates(self) -> Estimates:
        """The planner's inputs, from the telemetry: each depth's fit where it has run (several
        servers' fits averaged by observations), the tune's prior elsewhere, capacity per
        depth, acceptance per class."""
        priors, fitted = {}, {}
        for k in range(MAX_STEPS + 1):
            a, b = self.telemetry.priors[k]
            priors[k] = DepthEstimate(steps=k, capacity=self.capacity[k], intercept_s=a,
                                      per_token_s=b)  # fmt: skip
            fits = [m for (_, d), m in self.telemetry.iteration.items() if d == k]
            fits = [m for m in fits if m.observations]
            if fits:
                weight = sum(m.observations for m in fits)
                a = sum(m.intercept * m.observations for m in fits) / weight
                b = sum(m.slope * m.observations for m in fits) / weight
                fitted[k] = msgspec.structs.replace(priors[k], intercept_s=a, per_token_s=b)
        return Estimates(depths=calibrated(priors, fitted), classes=self.telemetry.classes(),
                         prior_alpha=self.telemetry.acceptance.prior_alpha)  # fmt: skip

    def servers(self) -> list[ServerState]:
        out = []
        for slot, node in zip(self.slots, self.nodes, strict=True):
            limit = int(node.engine.max_running_requests * self.overcommit)
            out.append(ServerState(
                name=node.name, setting=slot.pending or slot.setting, startup_s=self.startup_s,
                state=slot.state, limit=limit if slot.state == "serving" else None,
                changed_at=slot.changed_at, previous=slot.previous,
            ))  # fmt: skip
        return out

    def _tick(self) -> None:
        assert self.planner is not None
        in_flight: dict[str, float] = {}
        for req in self.reqs.values():
            in_flight[req.klass] = in_flight.get(req.klass, 0.0) + 1.0
        self.planner.observe(self.now, in_flight, queued=len(self.waiting))
        self._push(self.now + self.tick_s, TICK, -1)
        self.ticks += 1
        if self.ticks % self.plan_every:
            return
        plan = self.planner.plan(self.now, self.servers(), self.estimates())
        verdict = plan.verdict.split(":")[0] if plan.verdict.startswith("hold") else plan.verdict
        self.plans[verdict] = self.plans.get(verdict, 0) + 1
        for change in plan.start:
            i = next(j for j, n in enumerate(self.nodes) if n.name == change.server)
            self.begin(i, change.after, plan.reason)

    # -- the trace --------------------------------------------------------------------------

    def _phase(self, phase_mix: list[Sampling], users: int) -> None:
        self.mix = phase_mix
        before, self.users_now = self.users_now, users
        for u in range(before, users):
            self.send(u)
        self.waiting = [u for u in self.waiting if u < users]

    def run(
        self, scenario: Scenario, pool: str = "", scale: float = 1.0, manual: Sequence[Manual] = ()
    ) -> SimResult:
        """Replay `scenario` (durations times `scale`); `manual` restarts besides the planner's."""
        bounds, t = [], 0.0
        for p in scenario.phases:
            if p.rate is not None:
                raise ValueError(f"phase {p.name!r}: the simulator runs closed-loop users only")
            bounds.append((p.name, t, t + p.duration * scale))
            t += p.duration * scale
        end = t
        for idx, (_, start, _) in enumerate(bounds[1:], 1):
            self._push(start, PHASE, -1, idx)
        for at, server, setting in manual:
            self._push(at, RESTART, -1, (server, setting))
        first = scenario.phases[0]
        self._phase(first.mix or scenario.mix, first.concurrency)
        if self.planner is not None:
            self._push(self.tick_s, TICK, -1)
        self._loop(scenario, end)
        self.bins.extend([0.0] * (math.ceil(end / BIN_S) - len(self.bins)))
        return SimResult(pool, bounds, self.bins, self.finished, self.restarts, self.plans)

    def _loop(self, scenario: Scenario, end: float) -> None:
        while self.events:
            t, kind, _, idx, (gen, it) = heapq.heappop(self.events)  # type: ignore[misc]
            if t >= end:
                break
            self.now = t
            if kind == PHASE:
                phase = scenario.phases[it]
                self._phase(phase.mix or scenario.mix, phase.concurrency)
            elif kind == TICK:
                self._tick()
            elif kind == RESTART:
                server, setting = it
                if self.slots[server].state == "serving":
                    self.begin(server, setting, "manual")
            elif gen != self.slots[idx].generation:
                continue
            elif kind == EMIT:
                self._emit(it)
                self._push(t, STEP, idx)
            elif kind == STEP:
                node = self.nodes[idx]
                iteration = node.engine.step()
                if iteration is None:
                    node.stepping = False
                    continue
                self._push(node.engine.clock, EMIT, idx, iteration)
            elif kind == DRAIN_DEADLINE:
                if self.slots[idx].state == "draining":
                    self._abort_rest(idx)
            elif kind == READY:
                self._ready(idx)


def simulate(
    profile: str, pool: str, scenario: Scenario, *, seed: int = 0, scale: float = 1.0,
    manual: Sequence[Manual] = (), **kwargs: object,
) -> SimResult:  # fmt: skip
    sim = DepthSim(profile, pools()[pool], seed=seed, **kwargs)  # type: ignore[arg-type]
    return sim.run(scenario, pool, scale, manual)


def parse_restart(text: str) -> Manual:
    """`600:1:k7`: at 600 s, server 1 to depth 7."""
    at, server, depth = text.split(":")
    return float(at), int(server), Setting(steps=int(depth.removeprefix("k")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--trace", default=str(ROOT / "scenarios" / "depth-swing.toml"))
    parser.add_argument("--pool", action="append", default=[], choices=sorted(pools()))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply phase durations")
    parser.add_argument("--startup", type=float, default=None, help="seconds (default: profile)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--restart", action="append", type=parse_restart, default=[],
                        metavar="T:SERVER:kK", help="a manual restart, e.g. 600:1:k7")  # fmt: skip
    parser.add_argument("--planner-option", action="append", default=[], metavar="K=V",
                        help="a planner setting, as `specroute launch` takes it")  # fmt: skip
    args = parser.parse_args()
    planner = planner_fields(args.planner_option)
    scenario = load_scenario(args.trace)
    for pool in args.pool or ["auto"]:
        r = simulate(args.profile, pool, scenario, seed=args.seed, scale=args.scale,
                     manual=args.restart, startup_s=args.startup, planner=planner)  # fmt: skip
        agg, avg, p10 = r.window(0.0, r.phases[-1][2])
        cells = " ".join(f"{r.window(s, e)[0]:7.0f}" for _, s, e in r.phases)
        print(f"{pool:12} total {agg:7.0f} mean {avg:6.1f} p10 {p10:6.1f} | {cells}")
        for x in r.restarts:
            print(f"   {x.began:8.0f}s {x.server} {x.before} -> {x.after} ready "
                  f"{x.ready or float('nan'):8.0f}s aborted {x.aborted}: {x.reason}")  # fmt: skip


if __name__ == "__main__":
    main()
