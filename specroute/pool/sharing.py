"""What replicas of the proxy share: each one's own estimates (acceptance and length per class,
iteration time per backend and depth) with their weights, blended by weight on every replica,
and the table of peers (found by DNS, read over HTTP, dropped when they go). Pure: no I/O, the
caller passes the time.

Each replica serves only what it learned itself (`GET /pool/estimates`), never the blend, so a
sample is counted once however many replicas read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import msgspec

from specroute.policies import ClassEstimate
from specroute.pool.load import Share
from specroute.pool.telemetry import Telemetry

__all__ = [
    "ClassWire",
    "EstimatesWire",
    "IterationWire",
    "PeerTable",
    "Weighted",
    "blend_classes",
    "blend_iteration",
    "class_wires",
    "local_estimates",
]

ESTIMATES_SCHEMA = "specroute.estimates/1"


class Weighted(msgspec.Struct, frozen=True, array_like=True):
    """A value and the samples it stands for (decayed verifies, requests)."""

    value: float
    weight: float


class ClassWire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    alpha: Weighted
    accept_length: dict[int, Weighted] = {}
    samples: int = 0
    mean_tokens: Weighted | None = None
    completions: int = 0
    first_token_s: Weighted | None = None
    prefill_pause_s: Weighted | None = None


class IterationWire(msgspec.Struct, frozen=True, kw_only=True):
    backend: str
    steps: int
    intercept_s: float
    per_token_s: float
    observations: int
    stall_s: float = 0.0
    """The fit's mean pause beyond the decode where it was observed (`IterationTimeModel`)."""


class EstimatesWire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """`GET /pool/estimates`: one replica's own estimates (unknown fields allowed)."""

    instance: str
    schema: str = ESTIMATES_SCHEMA
    classes: dict[str, ClassWire] = {}
    iteration: list[IterationWire] = []


def class_wires(telemetry: Telemetry) -> dict[str, ClassWire]:
    """What this replica learned of each class, with weights."""
    lengths = telemetry.lengths.classes
    counts = telemetry.lengths.counts
    waits = telemetry.first_tokens.classes
    pauses = telemetry.pauses.classes
    classes = {}
    for name in dict.fromkeys([*telemetry.acceptance.classes, *counts]):
        est = telemetry.acceptance.get(name)
        tokens = lengths.get(name)
        wait = waits.get(name)
        pause = pauses.get(name)
        classes[name] = ClassWire(
            alpha=Weighted(est.alpha.value, est.alpha.weight),
            accept_length={k: Weighted(m.value, m.weight) for k, m in est.by_steps.items()},
            samples=est.samples,
            mean_tokens=None if tokens is None else Weighted(tokens.value, tokens.weight),
            completions=counts.get(name, 0),
            first_token_s=None if wait is None else Weighted(wait.value, wait.weight),
            prefill_pause_s=None if pause is None else Weighted(pause.value, pause.weight),
        )
    return classes


def local_estimates(telemetry: Telemetry, instance: str) -> EstimatesWire:
    """What this replica learned itself, with weights: classes and iteration-time fits."""
    classes = class_wires(telemetry)
    iteration = [
        IterationWire(
            backend=name,
            steps=steps,
            intercept_s=model.intercept,
            per_token_s=model.slope,
            observations=model.observations,
            stall_s=model.stall_s,
        )
        for (name, steps), model in telemetry.iteration.items()
        if model.observations
    ]
    return EstimatesWire(instance=instance, classes=classes, iteration=iteration)


def _mean(values: Iterable[Weighted]) -> Weighted | None:
    items = list(values)
    total = sum(w.weight for w in items)
    if not items:
        return None
    if total <= 0:
        return Weighted(items[0].value, 0.0)
    return Weighted(sum(w.value * w.weight for w in items) / total, total)


def blend_classes(parts: Iterable[EstimatesWire]) -> dict[str, ClassEstimate]:
    """Every class any replica has seen, each number the weighted mean over the replicas that
    have it (the first part's value where no one has weight)."""
    by_class: dict[str, list[ClassWire]] = {}
    for part in parts:
        for name, wire in part.classes.items():
            by_class.setdefault(name, []).append(wire)
    out = {}
    for name, wires in by_class.items():
        alpha = _mean(w.alpha for w in wires)
        depths = sorted({k for w in wires for k in w.accept_length})
        lengths = {
            k: _mean(w.accept_length[k] for w in wires if k in w.accept_length) for k in depths
        }
        tokens = _mean(w.mean_tokens for w in wires if w.mean_tokens is not None)
        wait = _mean(w.first_token_s for w in wires if w.first_token_s is not None)
        pause = _mean(w.prefill_pause_s for w in wires if w.prefill_pause_s is not None)
        out[name] = ClassEstimate(
            alpha=alpha.value if alpha is not None else wires[0].alpha.value,
            accept_length={k: m.value for k, m in lengths.items() if m is not None},
            samples=sum(w.samples for w in wires),
            mean_tokens=tokens.value if tokens is not None else None,
            completions=sum(w.completions for w in wires),
            first_token_s=wait.value if wait is not None else None,
            prefill_pause_s=pause.value if pause is not None else None,
        )
    return out


