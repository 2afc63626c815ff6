"""Depth follows load: every pool on every trace in virtual time, the envelope bound beside, and
the targets of the issue checked. One command prints the whole report for the three profiles:

    .venv/bin/python benchmarks/depth_bound.py --jobs 2

Pools (`depth_pools.pools(profile)`): `auto` is what `specroute launch --prior P.json
--reconfigure auto` runs, P.json being what `specroute tune --emulate --steps 0,...,7` wrote for
the profile (`benchmarks/results/depth-bound/tune/`): the pool the prior recommends for three
servers, the depths it measured (0-7) for the planner, no adaptive, under `throughput`, with the
product's depth loop; `launched` is that pool never reconfigured; then three servers at each
fixed depth 0..7 and three SGLang-adaptive servers (default tiers, deepest 7; capped at 3)
behind least_loaded.

The envelope is the bound for the same allowed depths: the best sequence of the fixed pools and
the launched one, one per phase (by aggregate tok/s), as if an oracle switched configuration at
phase boundaries; each switch is charged a restart: every server that changes is out for one
start-up, losing its share of the new configuration's phase rate. Where phases are long it is
the per-phase best. Adaptive pools are shown beside, outside the bound (launch does not allow
them by default).

The envelope is drawn a second time from the launched pool (its first switch charged too):
the most a loop `launch` starts could give over these pools. Where it is more than 0.5% under
the best fixed pool, never behind is out of reach on that row over the fixed pools; a mixed
pool may still reach it (a move simulated from the launched pool, `depth_sim.py --pool
launched --restart T:SERVER:kK`, says). It needs only the launched and fixed pools (no
`auto` run).
Cells: aggregate tok/s / mean / p10 per-request tok/s (1 / TPOT).

Where every phase lasts 11 minutes or more, the pools that never restart are measured phase by
phase on a 10-minute sample after a minute's warm-up (`sampled`), tiled over the phase: they
sit in a steady state there, and this keeps a 24-hour trace affordable. `auto`
always runs the whole trace, every transition and restart included.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import multiprocessing
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import msgspec
from depth_pools import ROOT, PoolSpec, pools
from depth_sim import BIN_S, SimResult, launch_options, simulate
from depth_verdict import HEADER, NEVER_BEHIND, Verdict, forecast_errors, verdict

from specroute.bench.stats import mean, percentile
from specroute.bench.trace import Scenario, load_scenario
from specroute.emulator.profiles import get_profile
from specroute.logs import configure_logging
from specroute.planner import Setting

PROFILES = ("seed-qwen35-122b", "costly-drafts", "h200-qwen35-122b-shape")
TRACES = {
    "depth-swing": ROOT / "scenarios" / "depth-swing.toml",
    "policy-eval": ROOT / "scenarios" / "policy-eval.toml",
    "depth-diurnal": ROOT / "scenarios" / "depth-diurnal.toml",
    "depth-night-burst": ROOT / "scenarios" / "depth-night-burst.toml",
    "depth-quiet-3": ROOT / "scenarios" / "depth-quiet-3.toml",
    "depth-flap": ROOT / "scenarios" / "depth-flap.toml",
    "depth-ramp": ROOT / "scenarios" / "depth-ramp.toml",
    "depth-temperature-swing": ROOT / "scenarios" / "depth-temperature-swing.toml",
    "depth-live": ROOT / "scenarios" / "depth-live.toml",
    "depth-agents": ROOT / "scenarios" / "depth-agents.toml",
}
DAY_S = 86400.0
WARM_S, SAMPLE_S = 60.0, 600.0
"""Pools that never restart are measured on this much of each phase (after a warm-up), where
every phase is longer; `auto` always runs the whole trace."""
CACHE = ROOT / "results" / "depth-sim"
SOURCES = (
    "benchmarks/depth_sim.py", "benchmarks/depth_pools.py", "benchmarks/policy_sim.py",
    "benchmarks/sim_results.py",
    "examples/adaptive-capped-3.json",
    "specroute/emulator/engine.py", "specroute/emulator/profiles.py",
    "specroute/emulator/adaptive.py", "specroute/emulator/adaptive_config.py",
    "specroute/policies/*.py", "specroute/pool/telemetry.py",
    "specroute/pool/estimators.py", "specroute/pool/prior.py", "specroute/speculation.py",
    "specroute/profile_format.py", "specroute/proxy/info.py",
)  # fmt: skip
"""What a simulated run depends on; `auto` also depends on the depth loop and its contract."""
LOOP = ("benchmarks/sim_proxy.py", "specroute/planner/*.py", "specroute/reconfigure/*.py",
        "specroute/wire/*.py")  # fmt: skip
"""What a run the depth loop plans depends on besides: the loop, its contract, and the
simulated proxy it reads (a pool that never restarts never asks that proxy anything)."""
Cell = tuple[float, float, float]
Job = tuple[str, str, str, float, int, bool, float | None, float | None]
"""... with a restart's start-up and drain (`--startup`, `--drain`; None: profile, launch)."""


