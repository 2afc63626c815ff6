"""Load shapes: closed-loop concurrency (C users, each sends when its last reply ends) and
open-loop Poisson arrivals. Every record's latency counts from its scheduled send time."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from specroute.bench.client import BenchClient, RequestRecord
from specroute.bench.workload import Workload

__all__ = ["Load", "OnDone", "closed_loop", "poisson_arrivals", "poisson_loop"]

OnDone = Callable[[RequestRecord], None]


class Load:
    """Where to send and how much: a target, a workload, a request budget and/or a deadline."""

    __slots__ = (
        "client",
        "duration",
        "first_index",
        "on_done",
        "origin",
        "phase",
        "requests",
        "url",
        "workload",
    )

    def __init__(
        self,
        client: BenchClient,
        url: str,
        workload: Workload,
        *,
        requests: int | None,
        duration: float | None,
        origin: float,
        first_index: int = 0,
        phase: str = "",
        on_done: OnDone | None = None,
    ) -> None:
        if requests is None and duration is None:
            raise ValueError("a load needs a request count, a duration, or both")
        self.client, self.url, self.workload = client, url, workload
        self.requests, self.duration, self.origin = requests, duration, origin
        self.first_index, self.phase, self.on_done = first_index, phase, on_done

    def now(self) -> float:
        return time.perf_counter() - self.origin

    async def send(self, index: int, scheduled: float) -> RequestRecord:
        prepared = self.workload.request(index)
        record = RequestRecord(
            index=index,
            klass=prepared.klass,
            greedy=prepared.greedy,
            scheduled=scheduled,
            phase=self.phase,
        )
        await self.client.stream(self.url, prepared, record, self.origin)
        if self.on_done is not None:
            self.on_done(record)
        return record


async def closed_loop(load: Load, concurrency: int) -> list[RequestRecord]:
    """`concurrency` users in lock-step with their replies until the budget or deadline ends;
    requests in flight at the deadline run to completion. While the target gives no HTTP answer
    the users back off (`ConnectBackoff`): a dead port is not flooded."""
    records: list[RequestRecord] = []
    counter = iter(range(load.first_index, load.first_index + (load.requests or 1 << 62)))
    deadline = None if load.duration is None else load.now() + load.duration
    gate = load.client.backoff(load.url)
    gate.start_level(time.monotonic())

    async def user() -> None:
        while deadline is None or load.now() < deadline:
            pause = gate.wait_s(time.monotonic())
            if pause is None:
                return
            if pause > 0:  # the target gave no answer lately: one user probes, the rest wait
                left = None if deadline is None else deadline - load.now()
                await asyncio.sleep(pause if left is None else max(0.0, min(pause, left)))
                continue
            index = next(counter, None)
            if index is None:
                return
            record = await load.send(index, load.now())
            gate.record(reached=record.status != 0, now=time.monotonic())
            records.append(record)

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(user())
    return sorted(records, key=lambda r: r.index)


def poisson_arrivals(
    rate: float, *, start: float, count: int | None, duration: float | None, seed: int
) -> list[float]:
    """Send times of a Poisson process of `rate` per second from `start`, up to `count`
    arrivals and/or `duration` seconds."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = random.Random(seed)
    times: list[float] = []
    at = start
    while count is None or len(times) < count:
        at += rng.expovariate(rate)
        if duration is not None and at - start > duration:
            break
        times.append(at)
    return times


async def poisson_loop(
    load: Load, rate: float, *, seed: int, max_concurrency: int | None = None
) -> list[RequestRecord]:
    """Open loop: requests go out at Poisson times whatever the replies do; with
    `max_concurrency` the wait for a free slot counts in their latency."""
    schedule = poisson_arrivals(
        rate, start=load.now(), count=load.requests, duration=load.duration, seed=seed
    )
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    records: list[RequestRecord] = []

    async def one(index: int, scheduled: float) -> None:
        if slots is None:
            records.append(await load.send(index, scheduled))
            return
        async with slots:
            records.append(await load.send(index, scheduled))

    async with asyncio.TaskGroup() as group:
        for offset, scheduled in enumerate(schedule):
            delay = scheduled - load.now()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(one(load.first_index + offset, scheduled))
    return sorted(records, key=lambda r: r.index)
