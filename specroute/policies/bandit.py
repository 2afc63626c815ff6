"""`bandit`: learns online which depth pays, per workload class and load, with no profile and
no model: discounted UCB or Thompson sampling; one arm per depth and backend-load bucket, so
piling a class onto one depth shows up as that depth's reward falling at higher load.

The reward is the request's own tokens over its whole time in the pool (queue wait
included): with closed-loop clients that is what the pool's throughput is made of. Discounting
forgets old rewards, so the choice follows load and acceptance that change.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import defaultdict, deque
from typing import Literal

import msgspec

from specroute.policies.groups import batch, candidates_of
from specroute.policies.predict import with_room
from specroute.policies.types import BackendView, Decision, Outcome, PoolView, RouteRequest

__all__ = ["Bandit", "BanditOptions"]


class BanditOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """method: `ucb` (discounted UCB) or `thompson`; discount: weight an arm keeps per new
    reward; exploration: UCB's bonus scale; buckets: edges of a backend's own load (in flight
    per slot of capacity) that split each depth's arm; seed: random source."""

    method: Literal["ucb", "thompson"] = "thompson"
    discount: float = 0.97
    exploration: float = 0.2
    buckets: str = "0.15 0.3 0.45 0.6 0.75 0.9 1.0 1.25"
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.discount <= 1.0:
            raise ValueError("discount must be in (0, 1]")
        if self.exploration < 0:
            raise ValueError("exploration must be >= 0")
        [float(x) for x in self.buckets.split()]


class _Arm:
    __slots__ = ("n", "sq", "total")

    def __init__(self) -> None:
        self.n = 0.0
        self.total = 0.0
        self.sq = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0


class Bandit:
    """Learns online which depth pays per class and load (discounted UCB or Thompson
    sampling over depth x the backend's own load bucket); needs no profile."""

    name = "bandit"
    Options = BanditOptions

    def __init__(self, options: BanditOptions | None = None) -> None:
        self.options = options or BanditOptions()
        self.edges = sorted(float(x) for x in self.options.buckets.split())
        self._rng = random.Random(self.options.seed)
        self._arms: defaultdict[tuple[str, int], dict[int, _Arm]] = defaultdict(dict)
        self._pending: defaultdict[tuple[str, str], deque[int]] = defaultdict(deque)

    def bucket(self, backend: BackendView) -> int:
        """The load bucket this backend would be in with one more request."""
        if not backend.capacity:
            return 0
        return bisect.bisect_left(self.edges, (batch(backend) + 1) / backend.capacity)

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        klass = request.workload_class
        scored = []
        # One arm per depth and load: a configuration's least loaded member stands for it.
        for b in with_room(candidates_of(view).bests()):
            bucket = self.bucket(b)
            score, note = self._score(self._arms[(klass, b.steps or 0)], bucket)
            scored.append((score, b, bucket, note))
        best = max(s for s, _, _, _ in scored)
        _, chosen, bucket, _ = self._rng.choice([x for x in scored if x[0] >= best])
        self._pending[(chosen.name, klass)].append(bucket)
        numbers = "; ".join(f"{b.name}(k={b.steps}) {note}" for _, b, _, note in scored)
        return Decision(backend=chosen.name, reason=f"bandit {klass} -> {chosen.name}: {numbers}")

    def _score(self, arms: dict[int, _Arm], bucket: int) -> tuple[float, str]:
        """UCB (or a Thompson draw) of the arm for this depth at this load; an unseen bucket
        borrows the nearest seen bucket's mean with little weight; nothing seen: explore."""
        arm = arms.get(bucket)
        if arm is None or arm.n < 0.5:
            seen = [k for k, a in arms.items() if a.n >= 0.5]
            if not seen:
                return math.inf, "unexplored"
            near = arms[min(seen, key=lambda k: (abs(k - bucket), k))]
            mean, n = near.mean, 0.5
        else:
            mean, n = arm.mean, arm.n
        if self.options.method == "thompson":
            var = max(arm.sq / arm.n - mean**2, (0.1 * mean) ** 2) if arm and arm.n else mean**2
            return self._rng.gauss(
                mean, math.sqrt(var / max(n, 0.5))
            ), f"{mean:.0f} tok/s n={n:.0f}"
        total = sum(a.n for a in arms.values()) + 1.0
        bonus = self.options.exploration * mean * math.sqrt(2 * math.log(total) / n)
        return mean + bonus, f"{mean:.0f}+{bonus:.0f} tok/s n={n:.0f}"

    def observe(self, outcome: Outcome) -> None:
        pending = self._pending.get((outcome.backend, outcome.workload_class))
        if not pending:
            return
        bucket = pending.popleft()
        tokens = outcome.completion_tokens or 0
        if outcome.error is not None or outcome.status != 200 or outcome.duration_s <= 0:
            return
        reward = tokens / outcome.duration_s
        arm = self._arms[(outcome.workload_class, outcome.steps or 0)].setdefault(bucket, _Arm())
        keep = self.options.discount
        arm.n, arm.total, arm.sq = arm.n * keep + 1, arm.total * keep + reward, arm.sq * keep
        arm.sq += reward * reward
