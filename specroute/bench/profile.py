"""Bench profiles: what sweeps measured, per target, traffic and concurrency, in the profile
format the pool loads as its prior (`specroute bench profile`; the format and its fits are
`specroute.profile_format`, schema `specroute.profile/2`).

`iteration_time_s` estimates one engine iteration at that load: the mean gap between chunks
after the first (inter-token latency times tokens per chunk). It and `aggregate_tok_s` count
the span the level held its concurrency (`levels.held_window`), not the drain after its last
send, where fewer requests run: a prior is the engine at that load. Sweeps against an emulator run
with `--time-scale X` are scaled back (`time_scale`): rates divided by X, times multiplied.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path

import msgspec

from specroute.bench.sweep import LevelResult, SweepResult, TargetResult
from specroute.bench.workload import PromptSettings, Sampling
from specroute.profile_format import (
    SCHEMA,
    Point,
    Profile,
    Target,
    Traffic,
    decode_profile,
    encode_profile,
    with_fits,
)

__all__ = [
    "SCHEMA",
    "encode_profile",
    "load_profile",
    "merge_profiles",
    "profile_from_result",
    "traffic_of",
]


def _point(level: LevelResult, traffic: str, scale: float) -> Point:
    s = level.summary
    tokens_per_chunk = s.accept.chunks or s.accept.best()
    held = s.held_s > 0 and s.held_itl.count > 0  # a summary written before `held_*`: whole
    itl = s.held_itl if held else s.itl
    iteration = itl.mean * tokens_per_chunk if tokens_per_chunk and itl.count else None
    return Point(
        traffic=traffic,
        concurrency=level.concurrency,
        per_request_tok_s=s.per_request_tok_s / scale,
        aggregate_tok_s=(s.held_tok_s if held else s.aggregate_tok_s) / scale,
        accept_length=s.accept.best(),
        accept_chunks=s.accept.chunks,
        accept_sglext=s.accept.sglext,
        accept_metrics=s.accept.metrics,
        iteration_time_s=iteration * scale if iteration is not None else None,
        tpot_s=s.tpot.mean * scale,
        ttft_p50_s=s.ttft.p50 * scale,
        requests=s.succeeded,
        errors=s.errors,
        client_limited=level.client.limited,
    )


def _target(target: TargetResult, levels: list[LevelResult], traffic: str, scale: float) -> Target:
    points = sorted(
        (
            _point(lv, traffic, scale)
            for lv in levels
            if lv.target == target.label and lv.rate is None and lv.summary.succeeded
        ),
        key=lambda p: p.concurrency,
    )
    return Target(
        label=target.label,
        url=target.url,
        model=target.facts.model,
        algorithm=target.facts.algorithm,
        steps=target.facts.steps,
        max_running_requests=target.facts.max_running_requests,
        points=points,
    )


def _prompts(settings: PromptSettings) -> str:
    if settings.source == "synthetic":
        return f"synthetic, {settings.words} words"
    return f"{settings.source} {settings.path}"


def traffic_of(mix: list[Sampling], prompts: PromptSettings, api: str) -> Traffic:
    """One sweep's traffic: its sampling class, or `mix` of several (greedy only if all are)."""
    live = [s for s in mix if s.weight > 0] or mix
    first = live[0]
    return Traffic(
        name=first.name if len(live) == 1 else "mix",
        temperature=first.temperature,
        top_p=first.top_p,
        greedy=all(s.greedy for s in live),
        ignore_eos=first.ignore_eos,
        max_tokens=first.max_tokens,
        prompts=_prompts(prompts),
        api=api,
    )


def profile_from_result(
    result: SweepResult, *, source: str = "", time_scale: float = 1.0
) -> Profile:
    """The closed-loop levels of a sweep as a profile, fitted."""
    traffic = traffic_of(result.settings.mix, result.settings.prompts, result.settings.api.api)
    targets = [_target(t, result.levels, traffic.name, time_scale) for t in result.targets]
    return with_fits(
        Profile(
            source=source,
            created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            models=sorted({t.model for t in targets if t.model}),
            traffic=[traffic],
            targets=targets,
        )
    )


def merge_profiles(profiles: Iterable[Profile], *, source: str = "") -> Profile:
    """One profile from several (one per traffic kind, say): targets of the same label pool
    their points, traffic kinds are listed once, and the fits are redone over everything."""
    targets: dict[str, Target] = {}
    traffic: dict[str, Traffic] = {}
    created = ""
    for profile in profiles:
        created = max(created, profile.created_at)
        traffic.update({t.name: t for t in profile.traffic})
        for target in profile.targets:
            known = targets.get(target.label)
            points = [*known.points, *target.points] if known else list(target.points)
            targets[target.label] = msgspec.structs.replace(target, points=points)
    merged = list(targets.values())
    return with_fits(
        Profile(
            source=source,
            created_at=created,
            models=sorted({t.model for t in merged if t.model}),
            traffic=list(traffic.values()),
            targets=merged,
        )
    )


def load_profile(path: str | Path) -> Profile:
    return decode_profile(Path(path).read_bytes(), source=str(path))