@dataclass(frozen=True)
class Envelope:
    picks: list[str]
    phases: list[Cell]
    whole: Cell
    switches: int


def _cache_path(
    profile: str, trace: str, pool: str, scale: float, seed: int, costs: str = ""
) -> Path:
    """Runs are kept under results/ by a digest of everything they depend on."""
    digest = hashlib.sha256(f"{profile} {pool} {scale} {seed} {WARM_S} {SAMPLE_S}{costs}".encode())
    digest.update(TRACES[trace].read_bytes())
    spec = pools(profile)[pool]
    patterns = [*SOURCES, *(LOOP if spec.planner else [])]
    for path in sorted(p for pattern in patterns for p in ROOT.glob(pattern)):
        digest.update(path.read_bytes())
    digest.update(repr(spec).encode())
    if spec.prior is not None:
        digest.update(spec.prior.read_bytes())
    name = f"{profile}__{trace}__{pool.replace('<=', 'le')}__{digest.hexdigest()[:12]}.json"
    return CACHE / name


def sampled(profile: str, pool: str, scenario: Scenario, seed: int, scale: float) -> SimResult:
    """A pool that never restarts, phase by phase: each phase from a fresh pool for `WARM_S`
    plus `SAMPLE_S` measured, tiled over the phase (tokens at the measured mean rate, the
    measured requests repeated). Its steady state at a fraction of the cost."""
    phases, bins, finished, start = [], [], [], 0.0
    for i, phase in enumerate(scenario.phases):
        length = phase.duration * scale
        short = msgspec.structs.replace(phase, duration=WARM_S + SAMPLE_S)
        r = simulate(profile, pool, msgspec.structs.replace(scenario, phases=[short]),
                     seed=seed + 7919 * i)  # fmt: skip
        rate = r.window(WARM_S, WARM_S + SAMPLE_S)[0]
        first, end = len(bins), math.ceil((start + length) / BIN_S)
        bins += [rate * BIN_S] * (end - first)
        measured = [(t - WARM_S, v) for t, v in r.finished if WARM_S <= t < WARM_S + SAMPLE_S]
        for tile in range(math.ceil(length / SAMPLE_S)):
            at = start + tile * SAMPLE_S
            finished += [(at + t, v) for t, v in measured if at + t < start + length]
        phases.append((phase.name, start, start + length))
        start += length
    return SimResult(pool, phases, bins, finished)


def _costs(job: Job) -> tuple[dict[str, object], str]:
    """What a restart costs auto in `job` (`--startup`, `--drain`; none: as launched), and
    the tag its digest takes for them."""
    profile, _, pool, _, _, _, startup, drain = job
    spec = pools(profile)[pool]
    costs: dict[str, object] = {}
    if spec.planner:  # `--startup`, `--drain`: what a restart costs auto (None: as launched)
        costs["startup_s"] = startup
        if drain is not None:
            costs["reconfigure"] = launch_options(spec, drain_s=drain)
    tag = f" {startup} {drain}" if spec.planner and (startup, drain) != (None, None) else ""
    return costs, tag


def _job_path(job: Job) -> Path:
    profile, trace, pool, scale, seed = job[:5]
    return _cache_path(profile, trace, pool, scale, seed, _costs(job)[1])


def _run(job: Job, path: Path) -> tuple[str, str, SimResult]:
    """One run, kept at `path`: its digest was taken before any run began, from the sources
    the workers run (forked from the parent, which imported them). Taken in the worker when
    the run starts, a source edited meanwhile filed the old code's run under the new code's
    digest, and a later run of the new code printed it (2026-12-04, the h200 shape's day)."""
    profile, trace, pool, scale, seed, fresh = job[:6]
    spec = pools(profile)[pool]
    costs = _costs(job)[0]
    if path.exists() and not fresh:
        return profile, trace, msgspec.json.decode(path.read_bytes(), type=SimResult)
    scenario = load_scenario(TRACES[trace])
    steady = all(p.duration * scale >= WARM_S + SAMPLE_S for p in scenario.phases)
    if steady and not spec.planner:
        result = sampled(profile, pool, scenario, seed, scale)
    else:
        result = simulate(profile, pool, scenario, seed=seed, scale=scale, **costs)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(result))
    return profile, trace, result


