"""The bound the peak rule leaves: `depth_bound.py`'s envelope drawn only over the pools the
planner may propose. The planner proposes only pools in which one server can still restart
while the others hold the launched pool's load, or the highest load seen if more (`Planner.
escape_load` against that floor, DESIGN.md's "peak rule"); three deep servers on a quiet trace
are not among them. So where the envelope's pick is a pool the rule forbids, no loop under the
rule reaches the envelope, and this says how far one could.

    .venv/bin/python benchmarks/rule_bound.py --jobs 2 --profile seed-qwen35-122b \\
        --trace depth-swing --trace depth-quiet-3

Per trace and profile it prints the best alternative (the launched pool and the fixed pools
k0..k7 never reconfigured: what an operator runs), the envelope over them (`depth_bound`'s,
unconstrained), and the envelope under the rule: per phase, the fixed pools the rule allows
there and the mixed pools it allows that the product's forecast ranks best at the phase's
load (`--top` of them), each simulated on that phase from a fresh pool (a minute's warm-up,
then up to ten minutes measured, as `depth_bound.sampled` measures pools on long phases),
routed by launch's `throughput` policy from the prior; one pool per phase, each switch charged
a restart as the envelope charges it. A phase's floor is the launched pool's escape load or
the highest phase concurrency up to it. Where auto's run is kept (`depth_bound.py --pool
auto`), its figure and its share of each bound's headroom are printed beside.

The rule's envelope is drawn twice: from any pool (the first phase's pick free), and from the
launched pool (its first switch charged: what a loop `launch` starts could reach under the
rule). Both envelopes are oracles: they know every phase in advance and pay no settle, confirm
or drain time. The rule's is also a lower bound on what the rule allows, since only `--top`
mixes are tried per phase. On traces of phases under eleven minutes, where `depth_bound`
runs the fixed pools whole, a mix is still measured phase by phase from a fresh pool: it
carries no requests over from the phase before.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import multiprocessing
import sys
import time
from pathlib import Path

import msgspec
from depth_bound import (
    CACHE,
    PROFILES,
    ROOT,
    SAMPLE_S,
    SOURCES,
    TRACES,
    WARM_S,
    Option,
    _job_path,
    _run,
    best_sequence,
    envelope,
)
from depth_pools import PoolSpec, pools
from depth_sim import LAUNCH_LIMIT, DepthSim
from sim_results import SimResult

from specroute.bench.trace import Scenario, load_scenario
from specroute.emulator.profiles import get_profile
from specroute.logs import configure_logging
from specroute.planner import Planner, PlannerOptions, Setting, forecast, user_counts
from specroute.planner.forecast import Physics
from specroute.reconfigure.readings import estimates
from specroute.speculation import is_greedy

TOP = 4
"""Mixed pools tried per phase: the ones the forecast ranks best among those the rule allows."""


class Rule:
    """The peak rule as the planner applies it to the pool `specroute launch` starts from the
    profile's prior: the estimates the loop reads from the simulated proxy at the start, and
    the launched pool's escape load (`Planner.escape_load`)."""

    def __init__(self, profile: str) -> None:
        auto = pools(profile)["auto"]
        self.allowed = auto.allowed or (0, 1, 2, 3)
        self.servers = len(auto.settings)
        est = estimates(DepthSim(profile, auto).snapshot(), self.allowed, lambda k: LAUNCH_LIMIT)
        if est is None:
            raise SystemExit(f"{profile}: the prior gives the planner no estimates")
        self.phys = Physics(est)
        self.planner = Planner(PlannerOptions())
        self.launched = self.escape(auto.settings)

    def escape(self, settings: tuple[Setting, ...]) -> float:
        return self.planner.escape_load(settings, self.phys)

    def floors(self, scenario: Scenario) -> list[float]:
        """Per phase, the load a proposed pool must stay escapable at: the launched pool's
        escape load, or the highest phase concurrency up to it if more."""
        out, peak = [], 0.0
        for phase in scenario.phases:
            peak = max(peak, float(phase.concurrency))
            out.append(max(self.launched, peak))
        return out


@functools.cache
def rule_of(profile: str) -> Rule:
    """`profile`'s rule, built once per run: its start-up estimates take a simulated pool."""
    return Rule(profile)


