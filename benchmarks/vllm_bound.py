"""No regret on a vLLM pool: auto (the product's depth loop, launch's defaults; `auto-tuned`
launched from a vLLM tune's prior) against every fixed K, the launched pool never reconfigured
and vLLM's own dynamic-K table, on the traces of "Depth follows load", in virtual time
(`vllm_pools.py`). One command prints the report:

    nice -n 5 .venv/bin/python benchmarks/vllm_bound.py --jobs 2 \\
        --profile seed-qwen35-122b --profile costly-drafts

`auto` and its variants run the whole trace. Where every phase lasts over 16 minutes
(depth-swing, depth-quiet-3), the pools that never restart are measured as `depth_bound.py`
measures them: each phase from a fresh pool, 15 minutes after a minute's warm-up, tiled over
the phase. Runs are kept under
`benchmarks/results/vllm-bound/` by a digest of what they depend on; `--fresh` ignores them.

The last column is the most a loop could give from the pool it is launched at (the 1/2/3 mix
for `auto`, the tuned pool for the others) over the fixed K pools: their best sequence, one a
phase, each switch charged a restart, the first from the launched pool (`from_launch`, as
`depth_bound.py` draws it). Where it is more than 0.5% under the best fixed K, never behind
is out of reach over those pools for any loop launched there.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import sys
import time
from pathlib import Path

import msgspec
from depth_bound import LOOP, PROFILES, SAMPLE_S, SOURCES, TRACES, WARM_S, Option, best_sequence
from depth_pools import ROOT, PoolSpec, pools
from sim_results import BIN_S, SimResult
from vllm_pools import TUNED, Run, VllmSim, simulate, tuned_pools, vllm_pools
from vllm_table import MAX_K, Table, operator_table

from specroute.bench.trace import Scenario, load_scenario
from specroute.emulator.profiles import get_profile
from specroute.logs import configure_logging
from specroute.planner import Setting

CACHE = ROOT / "benchmarks" / "results" / "vllm-bound"
OWN = ("benchmarks/vllm_pools.py", "benchmarks/depth_bound.py", "specroute/pool/load.py",
       "specroute/pool/engines.py", "specroute/pool/index.py",
       "specroute/emulator/vllm_schedule.py", "specroute/batch_limit.py")  # fmt: skip
Job = tuple[str, str, str, int, bool]
ORDER = ["policy-eval", "depth-flap", "depth-temperature-swing", "depth-ramp", "depth-quiet-3",
         "depth-swing"]  # fmt: skip
"""The traces of "Depth follows load", the cheapest first."""
TARGET = 0.005
"""The issue's bar: auto never behind by more than 0.5%."""


SHALLOW_TABLE = "dynamic-3"
"""The operator's table with K at most 3: the depths `auto` may use."""


def run_pool(profile: str, pool: str, scenario: Scenario, seed: int, table_for: Scenario) -> Run:
    """`vllm_pools.simulate`, and the shallow table's pool beside it."""
    if pool != SHALLOW_TABLE:
        return simulate(profile, pool, scenario, seed=seed, table_for=table_for)
    steps, table = operator_table(get_profile(profile), table_for, max_k=3)
    spec = PoolSpec((Setting(steps=steps),) * 3, "least_loaded")
    sim = VllmSim(profile, spec, table=table, seed=seed)
    return Run(sim.run(scenario, pool), table)


def _steady(trace: str, pool: str) -> bool:
    """Whether `pool` is measured on samples of each phase (`sampled`)."""
    long = all(p.duration >= WARM_S + SAMPLE_S for p in load_scenario(TRACES[trace]).phases)
    return long and not _loop(pool)


def _loop(pool: str) -> bool:
    """Whether `pool` runs the depth loop (auto and its variants, `auto-tuned-uN` included)."""
    return pool.startswith("auto")


