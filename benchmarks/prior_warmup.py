"""What a tuned prior is worth at start-up: the proxy's first requests over a fresh emulated
1/2/3 pool with the prior, against the same proxy without it, cold and after warm-up.

    python benchmarks/prior_warmup.py --prior specroute-tune/prior.json
        [--profile seed-qwen35-122b] [--concurrency 32] [--requests 100] [--warmup 300]

Each run starts three emulated servers (steps 1, 2, 3) and `specroute serve --policy
throughput` in front of them, all fresh, and sends half greedy, half sampled requests (the
seed's 256-word prompts, 256 tokens, ignore_eos) at a fixed concurrency:
- with the prior: the first `--requests` requests;
- without it, cold: the same, the pool starting from its built-in defaults;
- without it, warmed up: `--warmup` requests first, unrecorded, then `--requests`.
The goal: the first row reaches at least 95% of the last one's aggregate tok/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx

from specroute.bench import PromptSettings, Sampling, SweepSettings, Target, run_sweep
from specroute.children import free_port, spawn, stop_async, wait_ready
from specroute.emulator.fleet import emulated_fleet
from specroute.logs import configure_logging

MIX = [
    Sampling(name="greedy", weight=0.5, temperature=0.0, max_tokens=256, ignore_eos=True),
    Sampling(name="sampled", weight=0.5, temperature=1.0, max_tokens=256, ignore_eos=True),
]


async def _all_healthy(url: str, count: int) -> None:
    async with httpx.AsyncClient(timeout=2) as client:
        for _ in range(200):
            pool = (await client.get(url + "/pool")).json()
            if sum(1 for b in pool["backends"] if b["healthy"] and b["steps"]) == count:
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("the proxy did not see every backend healthy")


async def _level(url: str, concurrency: int, requests: int, seed: int) -> tuple[float, float]:
    settings = SweepSettings(
        targets=[Target(label="proxy", url=url)],
        concurrency=[concurrency],
        requests=requests,
        warmup=0,
        prompts=PromptSettings(words=256),
        mix=MIX,
        seed=seed,
        keep_chunks=False,
    )
    summary = (await run_sweep(settings)).levels[0].summary
    assert summary.errors == 0, summary.error_samples
    return summary.aggregate_tok_s, summary.per_request_tok_s


async def run(args: argparse.Namespace, prior: Path | None, warmup: int) -> tuple[float, float]:
    """One fresh pool and proxy; (aggregate, per-request) tok/s of the measured requests."""
    async with emulated_fleet((1, 2, 3), profile=args.profile) as servers:
        port = free_port()
        argv = [sys.executable, "-m", "specroute", "serve", "--port", str(port)]
        argv += ["--policy", "throughput", "--log-level", "warning"]
        argv += [a for s in servers for a in ("--backend", f"{s.label}={s.url}")]
        argv += ["--prior", str(prior)] if prior else []
        proxy = spawn(argv, stdout=subprocess.DEVNULL, env={"PYTHONUNBUFFERED": "1"})
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url + "/ready", process=proxy, within=60, name="proxy")
            await _all_healthy(url, len(servers))
            if warmup:
                await _level(url, args.concurrency, warmup, seed=1)
            return await _level(url, args.concurrency, args.requests, seed=2)
        finally:
            await stop_async(proxy)


async def main(args: argparse.Namespace) -> None:
    rows = [
        ("with the prior, first requests", await run(args, args.prior, 0)),
        ("without it, first requests", await run(args, None, 0)),
        (f"without it, after {args.warmup} requests", await run(args, None, args.warmup)),
    ]
    goal = rows[-1][1][0]
    load = os.getloadavg()[0]
    print(
        f"profile {args.profile}, pool steps 1/2/3, throughput policy, C={args.concurrency}, "
        f"{args.requests} requests, half greedy half sampled; load average {load:.1f}"
    )
    print(f"{'run':<34}{'aggregate tok/s':>16}{'per-request':>13}{'vs warmed up':>14}")
    for name, (aggregate, per_request) in rows:
        print(f"{name:<34}{aggregate:>16,.1f}{per_request:>13,.1f}{aggregate / goal:>14.1%}")
    verdict = "meets" if rows[0][1][0] >= 0.95 * goal else "MISSES"
    print(f"With the prior, the first {args.requests} requests {verdict} the 95% goal.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prior", type=Path, required=True, help="a profile from specroute tune")
    parser.add_argument("--profile", default="seed-qwen35-122b")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=300)
    configure_logging("warning")
    asyncio.run(main(parser.parse_args()))
