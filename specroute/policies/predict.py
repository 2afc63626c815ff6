"""What a request would get on each backend, from the pool's estimates: its own speed, the
change in the backend's (so the pool's) throughput, and its queue wait past capacity.

Pure arithmetic on a `PoolView` with the one performance model (`specroute.speculation`): T(b, k)
per backend from its fitted iteration time, E_k per class from its fitted acceptance curve, the
same values the planner uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from specroute import speculation
from specroute.policies.groups import batch
from specroute.policies.types import BackendView, PoolView
from specroute.speculation import DEFAULT_INTERCEPT_S, DEFAULT_OUTPUT_TOKENS, DEFAULT_PER_TOKEN_S

__all__ = [
    "Prediction",
    "accept_length",
    "has_room",
    "iteration_time",
    "loads",
    "mean_tokens",
    "predict",
    "with_room",
]

_UNBOUNDED = 1 << 20  # capacity of a backend that did not say


def _work(backend: BackendView) -> int:
    """Requests on the backend: the pool's combined count where it has one (its scrape of the
    backend plus this proxy's changes since), else this proxy's own plus the backend's queue
    from /metrics (what other clients put there)."""
    work = batch(backend)
    return work if backend.combined is not None else work + max(0, backend.queued or 0)


def loads(backends: Sequence[BackendView]) -> list[float]:
    """Each backend's requests (`_work`) per unit of capacity, on one scale: a backend that did
    not say its capacity counts as having the mean of the capacities the others said (each
    value once, so a configuration's least loaded member, which speaks for it, gets the same
    figure as a scan of every member).
    Comparing one server's requests per slot with another's raw count sent every request to
    the server whose limit was known (a vLLM server that had shown its limit beside twins that
    had not yet: three k2 servers lost 22% in the hot hour, 2026-12-02). Where none said, the
    raw counts."""
    known = {b.capacity for b in backends if b.capacity}
    stand_in = sum(known) / len(known) if known else None
    scaled = ((_work(b), b.capacity or stand_in) for b in backends)
    return [work / cap if cap else float(work) for work, cap in scaled]


def has_room(backend: BackendView) -> bool:
    """Below its capacity, counting the other replicas' share of its room where the pool says.
    A backend that did not say its capacity has room unless its engine queues requests
    (`_occupancy`)."""
    if backend.headroom is not None:
        return backend.headroom > 0
    requests, capacity = _occupancy(backend)
    return requests < capacity


def _occupancy(backend: BackendView) -> tuple[int, int]:
    """(requests on it, the requests it runs at once). A backend that did not say its capacity
    (a vLLM server: `--max-num-seqs` is not reported, and the pool learns it only once seen
    full in two scrapes) is full while its own gauges show requests waiting: its capacity is
    then what it runs, and the requests on it what it runs and queues. Taken as never full, it
    took every request its speed won while its queue grew."""
    n = batch(backend)
    if backend.capacity is not None:
        return n, backend.capacity
    running, queued = backend.running or 0, backend.queued or 0
    if queued > 0 and running > 0:
        return max(n, running + queued), running
    return n, _UNBOUNDED


def with_room(backends: Sequence[BackendView]) -> Sequence[BackendView]:
    """The backends below their capacity, or all of them when every one is full."""
    return tuple(b for b in backends if has_room(b)) or backends


def accept_length(view: PoolView, klass: str, steps: int) -> float:
    """Tokens per verify for `klass` at depth `steps`: the class's acceptance curve fitted to
    the depths it was measured at, else the pool's prior rate."""
    est = view.classes.get(klass)
    if est is None:
        return speculation.accept_length({}, view.prior_alpha, steps)
    return speculation.accept_length(est.accept_length, est.alpha, steps)


def mean_tokens(view: PoolView, klass: str, default: float = DEFAULT_OUTPUT_TOKENS) -> float:
    """The class's mean completion length, else `default`."""
    est = view.classes.get(klass)
    return est.mean_tokens if est is not None and est.mean_tokens else default


def iteration_time(backend: BackendView, batch: float) -> float:
    """Seconds per iteration with `batch` running requests."""
    a = backend.iteration_intercept_s
    s = backend.iteration_per_token_s
    a = DEFAULT_INTERCEPT_S if a is None else a
    s = DEFAULT_PER_TOKEN_S if s is None else s
    return speculation.iteration_time(a, s, batch, backend.steps or 0)


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    """One backend's prospects for one request; speeds in tokens per second."""

    backend: str
    steps: int
    speed: float
    """This request's decode speed once running."""
    effective_speed: float
    """Its tokens over queue wait plus decode time."""
    gain: float
    """Change in the backend's throughput (the pool's: other backends are unaffected)."""
    slowest_after: float
    """Speed of the slowest request running there once this one joins."""
    wait_s: float
    full: bool


def _running_accept(
    view: PoolView, steps: int, mix: Mapping[str, float], fallback: str, e_fallback: float
) -> tuple[float, float]:
    """(mean, lowest) accept length of the requests already running on a backend at depth
    `steps`; `e_fallback` is `fallback`'s there (the request's own class, already valued)."""
    total = sum(mix.values())
    if total <= 0:
        return e_fallback, e_fallback
    lengths = {
        k: e_fallback if k == fallback else accept_length(view, k, steps)
        for k, n in mix.items()
        if n > 0
    }
    mean = sum(lengths[k] * mix[k] for k in lengths) / total
    return mean, min(lengths.values())


def predict(
    request_class: str,
    backend: BackendView,
    view: PoolView,
    mix: Mapping[str, float] | None = None,
    queue_weight: float = 0.0,
) -> Prediction:
    """Prospects of a `request_class` request on `backend`; `mix` counts the classes in
    flight there (as the policy routed them), else they are taken to be like this one."""
    steps = backend.steps or 0
    n, capacity = _occupancy(backend)
    e_new = accept_length(view, request_class, steps)
    e_run, e_low = _running_accept(view, steps, mix or {}, request_class, e_new)
    before = min(n, capacity)
    t_before = iteration_time(backend, before)
    thr_before = before * e_run / t_before if before else 0.0
    if has_room(backend):
        t_after = iteration_time(backend, before + 1)
        speed = e_new / t_after
        gain = (before * e_run + e_new) / t_after - thr_before
        slowest = min(speed, e_low / t_after) if before else speed
        return Prediction(
            backend=backend.name,
            steps=steps,
            speed=speed,
            effective_speed=speed,
            gain=gain,
            slowest_after=slowest,
            wait_s=0.0,
            full=False,
        )
    # Full: it waits for (queue ahead + 1) slots to free, each running request finishing in
    # about mean_tokens / its speed; meanwhile it adds nothing, then it shifts the class mix.
    speed = e_new / t_before
    service = mean_tokens(view, request_class) / max(speed, 1e-9)
    running_service = mean_tokens(view, request_class) * t_before / max(e_run, 1e-9)
    wait = (max(n, capacity) - capacity + 1) * running_service / capacity
    effective = mean_tokens(view, request_class) / (wait + service)
    # Past capacity it adds nothing now; `queue_weight` values its later speed (0: only the
    # shortest wait decides among full backends).
    gain = queue_weight * speed * service / (wait + service) - 1e-3 * wait
    return Prediction(
        backend=backend.name,
        steps=steps,
        speed=speed,
        effective_speed=effective,
        gain=gain,
        slowest_after=min(speed, e_low / t_before),
        wait_s=wait,
        full=True,
    )
