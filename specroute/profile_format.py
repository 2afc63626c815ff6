"""The profile file, one format for its writers (`specroute bench profile`, `specroute tune`)
and its reader (the pool's prior): measured points per server and traffic, and the fits the
pool starts from, T(b, k), R(k) and acceptance per sampling class. Pure: bytes in, bytes out.

Schema `specroute.profile/2` (JSON; the Structs below are the reference)::

    {"schema": "specroute.profile/2", "source": "tune-out", "created_at": "...",
     "models": ["Qwen/Qwen3.5-122B-A10B"],
     "traffic": [{"name": "greedy", "temperature": 0.0, "top_p": 1.0, "greedy": true,
                  "ignore_eos": true, "max_tokens": 256, "prompts": "synthetic, 256 words",
                  "api": "chat"}],
     "targets": [{"label": "steps3", "url": "http://...", "model": "...", "algorithm": "EAGLE",
                  "steps": 3, "adaptive": false, "max_running_requests": 17, "startup_s": 88.0,
                  "points": [{"traffic": "greedy", "concurrency": 1, "per_request_tok_s": 234.0,
                              "aggregate_tok_s": 231.6, "accept_length": 3.98,
                              "accept_chunks": 3.97, "accept_sglext": 3.98,
                              "accept_metrics": 3.98, "iteration_time_s": 0.0170,
                              "tpot_s": 0.00427, "ttft_p50_s": 0.02, "requests": 3}]}],
     "depths": [{"steps": 3, "max_running_requests": 17, "intercept_s": 0.0155,
                 "per_token_s": 0.00021, "points": 5}],
     "acceptance": {"greedy": {"alpha": 0.99, "accept_length": {"3": 3.98}},
                    "sampled": {"alpha": 0.62, "accept_length": {"3": 2.54}}}}

Times are seconds on the real (or emulated, unscaled) hardware. `iteration_time_s` is one
engine iteration at that load (mean gap between stream chunks); `depths` fits
`T = intercept_s + per_token_s * min(C, R) * (k + 1)` over every point of that depth;
`acceptance` is keyed by the proxy's sampling bucket (`greedy`, `sampled`). A file whose
`depths` or `acceptance` are missing gets them fitted from its points on reading. Another
schema version is refused with a message naming both versions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import msgspec

from specroute.speculation import alpha_from_accept_length

__all__ = [
    "SCHEMA",
    "SCHEMA_NAME",
    "VERSION",
    "ClassFit",
    "DepthFit",
    "Point",
    "Profile",
    "ProfileFormatError",
    "Target",
    "Traffic",
    "decode_profile",
    "depth_curves",
    "depth_of",
    "encode_profile",
    "fit_acceptance",
    "fit_depths",
    "fit_line",
    "with_fits",
]

SCHEMA_NAME = "specroute.profile"
VERSION = 2
SCHEMA = f"{SCHEMA_NAME}/{VERSION}"
_OLD_NAMES = ("specroute.bench-profile",)  # version 1's name


class ProfileFormatError(ValueError):
    """The bytes are not a profile this version of specroute reads; the message says why."""


class Traffic(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of traffic the points were measured with (acceptance depends on it)."""

    name: str
    temperature: float
    top_p: float = 1.0
    greedy: bool
    ignore_eos: bool
    max_tokens: int
    prompts: str
    """`synthetic, N words`, or the dataset the prompts came from."""
    api: str = "chat"


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """One closed-loop level of one server under one kind of traffic. Writers fill every
    field; a reader needs only `concurrency` and what it uses."""

    concurrency: int
    traffic: str = ""
    per_request_tok_s: float = 0.0
    """Mean over requests of 1 / TPOT."""
    aggregate_tok_s: float = 0.0
    """Completion tokens / level wall time."""
    accept_length: float | None = None
    """Tokens per verify (bonus included), from the most exact source measured."""
    accept_chunks: float | None = None
    accept_sglext: float | None = None
    accept_metrics: float | None = None
    iteration_time_s: float | None = None
    tpot_s: float = 0.0
    ttft_p50_s: float = 0.0
    requests: int = 0
    errors: int = 0
    client_limited: bool = False
    """True when the client, not the server, may have capped this point."""


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """One server as it described itself, and what was measured on it."""

    label: str = ""
    url: str = ""
    model: str | None = None
    algorithm: str | None = None
    steps: int | None = None
    """`speculative_num_steps` from /server_info (an adaptive server's start depth)."""
    adaptive: bool = False
    max_running_requests: int | None = None
    startup_s: float | None = None
    """Seconds from launch to /ready, where the writer started the server."""
    points: list[Point] = []


class DepthFit(msgspec.Struct, frozen=True, kw_only=True):
    """Fitted iteration time and the capacity of fixed-depth servers at `steps`."""

    steps: int
    max_running_requests: int | None
    intercept_s: float
    per_token_s: float
    points: int


class ClassFit(msgspec.Struct, frozen=True, kw_only=True):
    """Acceptance of one sampling bucket: a per-token rate and the accept length per depth."""

    alpha: float
    accept_length: dict[int, float]


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    schema: str = SCHEMA
    source: str = ""
    created_at: str = ""
    models: list[str] = []
    traffic: list[Traffic] = []
    targets: list[Target] = []
    depths: list[DepthFit] = []
    acceptance: dict[str, ClassFit] = {}


class _Head(msgspec.Struct):
    schema: str | None = None


