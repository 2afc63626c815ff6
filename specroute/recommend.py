"""What a tune's measurements recommend, per traffic kind (pure): the best server per load
level, the marginal gain of each extra step and where returns diminish, the best fixed depth
overall, and the pool mix for N servers with its predicted gain over the best fixed depth.

Throughput is aggregate tok/s (at one user it is that user's speed). "Overall" is the geometric
mean over the levels measured, so every load counts alike however small its numbers. A pool
is predicted from the single-server curves: each user goes where it adds the most throughput
(as the `throughput` policy routes), at pool loads of N x C users for each level C.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

import msgspec

from specroute.profile_format import Profile

__all__ = [
    "MIN_MIX_GAIN",
    "MIN_STEP_GAIN",
    "MIX_SEARCH_LIMIT",
    "Advice",
    "MixAdvice",
    "Regime",
    "StepGain",
    "advise",
    "best_fixed",
    "best_mix",
    "curves",
    "diminishing",
    "geomean",
    "pool_loads",
    "pool_values",
    "primary",
    "regimes",
    "step_gains",
]

MIN_STEP_GAIN = 0.05
"""An extra step gaining less than this (overall) is not worth its memory."""
MIN_MIX_GAIN = 0.01
"""A mix must beat the best fixed depth by this much to be recommended over it."""
MIX_SEARCH_LIMIT = 6435
"""The most pools `best_mix` values: every pool of up to eight servers of eight depths. Past
that, pools of at most a few distinct depths (three for sixteen servers, two for sixty-four):
every multiset of sixteen servers is 245,157 pools, and `launch --prior --servers 16` spent
minutes choosing one before anything started."""

Curve = dict[int, float]
"""Concurrency -> tok/s of one server."""


class StepGain(msgspec.Struct, frozen=True, kw_only=True):
    """`label` against the next shallower depth `previous`: relative gain per level."""

    label: str
    previous: str
    aggregate: dict[int, float]
    per_request: dict[int, float]
    overall: float
    verdict: str
    """`first step`, `not diminishing`, `diminishing` or `a loss`."""


class Regime(msgspec.Struct, frozen=True):
    low: int
    high: int
    label: str


class MixAdvice(msgspec.Struct, frozen=True, kw_only=True):
    servers: tuple[str, ...]
    baseline: tuple[str, ...]
    """The best fixed-depth pool of the same size."""
    gain: float
    by_load: dict[int, float]
    """Predicted gain over the baseline at each pool load (users)."""


class Advice(msgspec.Struct, frozen=True, kw_only=True):
    traffic: str
    best_by_level: dict[int, str]
    best_fixed: str
    best_fixed_gap: float
    """How far the best fixed depth falls below the best server at its worst level."""
    best_fixed_gap_at: int
    regimes: list[Regime]
    steps: list[StepGain]
    diminishing_from: str | None
    """The first depth whose step gains less than the step before it."""
    worth_up_to: str | None
    """The deepest depth every step to which gains at least MIN_STEP_GAIN overall."""
    mix: MixAdvice | None


def curves(profile: Profile, traffic: str, metric: str = "aggregate") -> dict[str, Curve]:
    """Per server label, `aggregate` or `per_request` tok/s per concurrency under `traffic`."""
    field = "aggregate_tok_s" if metric == "aggregate" else "per_request_tok_s"
    out: dict[str, Curve] = {}
    for target in profile.targets:
        points = {p.concurrency: getattr(p, field) for p in target.points if p.traffic == traffic}
        if points:
            out[target.label] = dict(sorted(points.items()))
    return out


def geomean(values: Iterable[float]) -> float:
    logs = [math.log(max(v, 1e-9)) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else 0.0


def _levels(table: Mapping[str, Curve]) -> list[int]:
    return sorted(set().union(*(c.keys() for c in table.values()))) if table else []


def _best_at(table: Mapping[str, Curve], level: int) -> str:
    return max((lab for lab in table if level in table[lab]), key=lambda lab: table[lab][level])


def best_fixed(table: Mapping[str, Curve]) -> tuple[str, float, int]:
    """(label, its largest shortfall to the level's best, at which level): the server with
    the best geometric-mean throughput over the levels every server measured."""
    levels = [c for c in _levels(table) if all(c in curve for curve in table.values())]
    label = max(table, key=lambda lab: geomean(table[lab][c] for c in levels))
    gaps = {c: 1 - table[label][c] / table[_best_at(table, c)][c] for c in levels}
    at = max(gaps, key=lambda c: gaps[c])
    return label, gaps[at], at


def regimes(best_by_level: Mapping[int, str]) -> list[Regime]:
    """Adjacent levels with the same best server, merged into ranges."""
    out: list[Regime] = []
    for level, label in sorted(best_by_level.items()):
        if out and out[-1].label == label:
            out[-1] = Regime(out[-1].low, level, label)
        else:
            out.append(Regime(level, level, label))
    return out


def step_gains(
    aggregate: Mapping[str, Curve], per_request: Mapping[str, Curve], depths: Sequence[str]
) -> list[StepGain]:
    """Each depth against the one before it in `depths` (fixed depths, shallow first)."""
    gains: list[StepGain] = []
    for previous, label in itertools.pairwise(depths):
        if previous not in aggregate or label not in aggregate:
            continue
        shared = sorted(set(aggregate[previous]) & set(aggregate[label]))
        agg = {c: aggregate[label][c] / aggregate[previous][c] - 1 for c in shared}
        per = {c: per_request[label][c] / per_request[previous][c] - 1 for c in shared}
        overall = geomean(1 + g for g in agg.values()) - 1
        if not gains:
            verdict = "first step"
        elif overall < 0:
            verdict = "a loss"
        elif overall < gains[-1].overall:
            verdict = "diminishing"
        else:
            verdict = "not diminishing"
        gains.append(
            StepGain(
                label=label,
                previous=previous,
                aggregate=agg,
                per_request=per,
                overall=overall,
                verdict=verdict,
            )
        )
    return gains


def diminishing(gains: Sequence[StepGain]) -> tuple[str | None, str | None]:
    """(first depth whose step gains less than the one before, deepest depth worth taking)."""
    shrinking = next((g.label for g in gains if g.verdict in ("diminishing", "a loss")), None)
    worth = gains[0].previous if gains else None
    for gain in gains:
        if gain.overall < MIN_STEP_GAIN:
            break
        worth = gain.label
    return shrinking, worth


def _value(curve: Curve, users: float) -> float:
    """Throughput at `users`, linear between measured levels (0 at 0), flat past the last."""
    xs = [0, *curve]
    ys = [0.0, *curve.values()]
    if users >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in itertools.pairwise(zip(xs, ys, strict=True)):
        if users <= x1:
            return y0 + (y1 - y0) * (users - x0) / (x1 - x0)
    return ys[-1]


_Gains = tuple[tuple[float, ...], int, tuple[float, ...]]
"""A server's gain from each user up to a load, largest first, as (positive gains, how many
are zero, negative gains): past its last measured level a curve is flat, so most are zero."""


def _marginals(curve: Curve, upto: int) -> _Gains:
    values = [_value(curve, u) for u in range(upto + 1)]
    gains = sorted((b - a for a, b in itertools.pairwise(values)), reverse=True)
    positive = tuple(g for g in gains if g > 0)
    negative = tuple(g for g in gains if g < 0)
    return positive, len(gains) - len(positive) - len(negative), negative


def pool_loads(levels: Iterable[int], servers: int) -> list[int]:
    """The pool loads a mix is judged at: N x C users for each level C, so a pool of one
    depth scores as that depth's server does and the best fixed depths agree."""
    return sorted({servers * c for c in levels})


