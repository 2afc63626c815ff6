"""No regret on a vLLM pool: auto (the product's depth loop, launch's defaults) against every
fixed K, the launched mix never reconfigured and vLLM's own dynamic-K table, on the traces of
"Depth follows load", in virtual time (`vllm_pools.py`). One command prints the report:

    nice -n 5 .venv/bin/python benchmarks/vllm_bound.py --jobs 2 \\
        --profile seed-qwen35-122b --profile costly-drafts

Every pool runs the whole trace (no sampling). Runs are kept under
`benchmarks/results/vllm-bound/` by a digest of what they depend on; `--fresh` ignores them.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import sys
import time
from pathlib import Path

import msgspec
from depth_bound import PROFILES, SOURCES, TRACES
from depth_pools import ROOT
from vllm_pools import AUTO, MAX_K, Run, simulate, vllm_pools

from specroute.bench.trace import load_scenario
from specroute.logs import configure_logging

CACHE = ROOT / "benchmarks" / "results" / "vllm-bound"
LOOP = ("specroute/planner/*.py", "specroute/reconfigure/*.py", "specroute/wire/*.py")
OWN = ("benchmarks/vllm_pools.py", "benchmarks/depth_bound.py", "specroute/pool/load.py",
       "specroute/pool/engines.py", "specroute/pool/index.py",
       "specroute/emulator/vllm_schedule.py")  # fmt: skip
Job = tuple[str, str, str, int, bool]
TARGET = 0.005
"""The issue's bar: auto never behind by more than 0.5%."""


def _cache_path(profile: str, trace: str, pool: str, seed: int) -> Path:
    digest = hashlib.sha256(f"vllm {profile} {pool} {seed}".encode())
    digest.update(TRACES[trace].read_bytes())
    patterns = [*SOURCES, *OWN, *(LOOP if pool.startswith("auto") else ())]
    for path in sorted(p for pattern in patterns for p in ROOT.glob(pattern)):
        digest.update(path.read_bytes())
    return CACHE / f"{profile}__{trace}__{pool}__{digest.hexdigest()[:12]}.json"


def _run(job: Job) -> tuple[Job, Run]:
    profile, trace, pool, seed, fresh = job
    path = _cache_path(profile, trace, pool, seed)
    if path.exists() and not fresh:
        return job, msgspec.json.decode(path.read_bytes(), type=Run)
    run = simulate(profile, pool, load_scenario(TRACES[trace]), seed=seed)
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
    cells += [
        f"{rate[pool]:.0f}: {_pct(auto, rate[pool])}" if pool in rate else "-"
        for pool in ("mix-1-2-3", "dynamic")
    ]
    table = runs["dynamic"].table if "dynamic" in runs else ()
    cells.append(" ".join(f"{a}-{b}:{k}" for a, b, k in table) or "-")
    restarts = runs[name].result.restarts
    cells.append(str(len(restarts)))
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| profile | trace | pool | tok/s | best fixed (k0-k3) | best fixed (k0-k7) "
    "| launched mix (1/2/3) | dynamic-K table | its table (batch sizes: K) | restarts |\n"
    + "|---" * 10
    + "|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", choices=PROFILES, default=[])
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    parser.add_argument("--pool", action="append", choices=vllm_pools(), default=[])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="ignore runs kept in results/")
    parser.add_argument("--detail", action="store_true", help="auto's restarts per trace")
    args = parser.parse_args()
    configure_logging("warning")
    traces = args.trace or [t for t in TRACES if t not in ("depth-diurnal", "depth-night-burst")]
    jobs = [(p, t, pool, args.seed, args.fresh) for p in args.profile or PROFILES[:2]
            for t in traces for pool in args.pool or vllm_pools()]  # fmt: skip
    done: dict[Job, Run] = {}
    started = time.monotonic()
    with multiprocessing.Pool(args.jobs) as workers:  # progress on stderr, the report on stdout
        for job, run in workers.imap_unordered(_run, jobs, chunksize=1):
            done[job] = run
            print(f"[{len(done)}/{len(jobs)}] {job[0]} {job[1]} {job[2]} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    print(HEADER)
    grouped: dict[tuple[str, str], dict[str, Run]] = {}
    for job in jobs:
        grouped.setdefault((job[0], job[1]), {})[job[2]] = done[job]
    for (profile, trace), runs in grouped.items():
        for name in AUTO:
            if name in runs:
                print(row(profile, trace, runs, name))
    if args.detail:
        for (profile, trace), runs in grouped.items():
            for name in (n for n in AUTO if n in runs):
                moves = ", ".join(f"{r.began:.0f}s {r.server} {r.before}->{r.after}"
                                  for r in runs[name].result.restarts)  # fmt: skip
                print(f"- {profile} / {trace} / {name}: {moves or 'no restart'}")


if __name__ == "__main__":
    main()
