"""What the launcher's planner reads from the proxy's `GET /pool`: the load per workload class
and the estimates (T(b, k) fits, capacity per depth, acceptance per class). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from specroute.planner import DepthEstimate, Estimates
from specroute.policies import ClassEstimate

__all__ = ["Traffic", "estimates", "fits_by_depth"]


class Traffic:
    """Requests in flight per class, every replica's (each backend's combined load). The proxy
    counts in flight per backend, not per class, so the total is split by the classes' recent
    completions weighted by their mean length: by Little's law, what is in flight of a class
    is its rate times its duration."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self.shares: dict[str, float] = {}

    def sample(self, pool: Mapping[str, Any]) -> tuple[dict[str, float], float]:
        """(in flight per class, queued) from one /pool answer."""
        backends = pool.get("backends") or []
        total = float(sum(_load(b) for b in backends))
        classes = (pool.get("estimates") or {}).get("classes") or {}
        weights = {}
        for name, est in classes.items():
            done = int(est.get("samples") or 0)
            fresh = done - self._seen.get(name, 0)
            self._seen[name] = done
            if fresh > 0:
                weights[name] = fresh * float(est.get("mean_tokens") or 1.0)
        weight = sum(weights.values())
        if weight > 0:
            self.shares = {c: w / weight for c, w in weights.items()}
        queued = float(pool.get("waiting") or 0)
        if not self.shares:
            return ({"unknown": total} if total else {}), queued
        return {c: total * s for c, s in self.shares.items()}, queued


def _load(backend: Mapping[str, Any]) -> int:
    """A backend's requests from every proxy replica (its last scrape plus this replica's
    changes since), or this replica's own while no fresh scrape says more."""
    combined = backend.get("combined")
    return int(combined if combined is not None else backend.get("in_flight") or 0)


def fits_by_depth(backends: Sequence[Mapping[str, Any]]) -> dict[int, tuple[float, float, int]]:
    """(intercept_s, per_token_s, samples) per depth: the fitted iteration times of the
    backends at that depth, weighted by their samples (a prior counts as one)."""
    sums: dict[int, list[float]] = {}
    for b in backends:
        steps, a, s = b.get("steps"), b.get("iteration_intercept_s"), b.get("iteration_per_token_s")
        if steps is None or a is None or s is None or b.get("adaptive"):
            continue
        n = max(1, int(b.get("iteration_samples") or 0))
        acc = sums.setdefault(int(steps), [0.0, 0.0, 0.0])
        acc[0] += a * n
        acc[1] += s * n
        acc[2] += n
    return {k: (a / n, s / n, int(n)) for k, (a, s, n) in sums.items()}


def _capacities(backends: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for b in backends:
        steps, capacity = b.get("steps"), b.get("capacity")
        if steps is not None and capacity and not b.get("adaptive"):
            out[int(steps)] = max(out.get(int(steps), 0), int(capacity))
    return out


def estimates(
    pool: Mapping[str, Any], allowed: Sequence[int], limit: Callable[[int], int]
) -> Estimates | None:
    """The planner's estimates for every allowed depth, or None before any fit exists.

    A depth no backend runs borrows the nearest fitted depth's T(b) (the model already
    scales with k + 1), and its capacity is its `--max-running-requests` (`limit`), never
    more than a shallower depth was seen to hold: drafts only take memory away."""
    backends = pool.get("backends") or []
    fits = fits_by_depth(backends)
    if not fits:
        return None
    seen = _capacities(backends)
    depths = {}
    for k in allowed:
        a, s, _ = fits[min(fits, key=lambda d: (abs(d - k), -d))]
        capacity = min([limit(k), *(c for d, c in seen.items() if d <= k)])
        if k in seen:
            capacity = seen[k]
        depths[k] = DepthEstimate(steps=k, capacity=capacity, intercept_s=a, per_token_s=s)
    raw = (pool.get("estimates") or {}).get("classes") or {}
    classes = msgspec.convert(raw, dict[str, ClassEstimate], strict=False)
    prior = (pool.get("estimates") or {}).get("prior_alpha")
    if prior is None:
        return Estimates(depths=depths, classes=classes)
    return Estimates(depths=depths, classes=classes, prior_alpha=float(prior))