def _pool(servers: Sequence[_Gains], loads: Sequence[int]) -> dict[int, float]:
    """Pool throughput at each load: each user takes the largest gain left (the positive
    ones, then the zeros, then the least negative). A server's gains appear once per server:
    counted, not copied (a pool of 64 servers was 64 lists as long as its largest load)."""
    count = collections.Counter(servers)
    positive = sorted((g for (gains, _, _), n in count.items() for g in gains * n), reverse=True)
    zeros = sum(z * n for (_, z, _), n in count.items())
    negative = sorted((g for (_, _, gains), n in count.items() for g in gains * n), reverse=True)
    up = list(itertools.accumulate(positive, initial=0.0))
    down = list(itertools.accumulate(negative, initial=0.0))
    values = {}
    for load in loads:
        if load <= len(positive):
            values[load] = up[load]
        else:
            values[load] = up[-1] + down[min(len(negative), max(0, load - len(positive) - zeros))]
    return values


def _mixes(labels: Sequence[str], servers: int) -> Iterator[tuple[str, ...]]:
    """The pools `best_mix` values: every multiset of `labels` while they are at most
    `MIX_SEARCH_LIMIT`, else those of at most `d` distinct labels, for the largest `d` that
    keeps them within it (at least two), each in the order of `labels`."""

    def of_at_most(d: int) -> int:
        n = len(labels)
        return sum(math.comb(n, j) * math.comb(servers - 1, j - 1) for j in range(1, d + 1))

    if math.comb(len(labels) + servers - 1, servers) <= MIX_SEARCH_LIMIT:
        yield from itertools.combinations_with_replacement(labels, servers)
        return
    most = max([2, *(d for d in range(1, len(labels) + 1) if of_at_most(d) <= MIX_SEARCH_LIMIT)])
    for d in range(1, min(most, len(labels)) + 1):
        for chosen in itertools.combinations(labels, d):
            for cuts in itertools.combinations(range(1, servers), d - 1):
                sizes = [b - a for a, b in itertools.pairwise((0, *cuts, servers))]
                yield tuple(
                    lab for lab, size in zip(chosen, sizes, strict=True) for _ in range(size)
                )


