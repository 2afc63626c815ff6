"""Iteration-time priors from a bench profile (`specroute bench profile`, schema
`specroute.bench-profile/1`): one straight-line fit of iteration time against batch tokens per
depth. Read with structs of our own so the pool never imports the bench."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import msgspec

from specroute.pool.telemetry import IterationPrior

__all__ = ["PROFILE_SCHEMA", "load_profile_priors", "priors_from_profile"]

PROFILE_SCHEMA = "specroute.bench-profile/1"


class _Point(msgspec.Struct):
    concurrency: int
    iteration_time_s: float | None = None


class _Target(msgspec.Struct):
    steps: int | None = None
    max_running_requests: int | None = None
    points: list[_Point] = []


class _Profile(msgspec.Struct):
    schema: str
    targets: list[_Target] = []


def _fit(points: list[tuple[float, float]]) -> IterationPrior | None:
    """Least squares `seconds = intercept + slope * tokens`; a flat line from one batch size."""
    if not points:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return my, 0.0
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx)
    return max(1e-6, my - slope * mx), slope


def priors_from_profile(data: bytes) -> dict[int, IterationPrior]:
    """Priors per depth from a profile's JSON; targets without a depth are skipped."""
    profile = msgspec.json.decode(data, type=_Profile)
    if profile.schema != PROFILE_SCHEMA:
        raise ValueError(f"not a bench profile: schema {profile.schema!r}, want {PROFILE_SCHEMA}")
    by_steps: defaultdict[int, list[tuple[float, float]]] = defaultdict(list)
    for target in profile.targets:
        if target.steps is None:
            continue
        for point in target.points:
            if point.iteration_time_s is None or point.iteration_time_s <= 0:
                continue
            running = point.concurrency
            if target.max_running_requests:
                running = min(running, target.max_running_requests)
            by_steps[target.steps].append((running * (target.steps + 1.0), point.iteration_time_s))
    priors = {steps: _fit(points) for steps, points in by_steps.items()}
    return {steps: prior for steps, prior in priors.items() if prior is not None}


def load_profile_priors(path: str | Path) -> dict[int, IterationPrior]:
    return priors_from_profile(Path(path).read_bytes())
