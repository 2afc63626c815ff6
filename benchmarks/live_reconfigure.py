"""No regret over real HTTP: `specroute launch --emulate --reconfigure auto` with launch's
defaults (the pool and depths a `specroute tune --emulate` prior over depths 0-7 recommends),
beside the same pool never reconfigured, three servers alike at each depth that matters, and
the engine's own answer (three SGLang-adaptive servers; with `--engine vllm`, three vLLM servers
running the `num_speculative_tokens_per_batch_size` table an operator writes for the trace), all
at once on loopback under the same trace (one `specroute bench trace` per pool, started
together). Prints tok/s per phase and over the
trace, errors, auto's restarts with their reasons and forecast against realized (`/plan`), and
the machine's load (two shared cores: when the bench client may be the limit, it says so).

    .venv/bin/python benchmarks/live_reconfigure.py --out benchmarks/results/live-reconfigure
    .venv/bin/python benchmarks/live_reconfigure.py --engine vllm \
        --out benchmarks/results/live-reconfigure-vllm

Time is shrunk (see `live_pools.Scaling`): the emulated GPU runs at `--time-scale` (0.25: four
times slower, so 15 emulators, 5 proxies and 5 clients fit on two cores), while phases, start-up
and the planner's times are multiplied by `--compress`. Everything stops at the end (SIGINT).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
from live_pools import Pool, PoolResult, Scaling, launch_argv, pools, result_of, table, verdict
from live_pools import accounts as account_lines
from live_pools import loads as load_line
from vllm_table import operator_table

from specroute.bench.sweep import SweepResult
from specroute.bench.trace import load_scenario
from specroute.children import free_port, free_ports, spawn, stop, wait_ready_sync
from specroute.emulator.profiles import get_profile
from specroute.launch.defaults import launch_depths, table_text
from specroute.profile_format import decode_profile
from specroute.wire import PlanDocument

ROOT = Path(__file__).resolve().parent.parent
_plan = msgspec.json.Decoder(PlanDocument)
_trace = msgspec.json.Decoder(SweepResult)


TUNE_SPEED = 4.0
"""The tune's emulators' time scale (the live run's is `--time-scale`)."""
SERVERS_AT_MOST = 8
"""Ports held for each pool's servers (`--base-port` and the next ones) and the tune's (one
per depth 0-7): every pool runs at once, and no two may share a port."""


def _tune(args: argparse.Namespace, out: Path) -> Path:
    """A prior from `specroute tune --emulate` over `--tune-steps`, describing the GPU the live
    run emulates (`--time-scale`): the tune's emulators run at TUNE_SPEED (the later
    `--emulator-arg=--time-scale` is the one the emulator keeps), and tune divides its figures
    by their speed relative to the live run's. A prior at another speed would tell the proxy
    and the planner of depths 1/time-scale times as fast as the servers they read."""
    argv = [sys.executable, "-m", "specroute", "tune", "--emulate", "--steps", args.tune_steps,
            "--engine", args.engine, "--profile", args.profile,
            "--time-scale", f"{TUNE_SPEED / args.time_scale:g}",
            f"--emulator-arg=--time-scale={TUNE_SPEED:g}", "--temperature", "0,1",
            "--base-port", str(free_ports(SERVERS_AT_MOST)),
            "--out", str(out / "tune")]  # fmt: skip
    with (out / "tune.log").open("wb") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)
    return out / "tune" / "prior.json"


class Saved(msgspec.Struct, kw_only=True):
    """`report.json`: what `--report DIR` prints again."""

    settings: str
    results: list[PoolResult]
    samples: dict[str, list[float]]


class Running(msgspec.Struct, kw_only=True):
    pool: Pool
    url: str
    launcher: subprocess.Popen[bytes]
    folder: Path


def _start(pool: Pool, scaling: Scaling, prior: Path, out: Path, engine: str) -> Running:
    folder = out / pool.name
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = launch_argv(pool, scaling, python=sys.executable, prior=str(prior), port=port,
                       base_port=free_ports(SERVERS_AT_MOST), logs=str(folder / "logs"),
                       engine=engine)  # fmt: skip
    with (folder / "launch.log").open("wb") as log:
        launcher = spawn(argv, stdout=log, stderr=subprocess.STDOUT)
    return Running(pool=pool, url=f"http://127.0.0.1:{port}", launcher=launcher, folder=folder)


