"""Chaos run: the bench through the proxy in front of emulated backends while, on a seeded random
schedule, one backend at a time is killed and restarted, frozen (SIGSTOP), or restarted to
answer 500s, send malformed SSE, stall or crash mid-stream, die after N requests, or start not
ready. Loopback only; it stops by itself after --duration plus the settle time.

It prints what the clients saw (completed; failed, and how: error event by code, HTTP status,
or a cut connection), what the proxy retried invisibly, and checks that every request ended
before its deadline, that no failure before the first byte reached a client, and that in-flight
counts, open upstream connections and the proxy's file descriptors return to their start.

    python benchmarks/chaos.py --duration 180 --concurrency 32 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from harness import (
    Emulator,
    Proxy,
    closed_loop_through,
    metric_by,
    metric_sum,
    open_fds,
    upstream_connections,
)
from prometheus_client.samples import Sample

from specroute.bench import RequestRecord, Sampling
from specroute.children import ChildExited
from specroute.emulator.faults import EXIT_STATUS

CONFIG = """
[health]
interval_s = 0.25
timeout_s = 1.0
failure_threshold = 2
success_threshold = 1
[timeouts]
connect_s = 2.0
first_byte_s = {first_byte_s}
idle_s = {idle_s}
[retry]
max_attempts = 3
backoff_s = 0.05
[breaker]
failure_threshold = 5
open_s = 2.0
[limits]
shutdown_grace_s = 5.0
"""
_EXITING = frozenset({"crash_mid_stream", "exit_after_requests"})
"""Faults whose server ends itself (`EXIT_STATUS`) once traffic reaches it."""

# (fault, weight): one backend at a time, healed before the next.
FAULTS = [
    ("kill", 3),
    ("freeze", 2),
    ("http_500", 2),
    ("malformed_sse", 2),
    ("stall", 2),
    ("crash_mid_stream", 2),
    ("exit_after_requests", 1),
    ("not_ready", 1),
]


@dataclass
class Chaos:
    """The fault schedule's state: what was injected, and which backends need healing."""

    backends: list[Emulator]
    rng: random.Random
    injected: Counter[str] = field(default_factory=Counter)
    broken: set[int] = field(default_factory=set)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            index = self.rng.randrange(len(self.backends))
            names, weights = zip(*FAULTS, strict=True)
            fault = self.rng.choices(names, weights)[0]
            self.injected[fault] += 1
            self.broken.add(index)
            await self._inject(self.backends[index], fault)
            await self._heal(index)

    async def _inject(self, backend: Emulator, fault: str) -> None:
        rng = self.rng
        hold = rng.uniform(3.0, 8.0)
        if fault == "kill":
            backend.kill()
        elif fault == "freeze":
            backend.freeze(True)
        else:
            flags = {
                "http_500": ["--fail-rate", "0.5"],
                "malformed_sse": ["--malformed-sse-rate", "0.3"],
                "stall": ["--stall-after-tokens", str(rng.randint(1, 40))],
                "crash_mid_stream": ["--exit-mid-stream-after-tokens", str(rng.randint(1, 60))],
                "exit_after_requests": ["--exit-after-requests", str(rng.randint(0, 10))],
                "not_ready": ["--not-ready-for", "3"],
            }[fault]
            try:
                await backend.restart(*flags)
            except ChildExited as exc:
                # The proxy may send the restarted server a request before its readiness is
                # seen here, and a fault that ends the process can fire on it first: the fault
                # happened, as scheduled. Any other exit is the harness's to report.
                if exc.status != EXIT_STATUS or fault not in _EXITING:
                    raise
        await asyncio.sleep(hold)

    async def _heal(self, index: int) -> None:
        backend = self.backends[index]
        if backend.frozen:
            backend.freeze(False)
        else:
            await backend.restart()
        self.broken.discard(index)

    async def heal_all(self) -> None:
        for index in sorted(self.broken):
            await self._heal(index)


_MESSAGE_CODES = {
    "backend stream interrupted": "stream_interrupted",
    "backend stream stalled": "upstream_timeout",
    "proxy is shutting down": "shutting_down",
}


def classify(record: RequestRecord) -> str:
    """How one request ended, as a client sees it."""
    error = record.error
    if error is None:
        return "completed" if record.completion_tokens > 0 else "empty reply"
    if error.startswith("stream error:"):
        code = re.search(r'"code":\s*"?([\w-]+)', error)
        if code is None:  # the client keeps 200 bytes: long messages lose their code
            code = next((c for m, c in _MESSAGE_CODES.items() if m in error), None)
        return f"error event ({code.group(1) if isinstance(code, re.Match) else code})"
    if error.startswith("HTTP "):
        return f"HTTP status {error[5:8]}"
    if error.startswith("TimeoutError"):
        return "hung past its deadline"
    return f"connection cut ({error.split(':', 1)[0]})"


@dataclass
class Snapshot:
    in_flight: float
    waiting: float
    upstream: int
    fds: int

    def line(self) -> str:
        return (
            f"in-flight {self.in_flight:g}, waiting {self.waiting:g}, "
            f"upstream connections {self.upstream}, file descriptors {self.fds}"
        )