def sampled(profile: str, pool: str, scenario: Scenario, seed: int) -> Run:
    """A pool that never restarts, phase by phase: `WARM_S` then `SAMPLE_S` measured from a
    fresh pool, the rate and the requests tiled over the phase (`depth_bound.sampled`)."""
    phases: list[tuple[str, float, float]] = []
    bins: list[float] = []
    finished: list[tuple[float, float]] = []
    start, table = 0.0, Table()
    for i, phase in enumerate(scenario.phases):
        short = msgspec.structs.replace(phase, duration=WARM_S + SAMPLE_S)
        part = msgspec.structs.replace(scenario, phases=[short])
        run = run_pool(profile, pool, part, seed + 7919 * i, scenario)
        table, r = run.table, run.result
        rate = r.window(WARM_S, WARM_S + SAMPLE_S)[0]
        first, end = len(bins), math.ceil((start + phase.duration) / BIN_S)
        bins += [rate * BIN_S] * (end - first)
        measured = [(t - WARM_S, v) for t, v in r.finished if WARM_S <= t < WARM_S + SAMPLE_S]
        for tile in range(math.ceil(phase.duration / SAMPLE_S)):
            at = start + tile * SAMPLE_S
            finished += [(at + t, v) for t, v in measured if at + t < start + phase.duration]
        phases.append((phase.name, start, start + phase.duration))
        start += phase.duration
    return Run(SimResult(pool, phases, bins, finished), table)


def _cache_path(profile: str, trace: str, pool: str, seed: int) -> Path:
    how = "sampled" if _steady(trace, pool) else "whole"
    digest = hashlib.sha256(f"vllm {profile} {pool} {seed} {how}".encode())
    digest.update(TRACES[trace].read_bytes())
    patterns = [*SOURCES, *OWN, *(LOOP if _loop(pool) else ())]
    if pool.startswith("dynamic"):
        patterns.append("benchmarks/vllm_table.py")
    if pool.endswith("-tuned"):  # the vLLM tune the pool launches from
        digest.update((TUNED / f"{profile}.json").read_bytes())
    for path in sorted(p for pattern in patterns for p in ROOT.glob(pattern)):
        digest.update(path.read_bytes())
    return CACHE / f"{profile}__{trace}__{pool}__{digest.hexdigest()[:12]}.json"


def _run(keyed: tuple[Job, Path]) -> tuple[Job, Run]:
    """One run, kept at `path`: its digest was taken before any run began, from the sources
    the workers run (forked from the parent, which imported them). Taken in the worker when
    the run starts, a source edited meanwhile filed the old code's run under the new code's
    digest, and a later run of the new code printed it (depth_bound.py did, 2026-12-04)."""
    job, path = keyed
    profile, trace, pool, seed, fresh = job
    if path.exists() and not fresh:
        return job, msgspec.json.decode(path.read_bytes(), type=Run)
    scenario = load_scenario(TRACES[trace])
    if _steady(trace, pool):
        run = sampled(profile, pool, scenario, seed)
    else:
        run = run_pool(profile, pool, scenario, seed, scenario)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(run))
    return job, run


def _pct(a: float, b: float) -> str:
    text = f"{a / b - 1:+.1%}"
    return f"**{text}**" if a < b * (1 - TARGET) else text


def row(profile: str, trace: str, runs: dict[str, Run], name: str = "auto") -> str:
    """One line of the report: auto (or a variant, `name`) against the best fixed K (launch's
    default depths and any), the launched mix and the dynamic-K table."""
    total = runs[name].result.phases[-1][2]
    rate = {p: r.result.window(0, total)[0] for p, r in runs.items()}
    auto = rate[name]
    cells = [profile, trace, name, f"{auto:.0f}"]
    allowed = [f"k{k}" for k in range(4) if f"k{k}" in rate]
    deeper = [f"k{k}" for k in range(MAX_K + 1) if f"k{k}" in rate]
    for group in (allowed, deeper):
        best = max(group, key=rate.__getitem__) if group else None
        cells.append(f"{best} {rate[best]:.0f}: {_pct(auto, rate[best])}" if best else "-")
    # each loop against its own launched pool (`auto-tuned-uN` against `launched-tuned-uN`,
    # `auto-dynamic-tuned` against `launched-dynamic-tuned`); `auto` against the mix's column
    own = "launched" + name[len("auto") :]
    never = own if name != "auto" and own in rate else "launched-tuned"
    cells += [
        f"{rate[pool]:.0f}: {_pct(auto, rate[pool])}" if pool in rate else "-"
        for pool in ("mix-1-2-3", never, "dynamic", SHALLOW_TABLE)
    ]
    for pool in ("dynamic", SHALLOW_TABLE):
        table = runs[pool].table if pool in runs else ()
        cells.append(" ".join(f"{a}-{b}:{k}" for a, b, k in table) or "-")
    restarts = runs[name].result.restarts
    cells.append(str(len(restarts)))
    start = "mix-1-2-3" if name == "auto" else never
    bound = from_launch(profile, runs, start)
    best = max(deeper, key=rate.__getitem__) if deeper else None
    if bound is None or best is None:
        cells.append("-")
    else:
        out = " (out of reach over the fixed K)" if bound < rate[best] * (1 - TARGET) else ""
        cells.append(f"{bound:.0f}: {bound / rate[best] - 1:+.1%}{out}")
    return "| " + " | ".join(cells) + " |"


