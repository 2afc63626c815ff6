"""One load level of the bench: the sweep's settings and targets, a level's plan (concurrency
or rate, requests, phase), and `run_level`, which drives it and records every request. Shared by
the sweep, the trace and the worker processes."""

from __future__ import annotations

import math
import time

import msgspec

from specroute.bench.client import BenchClient, RequestRecord
from specroute.bench.loadgen import Load, OnDone, closed_loop, poisson_loop
from specroute.bench.selfcheck import ClientHealth, SelfMonitor
from specroute.bench.workload import ApiSettings, PromptSettings, Sampling, Workload, load_prompts

__all__ = ["LevelPlan", "SweepSettings", "Target", "parse_target", "run_level"]


class Target(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    label: str
    url: str


def parse_target(text: str, position: int = 0) -> Target:
    """`label=http://host:port` or a bare URL (labelled by its position)."""
    label, sep, url = text.partition("=")
    if not sep or "://" in label:
        label, url = f"target{position + 1}", text
    return Target(label=label, url=url.rstrip("/"))


class SweepSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a sweep does, saved beside its results. A closed-loop level of concurrency C
    sends `requests` requests, or max(min_requests, requests_per_concurrency * C) when None;
    with `duration` it stops sending after that many seconds. Non-empty `rates` replace the
    concurrency levels with open-loop Poisson levels (requests per second)."""

    targets: list[Target]
    concurrency: list[int] = msgspec.field(default_factory=lambda: [1, 4, 16, 32, 64])
    rates: list[float] = msgspec.field(default_factory=list)
    max_concurrency: int | None = None
    requests: int | None = None
    requests_per_concurrency: float = 2.0
    min_requests: int = 3
    duration: float | None = None
    warmup: int = 1
    prompts: PromptSettings = PromptSettings()
    mix: list[Sampling] = msgspec.field(default_factory=lambda: [Sampling()])
    api: ApiSettings = ApiSettings()
    seed: int = 0
    workers: int = 1
    keep_chunks: bool = True

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("a sweep needs at least one target")
        if any(c < 1 for c in self.concurrency) or any(r <= 0 for r in self.rates):
            raise ValueError("concurrency levels must be >= 1 and rates > 0")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.min_requests < 0 or self.requests_per_concurrency < 0 or self.warmup < 0:
            raise ValueError("min_requests, requests_per_concurrency and warmup must be >= 0")
        sends = max(self.min_requests, self.requests_per_concurrency)
        if self.requests is None and self.duration is None and sends <= 0:
            raise ValueError("a level would send no request: min_requests must be >= 1")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be > 0 seconds")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")

    def level_requests(self, concurrency: int) -> int | None:
        if self.requests is not None:
            return self.requests
        if self.duration is not None:
            return None
        return max(self.min_requests, math.ceil(self.requests_per_concurrency * concurrency))


class LevelPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One level as run by one process: closed-loop `concurrency` or Poisson `rate`."""

    url: str
    model: str
    concurrency: int
    rate: float | None
    requests: int | None
    duration: float | None
    seed: int
    first_index: int = 0
    phase: str = ""


def _workload(settings: SweepSettings, plan: LevelPlan, mix: list[Sampling]) -> Workload:
    count = plan.requests or max(64, 8 * max(1, plan.concurrency))
    prompts = load_prompts(settings.prompts, count, plan.seed)
    return Workload(prompts, mix, settings.api, plan.model, plan.seed)


async def run_level(
    client: BenchClient,
    settings: SweepSettings,
    plan: LevelPlan,
    *,
    mix: list[Sampling] | None = None,
    origin: float | None = None,
    on_done: OnDone | None = None,
) -> tuple[list[RequestRecord], ClientHealth]:
    """Run one level in this process; its records' times count from `origin`."""
    load = Load(
        client,
        plan.url,
        _workload(settings, plan, mix or settings.mix),
        requests=plan.requests,
        duration=plan.duration,
        origin=time.perf_counter() if origin is None else origin,
        first_index=plan.first_index,
        phase=plan.phase,
        on_done=on_done,
    )
    monitor = SelfMonitor()
    chunks_before = client.chunks
    monitor.start()
    try:
        if plan.rate is not None:
            records = await poisson_loop(
                load, plan.rate, seed=plan.seed, max_concurrency=settings.max_concurrency
            )
        else:
            records = await closed_loop(load, plan.concurrency)
    finally:
        health = await monitor.stop(client.chunks - chunks_before)
    return records, health