def blend_iteration(own: IterationWire, peers: Iterable[IterationWire | None]) -> IterationWire:
    """Every replica's fit of one backend and depth, weighted by observations (their sum);
    this replica's own (its prior) when no one has any."""
    fits = [own, *(p for p in peers if p is not None)]
    total = sum(f.observations for f in fits)
    if total <= 0:
        return own

    def mean(get: Callable[[IterationWire], float]) -> float:
        return sum(get(f) * f.observations for f in fits) / total

    return msgspec.structs.replace(
        own, intercept_s=mean(lambda f: f.intercept_s), per_token_s=mean(lambda f: f.per_token_s),
        stall_s=mean(lambda f: f.stall_s), observations=total,
    )  # fmt: skip


class _Endpoint:
    __slots__ = ("estimates", "iteration", "read_at")

    def __init__(self) -> None:
        self.estimates: EstimatesWire | None = None
        self.iteration: dict[tuple[str, int], IterationWire] = {}
        self.read_at: float | None = None


class PeerTable:
    """The replicas DNS lists (this one among them) and what each said last. A peer leaves the
    blend when DNS stops listing it or when it has not answered for `stale_after_s`."""

    def __init__(self, instance: str, stale_after_s: float) -> None:
        self.instance = instance
        self.stale_after_s = stale_after_s
        self._endpoints: dict[str, _Endpoint] = {}
        self._self: set[str] = set()
        self.version = 0  # bumps whenever what `live` returns may have changed

    def listed(self, endpoints: Iterable[str]) -> None:
        """The latest DNS answer: every replica's address, this one's included."""
        wanted = set(endpoints)
        for gone in set(self._endpoints) - wanted:
            del self._endpoints[gone]
            self.version += 1
        for new in wanted - set(self._endpoints):
            self._endpoints[new] = _Endpoint()
        self._self &= wanted

    def read(self, endpoint: str, estimates: EstimatesWire, now: float) -> None:
        """A peer's answer to `GET /pool/estimates` (our own, when it is this replica)."""
        entry = self._endpoints.get(endpoint)
        if entry is None:
            return
        if estimates.instance == self.instance:
            self._self.add(endpoint)
        entry.estimates, entry.read_at = estimates, now
        entry.iteration = {(i.backend, i.steps): i for i in estimates.iteration}
        self.version += 1

    def _fresh(self, entry: _Endpoint, now: float) -> bool:
        return entry.read_at is not None and now - entry.read_at <= self.stale_after_s

    def live(self, now: float) -> list[EstimatesWire]:
        """The other replicas' latest estimates, only those listed and read lately."""
        return [
            e.estimates
            for address, e in sorted(self._endpoints.items())
            if address not in self._self and e.estimates is not None and self._fresh(e, now)
        ]

    def iteration(self, backend: str, steps: int, now: float) -> list[IterationWire | None]:
        return [
            e.iteration.get((backend, steps))
            for address, e in self._endpoints.items()
            if address not in self._self and self._fresh(e, now)
        ]

    def share(self, now: float) -> Share:
        """How many replicas DNS lists (this one included) and this one's rank among their
        instance ids, known once every listed replica has answered lately."""
        # Until this replica has read itself among them, it counts itself on top (fewer slots).
        count = len(self._endpoints) + (0 if self._self else 1)
        if count == 1:
            return Share(1, 0)
        ids = {
            e.estimates.instance
            for e in self._endpoints.values()
            if e.estimates is not None and self._fresh(e, now)
        }
        ids.add(self.instance)
        if len(ids) != count:
            return Share(count, None)
        return Share(count, sorted(ids).index(self.instance))

    def ages(self, now: float) -> Mapping[str, float | None]:
        """Seconds since each listed endpoint last answered (None: never)."""
        return {
            a: None if e.read_at is None else now - e.read_at
            for a, e in sorted(self._endpoints.items())
        }