def evaluated(profile: str) -> list[str]:
    """The pools compared by default: auto, launched, fixed k0..k7, adaptive (no 1/2/3 mix
    where a tuned prior gives the launched pool)."""
    names = list(pools(profile))
    return [p for p in names if not (p == "mix-1-2-3" and "launched" in names)]


def _cost(job: Job) -> float:
    """Simulated seconds a job runs (the whole trace for `auto`, else the samples)."""
    _, trace, pool, scale, *_ = job
    phases = [p.duration * scale for p in load_scenario(TRACES[trace]).phases]
    if pool != "auto" and all(d >= WARM_S + SAMPLE_S for d in phases):
        return len(phases) * (WARM_S + SAMPLE_S)
    return sum(phases)


def _numbered(job: tuple[int, Job, Path]) -> tuple[int, tuple[str, str, SimResult]]:
    return job[0], _run(job[1], job[2])


@dataclass(frozen=True)
class Option:
    """A pool one phase may run, and its aggregate tok/s there."""

    name: str
    settings: tuple[Setting, ...]
    rate: float


def best_sequence(
    phases: list[tuple[str, float, float]],
    options: list[list[Option]],
    startup_s: float,
    start: Option | None = None,
) -> tuple[list[float], list[Option]]:
    """(tokens per phase, picks): the best sequence of `options`, one per phase, each switch
    charged a restart: every server that changes (settings matched as multisets) is out for
    one start-up, losing its share of the new pool's phase rate. Dynamic programming over the
    phases, so a switch happens only where it pays. From `start` (the pool running when the
    trace begins: its first pick is charged as a switch from it), else from any pool free."""

    def gained(prev: Option | None, pick: Option, i: int) -> float:
        _, start, end = phases[i]
        tokens = pick.rate * (end - start)
        if prev is None or prev.name == pick.name:
            return tokens
        left = Counter(s.label for s in prev.settings)
        changed = sum((Counter(s.label for s in pick.settings) - left).values())
        share = changed / len(pick.settings)
        return tokens - min(share * tokens, share * startup_s * pick.rate)

    best = {o.name: ([gained(start, o, 0)], [o]) for o in options[0]}
    for i in range(1, len(phases)):
        best = {
            o.name: max(
                (([*got, gained(path[-1], o, i)], [*path, o]) for got, path in best.values()),
                key=lambda gp: sum(gp[0]),
            )
            for o in options[i]
        }
    return max(best.values(), key=lambda gp: sum(gp[0]))


def bounded(specs: dict[str, PoolSpec], results: dict[str, SimResult]) -> list[str]:
    """The pools the envelope chooses among: those of the depths `auto` may use, no adaptive."""
    allowed = set(specs["auto"].allowed or range(4))
    return [p for p in results if p != "auto" and not any(s.tiers for s in specs[p].settings)
            and all(s.steps in allowed for s in specs[p].settings)]  # fmt: skip


def drawable(results: dict[str, SimResult]) -> bool:
    """Whether the report's verdict can be drawn: auto and a fixed pool (k0-k7) beside it.
    The launched pool is none (`depth_verdict.verdict`'s best fixed pool is a `k` pool):
    `--pool auto --pool launched` ran every run and then stopped on an empty `max`."""
    return "auto" in results and any(p.startswith("k") for p in results)


def envelope(
    results: dict[str, SimResult],
    startup_s: float,
    specs: dict[str, PoolSpec],
    start: str | None = None,
) -> Envelope:
    """The best sequence of alternative pools, one per phase, each switch charged a restart
    (`best_sequence`); from the pool `start` names (its first switch charged), else from any.
    From the launched pool it bounds what a loop `launch` starts can do over these pools (not
    over mixed ones): an oracle that knows every phase in advance and pays no settle, confirm
    or drain time."""
    alternatives = bounded(specs, results)
    phases = results[alternatives[0]].phases
    rates = [{p: results[p].window(s, e) for p in alternatives} for _, s, e in phases]
    options = [[Option(p, specs[p].settings, rates[i][p][0]) for p in alternatives]
               for i in range(len(phases))]  # fmt: skip
    first = None if start is None else Option(start, specs[start].settings, 0.0)
    tokens, chosen = best_sequence(phases, options, startup_s, first)
    picks = [o.name for o in chosen]
    cells: list[Cell] = []
    speeds: list[float] = []
    for i, pool in enumerate(picks):
        _, start, end = phases[i]
        cells.append((tokens[i] / (end - start), rates[i][pool][1], rates[i][pool][2]))
        speeds += [v for t, v in results[pool].finished if start <= t < end]
    whole = (sum(tokens) / phases[-1][2], mean(speeds) if speeds else 0.0,
             percentile(speeds, 10) if speeds else 0.0)  # fmt: skip
    switches = sum(a != b for a, b in itertools.pairwise(picks))
    return Envelope(picks, cells, whole, switches)


