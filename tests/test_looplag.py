"""The one event-loop lag sampler: a loop held busy shows up as lag, in the proxy's monitor and
in the bench client's self-check alike."""

from __future__ import annotations

import asyncio
import time

from specroute.bench.selfcheck import SelfMonitor
from specroute.looplag import LoopLagSampler

BLOCK_S = 0.08
TICK_S = 0.01


class Lags:
    """The sampler's callback: keeps every lag, and says when `wanted` have come."""

    def __init__(self, wanted: int) -> None:
        self.values: list[float] = []
        self.enough = asyncio.Event()
        self._wanted = wanted

    def __call__(self, lag: float) -> None:
        self.values.append(lag)
        if len(self.values) >= self._wanted:
            self.enough.set()


def hold_the_loop() -> None:
    """Block the event loop on purpose: the lag the samplers must see."""
    time.sleep(BLOCK_S)


def test_sampler_reports_a_held_loop_as_lag() -> None:
    async def main() -> list[float]:
        lags = Lags(wanted=3)
        sampler = LoopLagSampler(TICK_S, lags)
        sampler.start()
        try:
            await asyncio.sleep(0)  # the sampler's first sleep is under way
            hold_the_loop()
            await lags.enough.wait()
        finally:
            await sampler.stop()
        return lags.values

    lags = asyncio.run(main())
    assert max(lags) >= BLOCK_S - TICK_S
    assert min(lags) >= 0.0


def test_stopped_sampler_records_nothing_more() -> None:
    async def main() -> tuple[int, int]:
        lags = Lags(wanted=1)
        sampler = LoopLagSampler(TICK_S / 2, lags)
        sampler.start()
        await lags.enough.wait()
        await sampler.stop()
        seen = len(lags.values)
        await asyncio.sleep(TICK_S * 3)
        return seen, len(lags.values)

    seen, later = asyncio.run(main())
    assert later == seen


def test_bench_self_check_counts_a_held_loop() -> None:
    async def main() -> float:
        monitor = SelfMonitor()
        monitor.start()
        await asyncio.sleep(TICK_S * 2)
        hold_the_loop()
        await asyncio.sleep(TICK_S * 3)
        return (await monitor.stop(chunks=0)).loop_lag_max_ms

    assert asyncio.run(main()) >= (BLOCK_S - TICK_S) * 1e3
