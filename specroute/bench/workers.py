"""Spreading one level's load over several worker processes, for when one client core would
be the limit. Each worker runs its share of users (or of the arrival rate) with its own client;
CLOCK_MONOTONIC is system-wide, so every record's times share the parent's origin."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import msgspec

from specroute.bench.client import BenchClient, RequestRecord
from specroute.bench.level import LevelPlan, SweepSettings, run_level
from specroute.bench.loadgen import OnDone
from specroute.bench.selfcheck import ClientHealth

__all__ = ["combine_health", "run_level_workers", "split"]

_INDEX_STRIDE = 10_000_000


def split(total: int, parts: int) -> list[int]:
    """`total` as `parts` near-equal non-negative integers."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _shares(plan: LevelPlan, workers: int) -> list[LevelPlan]:
    users = split(plan.concurrency, workers)
    requests = split(plan.requests, workers) if plan.requests is not None else [None] * workers
    shares = []
    for w in range(workers):
        share = msgspec.structs.replace(
            plan,
            concurrency=users[w],
            requests=requests[w],
            rate=None if plan.rate is None else plan.rate / workers,
            first_index=plan.first_index + w * _INDEX_STRIDE,
            seed=plan.seed + 1000 * w,
        )
        if (share.rate is not None or share.concurrency > 0) and share.requests != 0:
            shares.append(share)
    return shares


def _work(settings_json: bytes, plan_json: bytes, origin: float) -> bytes:
    settings = msgspec.json.decode(settings_json, type=SweepSettings)
    plan = msgspec.json.decode(plan_json, type=LevelPlan)

    async def go() -> tuple[list[RequestRecord], ClientHealth]:
        async with BenchClient(
            connections=max(1, plan.concurrency) + 4,
            api_key=settings.api.api_key,
            timeout=settings.api.timeout,
        ) as c:
            return await run_level(c, settings, plan, origin=origin)

    return msgspec.json.encode(asyncio.run(go()))


def combine_health(parts: list[ClientHealth]) -> ClientHealth:
    """One verdict for several workers: the busiest worker decides whether the client limits."""
    wall = max((p.wall_s for p in parts), default=0.0)
    chunks = sum(p.chunks for p in parts)
    return ClientHealth(
        wall_s=wall,
        cpu_fraction=max((p.cpu_fraction for p in parts), default=0.0),
        loop_lag_p99_ms=max((p.loop_lag_p99_ms for p in parts), default=0.0),
        loop_lag_max_ms=max((p.loop_lag_max_ms for p in parts), default=0.0),
        chunks=chunks,
        chunks_per_s=chunks / wall if wall > 0 else 0.0,
        workers=len(parts),
        limited=any(p.limited for p in parts),
        reasons=sorted({r for p in parts for r in p.reasons}),
    )


async def run_level_workers(
    settings: SweepSettings, plan: LevelPlan, workers: int, on_done: OnDone | None = None
) -> tuple[list[RequestRecord], ClientHealth]:
    """Run `plan` split over `workers` processes and merge their records."""
    shares = _shares(plan, workers)
    settings_json = msgspec.json.encode(settings)
    origin = time.perf_counter()
    loop = asyncio.get_running_loop()
    kind = tuple[list[RequestRecord], ClientHealth]
    with ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            loop.run_in_executor(pool, _work, settings_json, msgspec.json.encode(s), origin)
            for s in shares
        ]
        results = [msgspec.json.decode(raw, type=kind) for raw in await asyncio.gather(*futures)]
    records = sorted((r for recs, _ in results for r in recs), key=lambda r: r.index)
    if on_done is not None:
        for record in records:
            on_done(record)
    return records, combine_health([health for _, health in results])