def settled(result: SimResult) -> list[tuple[float, float]]:
    """Each phase's window after the last restart begun in it is ready."""
    out = []
    for _, start, end in result.phases:
        ready = [r.ready for r in result.restarts if start <= r.began < end and r.ready]
        out.append((max([start, *ready]), end))
    return out


def _cell(c: Cell) -> str:
    return f"{c[0]:6.0f} / {c[1]:5.1f} / {c[2]:5.1f}"


BLOCK = 4
"""Traces of more phases than `MAX_COLUMNS` are tabled in blocks of this many phases."""
MAX_COLUMNS = 6


def _columns(phases: list[tuple[str, float, float]]) -> list[tuple[str, float, float, list[int]]]:
    """Table columns: each phase, or blocks of `BLOCK` phases when there are many."""
    if len(phases) <= MAX_COLUMNS:
        return [(n, s, e, [i]) for i, (n, s, e) in enumerate(phases)]
    out = []
    for i in range(0, len(phases), BLOCK):
        group = phases[i : i + BLOCK]
        name = f"{group[0][0].split('-')[0]}..{group[-1][0].split('-')[0]}"
        out.append((name, group[0][1], group[-1][2], list(range(i, i + len(group)))))
    return out


def report(
    profile: str, trace: str, results: dict[str, SimResult], startup_s: float | None = None
) -> tuple[list[str], Verdict]:
    startup = get_profile(profile).startup_s if startup_s is None else startup_s
    specs = pools(profile)
    env = envelope(results, startup, specs)
    phases = results["auto"].phases
    total = phases[-1][2]
    columns = _columns(phases)
    lines = [f"## {profile} / {trace} ({total / 3600:.1f} h)", ""]
    header = " | ".join(n for n, _, _, _ in columns)
    lines += [f"| pool | whole trace | {header} |", "|---" * (len(columns) + 2) + "|"]
    for pool, r in results.items():
        cells = " | ".join(_cell(r.window(s, e)) for _, s, e, _ in columns)
        lines.append(f"| {pool} | **{_cell(r.window(0, total))}** | {cells} |")
    auto = results["auto"]
    if len(columns) == len(phases):
        cells = " | ".join(_cell(auto.window(s, e)) for s, e in settled(auto))
        lines.append(f"| auto, settled | | {cells} |")
    cells = " | ".join(
        f"{_cell(_block(env, idx, phases))} {'/'.join(dict.fromkeys(env.picks[i] for i in idx))}"
        for _, _, _, idx in columns
    )
    lines.append(f"| envelope | **{_cell(env.whole)}** | {cells} |")
    start, ahead = _from_launched(profile, results, startup)
    if ahead is not None:
        cells = " | ".join(
            f"{_cell(_block(ahead, idx, phases))} "
            f"{'/'.join(dict.fromkeys(ahead.picks[i] for i in idx))}"
            for _, _, _, idx in columns
        )
        lines.append(f"| envelope from {start} | **{_cell(ahead.whole)}** | {cells} |")
    lines.append("")
    if len(columns) < len(phases):
        lines += _hours(results, env)
    v = verdict(profile, trace, results, env.whole[0], bounded(specs, results),
                None if ahead is None else ahead.whole[0])  # fmt: skip
    lines += _reach(results, start, ahead)
    lines += _verdicts(trace, results, env, v)
    return lines, v


def launched_pool(results: dict[str, SimResult]) -> str | None:
    """The pool `launch` starts the loop from, where it ran never reconfigured: `launched`
    (the prior's recommendation), else the 1/2/3 mix launch starts without a prior."""
    return next((p for p in ("launched", "mix-1-2-3") if p in results), None)