def _bench(run: Running, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "specroute", "bench", "trace", args.scenario, run.url,
            "--duration-scale", f"{args.compress:g}", "--no-chunks", "--seed", str(args.seed),
            "--json", str(run.folder / "trace.json")]  # fmt: skip
    with (run.folder / "bench.log").open("wb") as log:
        return spawn(argv, stdout=log, stderr=subprocess.STDOUT)


def _cpu_busy(previous: list[int]) -> tuple[float | None, list[int]]:
    """The machine's CPU busy share since `previous` (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        now = [int(x) for x in f.readline().split()[1:]]
    if not previous:
        return None, now
    delta = [a - b for a, b in zip(now, previous, strict=False)]
    total = sum(delta)
    idle = delta[3] + delta[4]
    return (1 - idle / total if total else None), now


def _watch(
    runs: list[Running], benches: list[subprocess.Popen[bytes]], out: Path
) -> dict[str, list[float]]:
    """Every 2 s while a bench runs: load average, CPU busy share, auto's plan (plans.jsonl)."""
    busy_name = f"CPU busy (all {os.cpu_count()} cores)"
    samples: dict[str, list[float]] = {"load average": [], busy_name: []}
    auto = next(r for r in runs if r.pool.name == "auto")
    stat: list[int] = []
    with (
        httpx.Client(base_url=auto.url, timeout=10) as client,
        (out / "plans.jsonl").open("wb") as f,
    ):
        while any(b.poll() is None for b in benches):
            busy, stat = _cpu_busy(stat)
            samples["load average"].append(os.getloadavg()[0])
            if busy is not None:
                samples[busy_name].append(busy)
            try:
                f.write(client.get("/plan").content.strip() + b"\n")
            except httpx.HTTPError as exc:
                f.write(msgspec.json.encode({"error": str(exc)}) + b"\n")
            time.sleep(2)
    return samples


