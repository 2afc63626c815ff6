"""Depth follows load, in virtual time: `policy_sim`'s pool of emulated engines, routed by the
real policies and reconfigured mid-trace by the product's own depth loop (`Reconfigurer`:
readings, planner, actuator, options), with a virtual clock, a simulated proxy that answers
only what the real `/pool` answers (the typed `PoolSnapshot`), and a simulated restart.

    .venv/bin/python benchmarks/depth_sim.py --profile seed-qwen35-122b \\
        --trace scenarios/depth-swing.toml --pool auto --pool k2

The loop's options are `specroute launch`'s (`--allowed-steps 0,1,2,3`, no adaptive unless
`--allow-adaptive`, `--min-dwell`, `--planner-option K=V`). A server the loop restarts is held
draining (no new requests) until its streams end or the drain runs out, is stopped (what it
still runs is aborted and its users send again), is away for the profile's start-up time, then
serves at its new depth once readmitted. Users are closed loops that follow the scenario's
phases without a pause.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
from depth_pools import ROOT, PoolSpec, adaptive_configs, load_prior, pools, setting_of
from policy_sim import Draw, Node, PoolSim, Req, prompt_tokens
from sim_proxy import SimProxy, pool_snapshot
from sim_results import BIN_S, Restart, SimResult

from specroute.bench.trace import Scenario, load_scenario
from specroute.bench.workload import Sampling
from specroute.emulator.engine import Engine, Iteration
from specroute.emulator.profiles import PROFILES
from specroute.logs import configure_logging
from specroute.planner import Setting
from specroute.policies import create
from specroute.reconfigure import Actuator, ReconfigureOptions, Reconfigurer
from specroute.reconfigure.options import add_planner_arguments, allowed_steps, planner_fields
from specroute.speculation import SPECULATIVE_DEFAULT_MAX_RUNNING, is_greedy
from specroute.wire import HoldAnswer, HoldState, PoolSnapshot

EMIT, STEP, TIMER, PHASE, DRAIN_DEADLINE, READY, RESTART = range(7)
Manual = tuple[float, int, Setting]
"""An operator's restart: at this time, this server (index) to this setting."""
_SETTLE_YIELDS = 8
"""Event-loop turns without any call into the simulator after which the loop is parked."""
LAUNCH_LIMIT = SPECULATIVE_DEFAULT_MAX_RUNNING
"""The loop's `limit` per depth: `specroute launch`'s `--max-running-requests` (its default,
said to every server), as `launch.restarts.depth_loop` passes `options.running_limit`."""


def launch_options(spec: PoolSpec, **given: object) -> ReconfigureOptions:
    """`specroute launch --reconfigure auto`'s options for `spec` with the flags `given`: the
    depths the pool's prior measured (`launch_depths`, `spec.allowed`) unless
    `allowed_steps` is given, else launch's default. Every caller that sets an option goes
    through here, so none drops the prior's depths by building its own."""
    options = ReconfigureOptions(mode="auto", **given)  # type: ignore[arg-type]
    if spec.allowed is not None and "allowed_steps" not in given:
        options = msgspec.structs.replace(options, allowed_steps=spec.allowed)
    return options


@dataclass
class SimServer:
    """A server's configuration, where it is in a restart, and the proxy's hold on it."""

    setting: Setting
    state: str = "serving"
    """serving, draining (an operator's restart) or starting."""
    hold: HoldState = "serving"
    pending: Setting | None = None
    generation: int = 0
    ready: asyncio.Future[None] | None = None
    """The loop's restart waiting for this server to come up."""


