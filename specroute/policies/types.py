"""What a policy sees and says: the request's features, a read-only pool view, its decision,
and the outcome it learns from. Plain data, no I/O."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from specroute.lanes import BATCH, Lane
from specroute.speculation import PRIOR_ALPHA

__all__ = [
    "BackendView",
    "CandidateSet",
    "ClassEstimate",
    "Decision",
    "Outcome",
    "Policy",
    "PoolView",
    "RouteRequest",
]


class RouteRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The routing features of one request; the body itself never reaches a policy."""

    route: str
    model: str | None
    workload_class: str
    stream: bool
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    lane: Lane = BATCH
    """`interactive`: served for its own speed; `batch`: for the pool's throughput."""
    target_tok_s: float = 0.0
    """The interactive lane's per-request speed target (0: none)."""


class BackendView(msgspec.Struct, frozen=True, kw_only=True):
    """One backend as the pool knows it right now. `steps` is the active depth (it follows an
    adaptive server's switches when its metrics report them); estimates are None until known."""

    name: str
    url: str
    model: str | None
    steps: int | None
    algorithm: str | None
    adaptive: bool
    capacity: int | None
    limit: int | None
    healthy: bool
    in_flight: int
    running: int | None = None
    queued: int | None = None
    accept_length: float | None = None
    gen_throughput: float | None = None
    iteration_intercept_s: float | None = None
    """Fitted iteration time at an empty batch (None: nothing learned and no prior)."""
    iteration_per_token_s: float | None = None
    """Fitted extra iteration time per token in the batch (running requests x (steps + 1))."""
    iteration_samples: int = 0
    iteration_tokens: float | None = None
    """Where the fit's observations lie (their mean tokens per iteration; None before any)."""
    iteration_stall_s: float = 0.0
    """Of the fitted iteration where it was observed, the mean pause beyond the decode (other
    requests' prefills): the planner takes it out and charges each candidate its own."""
    combined: int | None = None
    """Requests on the backend from every proxy and client: its last scrape plus this proxy's
    own changes since (None: no fresh scrape, only `in_flight` is known)."""
    headroom: int | None = None
    """Requests this proxy may still add before the backend is full, leaving the other replicas
    their share of its room (None: capacity less `combined` or `in_flight`)."""


class ClassEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """One workload class's learned acceptance: a per-token rate `alpha` that serves every
    depth, the accept length measured at each depth seen (from `samples` replies), and the
    mean completion length over its `completions` (every reply, whatever its server: one from
    an adaptive server or at depth 0 teaches no acceptance but is traffic all the same)."""

    alpha: float
    accept_length: dict[int, float] = msgspec.field(default_factory=dict)
    samples: int = 0
    mean_tokens: float | None = None
    completions: int = 0
    first_token_s: float | None = None
    """Mean wait for a streamed reply's first token beyond one iteration of its server (its
    prompt's prefill and the wait for the step it joins), over replies that found a free
    slot; None until one is seen."""
    prefill_pause_s: float | None = None
    """How long each other request's start (its prefill) paused a running request of the
    class, per request beside it; None until one is seen."""


class CandidateSet(Protocol):
    """The backends one request may go to, grouped by configuration and ordered by load
    (`policies.groups.Candidates` is the one implementation; the pool keeps one up to date)."""

    def bests(self, turn: int = 0) -> list[BackendView]:
        """Each group's least loaded usable member."""
        ...

    def any(self) -> bool: ...

    def get(self, name: str) -> BackendView | None:
        """The usable member called `name`, if there is one."""
        ...

    def next_from(self, index: int) -> tuple[int, BackendView] | None:
        """The first usable member at or after `index` in pool order, with its index."""
        ...

    def __iter__(self) -> Iterator[BackendView]: ...


class PoolView(msgspec.Struct, frozen=True, kw_only=True):
    """The backends this request may be sent to (healthy, circuit closed, below their limit,
    serving its model), in the pool's configured order; never empty when a policy is asked."""

    backends: Sequence[BackendView]
    classes: dict[str, ClassEstimate] = msgspec.field(default_factory=dict)
    """Acceptance per workload class; a class missing here is unknown (use `prior_alpha`)."""
    prior_alpha: float = PRIOR_ALPHA
    in_flight_total: int | None = None
    """Requests in flight on every healthy backend, not only the candidates (None: unknown)."""
    capacity_total: int | None = None
    candidates: CandidateSet | None = None
    """The same backends grouped by configuration and ordered by load, kept up to date by the
    pool (None: a policy groups `backends` itself, see `candidates_of`)."""
    reserve: int = 0
    """Slots on each deepest backend kept for interactive requests while one waits."""
    interactive_waiting: int = 0
    """Interactive requests waiting in the proxy's admission queue."""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The chosen backend (by name) and a short reason, logged and counted."""

    backend: str
    reason: str


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one routed request, reported once its reply has ended for any reason."""

    backend: str
    steps: int | None
    workload_class: str
    status: int
    stream: bool
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    chunks: int = 0
    verify_count: int | None = None
    accepted_drafts: int | None = None
    """Draft tokens accepted over `verify_count` verifies (vLLM's per-request metrics)."""
    accept_length: float | None = None
    ttft_s: float | None = None
    chunk_gaps_s: tuple[float, ...] = ()
    duration_s: float = 0.0
    in_flight_at_start: int = 0
    mean_in_flight: float | None = None
    """Time-averaged in-flight count of the backend while this request was there."""
    error: str | None = None
    lane: Lane = BATCH


@runtime_checkable
class Policy(Protocol):
    """A routing policy: pure, non-blocking, microseconds per call."""

    name: str

    def choose(self, request: RouteRequest, view: PoolView) -> Decision:
        """Pick one backend of `view.backends` for `request`."""
        ...

    def observe(self, outcome: Outcome) -> None:
        """Learn from a finished request."""
        ...
