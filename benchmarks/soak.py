"""Soak run: steady closed-loop load (several hundred concurrent streams) through the proxy in
front of emulated backends for a set duration, sampling the proxy's memory, file descriptors,
upstream connections, CPU, event-loop lag and the clients' latency; it prints every window (a
minute by default) and the growth from the first window to the last. Loopback only; it stops
by itself.

    python benchmarks/soak.py --duration 600 --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness import (
    Emulator,
    Proxy,
    closed_loop_through,
    metric_sum,
    open_fds,
    rss_bytes,
    upstream_connections,
)

from specroute.bench import RequestRecord, Sampling
from specroute.bench.stats import percentile

CONFIG = """
log_level = "info"
[health]
interval_s = 1.0
[admission]
queue_timeout_s = 120.0
"""
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    at: float
    rss: int
    fds: int
    upstream: int
    cpu_s: float
    lag_max_s: float
    health_s: float


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


async def sample_loop(
    proxy: Proxy, ports: set[int], origin: float, every: float, out: list[Sample]
) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while True:
            await asyncio.sleep(every)
            began = time.perf_counter()
            await client.get(proxy.url + "/health")
            health = time.perf_counter() - began
            metrics = await proxy.metrics(client)
            out.append(
                Sample(
                    at=time.perf_counter() - origin,
                    rss=rss_bytes(proxy.pid),
                    fds=open_fds(proxy.pid),
                    upstream=upstream_connections(proxy.pid, ports),
                    cpu_s=_cpu_seconds(proxy.pid),
                    lag_max_s=metric_sum(metrics, "specroute_event_loop_lag_seconds", stat="max"),
                    health_s=health,
                )
            )


@dataclass
class Window:
    """One window's figures (means unless named otherwise)."""

    start: float
    rss_mib: float
    fds: float
    upstream: float
    cpu_pct: float
    lag_ms_max: float
    health_ms: float
    finished: int
    errors: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    e2e_p50_s: float

    @staticmethod
    def header() -> str:
        return (
            f"{'from s':>7} {'RSS MiB':>8} {'fds':>6} {'upstream':>8} {'CPU %':>6} "
            f"{'lag max ms':>10} {'health ms':>9} {'done':>6} {'errors':>6} "
            f"{'TTFT p50 ms':>11} {'TTFT p99 ms':>11} {'e2e p50 s':>9}"
        )

    def row(self) -> str:
        return (
            f"{self.start:>7.0f} {self.rss_mib:>8.1f} {self.fds:>6.0f} {self.upstream:>8.0f} "
            f"{self.cpu_pct:>6.0f} {self.lag_ms_max:>10.1f} {self.health_ms:>9.1f} "
            f"{self.finished:>6} {self.errors:>6} {self.ttft_p50_ms:>11.0f} "
            f"{self.ttft_p99_ms:>11.0f} {self.e2e_p50_s:>9.2f}"
        )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def window(start: float, end: float, samples: list[Sample], records: list[RequestRecord]) -> Window:
    inside = [s for s in samples if start <= s.at < end]
    done = [r for r in records if start <= r.finished < end]
    ttfts = [r.ttft for r in done if r.ttft is not None]
    cpu = math.nan
    if len(inside) >= 2:
        cpu = 100 * (inside[-1].cpu_s - inside[0].cpu_s) / (inside[-1].at - inside[0].at)
    return Window(
        start=start,
        rss_mib=_mean([s.rss / 2**20 for s in inside]),
        fds=_mean([float(s.fds) for s in inside]),
        upstream=_mean([float(s.upstream) for s in inside]),
        cpu_pct=cpu,
        lag_ms_max=max((s.lag_max_s * 1e3 for s in inside), default=math.nan),
        health_ms=_mean([s.health_s * 1e3 for s in inside]),
        finished=len(done),
        errors=sum(1 for r in done if not r.ok),
        ttft_p50_ms=percentile(ttfts, 50) * 1e3 if ttfts else math.nan,
        ttft_p99_ms=percentile(ttfts, 99) * 1e3 if ttfts else math.nan,
        e2e_p50_s=percentile([r.e2e for r in done], 50) if done else math.nan,
    )


