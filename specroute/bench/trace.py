"""`bench trace`: replay a scenario (phases of closed-loop users or Poisson arrivals, each
with its own traffic mix and duration) against one target and report every phase."""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path

import msgspec

from specroute.bench.client import BenchClient
from specroute.bench.level import LevelPlan, SweepSettings, Target
from specroute.bench.probes import fetch_facts
from specroute.bench.progress import Progress
from specroute.bench.sweep import (
    LevelResult,
    SweepResult,
    TargetResult,
    measure_level,
    realism_warnings,
)
from specroute.bench.workload import ApiSettings, PromptSettings, Sampling
from specroute.structdoc import misspelt_hint

__all__ = ["Phase", "Scenario", "load_scenario", "run_trace"]


class Phase(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`concurrency` users for `duration` seconds (or Poisson `rate` per second when set);
    `mix` replaces the scenario's mix for this phase. Requests in flight at the end of a phase
    finish before the next phase starts."""

    name: str
    duration: float
    concurrency: int = 1
    rate: float | None = None
    mix: list[Sampling] | None = None

    def __post_init__(self) -> None:
        if self.duration <= 0 or self.concurrency < 1 or (self.rate is not None and self.rate <= 0):
            raise ValueError(f"phase {self.name!r}: duration, concurrency and rate must be > 0")


class Scenario(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str = ""
    prompts: PromptSettings = PromptSettings()
    api: ApiSettings = ApiSettings()
    mix: list[Sampling] = msgspec.field(default_factory=lambda: [Sampling()])
    phases: list[Phase]

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError(f"scenario {self.name!r} has no phases")


def load_scenario(path: str | Path) -> Scenario:
    """A scenario from TOML. Its errors name the file: ValueError where it is not TOML,
    msgspec.ValidationError (a ValueError) naming the field where it is but a value is wrong
    (`$.phases[2].duration`); OSError where it cannot be read."""
    with Path(path).open("rb") as handle:
        try:
            raw = tomllib.load(handle)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"scenario {path}: not valid TOML: {exc}") from exc
    try:
        return msgspec.convert(raw, type=Scenario)
    except msgspec.ValidationError as exc:
        hint = misspelt_hint(str(exc), Scenario)
        raise msgspec.ValidationError(f"scenario {path}: {exc}{hint}") from exc


def _settings(
    scenario: Scenario, url: str, model: str | None, api_key: str | None, seed: int
) -> SweepSettings:
    api = msgspec.structs.replace(
        scenario.api, model=model or scenario.api.model, api_key=api_key or scenario.api.api_key
    )
    return SweepSettings(
        targets=[Target(label="target", url=url.rstrip("/"))],
        concurrency=sorted({p.concurrency for p in scenario.phases}),
        warmup=0,
        prompts=scenario.prompts,
        mix=scenario.mix,
        api=api,
        seed=seed,
    )


async def _run_phases(
    client: BenchClient,
    settings: SweepSettings,
    scenario: Scenario,
    model: str,
    duration_scale: float,
    progress: Progress,
) -> list[LevelResult]:
    levels: list[LevelResult] = []
    first_index = 0
    for i, phase in enumerate(scenario.phases):
        plan = LevelPlan(
            url=settings.targets[0].url,
            model=model,
            concurrency=phase.concurrency,
            rate=phase.rate,
            requests=None,
            duration=phase.duration * duration_scale,
            seed=settings.seed + i,
            first_index=first_index,
            phase=phase.name,
        )
        level = await measure_level(
            client,
            settings,
            plan,
            settings.targets[0].label,
            progress,
            mix=phase.mix or scenario.mix,
        )
        levels.append(level)
        first_index += len(level.records)
    return levels


async def run_trace(
    scenario: Scenario,
    url: str,
    *,
    duration_scale: float = 1.0,
    model: str | None = None,
    api_key: str | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> SweepResult:
    """Run every phase in order against `url`; one level result per phase."""
    settings = _settings(scenario, url, model, api_key, seed)
    target = settings.targets[0]
    progress = progress or Progress(enabled=False)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    async with BenchClient(
        connections=max(p.concurrency for p in scenario.phases) + 8,
        api_key=settings.api.api_key,
        timeout=settings.api.timeout,
    ) as client:
        facts = await fetch_facts(client, target.url)
        chosen = settings.api.model or facts.model or "default"
        try:
            levels = await _run_phases(client, settings, scenario, chosen, duration_scale, progress)
        finally:
            progress.close()
        facts = await fetch_facts(client, target.url)
    mixes = [s for p in scenario.phases for s in (p.mix or scenario.mix)]
    return SweepResult(
        settings=settings,
        kind="trace",
        started_at=started,
        targets=[TargetResult(label=target.label, url=target.url, facts=facts)],
        levels=levels,
        warnings=realism_warnings(mixes),
        scenario=msgspec.to_builtins(scenario),
    )
