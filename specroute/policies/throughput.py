"""`throughput`: predict each backend's speed for this request and the change in the pool's
throughput if it goes there, from the pool's estimates, and pick by an objective."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Literal

import msgspec

from specroute.lanes import INTERACTIVE
from specroute.policies.groups import batch, candidates_of
from specroute.policies.lanes import displaced, interactive_choice, open_to_batch
from specroute.policies.predict import Prediction, predict
from specroute.policies.types import Decision, Outcome, PoolView, RouteRequest

__all__ = ["Throughput", "ThroughputOptions"]

_TIE = 1e-9


class ThroughputOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """objective: `latency` (fastest for this request, queue wait included), `throughput`
    (largest gain in pool tok/s) or `goodput` (largest gain while every request running on the
    backend keeps `floor_tok_s`); `seed` seeds the random tie-break."""

    objective: Literal["latency", "throughput", "goodput"] = "throughput"
    """What a choice maximises (above)."""
    floor_tok_s: float = 0.0
    """`goodput`'s floor: the tok/s each request on a backend must keep (0: none)."""
    queue_weight: float = 0.0
    """When every backend is full: the weight of a request's speed there, discounted by its wait
    in the queue, against the wait alone (0: the shortest wait decides)."""
    seed: int | None = None
    """Seeds the random tie-break (unset: a fresh one each start)."""

    def __post_init__(self) -> None:
        if self.floor_tok_s < 0:
            raise ValueError("floor_tok_s must be >= 0")


def _score(p: Prediction, objective: str) -> float:
    return p.effective_speed if objective == "latency" else p.gain


class Throughput:
    """Predicts this request's speed and the pool's throughput gain on every backend with room
    (queue wait included past capacity); chooses by latency, throughput or goodput. An
    interactive request goes where it is fastest (`policies.lanes`); a batch one by the
    objective, off the deepest backends' reserve while an interactive request waits."""

    name = "throughput"
    Options = ThroughputOptions

    def __init__(self, options: ThroughputOptions | None = None) -> None:
        self.options = options or ThroughputOptions()
        self._rng = random.Random(self.options.seed)
        # Classes this policy has in flight per backend: the running mix it predicts with.
        self._mix: defaultdict[str, defaultdict[str, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        # Interactive requests in flight per backend, and of those the ones sent shallower
        # because the deepest backends were full: they wait for the reserve.
        self._interactive: defaultdict[str, int] = defaultdict(int)
        self._shallower: defaultdict[str, int] = defaultdict(int)

    def predictions(self, request: RouteRequest, view: PoolView) -> list[Prediction]:
        """One prediction per configuration, on its least loaded member: within a group the
        least loaded has the largest gain, the fastest speed and the shortest wait."""
        klass, weight = request.workload_class, self.options.queue_weight
        return [
            predict(klass, b, view, self._scaled_mix(b.name, batch(b)), weight)
            for b in candidates_of(view).bests()
        ]

    def _scaled_mix(self, backend: str, in_flight: int) -> dict[str, float]:
        """The routed class mix, scaled to the backend's real in-flight count."""
        mix = self._mix.get(backend)
        total = sum(mix.values()) if mix else 0.0
        if not mix or total <= 0:
            return {}
        return {k: v * in_flight / total for k, v in mix.items() if v > 0}

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        preds = self.predictions(request, view)
        if request.lane == INTERACTIVE:
            chosen = interactive_choice(preds, request.target_tok_s)
            self._mix[chosen.backend][request.workload_class] += 1
            self._interactive[chosen.backend] += 1
            self._shallower[chosen.backend] += displaced(chosen, preds, view)
            reason = _reason(f"interactive >= {request.target_tok_s:.0f} tok/s", chosen, preds)
            return Decision(backend=chosen.backend, reason=reason)
        open_preds, held = open_to_batch(preds, view, self._interactive, self._shallower)
        decision = self._by_objective(request, open_preds)
        if held:
            reason = decision.reason + f"; reserve of {view.reserve} kept on the deepest"
            decision = Decision(backend=decision.backend, reason=reason)
        return decision

    def _by_objective(self, request: RouteRequest, preds: list[Prediction]) -> Decision:
        options = self.options
        objective = options.objective
        # A backend past capacity only when every one is: the queue wait decides among them.
        pool = [p for p in preds if not p.full] or preds
        if objective == "goodput":
            floor = options.floor_tok_s
            kept = [p for p in pool if p.slowest_after >= floor]
            pool, objective = (kept, objective) if kept else (pool, "latency")
        scores = [_score(p, objective) for p in pool]
        best = max(scores)
        tied = [p for p, s in zip(pool, scores, strict=True) if s >= best - _TIE * abs(best)]
        chosen = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        self._mix[chosen.backend][request.workload_class] += 1
        return Decision(backend=chosen.backend, reason=_reason(options.objective, chosen, preds))

    def observe(self, outcome: Outcome) -> None:
        mix = self._mix.get(outcome.backend)
        if mix is not None and mix.get(outcome.workload_class, 0) > 0:
            mix[outcome.workload_class] -= 1
        backend = outcome.backend
        if outcome.lane == INTERACTIVE and self._interactive.get(backend, 0) > 0:
            self._interactive[backend] -= 1
            shallower = self._shallower.get(backend, 0)
            self._shallower[backend] = min(shallower, self._interactive[backend])


def _reason(objective: str, chosen: Prediction, preds: list[Prediction]) -> str:
    """The numbers compared, with units: per backend, this request's predicted speed `v` and the
    change in pool throughput `gain` (tok/s), and the queue wait past capacity."""
    parts = [
        f"{p.backend}(k={p.steps}) v={p.effective_speed:.0f} tok/s gain={p.gain:+.0f} tok/s"
        + (f" wait={p.wait_s:.2f} s" if p.full else "")
        for p in preds
    ]
    return f"{objective} -> {chosen.backend}: " + "; ".join(parts)
