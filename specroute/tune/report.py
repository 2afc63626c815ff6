"""`specroute tune`'s report as data (saved as JSON): the saved depths as one profile (the prior
the pool loads), capacity and accept lengths per depth, the recommendation per traffic kind with
the `specroute launch` command that starts it, and, for the emulated seed workload, the gap to
the seed's published figures. `tune_render` lays it out."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

import msgspec

from specroute.bench.profile import merge_profiles, profile_from_result
from specroute.emulator.profiles import DEFAULT_PROFILE
from specroute.emulator.seed import (
    SEED_AGGREGATE_TOK_S,
    SEED_MAX_RUNNING_REQUESTS,
    SEED_PER_REQUEST_TOK_S,
    SEED_TOLERANCE,
)
from specroute.launch.argv import EMULATED_MODEL
from specroute.profile_format import Point, Profile, Target, Traffic
from specroute.recommend import Advice, advise, primary
from specroute.speculation import SPECULATIVE_DEFAULT_MAX_RUNNING
from specroute.tune.engine_facts import EngineFacts, engine_facts
from specroute.tune.layout import ServerPlan, TuneLayout, TuneOptions
from specroute.tune.run import DepthResult

__all__ = [
    "DepthRow",
    "SeedCheck",
    "SeedGap",
    "TuneReport",
    "build_profile",
    "build_report",
    "launch_command",
    "seed_check",
]


class DepthRow(msgspec.Struct, frozen=True, kw_only=True):
    label: str
    steps: int
    adaptive: bool
    max_running_requests: int | None
    startup_s: float
    sweep_s: float
    accept: dict[str, list[float | None]]
    """Per traffic kind: accept length from chunks, sglext and /metrics (request-weighted)."""


class SeedGap(msgspec.Struct, frozen=True, kw_only=True):
    label: str
    concurrency: int
    metric: str
    published: float
    measured: float
    gap: float


class SeedCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The emulated seed workload against the seed's published figures."""

    traffic: str
    gaps: list[SeedGap]
    worst: float
    capacities: dict[str, list[int | None]]
    """Per label: [measured, published] max_running_requests."""
    within: bool


