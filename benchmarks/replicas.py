"""N proxy replicas in front of one emulated 1/2/3 pool, the closed-loop users of
`scenarios/policy-eval.toml` split among them at random per request (as a Kubernetes Service
spreads them), against one proxy carrying the same traffic.

    .venv/bin/python benchmarks/replicas.py --replicas 1 2 3 6 --time-scale 2 --duration-scale 0.25
    .venv/bin/python benchmarks/replicas.py --report results/replicas-<stamp>    # print again

Per run: whole-trace aggregate tok/s; the requests that waited in a backend's queue, from the
backends' own `sglang:queue_time_seconds` (this pool holds 64 and 118 requests, the trace at
most 64 users: a router that knew every slot would make none wait, so each wait is one
over-admission); the worst per-class acceptance error in any replica's `GET /pool` against the
emulator's truth; and what the scrapes cost each replica. Saved under
results/replicas-<stamp>/ (records, each replica's /pool, rows.json, table.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec

from specroute.bench.client import BenchClient, RequestRecord
from specroute.bench.loadgen import Load, closed_loop
from specroute.bench.trace import load_scenario
from specroute.bench.workload import ApiSettings, Workload, load_prompts
from specroute.children import free_port, spawn, stop_async, wait_ready
from specroute.emulator.fleet import emulated_fleet
from specroute.emulator.profiles import get_profile, sampling_class
from specroute.prometheus import read_samples

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "policy-eval.toml"
DEPTHS = (1, 2, 3)


class SplitLoad(Load):
    """A load whose every request goes to one of `urls`, drawn at random per request."""

    __slots__ = ("_rng", "urls")

    def __init__(self, *args: Any, urls: Sequence[str], seed: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.urls = list(urls)
        self._rng = random.Random(seed)

    async def send(self, index: int, scheduled: float) -> RequestRecord:
        prepared = self.workload.request(index)
        record = RequestRecord(
            index=index, klass=prepared.klass, greedy=prepared.greedy,
            scheduled=scheduled, phase=self.phase,
        )  # fmt: skip
        await self.client.stream(self._rng.choice(self.urls), prepared, record, self.origin)
        return record


def queue_waits(text: str) -> dict[str, float]:
    """One backend's queue waits from its `sglang:queue_time_seconds` histogram: requests
    admitted, those that waited at all (past the zero bucket), and the seconds they waited."""
    found = {"requests": 0.0, "waited": 0.0, "wait_s": 0.0}
    for sample in read_samples(text) or []:
        if sample.name == "sglang:queue_time_seconds_count":
            found["requests"] += sample.value
            found["waited"] += sample.value
        elif sample.name == "sglang:queue_time_seconds_bucket" and sample.labels["le"] == "0.0":
            found["waited"] -= sample.value
        elif sample.name == "sglang:queue_time_seconds_sum":
            found["wait_s"] += sample.value
    return found


def acceptance_errors(pool: dict[str, Any], profile: str) -> dict[str, float]:
    """Each class and depth in one replica's GET /pool against the emulator's true accept
    length, as relative errors keyed `class@depth`."""
    truth = get_profile(profile)
    out = {}
    for name, est in pool.get("estimates", {}).get("classes", {}).items():
        emulated = sampling_class(0.0 if name.endswith(":greedy") else 0.8)
        for depth, learned in est["accept_length"].items():
            expected = truth.expected_tokens(emulated, int(depth))
            out[f"{name.rsplit(':', 1)[1]}@{depth}"] = learned / expected - 1
    return out


def _config(
    path: Path, port: int, urls: list[str], peers: list[str], args: argparse.Namespace
) -> None:
    lines = [
        f"port = {port}", f'policy = "{args.policy}"', 'log_level = "warning"',
        "[health]", "interval_s = 0.5", "metrics_interval_s = 1.0", "discovery_interval_s = 5.0",
        "[replicas]", f"peers = {json.dumps(peers)}", "read_every_s = 1.0", "resolve_every_s = 5.0",
        f"scrape_min_interval_s = {args.scrape_min_s}", f'split = "{args.split}"',
    ]  # fmt: skip
    lines += [f'[[backends]]\nurl = "{u}"\nname = "b{i}"' for i, u in enumerate(urls)]
    path.write_text("\n".join(lines) + "\n")


async def _settled(client: httpx.AsyncClient, urls: list[str], replicas: int) -> None:
    """Every proxy knows every backend's depth and, with peers, its rank among them."""
    for _ in range(200):
        pools = [(await client.get(u + "/pool")).json() for u in urls]
        known = all(b["steps"] is not None for p in pools for b in p["backends"])
        ranked = all(
            p["replicas"]["replicas"] == replicas and p["replicas"]["rank"] is not None
            for p in pools
        )
        if known and (ranked or replicas == 1):
            return
        await asyncio.sleep(0.25)
    raise TimeoutError("the proxies did not find their backends and each other")