def pool_values(
    table: Mapping[str, Curve], servers: Sequence[str], loads: Sequence[int]
) -> dict[int, float]:
    """The pool of `servers` (labels, one per server) at each of `loads` users, as `best_mix`
    values it: each user takes the largest gain left."""
    lists = [_marginals(table[lab], max(loads)) for lab in servers]
    return _pool(lists, loads)


def best_mix(
    table: Mapping[str, Curve],
    servers: int,
    candidates: Sequence[str],
    uniform: Sequence[str],
    loads: Sequence[int] = (),
) -> MixAdvice | None:
    """The best pool of `servers` drawn from `candidates` (any mix) or `uniform` (all alike),
    against the best pool of one fixed depth, judged at the pool `loads` (users; default
    `pool_loads` of the levels measured)."""
    labels = [lab for lab in dict.fromkeys([*candidates, *uniform]) if lab in table]
    if not labels:
        return None
    loads = sorted(set(loads)) or pool_loads(_levels(table), servers)
    lists = {lab: _marginals(table[lab], max(loads)) for lab in labels}
    mixes = [m for m in _mixes([c for c in candidates if c in lists], servers) if len(set(m)) > 1]
    mixes += [(lab,) * servers for lab in labels]
    scored = {mix: _pool([lists[lab] for lab in mix], loads) for mix in mixes}
    score = {mix: geomean(values.values()) for mix, values in scored.items()}
    fixed = [(lab,) * servers for lab in labels if lab in candidates] or [(labels[0],) * servers]
    baseline = max(fixed, key=lambda m: score[m])
    best = max(score, key=lambda m: score[m])
    if score[best] < score[baseline] * (1 + MIN_MIX_GAIN):
        best = baseline
    return MixAdvice(
        servers=tuple(sorted(best, key=labels.index)),
        baseline=baseline,
        gain=score[best] / score[baseline] - 1,
        by_load={load: scored[best][load] / scored[baseline][load] - 1 for load in loads},
    )


def advise(
    profile: Profile, traffic: str, depths: Sequence[str], others: Sequence[str], servers: int
) -> Advice | None:
    """Everything the report recommends for one traffic kind; `depths` are the fixed-depth
    labels shallow first, `others` servers that may only fill a pool alone (adaptive)."""
    aggregate = curves(profile, traffic, "aggregate")
    if not aggregate:
        return None
    per_request = curves(profile, traffic, "per_request")
    best_by_level = {c: _best_at(aggregate, c) for c in _levels(aggregate)}
    fixed = {lab: aggregate[lab] for lab in depths if lab in aggregate} or aggregate
    label, gap, at = best_fixed(fixed)
    gains = step_gains(aggregate, per_request, depths)
    shrinking, worth = diminishing(gains)
    return Advice(
        traffic=traffic,
        best_by_level=best_by_level,
        best_fixed=label,
        best_fixed_gap=gap,
        best_fixed_gap_at=at,
        regimes=regimes(best_by_level),
        steps=gains,
        diminishing_from=shrinking,
        worth_up_to=worth,
        mix=best_mix(aggregate, servers, depths, others),
    )


def primary(advice: Sequence[Advice]) -> Advice | None:
    """The advice a pool is recommended by: the first traffic kind that is not greedy (SGLang
    samples unless asked not to), else the first there is."""
    return next((a for a in advice if a.traffic != "greedy"), advice[0] if advice else None)