def _proxy_errors(metrics: str) -> dict[str, float]:
    """`specroute_requests_total` series with a status other than 200."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("specroute_requests_total{") and 'status="200"' not in line:
            key, _, value = line.rpartition(" ")
            if float(value):
                out[key] = float(value)
    return out


def _collect(run: Running, launched: str) -> PoolResult:
    with httpx.Client(base_url=run.url, timeout=10) as client:
        plan = _plan.decode(client.get("/plan").content)
        metrics = client.get("/metrics").text
    steps = ",".join(map(str, run.pool.steps)) if run.pool.steps else launched
    if run.pool.adaptive:
        steps = f"adaptive x{len(run.pool.steps or ())} (SGLang's tiers)"
    if run.pool.table is not None:
        ranges = " ".join(f"{a}-{b}:{k}" for a, b, k in run.pool.table)
        steps = f"dynamic-K x{len(run.pool.steps or ())} (batch: K {ranges})"
    if run.pool.reconfigure == "auto":
        steps = f"{launched} -> {','.join(s.setting for s in plan.servers)}"
    result = result_of(
        run.pool.name, steps, _trace.decode((run.folder / "trace.json").read_bytes())
    )
    result.plan = plan if plan.mode != "off" else None
    result.proxy_errors = _proxy_errors(metrics)
    return result


def _report(results: list[PoolResult], samples: dict[str, list[float]], settings: str) -> str:
    lines = [f"# Wall clock: {settings}", "",
             "Aggregate tok/s (wall-clock) per phase and over the trace:", "",
             table(results), "", verdict(results), "", "auto's changes (/plan):"]  # fmt: skip
    auto = next(r for r in results if r.name == "auto")
    lines += account_lines(auto.plan) or ["- none"]
    lines += ["", f"Machine: {load_line(samples)}; {os.cpu_count()} cores."]
    limited = [f"{r.name} {x}" for r in results for x in r.client_limited]
    lines.append("Bench client may be the limit: " + ("; ".join(limited) if limited else "never"))
    return "\n".join(lines) + "\n"


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--scenario", default=str(ROOT / "scenarios" / "depth-live.toml"))
    add("--profile", default="seed-qwen35-122b")
    add("--engine", choices=("sglang", "vllm"), default="sglang", help="the servers' engine")
    add("--time-scale", type=float, default=0.25, help="the emulated GPU's speed")
    add("--compress", type=float, default=0.2, help="phases, start-up, planner times x this")
    add("--fixed", default="2,3,7", help="depths of the three-alike pools")
    add("--servers", type=int, default=3)
    add("--prior", type=Path, default=None, help="a tune prior (default: tune one first)")
    add(
        "--allow-adaptive",
        action="store_true",
        help="auto and the launched pool with `launch --allow-adaptive` (vLLM: K-per-batch "
        "tables from the prior at start, and the planner's own)",
    )
    add("--tune-steps", default="0,1,2,3,4,5,6,7")
    add(
        "--planner-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a planner setting in place of its compressed default, e.g. window_s=60",
    )
    add("--seed", type=int, default=0)
    add(
        "--out",
        type=Path,
        default=None,
        help="default: benchmarks/results/live-reconfigure (-vllm with --engine vllm)",
    )
    add("--report", type=Path, default=None, metavar="DIR", help="print a saved run's report")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    if args.report is not None:
        saved = msgspec.json.decode((args.report / "report.json").read_bytes(), type=Saved)
        print(_report(saved.results, saved.samples, saved.settings))
        return
    suffix = "-vllm" if args.engine == "vllm" else ""
    out: Path = args.out or ROOT / "benchmarks" / "results" / f"live-reconfigure{suffix}"
    out.mkdir(parents=True, exist_ok=True)
    prior = args.prior or _tune(args, out)
    tables = args.allow_adaptive and args.engine == "vllm"
    depths = launch_depths(steps=None, allowed=None, servers=args.servers, tables=tables,
                           prior=decode_profile(prior.read_bytes(), source=str(prior)))  # fmt: skip
    launched = ",".join(map(str, depths.steps))
    if depths.tables:
        launched += " (" + "; ".join(f"k{d} on {table_text(t)}" for d, t in depths.tables.items())
        launched += ")"
    planner = {k: float(v) for k, _, v in (o.partition("=") for o in args.planner_option)}
    scaling = Scaling(profile=args.profile, time_scale=args.time_scale, compress=args.compress,
                      planner=planner)  # fmt: skip
    fixed = [int(k) for k in args.fixed.split(",")]
    dynamic = None
    if args.engine == "vllm":  # the table an operator who knows the trace writes (vllm_table)
        scenario = load_scenario(Path(args.scenario))
        dynamic = operator_table(get_profile(args.profile), scenario, servers=args.servers)
    chosen = pools(depths.steps, fixed, args.servers, dynamic, args.allow_adaptive)
    runs = [_start(p, scaling, prior, out, args.engine) for p in chosen]
    try:
        for run in runs:
            wait_ready_sync(run.url + "/ready", process=run.launcher, within=600, poll_s=0.5,
                            name=run.pool.name)  # fmt: skip
        benches = [_bench(run, args) for run in runs]
        samples = _watch(runs, benches, out)
        results = [_collect(run, launched) for run in runs]
    finally:
        for run in runs:
            if run.launcher.poll() is None:
                run.launcher.send_signal(signal.SIGINT)
        for run in runs:
            stop(run.launcher, sig=signal.SIGINT, grace_s=60)
    settings = (f"{Path(args.scenario).name} x {args.compress:g}, {args.engine} servers, "
                f"{args.profile} at time scale "
                f"{args.time_scale:g}, planner {scaling.planner_options()}; launch's pool "
                f"{launched} ({depths.steps_from}); allowed "
                f"{','.join(map(str, depths.allowed))}"
                + ("; launch --allow-adaptive" if args.allow_adaptive else ""))  # fmt: skip
    report = _report(results, samples, settings)
    (out / "report.md").write_text(report)
    saved = Saved(settings=settings, results=results, samples=samples)
    (out / "report.json").write_bytes(msgspec.json.encode(saved))
    print(report)


if __name__ == "__main__":
    main()
