"""The client measuring itself: event-loop lag, its own CPU and chunks per second, so a point
where the client (not the server) may be the limit is marked instead of reported as the server's.
"""

from __future__ import annotations

import time

import msgspec

from specroute.bench.stats import percentile
from specroute.looplag import LoopLagSampler

__all__ = ["CPU_LIMIT", "LAG_LIMIT", "ClientHealth", "SelfMonitor"]

CPU_LIMIT = 0.85
"""Fraction of one core above which the client may be what limits throughput."""
LAG_LIMIT = 0.025
"""p99 event-loop lag (seconds) above which chunk receive times are no longer trustworthy."""
_TICK = 0.01
_MIN_WALL = 0.5  # CPU shares over shorter spans are start-up noise, not load


class ClientHealth(msgspec.Struct, frozen=True, kw_only=True):
    """How busy the client was during one level; `limited` marks numbers the client may cap."""

    wall_s: float = 0.0
    cpu_fraction: float = 0.0
    loop_lag_p99_ms: float = 0.0
    loop_lag_max_ms: float = 0.0
    chunks: int = 0
    chunks_per_s: float = 0.0
    workers: int = 1
    limited: bool = False
    reasons: list[str] = []


def judge(
    wall: float, cpu: float, lags: list[float], chunks: int, workers: int = 1
) -> ClientHealth:
    """Turn raw self-measurements into a verdict (pure; `cpu` is CPU seconds per worker)."""
    fraction = cpu / wall if wall > 0 else 0.0
    p99 = percentile(lags, 99) if lags else 0.0
    reasons: list[str] = []
    if fraction >= CPU_LIMIT and wall >= _MIN_WALL:
        reasons.append(f"client CPU {fraction:.0%} of a core")
    if p99 >= LAG_LIMIT:
        reasons.append(f"event-loop lag p99 {p99 * 1e3:.1f} ms")
    return ClientHealth(
        wall_s=wall,
        cpu_fraction=fraction,
        loop_lag_p99_ms=p99 * 1e3,
        loop_lag_max_ms=max(lags, default=0.0) * 1e3,
        chunks=chunks,
        chunks_per_s=chunks / wall if wall > 0 else 0.0,
        workers=workers,
        limited=bool(reasons),
        reasons=reasons,
    )


class SelfMonitor:
    """Samples event-loop lag every 10 ms while running; `stop()` returns the verdict."""

    def __init__(self) -> None:
        self._lags: list[float] = []
        self._sampler = LoopLagSampler(_TICK, self._lags.append)
        self._wall = 0.0
        self._cpu = 0.0

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self._sampler.start()

    async def stop(self, chunks: int) -> ClientHealth:
        wall = time.perf_counter() - self._wall
        cpu = time.process_time() - self._cpu
        await self._sampler.stop()
        return judge(wall, cpu, self._lags, chunks)