def _shares(scenario: Scenario, i: int, model: str) -> dict[str, float]:
    """The phase's classes as the planner names them, by their share of the requests in
    flight (a request's weight times its longest reply: the forecast picks candidates, the
    simulator measures them)."""
    shares: dict[str, float] = {}
    for s in scenario.phases[i].mix or scenario.mix:  # a phase without one takes the trace's
        name = f"{model}:{'greedy' if is_greedy(s.temperature) else 'sampled'}"
        shares[name] = shares.get(name, 0.0) + s.weight * s.max_tokens
    total = sum(shares.values())
    return {c: v / total for c, v in shares.items()}


def candidates(profile: str, trace: str, top: int) -> list[list[tuple[Setting, ...]]]:
    """Per phase, the mixed pools the rule allows there that the forecast ranks best."""
    rule = rule_of(profile)
    scenario = load_scenario(TRACES[trace])
    model = next(iter(rule.phys.est.classes)).split(":")[0]
    out = []
    for i, (phase, floor) in enumerate(zip(scenario.phases, rule.floors(scenario), strict=True)):
        users = user_counts(float(phase.concurrency), _shares(scenario, i, model))
        mixes = []
        for combo in itertools.combinations_with_replacement(rule.allowed, rule.servers):
            settings = tuple(Setting(steps=k) for k in combo)
            if len(set(combo)) == 1 or rule.escape(settings) < floor:
                continue  # fixed pools are measured whole; forbidden ones are not candidates
            value = forecast(settings, users, rule.phys, "throughput", 0.0).value
            mixes.append((value, settings))
        out.append([s for _, s in sorted(mixes, key=lambda m: -m[0])[:top]])
    return out


def allowed_fixed(profile: str, trace: str) -> list[list[str]]:
    """Per phase, the pools that never restart (launched, k0..k7) the rule allows there."""
    rule, specs = rule_of(profile), pools(profile)
    names = ["launched", *(f"k{k}" for k in rule.allowed)]
    floors = rule.floors(load_scenario(TRACES[trace]))
    return [[n for n in names if rule.escape(specs[n].settings) >= f] for f in floors]


MixJob = tuple[str, str, int, tuple[int, ...], int]
"""(profile, trace, phase index, depths, seed)."""


def _mix_path(job: MixJob) -> Path:
    profile, trace, i, depths, seed = job
    digest = hashlib.sha256(f"{profile} {i} {depths} {seed} {WARM_S} {SAMPLE_S}".encode())
    digest.update(TRACES[trace].read_bytes())
    for path in sorted(p for pattern in SOURCES for p in ROOT.glob(pattern)):
        digest.update(path.read_bytes())
    prior = pools(profile)["launched"].prior
    if prior is not None:
        digest.update(prior.read_bytes())
    label = "-".join(map(str, depths))
    return CACHE / f"{profile}__{trace}__rule-mix-{label}__p{i}__{digest.hexdigest()[:12]}.json"


def _mix_rate(job: MixJob) -> tuple[MixJob, float]:
    """The mixed pool's aggregate tok/s on one phase, from a fresh pool: `WARM_S` of warm-up,
    then the phase's length up to `SAMPLE_S` measured. Kept under results/ like every run."""
    path = _mix_path(job)
    if path.exists():
        return job, msgspec.json.decode(path.read_bytes(), type=float)
    profile, trace, i, depths, seed = job
    scenario = load_scenario(TRACES[trace])
    phase = scenario.phases[i]
    measured = min(SAMPLE_S, phase.duration)
    short = msgspec.structs.replace(phase, duration=WARM_S + measured)
    launched = pools(profile)["launched"]
    spec = PoolSpec(tuple(Setting(steps=k) for k in depths), launched.policy, prior=launched.prior)
    sim = DepthSim(profile, spec, seed=seed + 7919 * i)
    result = sim.run(msgspec.structs.replace(scenario, phases=[short]), "rule-mix")
    rate = result.window(WARM_S, WARM_S + measured)[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(rate))
    return job, rate


def _fixed(job: tuple[str, str, str, int]) -> tuple[str, str, str, SimResult]:
    profile, trace, pool, seed = job
    full = (profile, trace, pool, 1.0, seed, False, None, None)
    return (profile, trace, pool, _run(full, _job_path(full))[2])


