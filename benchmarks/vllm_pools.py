"""Depth follows load on a pool of vLLM servers, in virtual time: `depth_sim`'s pool and the
product's own depth loop, with every server seen only as the proxy sees a vLLM backend.

    .venv/bin/python benchmarks/vllm_pools.py --profile seed-qwen35-122b \\
        --trace scenarios/depth-ramp.toml --pool auto --pool k3 --pool dynamic

What differs from the SGLang pool of `depth_sim.py`, each from what vLLM exposes
(`specroute/pool/engines.py`; vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py):
- load: `vllm:num_requests_running` + `..._waiting`, scraped every `metrics_interval_s` and
  written `SERVER_LAG_S` late (vllm-project/vllm#49538 reports 3-6 s), combined with the
  proxy's own in-flight counts by the proxy's own `LoadMark`, read with the proxy's lag for
  a vLLM backend (`pool.index.gauge_lag`);
- acceptance: no per-request figure (`--per-request-spec-decode-metrics` is off by default), so
  the proxy learns from tokens per stream chunk with vLLM's framing (role chunk, one chunk per
  engine step, the finish reason on the last one), and the backend's windowed accept length
  comes from the draft and accepted-token counters between two scrapes;
- no `/server_info`: depth and capacity are the launch's (`--max-num-seqs`, vLLM's default
  256 under the memory bound); a server with a `num_speculative_tokens_per_batch_size` table
  is adaptive (its accept length belongs to no one depth).
Restarts are charged as for SGLang: drain, stop, the profile's start-up, readmission.

The dynamic-K pool is three servers with the table an operator writes from the tune
measurements (`vllm_table.operator_table`).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec
from depth_pools import ROOT, PoolSpec, pools, tuned
from depth_sim import DepthSim, launch_options
from policy_sim import Node, Req
from sim_results import SimResult
from vllm_table import MAX_K, Table, operator_table

from specroute.batch_limit import BatchLimit
from specroute.bench.trace import Scenario, load_scenario
from specroute.config import HealthConfig, ReplicasConfig
from specroute.emulator.engine import Engine
from specroute.emulator.options import VLLM_DEFAULT_MAX_NUM_SEQS
from specroute.emulator.profiles import get_profile
from specroute.emulator.vllm_schedule import DynamicSchedule
from specroute.launch.vllm_argv import vllm_ranges
from specroute.logs import configure_logging
from specroute.planner import Setting
from specroute.policies import Outcome, PoolView
from specroute.pool.engines import STREAM_FRAMING
from specroute.pool.index import gauge_lag
from specroute.pool.load import LoadMark, Share, headroom
from specroute.reconfigure.options import add_planner_arguments, allowed_steps, planner_fields
from specroute.wire import PoolSnapshot

SERVER_LAG_S = 4.5
"""How late the emulated vLLM servers' running and waiting gauges are (vllm-project/vllm#49538:
3 to 6 s)."""
SCRAPE_S = HealthConfig().metrics_interval_s
GAUGE_LAG_S = ReplicasConfig().gauge_lag_s
STALE_S = max(ReplicasConfig().scrape_stale_s, 2 * SCRAPE_S)
HISTORY_S = 10.0
"""Own counts the proxy keeps per backend (`pool/index.py`'s `_HISTORY_S`)."""


@dataclass
class VllmNode(Node):
    """A backend with the proxy's load mark and the engine's lagging gauge."""

    mark: LoadMark = field(default_factory=LoadMark)
    history: deque[tuple[float, int]] = field(default_factory=deque)
    """(time, requests there from then on): what the gauges show `SERVER_LAG_S` later."""
    drafts: int = 0
    accepted: int = 0
    window: tuple[int, int] = (0, 0)
    accept_length: float | None = None
    scraped: int | None = None
    """The gauges' sum at the last scrape."""
    limits: BatchLimit = field(default_factory=BatchLimit)
    """The batch limit per depth the proxy read from the scrapes (`Backend.seen_limits`)."""

    def add(self, delta: int, now: float) -> None:
        super().add(delta, now)
        self.mark.moved(self.in_flight, now, HISTORY_S)
        self.history.append((now, self.in_flight))
        while len(self.history) > 1 and self.history[1][0] <= now - SERVER_LAG_S - 1.0:
            self.history.popleft()

    def gauge(self, now: float) -> int:
        """`num_requests_running + num_requests_waiting` as vLLM shows them at `now`."""
        at = now - SERVER_LAG_S
        index = bisect.bisect_right([t for t, _ in self.history], at) - 1
        return self.history[index][1] if index >= 0 else 0

    def scraped_accept_length(self) -> float | None:
        """1 + accepted / drafts between this scrape and the last (the last while none)."""
        drafts, accepted = self.drafts - self.window[0], self.accepted - self.window[1]
        self.window = (self.drafts, self.accepted)
        if drafts > 0:
            self.accept_length = 1.0 + accepted / drafts
        return self.accept_length


class VllmSim(DepthSim):
    """`DepthSim` whose servers are vLLM servers, as the proxy sees them."""

    nodes: list[VllmNode]  # type: ignore[assignment]
    tables = True

    def __init__(
        self, profile: str, spec: PoolSpec, *, table: Table = (), direct: bool = False,
        sglang_lag: bool = False, limits: bool = False, **kwargs: Any,
    ) -> None:  # fmt: skip
        self.table = table
        self.sglang_lag = sglang_lag
        """The proxy reads vLLM's gauges with SGLang's lag (as before `gauge_lag` knew vLLM)."""
        self.phantom: list[int] = []
        """At each scrape, the requests the proxy counts as other clients' (none exist)."""
        self.direct = direct
        """The loop and the policy read the proxy's own in-flight counts instead of vLLM's
        lagging gauges (the load as if known exactly; acceptance still as vLLM gives it)."""
        super().__init__(profile, spec, **kwargs)
        self.nodes = [VllmNode(n.name, n.engine) for n in self.nodes]
        if limits:  # the proxy told each depth's batch limit, and nothing else of a tune
            self.tuned_capacity = {k: self._engine(Setting(steps=k), 0).max_running_requests
                                   for k in range(MAX_K + 1)}  # fmt: skip

    def _engine(self, setting: Setting, salt: int) -> Engine:
        table = vllm_ranges(setting.table, VLLM_DEFAULT_MAX_NUM_SEQS) if setting.table else None
        table = table or self.table
        schedule = DynamicSchedule(table, setting.steps) if table else None
        return Engine(self.profile, steps=setting.steps, seed=self.seed * 1000 + salt,
                      max_running_requests=VLLM_DEFAULT_MAX_NUM_SEQS,
                      schedule=schedule)  # fmt: skip

    def learn(self, req: Req, generated: int, verify: int, error: str | None = None) -> None:
        """The `Outcome` the proxy makes of a vLLM stream: no per-request verify count; the
        chunks are the role chunk and one per engine step."""
        node = self.nodes[req.backend]
        if error is None and generated > 1:
            node.drafts += verify
            node.accepted += max(0, generated - 1 - verify)
        elapsed = self.now - req.start
        mean = (node.load_area(self.now) - req.area0) / elapsed if elapsed > 0 else None
        node.add(-1, self.now)
        gaps = tuple(b - a for a, b in zip(req.times, req.times[1:], strict=False))
        dynamic = bool(self.table or self.slots[req.backend].setting.table)
        outcome = Outcome(
            backend=node.name, steps=node.engine.steps, workload_class=req.klass, status=200,
            stream=True, completion_tokens=generated, chunks=len(req.times) + 1,
            verify_count=None, ttft_s=req.times[0] - req.start if req.times else None,
            chunk_gaps_s=gaps, duration_s=elapsed, in_flight_at_start=0, mean_in_flight=mean,
            error=error, lane=req.lane,
        )  # fmt: skip
        self.telemetry.observe(outcome, capacity=self.capacity_of(req.backend),
                               scraped=node.accept_length, acceptance=not dynamic,
                               framing=STREAM_FRAMING["vllm"])  # fmt: skip
        self.policy.observe(outcome)

    # -- what the proxy knows of a vLLM backend --------------------------------------------------

    async def _run(self, *args: Any) -> SimResult:
        """The trace, with the proxy's scraper beside it (routing reads its scrapes too)."""
        scraper = asyncio.create_task(self._scrape_forever())
        await self._settle()
        try:
            return await super()._run(*args)
        finally:
            scraper.cancel()

    async def _scrape_forever(self) -> None:
        """The proxy's scraper: each reachable backend's /metrics every `SCRAPE_S`."""
        while True:
            await self.sleep(SCRAPE_S)
            for i, (node, slot) in enumerate(zip(self.nodes, self.slots, strict=True)):
                if slot.state != "starting":
                    node.scraped = total = node.gauge(self.now)
                    if not self.table and not slot.setting.table:  # `Backend.scraped`
                        cap = node.engine.max_running_requests
                        node.limits.read(node.engine.steps, min(total, cap), max(0, total - cap))
                    node.mark.scraped(node.scraped, node.in_flight, self.now, self._lag(i))
                    node.scraped_accept_length()
            self.phantom.append(sum(n.mark.others for n in self.nodes))

    def _lag(self, i: int) -> float:
        """The lag the proxy assumes for backend `i`'s gauges (`RoutingIndex._lag`)."""
        if self.sglang_lag:
            return gauge_lag("sglang", GAUGE_LAG_S, super().view([i]).backends[0])
        return gauge_lag("vllm", GAUGE_LAG_S, None)

    def capacity_of(self, i: int) -> int | None:
        """A vLLM server's batch limit as the proxy knows it (`Backend.capacity`): vLLM reports
        none and `launch` configures none, so the tune's figure at the depth it runs (the
        prior's), else the one its scrapes showed there; none for the operator's dynamic-K
        server (no one depth), the tune's at the most it drafts for one the loop declared."""
        node, slot = self.nodes[i], self.slots[i]
        if self.table or slot.state == "starting":
            return None
        steps = slot.setting.steps if slot.setting.table else node.engine.steps
        tuned = self.tuned_capacity.get(steps)
        return tuned if tuned is not None else node.limits.at(steps)

    def in_flight_limit(self, i: int) -> int | None:
        cap = self.capacity_of(i)
        return None if cap is None else int(cap * self.overcommit)

    def _load(self, i: int) -> dict[str, Any]:
        """The proxy's combined count and room for one backend (`pool/index.py`'s `_load`)."""
        node = self.nodes[i]
        room = headroom(node.mark, node.in_flight, self.capacity_of(i), Share(), now=self.now,
                        stale_after_s=STALE_S)  # fmt: skip
        return {"combined": node.mark.combined(node.in_flight, self.now, STALE_S), "headroom": room}

    def _known(self, i: int) -> dict[str, Any]:
        """Capacity and in-flight limit as the proxy knows them."""
        return {"capacity": self.capacity_of(i), "limit": self.in_flight_limit(i)}

    def view(self, nodes: list[int]) -> PoolView:
        """What a policy sees: capacity as the proxy knows it, and the backends' load as the
        proxy combines it with the scrapes."""
        base = super().view(nodes)
        backends = tuple(
            msgspec.structs.replace(b, **self._known(i), **({} if self.direct else self._load(i)))
            for b, i in zip(base.backends, nodes, strict=True)
        )
        caps = [b.capacity for b in backends]
        total = None if None in caps else sum(c for c in caps if c is not None)
        return msgspec.structs.replace(base, backends=backends, capacity_total=total)

    def snapshot(self) -> PoolSnapshot:
        """`GET /pool` with vLLM's view of each backend: no gauge of its own but the lagging
        scrape, the proxy's combined load and room, the counters' accept length."""
        base = super().snapshot()
        if self.direct:
            backends = [msgspec.structs.replace(b, **self._known(i))
                        for i, b in enumerate(base.backends)]  # fmt: skip
            return msgspec.structs.replace(base, backends=backends)
        backends = []
        for i, (b, node, slot) in enumerate(zip(base.backends, self.nodes, self.slots,
                                                strict=True)):  # fmt: skip
            up = slot.state != "starting"
            cap = node.engine.max_running_requests
            total = node.scraped
            extra: dict[str, object] = {
                "steps": node.engine.steps if up else None, "algorithm": "mtp",
                "adaptive": bool(self.table), **self._known(i),
                **self._load(i),
                "running": None if total is None or not up else min(total, cap),
                "queued": None if total is None or not up else max(0, total - cap),
                "accept_length": node.accept_length if up else None,
            }  # fmt: skip
            backends.append(msgspec.structs.replace(b, **extra))
        return msgspec.structs.replace(base, backends=backends)


# -- pools and runs -----------------------------------------------------------------------------


AUTO = {"auto": "", "auto-k7": ",".join(map(str, range(MAX_K + 1))), "auto-direct": "",
        "auto-sglang-lag": "", "auto-tuned": ""}  # fmt: skip
"""The loop's pools: launch's default depths, every depth tune measured (0-7), launch's
default depths with the load known exactly (`direct`), and with vLLM's gauges read with
SGLang's lag (`sglang_lag`); `auto-tuned` is `specroute launch --engine vllm --prior P.json
--reconfigure auto` from a vLLM tune (`TUNED`): the prior's pool and depths."""
TUNED = ROOT / "benchmarks" / "results" / "vllm-bound" / "tune"
"""`prior.json` of `specroute tune --emulate --engine vllm --profile P --steps 0,...,7`, as
`P.json` (`benchmarks/results/vllm-bound/tune/README.md` has the commands)."""


EXPECTED_USERS = (8, 16, 32)
"""`--expected-users` the `-uN` pools launch with (the traces run 1 to 64 users at once)."""


def tuned_pools(profile: str) -> dict[str, PoolSpec]:
    """`auto-tuned` and `launched-tuned` (its pool never reconfigured), from the profile's
    vLLM tune, and the same launched with `--expected-users N` (`auto-tuned-uN`,
    `launched-tuned-uN`); none where no vLLM tune was kept."""
    path = TUNED / f"{profile}.json"
    out = {f"{name}-tuned": spec for name, spec in tuned(profile, path).items()}
    out.update({f"{name}-dynamic-tuned": spec
                for name, spec in tuned(profile, path, tables=True).items()})  # fmt: skip
    for users in EXPECTED_USERS:
        specs = tuned(profile, path, users)
        out.update({f"{name}-tuned-u{users}": spec for name, spec in specs.items()})
    return out


def vllm_pools() -> list[str]:
    """auto and its variants, the launched mix (and with the proxy told each server's batch
    limit, `-limits`), the tuned pool never reconfigured, fixed K 0..7, the operator's
    dynamic-K table."""
    fixed = (f"k{k}" for k in range(MAX_K + 1))
    expected = (f"{name}-tuned-u{n}" for n in EXPECTED_USERS for name in ("auto", "launched"))
    return [*AUTO, *expected, "mix-1-2-3", "mix-1-2-3-limits", "launched-tuned", *fixed,
            "dynamic", "auto-dynamic-tuned", "launched-dynamic-tuned"]  # fmt: skip


class Run(msgspec.Struct):
    """One pool's run on one trace, the dynamic pool's table, and the load the proxy counted
    as other clients' at its scrapes (mean over scrapes, summed over backends)."""

    result: SimResult
    table: Table = ()
    phantom: float = 0.0


def simulate(
    profile: str, pool: str, scenario: Scenario, *, seed: int = 0, scale: float = 1.0,
    table_for: Scenario | None = None, **kwargs: Any,
) -> Run:  # fmt: skip
    """One pool on one trace (the dynamic pool's table written for `table_for`, by default
    the trace itself)."""
    sim = pool_sim(profile, pool, table_for or scenario, seed=seed, **kwargs)
    result = sim.run(scenario, pool, scale)
    return Run(result, sim.table, sum(sim.phantom) / len(sim.phantom) if sim.phantom else 0.0)


def pool_sim(
    profile: str, pool: str, table_for: Scenario, *, seed: int = 0, **kwargs: Any
) -> VllmSim:
    """`pool` as `simulate` runs it, not yet run (the dynamic pool's table written for
    `table_for`)."""
    table: Table = ()
    if "-tuned" in pool:
        specs = tuned_pools(profile)
        if pool not in specs:
            raise SystemExit(f"{pool}: no vLLM tune of {profile} in {TUNED}")
        spec = specs[pool]
        if pool == "auto-dynamic-tuned":  # launch --allow-adaptive: tables from the start
            given = kwargs.get("reconfigure") or launch_options(spec)
            kwargs["reconfigure"] = msgspec.structs.replace(given, allow_adaptive=True)
    elif pool in AUTO:
        spec = pools()["auto"]
        if AUTO[pool]:
            kwargs["reconfigure"] = msgspec.structs.replace(
                kwargs.get("reconfigure") or launch_options(spec),
                allowed_steps=allowed_steps(AUTO[pool]))  # fmt: skip
        kwargs["direct"] = pool == "auto-direct"
        kwargs["sglang_lag"] = pool == "auto-sglang-lag"
    elif pool == "dynamic":
        steps, table = operator_table(get_profile(profile), table_for)
        spec = PoolSpec((Setting(steps=steps),) * 3, "least_loaded")
    elif pool == "mix-1-2-3-limits":
        spec, kwargs["limits"] = pools()["mix-1-2-3"], True
    else:
        spec = pools()[pool]
    return VllmSim(profile, spec, table=table, seed=seed, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--trace", default=str(ROOT / "scenarios" / "depth-swing.toml"))
    parser.add_argument("--pool", action="append", default=[], choices=vllm_pools())
    parser.add_argument("--scale", type=float, default=1.0, help="multiply phase durations")
    parser.add_argument("--seed", type=int, default=0)
    # --allowed-steps, --min-dwell, --planner-option: launch's (depths: the pool's prior's)
    add_planner_arguments(parser, None, "; default: auto-tuned's prior's, else 0,1,2,3")
    args = parser.parse_args()
    configure_logging("warning")
    scenario = load_scenario(args.trace)
    for pool in args.pool or ["auto"]:
        spec = tuned_pools(args.profile).get(pool) or pools()["auto"]
        given = {"allowed_steps": allowed_steps(args.allowed_steps)} if args.allowed_steps else {}
        options = launch_options(spec, min_dwell_s=args.min_dwell,
                                 planner=planner_fields(args.planner_option), **given)  # fmt: skip
        run = simulate(args.profile, pool, scenario, seed=args.seed, scale=args.scale,
                       reconfigure=options)  # fmt: skip
        r = run.result
        agg, avg, p10 = r.window(0.0, r.phases[-1][2])
        cells = " ".join(f"{r.window(s, e)[0]:7.0f}" for _, s, e in r.phases)
        print(f"{pool:16} total {agg:7.0f} mean {avg:6.1f} p10 {p10:6.1f} | {cells}")
        print(f"   others' requests the proxy counted at its scrapes (none exist): mean "
              f"{run.phantom:.2f}")  # fmt: skip
        if run.table:
            print(f"   num_speculative_tokens_per_batch_size {[list(t) for t in run.table]}")
        for x in r.restarts:
            print(f"   {x.began:8.0f}s {x.server} {x.before} -> {x.after} ready "
                  f"{x.ready or float('nan'):8.0f}s aborted {x.aborted}: {x.reason}")  # fmt: skip


if __name__ == "__main__":
    main()