def _from_launched(
    profile: str, results: dict[str, SimResult], startup_s: float
) -> tuple[str, Envelope | None]:
    """The launched pool and the envelope from it (`envelope(start=...)`), where it and a
    pool the envelope may choose ran; it needs no auto run."""
    specs = pools(profile)
    start = launched_pool(results)
    if start is None or not bounded(specs, results):
        return "", None
    return start, envelope(results, startup_s, specs, start)


def _reach(results: dict[str, SimResult], start: str, ahead: Envelope | None) -> list[str]:
    """The bound on never behind from the launched pool `start`, over the fixed pools: the
    best fixed pool over the whole trace against `ahead`, the envelope from `start`. Not a
    bound over mixed pools."""
    fixed = [p for p in results if p.startswith("k")]
    if ahead is None or not fixed:
        return []
    total = results[fixed[0]].phases[-1][2]
    best = max(fixed, key=lambda p: results[p].window(0, total)[0])
    rate = results[best].window(0, total)[0]
    gap = ahead.whole[0] / rate - 1
    reach = "within reach" if gap >= -NEVER_BEHIND else "OUT OF REACH over the fixed pools"
    picks = " > ".join(dict.fromkeys(ahead.picks))
    return [
        f"- from {start} ({results[start].window(0, total)[0]:.0f} tok/s), the envelope over "
        f"these pools, restarts' start-ups charged: {ahead.whole[0]:.0f} tok/s ({picks}), "
        f"{gap:+.1%} against the best fixed pool, {best} {rate:.0f}: never behind "
        f"({NEVER_BEHIND:.1%}) is {reach} for a loop that starts there (a mixed pool may do "
        f"better: `depth_sim.py --pool {start} --restart T:SERVER:kK` runs a move)"
    ]


def _unbounded(
    profile: str, trace: str, results: dict[str, SimResult], startup_s: float | None = None
) -> list[str]:
    """Each pool's own figures where no envelope can be drawn (no fixed pool run, or no auto):
    its tok/s over the trace, and for a pool that restarts, its restarts and its changes'
    median forecast error (as the summary's columns count them); where the launched pool and
    a fixed one ran, the bound on never behind from it (`_reach`)."""
    lines = [f"## {profile} / {trace}: no envelope without auto and a fixed pool", ""]
    for pool, r in results.items():
        line = f"- {pool}: {r.window(0, r.phases[-1][2])[0]:.0f} tok/s"
        if r.restarts:
            errors = forecast_errors(r)
            median = f"{percentile(list(errors), 50):.1%} ({len(errors)})" if errors else "-"
            line += f", {len(r.restarts)} restarts, forecast error {median}"
        lines.append(line)
    startup = get_profile(profile).startup_s if startup_s is None else startup_s
    return [*lines, *_reach(results, *_from_launched(profile, results, startup)), ""]


def _block(env: Envelope, idx: list[int], phases: list[tuple[str, float, float]]) -> Cell:
    """The envelope over several phases: tokens summed; per-request figures by duration."""
    spans = [phases[i][2] - phases[i][1] for i in idx]
    weights = [d / sum(spans) for d in spans]
    return tuple(sum(w * env.phases[i][j] for w, i in zip(weights, idx, strict=True))
                 for j in range(3))  # type: ignore[return-value]  # fmt: skip


def _hours(results: dict[str, SimResult], env: Envelope) -> list[str]:
    """Phase by phase: auto, the best alternative of the phase, the envelope's pick."""
    auto = results["auto"]
    lines = [
        "| phase | auto | best of the phase | envelope | auto's restarts |",
        "|---|---|---|---|---|",
    ]
    for i, (name, start, end) in enumerate(auto.phases):
        alts = {p: r.window(start, end) for p, r in results.items() if p != "auto"}
        best = max(alts, key=lambda p: alts[p][0])
        moves = [
            f"{r.server} {r.before}->{r.after}" for r in auto.restarts if start <= r.began < end
        ]
        lines.append(f"| {name} | {_cell(auto.window(start, end))} | {best} {_cell(alts[best])} | "
                     f"{env.picks[i]} {_cell(env.phases[i])} | {', '.join(moves)} |")  # fmt: skip
    return [*lines, ""]