async def _trace(
    urls: list[str], model: str, args: argparse.Namespace
) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
    scenario = load_scenario(SCENARIO)
    api = ApiSettings(model=model, timeout=600.0)
    records: list[RequestRecord] = []
    phases = []
    origin = time.perf_counter()
    users = max(p.concurrency for p in scenario.phases)
    async with BenchClient(connections=users + 8, timeout=api.timeout) as client:
        for i, phase in enumerate(scenario.phases):
            seed = args.seed + i
            prompts = load_prompts(scenario.prompts, max(64, 8 * phase.concurrency), seed)
            load = SplitLoad(
                client, urls[0], Workload(prompts, phase.mix or scenario.mix, api, model, seed),
                requests=None, duration=phase.duration * args.duration_scale, origin=origin,
                first_index=len(records), phase=phase.name, urls=urls, seed=seed * 7919 + 1,
            )  # fmt: skip
            started = time.perf_counter()
            done = await closed_loop(load, phase.concurrency)
            wall = time.perf_counter() - started
            for record in done:  # counted already; not worth their bytes on disk
                record.chunk_times, record.chunk_tokens = [], []
            tokens = sum(r.completion_tokens for r in done if r.error is None)
            errors = sum(1 for r in done if r.error is not None)
            phases.append({"phase": phase.name, "tokens": tokens, "wall_s": wall, "errors": errors})
            records += done
    return records, phases