def fit_line(points: Iterable[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares `y = intercept + slope * x`, slope >= 0; a flat line from one x."""
    pts = list(points)
    if not pts:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx <= 0:
        return my, 0.0
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in pts) / sxx)
    return max(1e-6, my - slope * mx), slope


def depth_of(target: Target) -> int | None:
    """A target's depth: its `steps`, or 0 for a server that described itself (its batch limit)
    and names no speculative algorithm (SGLang reports no `speculative_num_steps` then); None
    where it said nothing."""
    if target.steps is not None:
        return target.steps
    return 0 if target.algorithm is None and target.max_running_requests else None


def _depth_points(
    targets: Iterable[Target],
) -> tuple[dict[int, list[tuple[float, float]]], dict[int, int | None]]:
    """Every fixed-depth target's (tokens verified per iteration, seconds) points per depth,
    b = min(C, R(k)) running requests verifying k + 1 tokens each, and each depth's R(k)."""
    by_steps: defaultdict[int, list[tuple[float, float]]] = defaultdict(list)
    capacity: dict[int, int | None] = {}
    for target in targets:
        steps = depth_of(target)
        if steps is None or target.adaptive:
            continue
        capacity.setdefault(steps, target.max_running_requests)
        for p in target.points:
            if p.iteration_time_s is None or p.iteration_time_s <= 0:
                continue
            running = p.concurrency
            if target.max_running_requests:
                running = min(running, target.max_running_requests)
            by_steps[steps].append((running * (steps + 1.0), p.iteration_time_s))
    return dict(by_steps), capacity


def fit_depths(targets: Iterable[Target]) -> list[DepthFit]:
    """T(b, k) per depth over every fixed-depth target's points, b = min(C, R(k))."""
    by_steps, capacity = _depth_points(targets)
    fits = []
    for steps, pts in sorted(by_steps.items()):
        line = fit_line(pts)
        if line is not None:
            fits.append(
                DepthFit(
                    steps=steps,
                    max_running_requests=capacity.get(steps),
                    intercept_s=line[0],
                    per_token_s=line[1],
                    points=len(pts),
                )
            )
    return fits


def depth_curves(targets: Iterable[Target]) -> dict[int, tuple[tuple[float, float], ...]]:
    """Per depth, the measured iteration time at each number of tokens verified per iteration
    (the mean of the points there), sorted by tokens and never falling as tokens grow (a
    bigger batch is never faster; a dip is noise): what `speculation.measured_time` reads
    between the points, where the line of `fit_depths` misses the bend."""
    by_steps, _ = _depth_points(targets)
    curves = {}
    for steps, pts in sorted(by_steps.items()):
        sums: defaultdict[float, list[float]] = defaultdict(list)
        for x, y in pts:
            sums[x].append(y)
        curve, top = [], 0.0
        for x in sorted(sums):
            top = max(top, sum(sums[x]) / len(sums[x]))
            curve.append((x, top))
        curves[steps] = tuple(curve)
    return curves


def _bucket(traffic: Traffic | None) -> str | None:
    if traffic is None:
        return None
    return "greedy" if traffic.greedy else "sampled"


def fit_acceptance(targets: Iterable[Target], traffic: Iterable[Traffic]) -> dict[str, ClassFit]:
    """Per sampling bucket: the request-weighted accept length per depth, and the alpha that
    explains them (fixed-depth servers with speculation only)."""
    kinds = {t.name: t for t in traffic}
    sums: defaultdict[str, defaultdict[int, list[float]]] = defaultdict(
        lambda: defaultdict(lambda: [0.0, 0.0])
    )
    for target in targets:
        if not target.steps or target.adaptive:
            continue
        for p in target.points:
            bucket = _bucket(kinds.get(p.traffic))
            if bucket is None or p.accept_length is None or p.requests <= 0:
                continue
            cell = sums[bucket][target.steps]
            cell[0] += p.accept_length * p.requests
            cell[1] += p.requests
    fits = {}
    for bucket, by_steps in sums.items():
        lengths = {k: total / weight for k, (total, weight) in sorted(by_steps.items())}
        alphas = [alpha_from_accept_length(length, k) for k, length in lengths.items()]
        fits[bucket] = ClassFit(alpha=sum(alphas) / len(alphas), accept_length=lengths)
    return fits


def with_fits(profile: Profile) -> Profile:
    """The profile with `depths` and `acceptance` fitted from its points where missing."""
    depths = profile.depths or fit_depths(profile.targets)
    acceptance = profile.acceptance or fit_acceptance(profile.targets, profile.traffic)
    return msgspec.structs.replace(profile, depths=depths, acceptance=acceptance)


def encode_profile(profile: Profile) -> bytes:
    return msgspec.json.format(msgspec.json.encode(profile), indent=2)


def _version_error(schema: str | None, source: str) -> ProfileFormatError:
    where = f"{source}: " if source else ""
    if schema is None:
        return ProfileFormatError(f"{where}not a specroute profile (no `schema` field)")
    name, _, version = schema.rpartition("/")
    if name == SCHEMA_NAME or name in _OLD_NAMES:
        return ProfileFormatError(
            f"{where}profile version {version} ({schema}); this specroute reads version "
            f"{VERSION} ({SCHEMA}): write it again with `specroute tune` or "
            "`specroute bench profile`"
        )
    return ProfileFormatError(f"{where}not a specroute profile: schema {schema!r}, want {SCHEMA}")


def decode_profile(data: bytes, *, source: str = "") -> Profile:
    """A profile from JSON bytes, fitted where the file has no fits; ProfileFormatError names
    `source` and what is wrong (not JSON, another version, a bad field)."""
    where = f"{source}: " if source else ""
    try:
        head = msgspec.json.decode(data, type=_Head)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProfileFormatError(f"{where}not a JSON profile: {exc}") from exc
    if head.schema != SCHEMA:
        raise _version_error(head.schema, source)
    try:
        profile = msgspec.json.decode(data, type=Profile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProfileFormatError(f"{where}invalid profile: {exc}") from exc
    return with_fits(profile)
