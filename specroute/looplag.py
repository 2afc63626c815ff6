"""Event-loop lag: how late a short timer fires, which is the wait every other task on the loop
suffers. One sampler for the proxy's `/metrics` and the bench client's self-check."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from specroute.tasks import cancel

__all__ = ["LoopLagSampler"]


class LoopLagSampler:
    """Sleeps `interval_s` over and over in a background task on the running loop and hands how
    late each wake-up came (seconds, never negative) to `record`."""

    def __init__(self, interval_s: float, record: Callable[[float], None]) -> None:
        self._interval = interval_s
        self._record = record
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        await cancel([self._task])
        self._task = None

    async def _run(self) -> None:
        interval, record = self._interval, self._record
        while True:
            before = time.perf_counter()
            await asyncio.sleep(interval)
            record(max(0.0, time.perf_counter() - before - interval))