async def snapshot(proxy: Proxy, ports: set[int], client: httpx.AsyncClient) -> Snapshot:
    metrics = await proxy.metrics(client)
    return Snapshot(
        in_flight=metric_sum(metrics, "specroute_in_flight_requests"),
        waiting=metric_sum(metrics, "specroute_admission_waiting_requests"),
        upstream=upstream_connections(proxy.pid, ports),
        fds=open_fds(proxy.pid),
    )


async def settle(
    proxy: Proxy, ports: set[int], start: Snapshot, client: httpx.AsyncClient, within: float
) -> tuple[Snapshot, float]:
    """Poll until the proxy is back at `start` (idle keep-alive connections expire in 30 s)."""
    began = time.monotonic()
    while True:
        now = await snapshot(proxy, ports, client)
        back = now.in_flight == 0 and now.waiting == 0
        back = back and now.upstream <= start.upstream and now.fds <= start.fds
        if back or time.monotonic() - began > within:
            return now, time.monotonic() - began
        await asyncio.sleep(0.5)


async def load(proxy: Proxy, args: argparse.Namespace) -> list[RequestRecord]:
    mix = [
        Sampling(name="short", weight=1.0, max_tokens=32),
        Sampling(name="long", weight=1.0, max_tokens=args.max_tokens),
    ]
    return await closed_loop_through(
        proxy.url,
        mix,
        concurrency=args.concurrency,
        duration=args.duration,
        seed=args.seed,
        request_timeout_s=args.deadline,
    )


def report(
    records: list[RequestRecord],
    chaos: Chaos,
    metrics: list[Sample],
    start: Snapshot,
    end: Snapshot,
    settle_s: float,
) -> bool:
    outcomes = Counter(classify(r) for r in records)
    retries = metric_by(metrics, "specroute_upstream_retries_total", "reason")
    by_reason: Counter[str] = Counter()
    for reason, value in retries.items():
        by_reason[reason] += int(value)
    print("\n== chaos: faults injected (one backend at a time) ==")
    for fault, count in sorted(chaos.injected.items()):
        print(f"  {fault:<22} {count}")
    print("\n== requests, as the clients saw them ==")
    print(f"  sent                   {len(records)}")
    for outcome, count in outcomes.most_common():
        print(f"  {outcome:<40} {count}")
    print(f"  retried invisibly by the proxy: {sum(by_reason.values())} attempts")
    for reason, count in by_reason.most_common():
        print(f"    {reason:<36} {count}")
    print("\n== the proxy, before and after ==")
    print(f"  start: {start.line()}")
    print(f"  end:   {end.line()}  (settled in {settle_s:.1f} s)")
    checks = {
        "every request ended before its deadline": outcomes["hung past its deadline"] == 0,
        "no failure before the first byte reached a client (all retried)": not any(
            o.startswith("HTTP status") for o in outcomes
        ),
        "no stream cut without an error event": not any(
            o.startswith(("connection cut", "empty reply")) for o in outcomes
        ),
        "in-flight and waiting counts back to zero": end.in_flight == 0 and end.waiting == 0,
        "open upstream connections back to their start": end.upstream <= start.upstream,
        "file descriptors back to their start": end.fds <= start.fds,
    }
    print("\n== checks ==")
    for name, ok in checks.items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    return all(checks.values())


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="specroute-chaos-"))
    emu_args = ["--time-scale", str(args.time_scale), "--seed", str(args.seed)]
    backends = [Emulator(steps, emu_args, work) for steps in (1, 2, 3)[: args.backends]]
    config = work / "proxy.toml"
    body = CONFIG.format(first_byte_s=args.first_byte_s, idle_s=args.idle_s)
    config.write_text("".join(f'[[backends]]\nurl = "{b.url}"\n' for b in backends) + body)
    proxy = Proxy(config, work / "proxy.log")
    ports = {b.port for b in backends}
    chaos = Chaos(backends, random.Random(args.seed))
    print(f"chaos: {args.duration:g} s, {args.concurrency} streams, seed {args.seed}")
    print(f"logs in {work}")
    try:
        for backend in backends:
            backend.start()
        await asyncio.gather(*(b.ready() for b in backends))
        await proxy.start()
        async with httpx.AsyncClient(timeout=10) as client:
            start = await snapshot(proxy, ports, client)
            faults = asyncio.create_task(chaos.run())
            try:
                records = await load(proxy, args)
            finally:
                faults.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await faults
                await chaos.heal_all()
            end, settle_s = await settle(proxy, ports, start, client, args.settle)
            metrics = await proxy.metrics(client)
        ok = report(records, chaos, metrics, start, end, settle_s)
    finally:
        status = proxy.stop()
        for backend in backends:
            backend.stop()
    # uvicorn re-raises SIGTERM once its graceful shutdown is done: -15 is a clean exit
    print(f"  proxy exit status after SIGTERM: {status}")
    return 0 if ok else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent streams")
    parser.add_argument("--seed", type=int, default=7, help="seeds the fault schedule")
    parser.add_argument("--backends", type=int, default=3, choices=[2, 3])
    parser.add_argument("--max-tokens", type=int, default=256, help="long requests' length")
    parser.add_argument("--time-scale", type=float, default=5.0, help="emulated GPU speed-up")
    parser.add_argument("--deadline", type=float, default=60.0, help="per-request deadline, s")
    parser.add_argument("--first-byte-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument(
        "--settle",
        type=float,
        default=75.0,
        help="max wait for counts to return, s (idle "
        "upstream connections close after 30 s of keep-alive, checked every 30 s)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
