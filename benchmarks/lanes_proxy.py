"""Latency lanes through the real proxy, wall clock: emulated servers on loopback, `specroute
serve` with and without `[lanes]`, and closed-loop users whose requests are interactive
(`service_tier: priority`; greedy code and chat at 0.3, up to 256 tokens) with probability
`--share`, else batch (`flex`; sampled at 0.9, up to 768 tokens), through the phases of
scenarios/policy-eval.toml (durations times `--duration-scale`). On the pools without lanes
requests name no `service_tier`, as `lanes_sim.py` runs them: the proxy reads it with or
without `[lanes]`. One run over every pool:

    .venv/bin/python benchmarks/lanes_proxy.py --duration-scale 0.25

Prints, per pool, the interactive requests' median tok/s by the phase they began in, their
target attainment as the client measured it and as the proxy's `/pool` reports it, the
aggregate tok/s (every completion token over the time to the last answer) and the batch
lane's p99 queue wait from `/pool`. Speeds are the emulators' (wall tok/s over `--time-scale`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from lanes_sim import _alike, _deep, _median, _nan_low, where

from specroute.children import free_port, spawn, stop_async, wait_ready
from specroute.emulator.fleet import emulated_fleet
from specroute.logs import configure_logging

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "policy-eval.toml"
MODEL = "Qwen/Qwen3.5-122B-A10B"
PROMPT = " ".join(f"word{i % 97}" for i in range(256))
INTERACTIVE = ((0.0, 256), (0.3, 256))
BATCH = (0.9, 768)


CAPPED = ROOT / "examples" / "adaptive-capped-3.json"


@dataclass(frozen=True)
class Pool:
    name: str
    depths: tuple[int, ...]
    policy: str
    lanes: bool
    emulate: tuple[str, ...] = ()
    """More `specroute emulate` flags for every server (SGLang's adaptive mode)."""


ADAPTIVE = (
    Pool("3 x adaptive<=3", (3, 3, 3), "least_loaded", False,
         ("--speculative-adaptive", "--speculative-adaptive-config", str(CAPPED))),
    Pool("3 x adaptive<=7", (3, 3, 3), "least_loaded", False, ("--speculative-adaptive",)),
)  # fmt: skip
POOLS = (
    Pool("lanes k1/k3/k5", (1, 3, 5), "throughput", True),
    Pool("no lanes k1/k3/k5", (1, 3, 5), "throughput", False),
    Pool("lanes k2/k2/k5", (2, 2, 5), "throughput", True),
    Pool("no lanes k2/k2/k5", (2, 2, 5), "throughput", False),
    *(Pool(f"3 x k{k}", (k, k, k), "least_loaded", False) for k in range(8)),
    *ADAPTIVE,
)
"""`lanes_sim.py`'s configurations but the planner's: every fixed pool, the adaptive pools (the
same tiers: SGLang's default, deepest 7, and `examples/adaptive-capped-3.json`), and two mixed
pools with lanes and without (`k2/k2/k5`: the best one never moved in virtual time)."""


@dataclass
class Done:
    lane: str
    phase: int
    tokens: int
    speed: float | None
    end: float
    backend: str | None = None
    """The server that answered (`x-specroute-backend`)."""
    temperature: float = 0.0


@dataclass
class Trace:
    users_now: int = 0
    phase: int = 0
    done: list[Done] = field(default_factory=list)
    errors: int = 0
    tiers: bool = True
    """Requests name their lane (`service_tier`). Off for the pools without lanes: the proxy
    reads `service_tier` whatever its config (`priority` routes a request as interactive, to
    its fastest server), so only requests that name no lane are routed and queued alike."""


def _config(
    path: Path, urls: list[str], pool: Pool, port: int, target: float, reserve: int
) -> None:
    lines = [f"port = {port}", f'policy = "{pool.policy}"', 'log_level = "warning"',
             "[health]", "interval_s = 0.5", "metrics_interval_s = 1.0"]  # fmt: skip
    if pool.lanes:
        lines += ["[lanes]", f"target_tok_s = {target}", f"reserve = {reserve}"]
    lines += [f'[[backends]]\nurl = "{u}"\nname = "b{i}"' for i, u in enumerate(urls)]
    path.write_text("\n".join(lines) + "\n")


async def _request(
    client: httpx.AsyncClient, trace: Trace, rng: random.Random, share: float
) -> None:
    """One request of a random lane; its tokens and decode speed, or an error counted."""
    interactive = rng.random() < share
    temperature, max_tokens = rng.choice(INTERACTIVE) if interactive else BATCH
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "max_tokens": max_tokens, "temperature": temperature,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if trace.tiers:
        body["service_tier"] = "priority" if interactive else "flex"
    phase = trace.phase
    try:
        first, tokens, backend = await _stream(client, body)
    except httpx.HTTPError:
        trace.errors += 1
        return
    end = time.perf_counter()
    timed = first is not None and tokens > 1 and end > first
    speed = (tokens - 1) / (end - first) if timed and first is not None else None
    lane = "interactive" if interactive else "batch"
    trace.done.append(Done(lane, phase, tokens, speed, end, backend, temperature))


async def _stream(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[float | None, int, str | None]:
    """(when the first content arrived, completion tokens, the server that answered) of one
    streamed chat completion."""
    first, tokens = None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            raise httpx.HTTPStatusError("not 200", request=reply.request, response=reply)
        backend = reply.headers.get("x-specroute-backend")
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices")
            if first is None and choices and choices[0].get("delta", {}).get("content"):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first, tokens, backend


async def _user(u: int, client: httpx.AsyncClient, trace: Trace, share: float, seed: int) -> None:
    rng = random.Random(seed * 1000 + u)
    while u < trace.users_now:
        await _request(client, trace, rng, share)


async def _drive(
    url: str, phases: list[tuple[str, int, float]], share: float, seed: int, tiers: bool
) -> tuple[Trace, float]:
    trace = Trace(tiers=tiers)
    tasks: list[asyncio.Task[None]] = []
    limits = httpx.Limits(max_connections=128)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        for i, (_, users, duration) in enumerate(phases):
            trace.phase, before, trace.users_now = i, trace.users_now, users
            tasks += [
                asyncio.create_task(_user(u, client, trace, share, seed))
                for u in range(before, users)
            ]
            await asyncio.sleep(duration)
        trace.users_now = 0
        await asyncio.gather(*tasks)
        return trace, time.perf_counter() - start


async def one_pool(
    pool: Pool, args: argparse.Namespace, phases: list[tuple[str, int, float]], out: Path
) -> dict[str, Any]:
    scale = args.time_scale
    async with emulated_fleet(
        pool.depths, profile=args.profile, extra_args=["--time-scale", str(scale), *pool.emulate]
    ) as servers:
        port = free_port()
        config = out / f"{pool.name.replace(' ', '_').replace('/', '-')}.toml"
        _config(config, [s.url for s in servers], pool, port, args.target * scale, args.reserve)
        proxy = spawn([sys.executable, "-m", "specroute", "serve", "--config", str(config)],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url + "/ready", process=proxy, poll_s=0.2, name="the proxy")
            await asyncio.sleep(1.5)  # discovery of every backend
            trace, wall = await _drive(url, phases, args.share, args.seed, pool.lanes)
            async with httpx.AsyncClient(timeout=10) as client:
                lanes = (await client.get(url + "/pool")).json().get("lanes", {})
        finally:
            await stop_async(proxy)
    return {"trace": trace, "wall": wall, "lanes": lanes}


@dataclass(frozen=True)
class Summary:
    """One pool's figures: the aggregate, the interactive lane's median speed and share at the
    target per phase and over the trace (emulated tok/s)."""

    pool: Pool
    aggregate: float
    medians: tuple[float, ...]
    met: tuple[float, ...]
    """Per phase, the share of interactive requests at the target (nan: none)."""
    met_all: float


def summary(pool: Pool, r: dict[str, Any], phases: int, args: argparse.Namespace) -> Summary:
    scale, trace = args.time_scale, r["trace"]
    inter = [d for d in trace.done if d.lane == "interactive" and d.speed is not None]
    by_phase = [[d.speed / scale for d in inter if d.phase == i] for i in range(phases)]

    def met(speeds: list[float]) -> float:
        return sum(v >= args.target for v in speeds) / len(speeds) if speeds else float("nan")

    return Summary(
        pool=pool,
        aggregate=sum(d.tokens for d in trace.done) / r["wall"] / scale,
        medians=tuple(_median(v) for v in by_phase),
        met=tuple(met(v) for v in by_phase),
        met_all=met([v for speeds in by_phase for v in speeds]),
    )


def row(s: Summary, r: dict[str, Any], args: argparse.Namespace) -> str:
    cells = " ".join(f"{m:7.1f}" for m in s.medians)
    lane = r["lanes"].get("interactive", {})
    seen = lane.get("attainment") if s.pool.lanes else None
    wait = r["lanes"].get("batch", {}).get("wait_p99_s")
    seen_txt = "  -  " if seen is None else f"{seen:5.0%}"
    wait_txt = "  -  " if wait is None else f"{wait * args.time_scale:5.2f}"
    errors = r["trace"].errors
    tail = f" ({errors} errors)" if errors else ""
    return (
        f"{s.pool.name:20} {s.aggregate:9.0f} {s.met_all:5.0%} {seen_txt} {wait_txt} s | "
        f"{cells}{tail}"
    )


def by_temperature(trace: Trace, phases: list[tuple[str, int, float]], scale: float) -> str:
    """Each phase's interactive requests per temperature: how many, and their median tok/s. The
    lane's two kinds decode at very different speeds on a deep server (greedy about twice
    chat's at k7), so in a short phase the lane's median is one kind's or the other's as the
    draw falls."""
    cells = []
    for i, (name, _, _) in enumerate(phases):
        kinds = []
        for temperature, _ in INTERACTIVE:
            speeds = [
                d.speed / scale
                for d in trace.done
                if d.lane == "interactive"
                and d.phase == i
                and d.temperature == temperature
                and d.speed is not None
            ]
            kinds.append(f"t={temperature:g} {len(speeds)} at {_median(speeds):.1f}")
        cells.append(f"{name} {', '.join(kinds)}")
    return "interactive by temperature (requests at median tok/s): " + "; ".join(cells)


def verdicts(runs: list[Summary], names: list[str]) -> list[str]:
    """The issue's claims for each lanes pool, in numbers: per phase, the interactive median
    against the best deep pool's and the share at the target against 95% where any pool gets
    95% of its interactive requests there; the aggregate against the best pool without lanes."""
    others = [s for s in runs if not s.pool.lanes]
    deep = [s for s in others if _alike(s.pool.name) and _deep(s.pool.name)]
    lines = []
    for ours in (s for s in runs if s.pool.lanes):
        for i, name in enumerate(names):
            if not deep or math.isnan(ours.medians[i]):
                continue
            best = max(deep, key=lambda s: _nan_low(s.medians[i]))
            fast = "yes" if ours.medians[i] >= best.medians[i] else "NO"
            reach = [s.pool.name for s in runs if _nan_low(s.met[i]) >= 0.95]
            target = f"{ours.met[i]:.0%} at the target"
            if reach:
                ok = "yes" if ours.met[i] >= 0.95 else "NO"
                target += f", 95%: {ok} ({len(reach)} pools reach it, e.g. {reach[0]})"
            else:
                target += " (no pool reaches 95%)"
            lines.append(
                f"{ours.pool.name:16} {name:14} median {ours.medians[i]:6.1f} vs "
                f"{best.pool.name} {best.medians[i]:6.1f}: at least as fast: {fast}; {target}"
            )
        if others:
            best_agg = max(others, key=lambda s: s.aggregate)
            gap = ours.aggregate / best_agg.aggregate - 1
            lines.append(
                f"{ours.pool.name:16} aggregate {ours.aggregate:.0f} tok/s vs best alternative "
                f"{best_agg.pool.name} {best_agg.aggregate:.0f}: {gap:+.1%} (within 2%: "
                f"{'yes' if gap >= -0.02 else 'NO'})"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--share", type=float, default=0.2)
    parser.add_argument("--target", type=float, default=100.0, help="interactive tok/s (emulated)")
    parser.add_argument("--reserve", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--duration-scale", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--out", default="/tmp/lanes-proxy")
    parser.add_argument("--where", action="store_true",
                        help="print where each phase's interactive requests ran")  # fmt: skip
    args = parser.parse_args()
    configure_logging("warning")
    data = tomllib.loads(SCENARIO.read_text())
    phases = [(p["name"], p["concurrency"], p["duration"] * args.duration_scale)
              for p in data["phases"]]  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"interactive share {args.share:.0%}, target {args.target:.0f} tok/s, reserve "
          f"{args.reserve}, profile {args.profile}, phases x{args.duration_scale:g}, "
          f"time scale {args.time_scale:g}")  # fmt: skip
    names = " ".join(n for n, _, _ in phases)
    print(f"{'pool':20} {'agg tok/s':>9} {'met':>5} {'/pool':>5} {'batch p99 wait':>7} | "
          f"interactive median tok/s per phase: {names}", flush=True)  # fmt: skip
    runs: list[Summary] = []
    for pool in POOLS:
        if args.only and not any(o in pool.name for o in args.only):
            continue
        r = asyncio.run(one_pool(pool, args, phases, out))
        runs.append(summary(pool, r, len(phases), args))
        print(row(runs[-1], r, args), flush=True)
        if args.where:
            ran = [(d.phase, d.backend or "?") for d in r["trace"].done if d.lane == "interactive"]
            by_server = where([n for n, _, _ in phases], ran)
            print(f"   {pool.name}: interactive requests by server: {by_server}")
            print(f"   {pool.name}: {by_temperature(r['trace'], phases, args.time_scale)}")
    for line in verdicts(runs, [n for n, _, _ in phases]):
        print(line)


if __name__ == "__main__":
    main()