@contextlib.asynccontextmanager
async def _proxies(
    out: Path, tag: str, backends: list[str], replicas: int, args: argparse.Namespace
) -> AsyncIterator[list[str]]:
    """`replicas` proxies over `backends`, each listing all of them as peers (none when
    alone), ready; their urls."""
    ports = [free_port() for _ in range(replicas)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = []
    try:
        for i, port in enumerate(ports):
            config = out / f"{tag}__proxy{i}.toml"
            _config(config, port, backends, urls if replicas > 1 else [], args)
            procs.append(spawn(
                [sys.executable, "-m", "specroute", "serve", "--config", str(config)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        for url, proc in zip(urls, procs, strict=True):
            await wait_ready(url + "/ready", process=proc, poll_s=0.2, name="a proxy")
        yield urls
    finally:
        for proc in procs:
            await stop_async(proc)


async def one_run(
    out: Path, profile: str, replicas: int, args: argparse.Namespace
) -> dict[str, Any]:
    tag = f"{profile}__x{replicas}"
    extra = ["--time-scale", str(args.time_scale)]
    load_before = os.getloadavg()[0]
    async with emulated_fleet(DEPTHS, profile=profile, extra_args=extra) as servers:
        backends = [s.url for s in servers]
        async with (
            _proxies(out, tag, backends, replicas, args) as urls,
            httpx.AsyncClient(timeout=10.0) as client,
        ):
            await _settled(client, urls, replicas)
            model = (await client.get(urls[0] + "/v1/models")).json()["data"][0]["id"]
            records, phases = await _trace(urls, model, args)
            pools = [(await client.get(u + "/pool")).json() for u in urls]
            texts = [(await client.get(b + "/metrics")).text for b in backends]
    (out / f"{tag}.records.json").write_bytes(msgspec.json.encode(records))
    (out / f"{tag}.pools.json").write_text(json.dumps(pools, indent=1))
    row = _row(profile, phases, pools, [queue_waits(t) for t in texts])
    row.update(
        replicas=replicas, load_average=[round(load_before, 2), round(os.getloadavg()[0], 2)]
    )
    return row


def _row(
    profile: str, phases: list[dict[str, Any]], pools: list[Any], waits: list[dict[str, float]]
) -> dict[str, Any]:
    errors = [acceptance_errors(p, profile) for p in pools]
    scrapes = [p["replicas"]["scrapes"] for p in pools]
    return {
        "profile": profile,
        "agg_tok_s": sum(p["tokens"] for p in phases) / sum(p["wall_s"] for p in phases),
        "phases": phases,
        "errors": sum(p["errors"] for p in phases),
        "waits": {k: sum(w[k] for w in waits) for k in waits[0]},
        "worst_acceptance_error": max((abs(v) for e in errors for v in e.values()), default=0.0),
        "acceptance": errors,
        "scrapes_per_s": sum(s["per_s"] for s in scrapes) / len(scrapes),
        "parse_us_each": sum(s["parse_us_each"] for s in scrapes) / len(scrapes),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| profile | replicas | whole trace agg tok/s | vs 1 replica | requests | queued at a "
        "backend (over-admission) | seconds queued | worst acceptance error | scrapes/s per "
        "replica | us per scrape | load average (start, end) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    single = {r["profile"]: r["agg_tok_s"] for r in rows if r["replicas"] == 1}
    for r in sorted(rows, key=lambda r: (r["profile"], r["replicas"])):
        base = single.get(r["profile"])
        vs = f"{r['agg_tok_s'] / base - 1:+.1%}" if base else "-"
        w = r["waits"]
        lines.append(
            f"| {r['profile']} | {r['replicas']} | {r['agg_tok_s']:.0f} | {vs} | "
            f"{w['requests']:.0f} | {w['waited']:.0f} | {w['wait_s']:.1f} | "
            f"{r['worst_acceptance_error']:.1%} | {r['scrapes_per_s']:.1f} | "
            f"{r['parse_us_each']:.0f} | {r['load_average'][0]}, {r['load_average'][1]} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3, 6])
    parser.add_argument("--profile", action="append", default=[])
    parser.add_argument("--policy", default="throughput")
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--duration-scale", type=float, default=0.25)
    parser.add_argument("--scrape-min-s", type=float, default=0.25)
    parser.add_argument("--split", choices=["capacity", "room"], default="capacity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="results directory (default results/replicas-<stamp>)")
    parser.add_argument("--report", metavar="DIR", help="only print the table of a saved run")
    args = parser.parse_args()
    if args.report:
        print(table(json.loads((Path(args.report) / "rows.json").read_text())["rows"]))
        return
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or ROOT / "results" / f"replicas-{stamp}")
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  # once, before any run
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "report")}
    settings["profile"] = args.profile or ["seed-qwen35-122b", "costly-drafts"]
    rows: list[dict[str, Any]] = []
    for profile in settings["profile"]:
        for replicas in args.replicas:
            row = await one_run(out, profile, replicas, args)
            rows.append(row)
            print(f"{profile} x{replicas}: {row['agg_tok_s']:.0f} tok/s, waits {row['waits']}",
                  flush=True)  # fmt: skip
            (out / "rows.json").write_text(json.dumps({"settings": settings, "rows": rows}))
    text = table(rows)
    print(text)
    (out / "table.md").write_text(f"settings: {json.dumps(settings)}\n\n{text}\n")


if __name__ == "__main__":
    asyncio.run(main())