class TuneReport(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    emulated: bool
    profile: str | None
    time_scale: float
    traffic: list[Traffic]
    concurrency: list[int]
    servers: int
    depths: list[DepthRow]
    failures: dict[str, str]
    advice: list[Advice]
    recommended_for: str | None
    command: str | None
    seed: SeedCheck | None
    prior: str
    engine: EngineFacts | None = None
    """The engine measured, each server's K and method, and what that engine cannot tell."""


def build_profile(results: Sequence[DepthResult], options: TuneOptions, source: str) -> Profile:
    """Every sweep of every depth as one profile, back in real time, fitted."""
    parts = []
    for result in results:
        for sweep in result.sweeps.values():
            part = profile_from_result(sweep, source=source, time_scale=options.time_scale)
            targets = [_as_measured(t, result) for t in part.targets]
            parts.append(msgspec.structs.replace(part, targets=targets))
    return merge_profiles(parts, source=source)


def _as_measured(target: Target, result: DepthResult) -> Target:
    """The sweep's target with what the tune knows of its server: adaptive or not, start-up,
    and, where the server reported none (vLLM), the depth, method and batch limit the tune
    found (`vllm_facts`), so the prior fits each depth as it does SGLang's."""
    facts = result.facts
    return msgspec.structs.replace(
        target,
        adaptive=result.adaptive,
        startup_s=result.startup_s,
        steps=target.steps if target.steps is not None else facts.steps,
        algorithm=target.algorithm or facts.algorithm,
        max_running_requests=target.max_running_requests or facts.max_running_requests,
    )


def _accept(target: Target, kind: str) -> list[float | None]:
    points = [p for p in target.points if p.traffic == kind and p.requests]
    out: list[float | None] = []
    for field in ("accept_chunks", "accept_sglext", "accept_metrics"):
        pairs = [(getattr(p, field), p.requests) for p in points if getattr(p, field) is not None]
        weight = sum(w for _, w in pairs)
        out.append(sum(v * w for v, w in pairs) / weight if weight else None)
    return out


def _rows(results: Sequence[DepthResult], profile: Profile) -> list[DepthRow]:
    targets = {t.label: t for t in profile.targets}
    return [
        DepthRow(
            label=r.label,
            steps=r.steps,
            adaptive=r.adaptive,
            max_running_requests=r.facts.max_running_requests,
            startup_s=r.startup_s,
            sweep_s=r.sweep_s,
            accept={k: _accept(targets[r.label], k) for k in r.sweeps if r.label in targets},
        )
        for r in results
    ]


def _configured(rows: list[DepthRow], facts: EngineFacts) -> list[DepthRow]:
    """Rows whose server did not report its capacity and whose tune did not measure it (vLLM
    depths saved before the tune read /metrics) show the launch's limit."""
    if facts.engine != "vllm":
        return rows
    return [
        msgspec.structs.replace(r, max_running_requests=facts.capacity.get(r.label))
        if r.max_running_requests is None
        else r
        for r in rows
    ]


def _is_seed_workload(options: TuneOptions, kind: Traffic) -> bool:
    return (
        options.launch.emulate
        and (options.profile or DEFAULT_PROFILE) == DEFAULT_PROFILE
        and kind.greedy
        and kind.ignore_eos
        and kind.max_tokens == 256
        and kind.prompts == "synthetic, 256 words"
    )


def _point(target: Target | None, kind: str, concurrency: int) -> Point | None:
    if target is None:
        return None
    return next(
        (p for p in target.points if (p.traffic, p.concurrency) == (kind, concurrency)), None
    )


def seed_check(profile: Profile, options: TuneOptions) -> SeedCheck | None:
    """Gaps to every published seed point measured, when the run is the seed's own."""
    kind = next((t for t in profile.traffic if _is_seed_workload(options, t)), None)
    if kind is None:
        return None
    targets = {t.steps: t for t in profile.targets if not t.adaptive}
    gaps = []
    for metric, table in (
        ("per-request", SEED_PER_REQUEST_TOK_S),
        ("aggregate", SEED_AGGREGATE_TOK_S),
    ):
        for (k, c), published in table.items():
            point = _point(targets.get(k), kind.name, c)
            if point is None:
                continue
            measured = point.per_request_tok_s if metric == "per-request" else point.aggregate_tok_s
            gap = measured / published - 1
            gaps.append(
                SeedGap(
                    label=targets[k].label,
                    concurrency=c,
                    metric=metric,
                    published=published,
                    measured=measured,
                    gap=gap,
                )
            )
    capacities = {
        f"steps{k}": [targets[k].max_running_requests if k in targets else None, published]
        for k, published in SEED_MAX_RUNNING_REQUESTS.items()
    }
    worst = max((abs(g.gap) for g in gaps), default=0.0)
    within = worst <= SEED_TOLERANCE and all(m == p for m, p in capacities.values() if m)
    return SeedCheck(
        traffic=kind.name, gaps=gaps, worst=worst, capacities=capacities, within=within
    )


def launch_command(
    options: TuneOptions,
    servers: Sequence[ServerPlan],
    prior: str,
    capacities: Mapping[int, int] | None = None,
) -> str:
    """The `specroute launch` line that starts `servers` with the tuned prior; `capacities`
    (each depth's `max_running_requests` as its server reported it) are passed per depth, so
    the launched servers hold what the tune measured."""
    launch = options.launch
    parts = ["specroute", "launch"]
    if launch.emulate:
        parts.append("--emulate")
    if launch.engine != "sglang":
        parts += ["--engine", launch.engine]
    if launch.model != EMULATED_MODEL:
        parts += ["--model", launch.model]
    parts += ["--steps", ",".join(str(s.steps) for s in servers)]
    if launch.algorithm != "NEXTN":
        parts += ["--algorithm", launch.algorithm]
    if launch.draft_model:
        parts += ["--draft-model", launch.draft_model]
    if launch.tp != 1:
        parts += ["--tp", str(launch.tp)]
    fixed = sorted({s.steps for s in servers if not s.adaptive})
    measured = {k: n for k, n in (capacities or {}).items() if k in fixed}
    if measured:
        every = (
            ""
            if launch.max_running_requests == SPECULATIVE_DEFAULT_MAX_RUNNING
            else (f"{launch.max_running_requests},")
        )
        per_depth = ",".join(f"{k}={measured[k]}" for k in sorted(measured))
        parts += ["--max-running-requests", every + per_depth]
    elif launch.max_running_requests != SPECULATIVE_DEFAULT_MAX_RUNNING:
        parts += ["--max-running-requests", str(launch.max_running_requests)]
    flag, extra = "--sglang-arg", list(launch.sglang_args)
    if launch.emulate:
        flag, extra = "--emulator-arg", list(launch.emulator_args)
    elif launch.engine == "vllm":
        flag, extra = "--vllm-arg", list(launch.vllm_args)
    if launch.emulate and options.profile not in (None, DEFAULT_PROFILE):
        extra.insert(0, f"--profile={options.profile}")
    if any(s.adaptive for s in servers):
        extra.append("--speculative-adaptive")
        if options.adaptive_config:
            extra.append(f"--speculative-adaptive-config={options.adaptive_config}")
    parts += [f"{flag}={arg}" for arg in extra]
    return shlex.join([*parts, "--prior", prior])


def build_report(
    options: TuneOptions,
    plans: Sequence[ServerPlan],
    results: Mapping[str, DepthResult],
    failures: Mapping[str, str],
    layout: TuneLayout,
) -> tuple[TuneReport, Profile]:
    """The report and the profile from every depth measured (in plan order)."""
    done = [results[p.label] for p in plans if p.label in results]
    profile = build_profile(done, options, str(layout.out))
    depths = [p.label for p in plans if not p.adaptive and p.label in results]
    others = [p.label for p in plans if p.adaptive and p.label in results]
    advice = [
        a
        for kind in options.traffic
        if (a := advise(profile, kind.name, depths, others, options.servers)) is not None
    ]
    chosen_by = primary(advice)
    by_label = {p.label: p for p in plans}
    command = None
    if chosen_by is not None and chosen_by.mix is not None:
        chosen = [by_label[label] for label in chosen_by.mix.servers]
        capacities = {
            r.steps: r.facts.max_running_requests
            for r in done
            if not r.adaptive and r.facts.max_running_requests is not None
        }
        command = launch_command(options, chosen, str(layout.prior.resolve()), capacities)
    facts = engine_facts(options, plans)
    model = options.launch.model
    if model == EMULATED_MODEL and profile.models:
        model = profile.models[0]
    report = TuneReport(
        model=model,
        emulated=options.launch.emulate,
        profile=(options.profile or DEFAULT_PROFILE) if options.launch.emulate else None,
        time_scale=options.time_scale,
        traffic=profile.traffic,
        concurrency=list(options.concurrency),
        servers=options.servers,
        depths=_configured(_rows(done, profile), facts),
        failures=dict(failures),
        advice=advice,
        recommended_for=chosen_by.traffic if chosen_by else None,
        command=command,
        seed=seed_check(profile, options),
        prior=str(layout.prior),
        engine=facts,
    )
    return report, profile
