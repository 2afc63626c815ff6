"""`bench sweep`: every target x every load level, each level's requests recorded and
summarized, the server's counters read around each level. `run_sweep` is the Python API."""

from __future__ import annotations

import datetime
import math
from typing import Any

import msgspec
import structlog

from specroute import __version__
from specroute.bench.client import BenchClient, RequestRecord
from specroute.bench.level import LevelPlan, SweepSettings, Target, run_level
from specroute.bench.levels import LevelSummary, summarize_level
from specroute.bench.probes import Counters, ServerFacts, fetch_counters, fetch_facts
from specroute.bench.progress import Progress
from specroute.bench.selfcheck import ClientHealth
from specroute.bench.workers import run_level_workers
from specroute.bench.workload import Sampling

__all__ = [
    "LevelResult",
    "SweepResult",
    "TargetResult",
    "measure_level",
    "realism_warnings",
    "run_sweep",
]

log = structlog.get_logger()


class LevelResult(msgspec.Struct, kw_only=True):
    target: str
    concurrency: int
    rate: float | None = None
    phase: str = ""
    summary: LevelSummary
    client: ClientHealth
    records: list[RequestRecord] = []


class TargetResult(msgspec.Struct, kw_only=True):
    label: str
    url: str
    facts: ServerFacts


class SweepResult(msgspec.Struct, kw_only=True):
    """A sweep's settings, what each target said about itself, and every level's results."""

    settings: SweepSettings
    targets: list[TargetResult]
    levels: list[LevelResult]
    kind: str = "sweep"
    version: str = __version__
    started_at: str = ""
    warnings: list[str] = []
    scenario: dict[str, Any] | None = None
    """The replayed scenario, for `kind == "trace"`."""

    def level(self, target: str, concurrency: int) -> LevelResult | None:
        return next(
            (lv for lv in self.levels if lv.target == target and lv.concurrency == concurrency),
            None,
        )


async def _summarize(
    client: BenchClient, url: str, records: list[RequestRecord], before: Counters | None
) -> LevelSummary:
    """The level's summary, with the server's counter deltas and lifetime accept length."""
    after = await fetch_counters(client, url)
    info = await fetch_facts(client, url)
    return summarize_level(
        records,
        metrics_accept=after.accept_length_since(before) if before and after else None,
        server_info_accept=info.avg_spec_accept_length,
    )


async def measure_level(
    client: BenchClient,
    settings: SweepSettings,
    plan: LevelPlan,
    label: str,
    progress: Progress,
    mix: list[Sampling] | None = None,
) -> LevelResult:
    """Run one level and summarize it with the server's counters read around it."""
    before = await fetch_counters(client, plan.url)
    shape = f"rate {plan.rate:g}/s" if plan.rate else f"C={plan.concurrency}"
    progress.level(f"{label} {plan.phase or shape}", plan.requests)
    if settings.workers > 1:
        records, health = await run_level_workers(settings, plan, settings.workers, progress.done)
    else:
        records, health = await run_level(client, settings, plan, mix=mix, on_done=progress.done)
    summary = await _summarize(client, plan.url, records, before)
    if health.limited:
        summary.warnings.append("client may be the limit: " + "; ".join(health.reasons))
    if not settings.keep_chunks:
        for record in records:
            record.chunk_times, record.chunk_tokens = [], []
    log.info(
        "bench_level_done",
        target=label,
        concurrency=plan.concurrency,
        rate=plan.rate,
        per_request_tok_s=round(summary.per_request_tok_s, 1),
        errors=summary.errors,
    )
    return LevelResult(
        target=label,
        concurrency=plan.concurrency,
        rate=plan.rate,
        phase=plan.phase,
        summary=summary,
        client=health,
        records=records,
    )


def realism_warnings(mix: list[Sampling]) -> list[str]:
    """Greedy decoding and ignore_eos flatter speculation; say so beside the numbers."""
    warnings = []
    greedy = [s.name for s in mix if s.greedy and s.weight > 0]
    if greedy and len(greedy) == len([s for s in mix if s.weight > 0]):
        warnings.append(
            "all traffic is greedy: acceptance is near 100%, unrealistically high "
            "for sampled traffic; deep speculation looks better than it will be"
        )
    if any(s.ignore_eos for s in mix if s.weight > 0):
        warnings.append("ignore_eos fixes output lengths that real traffic does not have")
    return warnings


def _plans(settings: SweepSettings, target: Target, model: str) -> list[LevelPlan]:
    """Closed-loop levels, or Poisson levels (default budget: ten seconds of arrivals)."""
    plans = []
    if settings.rates:
        for i, rate in enumerate(settings.rates):
            requests = settings.requests
            if requests is None and settings.duration is None:
                requests = max(settings.min_requests, math.ceil(10 * rate))
            plans.append(
                LevelPlan(
                    url=target.url,
                    model=model,
                    concurrency=settings.max_concurrency or 0,
                    rate=rate,
                    requests=requests,
                    duration=settings.duration,
                    seed=settings.seed + i,
                )
            )
        return plans
    for i, concurrency in enumerate(settings.concurrency):
        plans.append(
            LevelPlan(
                url=target.url,
                model=model,
                concurrency=concurrency,
                rate=None,
                requests=settings.level_requests(concurrency),
                duration=settings.duration,
                seed=settings.seed + i,
            )
        )
    return plans


async def _sweep_target(
    client: BenchClient, settings: SweepSettings, target: Target, progress: Progress
) -> tuple[TargetResult, list[LevelResult]]:
    facts = await fetch_facts(client, target.url)
    model = settings.api.model or facts.model or "default"
    if settings.warmup > 0:
        warm = LevelPlan(
            url=target.url,
            model=model,
            concurrency=min(settings.warmup, 4),
            rate=None,
            requests=settings.warmup,
            duration=None,
            seed=settings.seed - 1,
        )
        await run_level(client, settings, warm)
    levels = [
        await measure_level(client, settings, plan, target.label, progress)
        for plan in _plans(settings, target, model)
    ]
    facts = await fetch_facts(client, target.url)
    return TargetResult(label=target.label, url=target.url, facts=facts), levels


async def run_sweep(settings: SweepSettings, *, progress: Progress | None = None) -> SweepResult:
    """Run every target through every level, one target at a time, and return it all."""
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    progress = progress or Progress(enabled=False)
    peak = max([*settings.concurrency, settings.max_concurrency or 0, 1])
    targets, levels = [], []
    async with BenchClient(
        connections=peak + 8, api_key=settings.api.api_key, timeout=settings.api.timeout
    ) as client:
        try:
            for target in settings.targets:
                result, target_levels = await _sweep_target(client, settings, target, progress)
                targets.append(result)
                levels.extend(target_levels)
        finally:
            progress.close()
    return SweepResult(
        settings=settings,
        targets=targets,
        levels=levels,
        started_at=started,
        warnings=realism_warnings(settings.mix),
    )
