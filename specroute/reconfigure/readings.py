"""What the launcher's planner reads from the proxy's `GET /pool`: the load per workload class,
the interactive lane's share of it, and the estimates (T(b, k) fits, capacity per depth,
acceptance per class). Pure."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

from specroute.lanes import INTERACTIVE
from specroute.planner import DepthEstimate, Estimates, LaneDemand
from specroute.policies import ClassEstimate
from specroute.speculation import measured_time
from specroute.wire import BackendSnapshot, ClassSnapshot, PoolSnapshot

__all__ = ["LANE_WINDOW", "LaneTraffic", "Traffic", "estimates", "fits_by_depth"]

LANE_WINDOW = 30
"""Samples the interactive lane's share is averaged over (a minute at the loop's 2 s tick)."""

MIX_REPLIES = 10
"""Replies the class mix is read over at least (`Traffic`): the answers since then count."""


class Traffic:
    """Requests in flight per class, every replica's (each backend's combined load), split
    by the classes' recent replies weighted by their mean length: each class's rate times its
    length, where Little's law wants its rate times its duration. A class that a pool's depths
    speed up more (greedy) holds fewer of the requests in flight than its share of the tokens:
    on costly-drafts' temperature swing the mostly sampled regime reads 32% of its requests in
    flight as greedy where 22% are (`benchmarks/inflight_split.py`). The proxy counts its
    requests in flight per lane and class (`/pool`'s `lanes`); splitting by that count
    instead was tried and not kept: the forecasts came nearer, and twelve of the evaluation's
    27 rows lost 0.2% to 13.5%, none gained (`docs/policy-evaluation.md`, "The mix in flight,
    counted").

    After the first answer every reply counts (`completions`). Servers on vLLM tables,
    SGLang-adaptive or at depth 0 teach no accept length per depth, but their replies are the
    traffic: split by the replies that taught acceptance (`samples`), as it was from item 21
    on, a server moved onto a table took the greedy requests it sped out of the count, the mix
    read sampled-heavy the moment it came up, a regime began, and the next plan moved it again
    (five restarts in one quiet hour, `vllm_bound.py`, costly-drafts' depth-swing). The first
    answer is split by `samples` where it has any: the prior's samples count there, as the
    virtual-time evaluation was measured (`docs/policy-evaluation.md`, "Rerun after the
    class-mix fix"). Where the prior's mix is not the traffic's, the next answers' mix ends
    the first regime a minute or two after launch, and with it the charge for load not seen
    yet (the planner's cold-start caution) lapses ("The mix in flight, counted").

    Each answer's replies are read with the answers before it back to the `MIX_REPLIES`th
    reply: read alone, an answer with one reply in it split the load all to that reply's
    class, and where a reply or none comes per answer (a few users, long replies) the mix
    the regime summed was the requests' share, not their tokens' (depth-quiet-3 read 89%
    greedy where 98% of the tokens and 96% of the requests in flight were). An answer with
    that many replies or more is read alone, as before."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, int]] = {"samples": {}, "completions": {}}
        self._recent: collections.deque[tuple[int, dict[str, float]]] = collections.deque()
        self.shares: dict[str, float] = {}
        self.tokens = 0.0
        """Tokens completed since the first answer (every reply, times its class's mean
        length): the realized rate that changes are held to. Counting only replies that
        taught acceptance measured a change onto a table at 5 tok/s on a pool running 290."""

    def _fresh(
        self, pool: PoolSnapshot, counter: Literal["samples", "completions"]
    ) -> tuple[int, dict[str, float]]:
        """(replies, tokens per class in them) that `counter` counted since the last answer."""
        seen = self._seen[counter]
        weights = {}
        replies = 0
        for name, est in pool.estimates.classes.items():
            count = getattr(est, counter)
            fresh = count - seen.get(name, 0)
            seen[name] = count
            if fresh > 0:
                weights[name] = fresh * (est.mean_tokens or 1.0)
                replies += fresh
        return replies, weights

    def _window(self, replies: int, weights: dict[str, float]) -> dict[str, float]:
        """Tokens per class over this answer and those before it back to the
        `MIX_REPLIES`th reply."""
        self._recent.append((replies, weights))
        while (
            len(self._recent) > 1
            and sum(n for n, _ in self._recent) - self._recent[0][0] >= MIX_REPLIES
        ):
            self._recent.popleft()
        out: dict[str, float] = {}
        for _, part in self._recent:
            for c, w in part.items():
                out[c] = out.get(c, 0.0) + w
        return out

    def sample(self, pool: PoolSnapshot) -> tuple[dict[str, float], float]:
        """(in flight per class, queued) from one /pool answer."""
        total = float(sum(b.load for b in pool.backends))
        first = not any(self._seen.values())
        _, taught = self._fresh(pool, "samples")
        count, replies = self._fresh(pool, "completions")
        if first:
            weights = taught or replies
        else:
            self.tokens += sum(replies.values())
            weights = self._window(count, replies) if replies else {}
        weight = sum(weights.values())
        if weight > 0:
            self.shares = {c: w / weight for c, w in weights.items()}
        queued = float(pool.waiting)
        if not self.shares:
            return ({"unknown": total} if total else {}), queued
        return {c: total * s for c, s in self.shares.items()}, queued


class LaneTraffic:
    """The interactive lane's share of the requests in flight and its class mix, summed over
    the last `window` /pool answers, with its target: what the planner serves first."""

    def __init__(self, window: int = LANE_WINDOW) -> None:
        self._samples: collections.deque[tuple[int, int, dict[str, int]]] = collections.deque(
            maxlen=window
        )

    def sample(self, pool: PoolSnapshot) -> LaneDemand | None:
        """The lane's demand after one /pool answer (None: no lanes, no target, or no load
        seen yet)."""
        lane = pool.lanes.get(INTERACTIVE)
        if lane is None or lane.target_tok_s <= 0:
            return None
        total = sum(snap.in_flight for snap in pool.lanes.values())
        self._samples.append((lane.in_flight, total, dict(lane.classes)))
        seen = sum(t for _, t, _ in self._samples)
        if seen <= 0:
            return None
        classes: dict[str, float] = {}
        for _, _, mix in self._samples:
            for name, n in mix.items():
                classes[name] = classes.get(name, 0.0) + n
        share = sum(i for i, _, _ in self._samples) / seen
        return LaneDemand(share=share, target_tok_s=lane.target_tok_s, classes=classes)


class DepthFit(NamedTuple):
    """The fitted iteration time of a depth's backends, weighted by their samples."""

    intercept_s: float
    per_token_s: float
    tokens: float | None
    """Where their observations lie (mean tokens per iteration; None before any)."""


def fits_by_depth(backends: Sequence[BackendSnapshot]) -> dict[int, DepthFit]:
    """Per depth, the decode's iteration times on the backends at that depth, weighted by
    their samples (a prior counts as one): each backend's fit (the router's, which holds the
    other requests' prefills at the load and depth it saw) scaled so that where it was
    observed it reads the decode alone (`iteration_stall_s` taken out). The planner charges
    each candidate the pauses of its own load (`planner.forecast`); a fit that kept them
    valued the depth a server runs with the agents' prefills in it and a depth it does not
    run from tune's short prompts, and moved to the latter (`docs/policy-evaluation.md`,
    item 31)."""
    sums: dict[int, list[float]] = {}
    for b in backends:
        steps, a, s = b.steps, b.iteration_intercept_s, b.iteration_per_token_s
        if steps is None or a is None or s is None or b.adaptive:
            continue
        if b.iteration_tokens is not None and b.iteration_stall_s > 0:
            seen = a + s * b.iteration_tokens
            # at least a quarter: a fit still near its prior may read under its own pauses
            scale = max(0.25, (seen - b.iteration_stall_s) / seen) if seen > 0 else 1.0
            a, s = a * scale, s * scale
        n = max(1, b.iteration_samples)
        acc = sums.setdefault(steps, [0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += a * n
        acc[1] += s * n
        acc[2] += n
        if b.iteration_tokens is not None and b.iteration_samples > 0:
            acc[3] += b.iteration_tokens * b.iteration_samples
            acc[4] += b.iteration_samples
    return {
        k: DepthFit(a / n, s / n, x / w if w > 0 else None) for k, (a, s, n, x, w) in sums.items()
    }


def _capacities(backends: Sequence[BackendSnapshot]) -> dict[int, int]:
    out: dict[int, int] = {}
    for b in backends:
        if b.steps is not None and b.capacity and not b.adaptive:
            out[b.steps] = max(out.get(b.steps, 0), b.capacity)
    return out


def estimates(
    pool: PoolSnapshot, allowed: Sequence[int], limit: Callable[[int], int]
) -> Estimates | None:
    """The planner's estimates for every allowed depth, or None before any fit exists (a pool
    of adaptive servers only, whose fits belong to no one depth, plans from the prior's).

    A depth a backend runs takes the live fit of its backends, read along tune's points for
    that depth where the prior has them, scaled through the fit where it was observed
    (`_through`). A depth no backend runs takes the prior's fit for it (what tune measured at
    that depth: its drafts' own cost; read between its measured points where it has them),
    else borrows the nearest fitted depth's T(b) (the model scales with k + 1, not with the
    drafts); its capacity is its `--max-running-requests` (`limit`), never more than the
    prior's tune measured at that depth nor than a shallower depth was seen to hold: drafts
    only take memory away."""
    backends = pool.backends
    fits = fits_by_depth(backends)
    priors = pool.estimates.depths
    if not fits and not (priors and any(b.adaptive for b in backends)):
        return None
    seen = _capacities(backends)
    tuned = pool.estimates.capacity
    depths = {}
    for k in allowed:
        measured: tuple[tuple[float, float], ...] = ()
        points = tuple(sorted(priors[k].measured)) if k in priors else ()
        if k not in fits and k in priors:
            a, s = priors[k].intercept_s, priors[k].per_token_s
            measured = points
        elif not fits:  # nothing to borrow from
            continue
        else:
            fit = fits[min(fits, key=lambda d: (abs(d - k), -d))]
            a, s = fit.intercept_s, fit.per_token_s
            if k in fits and points:
                measured = _through(points, fit)
        limits = [tuned[k]] if k in tuned else []
        capacity = min([limit(k), *limits, *(c for d, c in seen.items() if d <= k)])
        if k in seen:
            capacity = seen[k]
        depths[k] = DepthEstimate(
            steps=k, capacity=capacity, intercept_s=a, per_token_s=s, measured=measured
        )
    classes = {name: _class(c) for name, c in pool.estimates.classes.items()}
    return Estimates(depths=depths, classes=classes, prior_alpha=pool.estimates.prior_alpha)


def _through(
    points: tuple[tuple[float, float], ...], fit: DepthFit
) -> tuple[tuple[float, float], ...]:
    """Tune's measured points for a depth the pool runs, scaled to pass through its live fit
    where the fit's observations lie: the live line is right there and the points keep the
    bend a line misses elsewhere (a quiet pool's fit valued at the busy hour)."""
    if fit.tokens is None:
        return points
    at = measured_time(points, fit.tokens, fit.per_token_s)
    scale = (fit.intercept_s + fit.per_token_s * fit.tokens) / at
    return tuple((t, y * scale) for t, y in points)


def _class(c: ClassSnapshot) -> ClassEstimate:
    return ClassEstimate(alpha=c.alpha, accept_length=dict(c.accept_length), samples=c.samples,
                         mean_tokens=c.mean_tokens, completions=c.completions,
                         first_token_s=c.first_token_s,
                         prefill_pause_s=c.prefill_pause_s)  # fmt: skip
