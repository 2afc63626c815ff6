"""Routing by latency lane: where an interactive request meets its speed target with the most
margin, and which slots a batch request may not take (the reserve on the deepest backends while
an interactive request waits). Pure functions on predictions and the pool view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specroute.policies.groups import batch
from specroute.policies.predict import Prediction
from specroute.policies.types import BackendView, PoolView

__all__ = [
    "deepest",
    "displaced",
    "in_reserve",
    "interactive_choice",
    "interactive_waiting",
    "open_to_batch",
]


def deepest(view: PoolView) -> int | None:
    """The largest depth among the backends this request may go to (None: none reports one)."""
    depths = [b.steps for b in view.backends if b.steps is not None]
    return max(depths) if depths else None


def _room(backend: BackendView) -> int | None:
    """Slots this proxy may still fill before the backend is full (None: unbounded)."""
    if backend.headroom is not None:
        return backend.headroom
    return None if backend.capacity is None else backend.capacity - batch(backend)


def in_reserve(backend: BackendView, view: PoolView, depth: int | None) -> bool:
    """Whether the next slot of `backend` is one of the `view.reserve` kept on each backend
    at the pool's deepest `depth` for the interactive lane, or past them: its queue, which
    the interactive lane also comes first in."""
    if view.reserve <= 0 or depth is None or backend.steps != depth:
        return False
    room = _room(backend)
    return room is not None and room <= view.reserve


def interactive_waiting(
    view: PoolView, interactive: Mapping[str, int], shallower: Mapping[str, int]
) -> int:
    """Interactive requests waiting for a deep slot: those in the proxy's queue, those running
    shallower than they would have because the deepest backends were full (`shallower`), and
    on each backend past its capacity as many as it has interactive requests in flight, at
    most its queue (an upper bound: without the engine's priority its queue may hold batch
    requests instead)."""
    waiting = view.interactive_waiting + sum(shallower.values())
    for backend in view.backends:
        mine = interactive.get(backend.name, 0)
        if mine and backend.capacity is not None:
            waiting += max(0, min(mine, batch(backend) - backend.capacity))
    return waiting


def open_to_batch(
    preds: Sequence[Prediction],
    view: PoolView,
    interactive: Mapping[str, int],
    shallower: Mapping[str, int],
) -> tuple[list[Prediction], bool]:
    """The predictions a batch request may choose among, and whether the reserve held it back:
    every one, unless an interactive request waits; then not the reserved slots of the
    deepest backends, as long as another backend has room or a queue to join."""
    if view.reserve <= 0:  # no reserve (the default): no slot is anyone's, nothing to look at
        return list(preds), False
    depth = deepest(view)
    reserved = {
        b.name
        for b in view.backends
        if in_reserve(b, view, depth) and b.name in {p.backend for p in preds}
    }
    if not reserved or not interactive_waiting(view, interactive, shallower):
        return list(preds), False
    kept = [p for p in preds if p.backend not in reserved]
    return (kept, True) if kept else (list(preds), False)


def displaced(chosen: Prediction, preds: Sequence[Prediction], view: PoolView) -> bool:
    """Whether an interactive request sent to `chosen` waits for a deep slot: the deepest
    backends had no room for it and it went shallower."""
    depth = deepest(view)
    deep = [p for p in preds if p.steps == depth]
    return chosen.steps != depth and (not deep or all(p.full for p in deep))


def interactive_choice(preds: Sequence[Prediction], target: float) -> Prediction:
    """The backend where this request's predicted speed (queue wait included) beats `target`
    by the most; backends with room first, as every objective does. Without a target, or when
    none meets it, the fastest."""
    pool = [p for p in preds if not p.full] or list(preds)
    return max(pool, key=lambda p: p.effective_speed - target)