def _growth(first: float, last: float) -> str:
    if not first or math.isnan(first) or math.isnan(last):
        return "n/a"
    return f"{100 * (last - first) / first:+.1f}%"


def report(args: argparse.Namespace, samples: list[Sample], records: list[RequestRecord]) -> bool:
    edges = range(0, math.ceil(args.duration), math.ceil(args.window))
    windows = [window(t, t + args.window, samples, records) for t in edges]
    windows = [w for w in windows if not math.isnan(w.rss_mib)]
    print(f"\n== soak: {args.concurrency} concurrent streams for {args.duration:g} s ==")
    print(f"requests finished {len(records)}, failed {sum(1 for r in records if not r.ok)}")
    print(Window.header())
    for w in windows:
        print(w.row())
    first, last = windows[0], windows[-1]
    print(f"\n== growth from the first window (from {first.start:.0f} s) to the last ==")
    rows = [
        ("RSS MiB", first.rss_mib, last.rss_mib),
        ("file descriptors", first.fds, last.fds),
        ("upstream connections", first.upstream, last.upstream),
        ("proxy CPU %", first.cpu_pct, last.cpu_pct),
        ("event-loop lag max ms", first.lag_ms_max, last.lag_ms_max),
        ("health round trip ms", first.health_ms, last.health_ms),
        ("TTFT p50 ms", first.ttft_p50_ms, last.ttft_p50_ms),
        ("TTFT p99 ms", first.ttft_p99_ms, last.ttft_p99_ms),
        ("e2e p50 s", first.e2e_p50_s, last.e2e_p50_s),
    ]
    for name, a, b in rows:
        print(f"  {name:<22} {a:>9.2f} -> {b:>9.2f}  ({_growth(a, b)})")
    rss_growth = 100 * (last.rss_mib - first.rss_mib) / first.rss_mib
    checks = {
        f"memory growth under {args.max_growth:g}% from the first to the last window": (
            rss_growth < args.max_growth
        ),
        "no failed requests": all(r.ok for r in records),
        "descriptors did not grow": last.fds <= first.fds * 1.05 + 2,
    }
    print("\n== checks ==")
    for name, ok in checks.items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    return all(checks.values())


async def load(proxy: Proxy, args: argparse.Namespace, origin: float) -> list[RequestRecord]:
    records = await closed_loop_through(
        proxy.url,
        [Sampling(max_tokens=args.max_tokens)],
        concurrency=args.concurrency,
        duration=args.duration,
        seed=args.seed,
        request_timeout_s=args.duration + 300,
        origin=origin,
    )
    for record in records:  # bench keeps no chunks here; drop the rest of the weight too
        record.chunk_times, record.chunk_tokens = [], []
    return records


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="specroute-soak-"))
    per_backend = math.ceil(args.concurrency / args.backends) + 8
    emu_args = ["--time-scale", str(args.time_scale), "--seed", str(args.seed)]
    emu_args += ["--max-running-requests", str(per_backend)]
    backends = [Emulator(k, emu_args, work) for k in (1, 2, 3)[: args.backends]]
    config = work / "proxy.toml"
    config.write_text(CONFIG + "".join(f'[[backends]]\nurl = "{b.url}"\n' for b in backends))
    proxy = Proxy(config, work / "proxy.log")
    print(f"soak: {args.concurrency} streams, {args.duration:g} s, windows of {args.window:g} s")
    print(f"logs in {work}")
    samples: list[Sample] = []
    try:
        for backend in backends:
            backend.start()
        await asyncio.gather(*(b.ready() for b in backends))
        await proxy.start()
        origin = time.perf_counter()
        ports = {b.port for b in backends}
        sampler = asyncio.create_task(sample_loop(proxy, ports, origin, args.sample, samples))
        try:
            records = await load(proxy, args, origin)
        finally:
            sampler.cancel()
        ok = report(args, samples, records)
    finally:
        proxy.stop()
        for backend in backends:
            backend.stop()
    return 0 if ok else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=256, help="concurrent streams")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per window")
    parser.add_argument("--sample", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--backends", type=int, default=3, choices=[1, 2, 3])
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens per request")
    parser.add_argument("--time-scale", type=float, default=1.0, help="emulated GPU speed-up")
    parser.add_argument("--max-growth", type=float, default=10.0, help="RSS growth limit, %%")
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