def _auto(profile: str, trace: str, seed: int) -> SimResult | None:
    """auto's kept run of this trace, if `depth_bound.py --pool auto` made one on this code."""
    job = (profile, trace, "auto", 1.0, seed, False, None, None)
    path = _job_path(job)
    return msgspec.json.decode(path.read_bytes(), type=SimResult) if path.exists() else None


def _share(auto: float, best: float, bound: float) -> str:
    if bound - best <= 0.005 * best:
        return "-"
    return f"{(auto - best) / (bound - best):.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", choices=PROFILES, default=[])
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    parser.add_argument("--top", type=int, default=TOP, help="mixed pools tried per phase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    configure_logging("warning")
    rows = [(p, t) for p in args.profile or PROFILES for t in args.trace or TRACES]
    fixed_jobs = [(p, t, pool, args.seed) for p, t in rows
                  for pool in ["launched", *(f"k{k}" for k in pools(p)["auto"].allowed or
                                             (0, 1, 2, 3))]]  # fmt: skip
    mixes = {(p, t): candidates(p, t, args.top) for p, t in rows}
    mix_jobs = sorted({(p, t, i, tuple(s.steps for s in settings), args.seed)
                       for (p, t), per_phase in mixes.items()
                       for i, phase in enumerate(per_phase) for settings in phase})  # fmt: skip
    started = time.monotonic()
    results: dict[tuple[str, str], dict[str, SimResult]] = {}
    rates: dict[MixJob, float] = {}
    with multiprocessing.Pool(args.jobs) as workers:  # progress on stderr, the report on stdout
        total = len(fixed_jobs) + len(mix_jobs)
        for n, (p, t, pool, r) in enumerate(workers.imap_unordered(_fixed, fixed_jobs), 1):
            results.setdefault((p, t), {})[pool] = r
            print(f"[{n}/{total}] {p} {t} {pool} ({time.monotonic() - started:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
        done = len(fixed_jobs)
        for n, (job, rate) in enumerate(workers.imap_unordered(_mix_rate, mix_jobs), done + 1):
            rates[job] = rate
            print(f"[{n}/{total}] {job[0]} {job[1]} phase {job[2]} mix {job[3]} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    print(
        "| profile | trace | best alternative | envelope | under the peak rule | its picks "
        "| from the launched pool, under the rule | auto | auto's share of each headroom |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for profile, trace in rows:
        by_pool = results[(profile, trace)]
        specs = pools(profile)
        startup = get_profile(profile).startup_s
        phases = by_pool["launched"].phases
        end = phases[-1][2]
        whole = {pool: r.window(0, end)[0] for pool, r in by_pool.items()}
        alt = max(whole, key=lambda pool: whole[pool])
        env = envelope(by_pool, startup, specs).whole[0]
        allowed = allowed_fixed(profile, trace)
        options = []
        for i, (_, start, stop) in enumerate(phases):
            here = [Option(n, specs[n].settings, by_pool[n].window(start, stop)[0])
                    for n in allowed[i]]  # fmt: skip
            for job, rate in rates.items():
                if job[:3] == (profile, trace, i):
                    settings = tuple(Setting(steps=k) for k in job[3])
                    here.append(Option("/".join(s.label for s in settings), settings, rate))
            options.append(here)
        tokens, chosen = best_sequence(phases, options, startup)
        bound, picks = sum(tokens) / end, [o.name for o in chosen]
        launched = Option("launched", specs["launched"].settings, 0.0)
        held = sum(best_sequence(phases, options, startup, launched)[0]) / end
        auto = _auto(profile, trace, args.seed)
        mine = "-" if auto is None else f"{auto.window(0, end)[0]:.0f}"
        shares = "-" if auto is None else (
            f"{_share(auto.window(0, end)[0], whole[alt], env)} of the envelope's, "
            f"{_share(auto.window(0, end)[0], whole[alt], bound)} of the rule's")  # fmt: skip
        runs = [name for name, _ in itertools.groupby(picks)]
        shown = " > ".join(runs) if len(runs) <= 6 else f"{len(runs)} pools in turn"
        print(f"| {profile} | {trace} | {alt} {whole[alt]:.0f} | {env:.0f} "
              f"({env / whole[alt] - 1:+.1%}) | {bound:.0f} ({bound / whole[alt] - 1:+.1%}) "
              f"| {shown} | {held:.0f} ({held / whole[alt] - 1:+.1%}) | {mine} "
              f"| {shares} |")  # fmt: skip


if __name__ == "__main__":
    main()