def _verdicts(trace: str, results: dict[str, SimResult], env: Envelope, v: Verdict) -> list[str]:
    auto = results["auto"]
    total = auto.phases[-1][2]
    alts = {p: r.window(0, total) for p, r in results.items() if p != "auto"}
    agg = auto.window(0, total)[0]
    per_day = len(auto.restarts) * DAY_S / total
    capture = "no headroom" if v.capture is None else f"{v.capture:.0%}"
    lines = [
        f"- restarts: {len(auto.restarts)} ({per_day:.1f} per day); aborted requests: "
        f"{sum(r.aborted for r in auto.restarts)}; envelope switches: {env.switches}",
        f"- whole trace: auto {agg:.0f} tok/s; best fixed {v.best_fixed} {v.fixed:.0f} "
        f"({agg / v.fixed - 1:+.2%}); launched, never reconfigured, {v.launched:.0f} "
        f"({agg / v.launched - 1:+.2%}); envelope {env.whole[0]:.0f} "
        f"({env.whole[0] / v.best_alternative - 1:+.1%} over the best alternative); headroom "
        f"captured {capture}; never behind (0.5%): {'yes' if v.met() else 'NO'}",
    ]
    adaptive = [p for p in alts if p.startswith("adaptive")]
    if adaptive:
        best = max(adaptive, key=lambda p: alts[p][0])
        lines.append(
            f"- beside the bound: {best} {alts[best][0]:.0f} ({agg / alts[best][0] - 1:+.1%})"
        )
    if len(auto.restarts) <= 24:
        steps = ", ".join(f"{r.began:.0f}s {r.server} {r.before}->{r.after}" for r in auto.restarts)
        lines.append(f"- auto's restarts: {steps or 'none'}")
    if v.forecast_error is not None:
        lines.append(
            f"- forecasts: median |forecast - realized| / realized {v.forecast_error:.1%}"
            f" over {len(v.forecast_errors)} settled changes"
        )
    if trace == "policy-eval" or len(auto.phases) > 6:
        return [*lines, ""]
    for (name, start, end), (s0, s1) in zip(auto.phases, settled(auto), strict=True):
        if s1 - s0 < 0.25 * (end - start):
            continue
        quiet = name.startswith("quiet")
        col = 1 if quiet else 0
        best = max(alts, key=lambda p: results[p].window(s0, s1)[col])
        mine, theirs = auto.window(s0, s1)[col], results[best].window(s0, s1)[col]
        what = "mean per-request" if quiet else "aggregate"
        lines.append(f"- {name}, settled ({s1 - s0:.0f} s): {what} {mine:.1f} vs best {best} "
                     f"{theirs:.1f} ({mine / theirs - 1:+.1%})")  # fmt: skip
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", choices=PROFILES, default=[])
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    parser.add_argument("--pool", action="append", default=[], help="default: every pool")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply phase durations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="ignore runs kept in results/")
    parser.add_argument(
        "--startup",
        type=float,
        default=None,
        metavar="S",
        help="a restart's start-up, auto's and the envelope's (default: profile)",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=None,
        metavar="S",
        help="auto's drain before a restart (default: launch's --drain, 30 s)",
    )
    args = parser.parse_args()
    configure_logging("warning")  # the loop's plan lines would drown the table
    jobs = [(p, t, pool, args.scale, args.seed, args.fresh, args.startup, args.drain)
            for p in args.profile or PROFILES
            for t in args.trace or TRACES for pool in args.pool or evaluated(p)]  # fmt: skip
    done: dict[int, tuple[str, str, SimResult]] = {}
    started = time.monotonic()
    order = sorted(enumerate(jobs), key=lambda job: -_cost(job[1]))
    longest_first = [(i, job, _job_path(job)) for i, job in order]
    with multiprocessing.Pool(args.jobs) as workers:  # progress on stderr, the report on stdout
        for i, out in workers.imap_unordered(_numbered, longest_first, chunksize=1):
            done[i] = out
            print(f"[{len(done)}/{len(jobs)}] {out[0]} {out[1]} {out[2].pool} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    grouped: dict[tuple[str, str], dict[str, SimResult]] = {}
    for i in range(len(jobs)):  # in the order of `pools()`
        profile, trace, result = done[i]
        grouped.setdefault((profile, trace), {})[result.pool] = result
    verdicts = []
    for (profile, trace), results in grouped.items():
        if not drawable(results) or not bounded(pools(profile), results):
            print("\n".join(_unbounded(profile, trace, results, args.startup)))
            continue
        lines, v = report(profile, trace, results, args.startup)
        print("\n".join(lines))
        verdicts.append(v)
    print("\n".join(["## Summary", "", *HEADER, *(v.row() for v in verdicts), ""]))


if __name__ == "__main__":
    main()