@dataclass
class Where:
    """Where the users were over [start, end): each server's tokens and its requests in
    flight by class, weighed by time (`--where`)."""

    start: float
    end: float
    tokens: dict[str, float] = field(default_factory=dict)
    users: dict[tuple[str, str], float] = field(default_factory=dict)
    last: float | None = None

    def tally(
        self, now: float, running: Mapping[str, Req], it: Iteration, labels: list[str]
    ) -> None:
        """Before `it`'s tokens land: the time since the last tally at the requests in flight
        then (every server emits every few tens of milliseconds, so that is their count),
        each under its server's depth of the moment (`labels`)."""
        t = min(max(now, self.start), self.end)
        if self.last is not None and t > self.last:
            for req in running.values():
                key = (f"b{req.backend} {labels[req.backend]}", req.klass.rsplit(":", 1)[-1])
                self.users[key] = self.users.get(key, 0.0) + (t - self.last)
        self.last = t
        if self.start <= now < self.end:
            for em in it.emissions:
                emitting = running.get(em.seq.rid)
                if emitting is not None:
                    server = f"b{emitting.backend} {labels[emitting.backend]}"
                    self.tokens[server] = self.tokens.get(server, 0.0) + em.tokens

    def lines(self) -> list[str]:
        span = self.end - self.start
        out = [f"   {self.start:.0f}-{self.end:.0f} s, each server (at each depth it ran): "
               "tok/s, requests in flight by class"]  # fmt: skip
        for server in sorted({*self.tokens, *(n for n, _ in self.users)}):
            users = {k: v / span for (n, k), v in sorted(self.users.items()) if n == server}
            cells = ", ".join(f"{k} {v:.2f}" for k, v in users.items())
            out.append(f"     {server:8} {self.tokens.get(server, 0.0) / span:7.0f}  {cells}")
        return out


