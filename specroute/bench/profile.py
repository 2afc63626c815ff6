"""Bench profiles: what a sweep measured, per target and concurrency, in the shape the
throughput policy and the pool's estimators take as a prior (`specroute bench profile`).

Schema `specroute.bench-profile/1` (JSON, msgspec Structs below)::

    {"schema": "specroute.bench-profile/1", "source": "sweep.json", "created_at": "...",
     "workload": {"greedy_share": 1.0, "temperature": 0.0, "ignore_eos": true,
                  "max_tokens": 256, "prompt_words": 256, "api": "chat"},
     "targets": [{"label": "steps3", "url": "http://...", "model": "...", "algorithm": "EAGLE",
                  "steps": 3, "max_running_requests": 17,
                  "points": [{"concurrency": 1, "per_request_tok_s": 234.0,
                              "aggregate_tok_s": 230.1, "accept_length": 3.98,
                              "iteration_time_s": 0.0170, "tpot_s": 0.00427,
                              "ttft_p50_s": 0.02, "requests": 3, "client_limited": false}]}]}

`iteration_time_s` estimates one engine iteration at that load: the mean gap between chunks
after the first (inter-token latency times tokens per chunk), i.e. accept length x time per
token. `accept_length` is tokens per verify from the most exact source the sweep had.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import msgspec

from specroute.bench.sweep import LevelResult, SweepResult, TargetResult

__all__ = [
    "PROFILE_SCHEMA",
    "BenchProfile",
    "ProfilePoint",
    "ProfileWorkload",
    "TargetProfile",
    "encode_profile",
    "load_profile",
    "profile_from_result",
]

PROFILE_SCHEMA = "specroute.bench-profile/1"


class ProfilePoint(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One closed-loop level of one target."""

    concurrency: int
    per_request_tok_s: float
    """Mean over requests of 1 / TPOT."""
    aggregate_tok_s: float
    """Completion tokens / level wall time."""
    accept_length: float | None
    """Tokens per verify step (bonus token included)."""
    iteration_time_s: float | None
    """Estimated engine iteration time at this load (mean chunk gap)."""
    tpot_s: float
    ttft_p50_s: float
    requests: int
    client_limited: bool = False
    """True when the client, not the server, may have capped this point."""


class ProfileWorkload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The traffic the profile was measured with (acceptance depends on it)."""

    greedy_share: float
    temperature: float
    ignore_eos: bool
    max_tokens: int
    prompt_words: int
    api: str


class TargetProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    label: str
    url: str
    model: str | None
    algorithm: str | None
    steps: int | None
    """`speculative_num_steps` from /server_info (None if the server did not say)."""
    max_running_requests: int | None
    points: list[ProfilePoint]


class BenchProfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    schema: str = PROFILE_SCHEMA
    source: str = ""
    created_at: str = ""
    workload: ProfileWorkload
    targets: list[TargetProfile]

    def __post_init__(self) -> None:
        if self.schema != PROFILE_SCHEMA:
            raise ValueError(f"unsupported profile schema {self.schema!r}")


def _point(level: LevelResult) -> ProfilePoint:
    s = level.summary
    tokens_per_chunk = s.accept.chunks or s.accept.best()
    return ProfilePoint(
        concurrency=level.concurrency,
        per_request_tok_s=s.per_request_tok_s,
        aggregate_tok_s=s.aggregate_tok_s,
        accept_length=s.accept.best(),
        iteration_time_s=s.itl.mean * tokens_per_chunk
        if tokens_per_chunk and s.itl.count
        else None,
        tpot_s=s.tpot.mean,
        ttft_p50_s=s.ttft.p50,
        requests=s.succeeded,
        client_limited=level.client.limited,
    )


def _target(target: TargetResult, levels: list[LevelResult]) -> TargetProfile:
    points = sorted(
        (
            _point(lv)
            for lv in levels
            if lv.target == target.label and lv.rate is None and lv.summary.succeeded
        ),
        key=lambda p: p.concurrency,
    )
    return TargetProfile(
        label=target.label,
        url=target.url,
        model=target.facts.model,
        algorithm=target.facts.algorithm,
        steps=target.facts.steps,
        max_running_requests=target.facts.max_running_requests,
        points=points,
    )


def profile_from_result(result: SweepResult, *, source: str = "") -> BenchProfile:
    """The closed-loop levels of a sweep as a profile."""
    mix = [s for s in result.settings.mix if s.weight > 0]
    total = sum(s.weight for s in mix) or 1.0
    first = mix[0] if mix else result.settings.mix[0]
    workload = ProfileWorkload(
        greedy_share=sum(s.weight for s in mix if s.greedy) / total,
        temperature=first.temperature,
        ignore_eos=first.ignore_eos,
        max_tokens=first.max_tokens,
        prompt_words=result.settings.prompts.words,
        api=result.settings.api.api,
    )
    return BenchProfile(
        source=source,
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        workload=workload,
        targets=[_target(t, result.levels) for t in result.targets],
    )


def encode_profile(profile: BenchProfile) -> bytes:
    return msgspec.json.format(msgspec.json.encode(profile), indent=2)


def load_profile(path: str | Path) -> BenchProfile:
    return msgspec.json.decode(Path(path).read_bytes(), type=BenchProfile)