def _settings(profile: str, pool: str) -> tuple[Setting, ...]:
    """A pool's servers: K for each fixed `kK`, launch's 1/2/3 mix, or the tuned pool."""
    if pool.startswith("k") and pool[1:].isdigit():
        return (Setting(steps=int(pool[1:])),) * 3
    if pool.startswith("mix-1-2-3"):
        return pools()["mix-1-2-3"].settings
    return tuned_pools(profile)[pool].settings


def from_launch(profile: str, runs: dict[str, Run], start: str) -> float | None:
    """The most a loop launched at `start` could give over the fixed K pools (tok/s): their
    best sequence, one a phase, each switch charged a restart and the first from `start`
    (`depth_bound.best_sequence`); None where `start` or no fixed K ran. Not a bound over
    mixed pools or tables."""
    fixed = [f"k{k}" for k in range(MAX_K + 1) if f"k{k}" in runs]
    if start not in runs or not fixed:
        return None
    phases = runs[fixed[0]].result.phases
    options = [[Option(p, _settings(profile, p), runs[p].result.window(s, e)[0]) for p in
                [start, *fixed]] for _, s, e in phases]  # fmt: skip
    first = Option(start, _settings(profile, start), 0.0)
    tokens, _ = best_sequence(phases, options, get_profile(profile).startup_s, first)
    return sum(tokens) / phases[-1][2]


HEADER = (
    "| profile | trace | pool | tok/s | best fixed (k0-k3) | best fixed (k0-k7) "
    "| launched mix (1/2/3) | tuned pool, never reconfigured | dynamic-K table "
    "| dynamic-K, K <= 3 | its table (batch: K) | K <= 3 table | restarts "
    "| from its launch, over the fixed K (against the best fixed) |\n" + "|---" * 14 + "|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", choices=PROFILES, default=[])
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    parser.add_argument("--pool", action="append", choices=[*vllm_pools(), SHALLOW_TABLE],
                        default=[])  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="ignore runs kept in results/")
    parser.add_argument("--detail", action="store_true", help="auto's restarts per trace")
    parser.add_argument("--kept", action="store_true", help="report only runs already kept")
    args = parser.parse_args()
    configure_logging("warning")
    traces = args.trace or ORDER
    jobs = [(p, t, pool, args.seed, args.fresh) for p in args.profile or PROFILES[:2]
            for t in traces for pool in args.pool or vllm_pools()]  # fmt: skip
    if args.kept:
        jobs = [j for j in jobs if _cache_path(j[0], j[1], j[2], j[3]).exists()]
    done: dict[Job, Run] = {}
    started = time.monotonic()
    with multiprocessing.Pool(args.jobs) as workers:  # progress on stderr, the report on stdout
        keyed = [(job, _cache_path(*job[:4])) for job in jobs]
        for job, run in workers.imap_unordered(_run, keyed, chunksize=1):
            done[job] = run
            print(f"[{len(done)}/{len(jobs)}] {job[0]} {job[1]} {job[2]} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    print(HEADER)
    grouped: dict[tuple[str, str], dict[str, Run]] = {}
    for job in jobs:
        grouped.setdefault((job[0], job[1]), {})[job[2]] = done[job]
    for (profile, trace), runs in grouped.items():
        for name in (n for n in runs if _loop(n)):
            print(row(profile, trace, runs, name))
    if args.detail:
        for (profile, trace), runs in grouped.items():
            for name in (n for n in runs if _loop(n)):
                moves = ", ".join(f"{r.began:.0f}s {r.server} {r.before}->{r.after}"
                                  for r in runs[name].result.restarts)  # fmt: skip
                print(f"- {profile} / {trace} / {name}: {moves or 'no restart'}")


if __name__ == "__main__":
    main()