class DepthSim(PoolSim):
    """A pool whose servers can be restarted at another depth while the trace runs; with a
    planner, the product's `Reconfigurer` runs beside it on the simulator's clock."""

    tables = False
    """The engine runs vLLM's K per batch size (`Setting.table`): `--allow-adaptive` offers
    the planner those rather than SGLang's tiers."""

    def __init__(
        self,
        profile: str,
        spec: PoolSpec,
        *,
        seed: int = 0,
        startup_s: float | None = None,
        drain_limit_s: float = 120.0,
        reconfigure: ReconfigureOptions | None = None,
        planner: Mapping[str, str] | None = None,
        where: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(profile, [s.steps for s in spec.settings], create(spec.policy), seed=seed)
        configs = adaptive_configs().values()
        self.configs = {setting_of(c).tiers: c for c in configs}
        self.seed = seed
        self.slots = [SimServer(s) for s in spec.settings]
        self.nodes = [Node(f"b{i}", self._engine(s, i)) for i, s in enumerate(spec.settings)]
        self.startup_s = self.profile.startup_s if startup_s is None else startup_s
        self.drain_limit_s = drain_limit_s
        self.tuned_capacity: dict[int, int] = {}
        """The prior's batch limit per depth (`/pool`'s `estimates.capacity`)."""
        if spec.prior is not None:  # `launch --prior`: the proxy starts from the tuned profile
            prior = msgspec.structs.replace(load_prior(spec.prior), models=(self.model,))
            self.telemetry = prior.telemetry()
            self.tuned_capacity = dict(prior.capacity)
        # Without a prior the proxy starts from nothing, as `specroute launch` without --prior.
        options = reconfigure or launch_options(spec)
        if planner:  # `--planner-option K=V`, as `specroute launch` takes them
            options = msgspec.structs.replace(options, planner={**options.planner, **planner})
        self.options = options if spec.planner else None
        self.proxy = SimProxy(self)
        self.loop: Reconfigurer | None = None
        self.calls = 0
        self.users_now = 0
        self.mix: list[Sampling] = []
        self.bins: list[float] = []
        self.finished: list[tuple[float, float]] = []
        self.restarts: list[Restart] = []
        self.decisions: list[tuple[float, str, str, tuple[str, ...]]] = []
        self.where = Where(*where) if where is not None else None

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
        slot = self.slots[i]
        return slot.state == "serving" and slot.hold == "serving" and super().admits(i)

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
        if self.where is not None:
            self.where.tally(self.now, self.reqs, it, [x.setting.label for x in self.slots])
        b = int(self.now // BIN_S)
        if b >= len(self.bins):
            self.bins.extend([0.0] * (b + 1 - len(self.bins)))
        for em in it.emissions:
            req = self.reqs.get(em.seq.rid)
            if req is None:  # aborted when its server stopped
                continue
            self.bins[b] += em.tokens
            if em.tokens > 0:
                req.times.append(self.now)
            if em.finish_reason is not None:
                del self.reqs[em.seq.rid]
                self._finish(req, em.seq.generated, em.seq.verify_ct)

    # -- what the proxy knows -----------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """`GET /pool` as the real proxy would answer it (`sim_proxy.pool_snapshot`)."""
        return pool_snapshot(self)

    def hold(self, name: str, state: HoldState) -> HoldAnswer:
        """`PUT /pool/backends/{name}/state`: a held backend gets no new request."""
        i = self._index(name)
        slot, node = self.slots[i], self.nodes[i]
        slot.hold = state
        if state == "serving":
            self._wake()
        return HoldAnswer(backend=name, state=state, in_flight=node.in_flight,
                          reachable=slot.state != "starting", steps=node.engine.steps,
                          capacity=node.engine.max_running_requests)  # fmt: skip

    def _index(self, name: str) -> int:
        return next(j for j, n in enumerate(self.nodes) if n.name == name)

    # -- restarts -------------------------------------------------------------------------------

    async def restart(self, name: str, setting: Setting) -> str | None:
        """The launcher's restart: stop the server (what it still runs is aborted), start it
        at `setting`, and wait out its start-up."""
        self.calls += 1
        i = self._index(name)
        slot = self.slots[i]
        assert self.loop is not None
        began = self.loop.actuator.slots[name].started
        self.restarts.append(Restart(name, slot.setting.label, setting.label, began,
                                     reason=self.loop.actuator.slots[name].reason))  # fmt: skip
        slot.pending = setting
        ready = slot.ready = asyncio.get_running_loop().create_future()
        self._abort_rest(i)
        await ready
        return None

    def begin(self, i: int, after: Setting, reason: str) -> None:
        """An operator's restart (`--restart`), outside the loop: drain, stop, start."""
        slot = self.slots[i]
        self.restarts.append(Restart(self.nodes[i].name, slot.setting.label, after.label,
                                     self.now, reason=reason))  # fmt: skip
        slot.state, slot.pending = "draining", after
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
        if slot.ready is not None:  # the loop readmits it (`hold serving`)
            slot.ready.set_result(None)
            slot.ready = None
        self._wake()

    # -- the loop's clock -----------------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """The loop's `sleep`: resumes when the simulator's clock reaches it."""
        self.calls += 1
        done = asyncio.get_running_loop().create_future()
        self._push(self.now + max(0.0, seconds), TIMER, -1, done)
        await done

    async def _settle(self) -> None:
        """Let the loop run until it waits on the simulator again (a sleep or a restart)."""
        quiet = 0
        while quiet < _SETTLE_YIELDS:
            before = self.calls
            await asyncio.sleep(0)
            quiet = quiet + 1 if self.calls == before else 0

    def _start_loop(self) -> Reconfigurer:
        assert self.options is not None
        servers = [(n.name, s.setting, self.startup_s) for n, s in zip(self.nodes, self.slots,
                                                                      strict=True)]  # fmt: skip
        actuator = Actuator(self.options.mode, servers, clock=lambda: self.now)
        # --allow-adaptive: SGLang's tiers, or on vLLM (`tables`) its K per batch size
        adaptive = tuple(self.configs) if self.options.allow_adaptive and not self.tables else ()
        return Reconfigurer(self.options, self.proxy, actuator, self.restart,
                            limit=lambda k: LAUNCH_LIMIT, adaptive=adaptive,
                            tables=self.tables and self.options.allow_adaptive,
                            sleep=self.sleep)  # fmt: skip

    # -- the trace ------------------------------------------------------------------------------

    def _phase(self, phase_mix: list[Sampling], users: int) -> None:
        self.mix = phase_mix
        before, self.users_now = self.users_now, users
        for u in range(before, users):
            self.send(u)
        self.waiting = [u for u in self.waiting if u < users]

    def run(
        self, scenario: Scenario, pool: str = "", scale: float = 1.0, manual: Sequence[Manual] = ()
    ) -> SimResult:
        """Replay `scenario` (durations times `scale`); `manual` restarts besides the loop's."""
        return asyncio.run(self._run(scenario, pool, scale, manual))

    async def _run(
        self, scenario: Scenario, pool: str, scale: float, manual: Sequence[Manual]
    ) -> SimResult:
        bounds, t = [], 0.0
        for p in scenario.phases:
            if p.rate is not None:
                raise ValueError(f"phase {p.name!r}: the simulator runs closed-loop users only")
            bounds.append((p.name, t, t + p.duration * scale))
            t += p.duration * scale
        end = t
        if scenario.prompts.source != "synthetic":
            raise ValueError("the simulator sends synthetic prompts only ([prompts] words = N)")
        self.prompt_tokens = prompt_tokens(scenario.prompts.words)
        for idx, (_, start, _) in enumerate(bounds[1:], 1):
            self._push(start, PHASE, -1, idx)
        for at, server, setting in manual:
            self._push(at, RESTART, -1, (server, setting))
        first = scenario.phases[0]
        self._phase(first.mix or scenario.mix, first.concurrency)
        task = None
        if self.options is not None:
            self.loop = self._start_loop()
            task = asyncio.create_task(self.loop.run(asyncio.Event()))
            await self._settle()
        try:
            await self._loop(scenario, end)
        finally:
            if task is not None:
                # A restart still under way when the trace ends waits on a clock that stopped.
                for pending in (task, *self.loop._tasks):  # type: ignore[union-attr]
                    pending.cancel()
                await asyncio.gather(task, *self.loop._tasks, return_exceptions=True)  # type: ignore[union-attr]
        if self.loop is not None and self.loop.failed_ticks:
            # The product's loop goes on after a failed tick (it logs `plan_failed`); a run
            # with one measured a pool nothing planned for part of the time.
            failed = self.loop.failed_ticks
            raise RuntimeError(f"the depth loop failed {failed} ticks") from self.loop.last_failure
        self.bins.extend([0.0] * (math.ceil(end / BIN_S) - len(self.bins)))
        plans: dict[str, int] = {}
        for _, verdict, _, _ in self.decisions:
            key = verdict.split(":")[0]
            plans[key] = plans.get(key, 0) + 1
        document = self.proxy.document
        accounts = list(document.accounts) if document is not None else []
        return SimResult(pool, bounds, self.bins, self.finished, self.restarts, plans,
                         self.decisions, accounts)  # fmt: skip

    async def _loop(self, scenario: Scenario, end: float) -> None:
        while self.events:
            t, kind, _, idx, (gen, it) = heapq.heappop(self.events)  # type: ignore[misc]
            if t >= end:
                break
            self.now = t
            if kind == PHASE:
                phase = scenario.phases[it]
                self._phase(phase.mix or scenario.mix, phase.concurrency)
            elif kind == TIMER:
                if not it.done():
                    it.set_result(None)
                    await self._settle()
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
                waited = self.slots[idx].ready is not None
                self._ready(idx)
                if waited:
                    await self._settle()


def simulate(
    profile: str, pool: str, scenario: Scenario, *, seed: int = 0, scale: float = 1.0,
    manual: Sequence[Manual] = (), **kwargs: object,
) -> SimResult:  # fmt: skip
    sim = DepthSim(profile, pools(profile)[pool], seed=seed, **kwargs)  # type: ignore[arg-type]
    return sim.run(scenario, pool, scale, manual)


def parse_restart(text: str) -> Manual:
    """`600:1:k7`: at 600 s, server 1 to depth 7."""
    at, server, depth = text.split(":")
    return float(at), int(server), Setting(steps=int(depth.removeprefix("k")))


def parse_window(text: str) -> tuple[float, float]:
    """`700:800`: from 700 s to 800 s."""
    start, end = (float(x) for x in text.split(":"))
    if not 0 <= start < end:
        raise argparse.ArgumentTypeError(f"{text!r}: START:END with 0 <= START < END")
    return start, end


def with_profile_fields(profile: str, given: Sequence[str]) -> None:
    """`--profile-field prefill_base=0`: the emulated engine with these fields of `profile`
    replaced, for this run (what one part of the emulated GPU costs a pool). The simulated
    proxy's prior is the tune's as measured, so forecasts keep the unchanged profile's."""
    fields = {}
    for text in given:
        key, sep, value = text.partition("=")
        if not sep or key not in PROFILES[profile].__struct_fields__:
            raise SystemExit(f"--profile-field {text!r}: KEY=NUMBER, KEY a field of the profile")
        fields[key] = float(value)
    if fields:
        PROFILES[profile] = msgspec.structs.replace(PROFILES[profile], **fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--trace", default=str(ROOT / "scenarios" / "depth-swing.toml"))
    parser.add_argument("--pool", action="append", default=[],
                        choices=sorted({*pools(), "launched"}))  # fmt: skip
    parser.add_argument("--scale", type=float, default=1.0, help="multiply phase durations")
    parser.add_argument("--startup", type=float, default=None, help="seconds (default: profile)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--restart", action="append", type=parse_restart, default=[],
                        metavar="T:SERVER:kK", help="a manual restart, e.g. 600:1:k7")  # fmt: skip
    # --allowed-steps, --min-dwell, --planner-option: launch's (depths: the pool's prior's)
    add_planner_arguments(parser, None, "; default: the tuned prior's, else 0,1,2,3")
    parser.add_argument(
        "--allow-adaptive", action="store_true", help="the loop may choose SGLang-adaptive servers"
    )
    parser.add_argument(
        "--log-level", default="warning", choices=("debug", "info", "warning"),
        help="info: the loop's plan, restart and account lines (on stderr) beside the table",
    )  # fmt: skip
    parser.add_argument(
        "--profile-field", action="append", default=[], metavar="KEY=NUMBER",
        help="run the emulated engine with this profile field replaced, e.g. prefill_base=0 "
        "(repeatable; what that cost does to a pool)",
    )  # fmt: skip
    parser.add_argument(
        "--where", type=parse_window, default=None, metavar="START:END",
        help="also print each server's tok/s and its requests in flight by class over "
        "[START, END) seconds (where the routing put the users)",
    )  # fmt: skip
    args = parser.parse_args()
    configure_logging(args.log_level)  # by default the loop's plan lines would drown the table
    with_profile_fields(args.profile, args.profile_field)
    scenario = load_scenario(args.trace)
    for pool in args.pool or ["auto"]:
        given = {"allowed_steps": allowed_steps(args.allowed_steps)} if args.allowed_steps else {}
        options = launch_options(
            pools(args.profile)[pool], allow_adaptive=args.allow_adaptive,
            min_dwell_s=args.min_dwell, planner=planner_fields(args.planner_option), **given,
        )  # fmt: skip
        sim = DepthSim(args.profile, pools(args.profile)[pool], seed=args.seed,
                       startup_s=args.startup, reconfigure=options, where=args.where)  # fmt: skip
        r = sim.run(scenario, pool, args.scale, args.restart)
        agg, avg, p10 = r.window(0.0, r.phases[-1][2])
        cells = " ".join(f"{r.window(s, e)[0]:7.0f}" for _, s, e in r.phases)
        print(f"{pool:12} total {agg:7.0f} mean {avg:6.1f} p10 {p10:6.1f} | {cells}")
        for x in r.restarts:
            print(f"   {x.began:8.0f}s {x.server} {x.before} -> {x.after} ready "
                  f"{x.ready or float('nan'):8.0f}s aborted {x.aborted}: {x.reason}")  # fmt: skip
        if sim.where is not None:
            print("\n".join(sim.where.lines()))


if __name__ == "__main__":
    main()
