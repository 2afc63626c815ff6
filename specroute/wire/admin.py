"""The admin contract: the proxy's `GET /pool` snapshot, the `/plan` document the depth loop
publishes, and the backend holds it sets while it restarts a server. Both sides encode and
decode these Structs; unknown fields are allowed, so either side may add one first."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "Account",
    "BackendChange",
    "BackendSnapshot",
    "ChangeRecord",
    "ChangeSummary",
    "ClassSnapshot",
    "ForecastSummary",
    "HoldAnswer",
    "HoldChange",
    "HoldState",
    "IterationFit",
    "LaneSnapshot",
    "PlanDocument",
    "PlanSummary",
    "PoolEstimates",
    "PoolSnapshot",
    "RegimeSummary",
    "ServerRow",
    "SettingWire",
    "no_planner",
]

HoldState = Literal["serving", "draining", "restarting"]


class _Wire(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Wire types: unknown fields allowed, defaults left out."""


# -- GET /pool ---------------------------------------------------------------------------------


class BackendChange(msgspec.Struct, kw_only=True):
    """A depth change in progress on one backend: its hold, the setting it moves to and why."""

    state: HoldState
    to: str = ""
    reason: str = ""
    since_s: float = 0.0


class BackendSnapshot(msgspec.Struct, kw_only=True):
    """One backend as `GET /pool` shows it: every field always sent (the dashboard reads nulls),
    so no defaults except what an older proxy did not send."""

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
    """This proxy replica's own requests on it."""
    running: int | None
    queued: int | None
    accept_length: float | None
    gen_throughput: float | None
    iteration_intercept_s: float | None
    """Fitted iteration time at an empty batch (None: nothing learned and no prior)."""
    iteration_per_token_s: float | None
    iteration_samples: int
    iteration_tokens: float | None = None
    """Where the fit's observations lie (their mean tokens per iteration; None before any)."""
    iteration_stall_s: float = 0.0
    """Of the fitted iteration where it was observed, the mean pause beyond the decode (other
    requests' prefills): the planner takes it out and charges each candidate its own."""
    combined: int | None = None
    """Every replica's requests on it: its last scrape plus this replica's changes since."""
    headroom: int | None = None
    breaker: str = "closed"
    state: str = "serving"
    """serving, draining, restarting (a planned depth change) or down (an outage)."""
    change: BackendChange | None = None
    """The depth change a held backend is part of, as the launcher's actuator said."""

    @property
    def load(self) -> int:
        """Its requests from every replica, or this replica's own while no scrape says more."""
        return self.combined if self.combined is not None else self.in_flight


class ClassSnapshot(_Wire):
    """A workload class's acceptance (per-token rate and accept length per depth seen), its
    completions and mean length."""

    alpha: float
    accept_length: dict[int, float] = {}
    samples: int = 0
    """Replies its acceptance was learned from."""
    mean_tokens: float | None = None
    completions: int = 0
    """Replies of the class, from any server (the loop splits the load by these)."""
    first_token_s: float | None = None
    """Mean wait for a streamed reply's first token beyond one iteration of its server (the
    planner adds it to each request's time)."""
    prefill_pause_s: float | None = None
    """How long each other request's start (its prefill) paused a running request of the
    class, per request beside it (the planner charges it per user on a candidate server)."""


class IterationFit(_Wire):
    intercept_s: float
    per_token_s: float
    observations: int = 0
    measured: list[tuple[float, float]] = []
    """In `depths`: the (tokens verified per iteration, seconds) points tune measured at the
    depth, which the planner reads between rather than along the line."""


class PoolEstimates(msgspec.Struct, kw_only=True):
    """What the pool has learned: classes as policies see them (blended over replicas), this
    replica's own, the prior rate, where acceptance came from, iteration fits per backend@depth,
    and the prior's fit and batch limit per depth (`--prior`: what tune measured, for depths no
    backend runs)."""

    classes: dict[str, ClassSnapshot]
    local_classes: dict[str, ClassSnapshot]
    prior_alpha: float
    acceptance_sources: dict[str, Any] = {}
    iteration: dict[str, IterationFit] = {}
    depths: dict[int, IterationFit] = {}
    capacity: dict[int, int] = {}


class LaneSnapshot(msgspec.Struct, kw_only=True):
    """One latency lane in `/pool`: its load now (requests in flight from arrival to end,
    queue included, and by workload class), its speed target and how many met it since
    start, and the per-request decode speeds and queue waits of its recent requests. Every
    field always sent (the dashboard reads nulls)."""

    requests: int = 0
    in_flight: int = 0
    """Requests of the lane in this proxy now, waiting or running: the load the planner plans."""
    waiting: int = 0
    """Of those, waiting in the admission queue."""
    classes: dict[str, int] = {}
    """`in_flight` by workload class."""
    target_tok_s: float = 0.0
    met: int = 0
    missed: int = 0
    attainment: float | None = None
    mean_tok_s: float | None = None
    tok_s_p50: float | None = None
    """Per-request decode speed percentiles over the lane's recent requests."""
    tok_s_p90: float | None = None
    tok_s_p99: float | None = None
    mean_wait_s: float | None = None
    wait_p50_s: float | None = None
    """Queue wait (arrival to first attempt) percentiles over the lane's recent requests."""
    wait_p99_s: float | None = None
    max_wait_s: float = 0.0


class PoolSnapshot(msgspec.Struct, kw_only=True):
    """`GET /pool`."""

    policy: str
    waiting: int
    """Requests queued at this proxy for a free slot."""
    backends: list[BackendSnapshot]
    estimates: PoolEstimates
    replicas: dict[str, Any] = {}
    recent_decisions: list[Any] = []
    lanes: dict[str, LaneSnapshot] = {}
    """Per latency lane: its load, target attainment, speed and queue wait."""


# -- backend holds -----------------------------------------------------------------------------


class HoldChange(msgspec.Struct, forbid_unknown_fields=True):
    """`PUT /pool/backends/{name}/state`: the hold, and for a planned restart the setting the
    server moves to and the plan's reason (shown as `restarting`, not as an outage). `setting`:
    what the server runs, as its launcher knows it (a readmission: the setting that came up),
    for what its engine does not say (vLLM's K per batch size, outside its developer mode)."""

    state: HoldState
    to: str = ""
    reason: str = ""
    setting: SettingWire | None = None


class HoldAnswer(msgspec.Struct, kw_only=True):
    """Its answer: the backend's hold (and the change it is part of) and what it still has in
    flight."""

    backend: str
    state: HoldState
    to: str = ""
    reason: str = ""
    in_flight: int
    reachable: bool
    steps: int | None
    capacity: int | None


# -- PUT /plan, GET /plan ----------------------------------------------------------------------


class SettingWire(_Wire):
    """A server's speculative setting (`planner.Setting`): a depth, SGLang's adaptive tiers, or
    vLLM's K per batch size as (first batch size, K) ranges."""

    steps: int
    tiers: list[tuple[int, list[int]]] = []
    table: list[tuple[int, int]] = []


class ForecastSummary(_Wire):
    """A forecast of one assignment: its labels, pool tok/s and the objective's figure."""

    settings: list[str]
    tok_s: float
    value: float
    """What the planner ranks it by: the objective's figure less `lane_charge`."""
    per_request_tok_s: float = 0.0
    queued: float = 0.0
    lane_charge: float = 0.0
    """What the interactive lane's shortfall took off `value` (0 where the lane is served)."""


class RegimeSummary(_Wire):
    concurrency: float
    shares: dict[str, float]
    elapsed_s: float
    expected_remaining_s: float
    regimes_seen: int = 0
    alike_seen: int = 0


class ChangeSummary(_Wire):
    server: str
    before: SettingWire
    after: SettingWire
    cost_tokens: float = 0.0


class PlanSummary(_Wire):
    """The planner's last plan: its verdict and reason, the forecasts it compared, the gain
    over the horizon it is valued on, and the changes it begins now."""

    at: float
    verdict: str
    reason: str
    regime: RegimeSummary
    current: ForecastSummary
    proposed: ForecastSummary | None = None
    gain: float = 0.0
    gain_tokens: float = 0.0
    restart_cost_tokens: float = 0.0
    horizon_s: float = 0.0
    """Seconds the proposal is valued over: the restarts plus the dwell they commit the pool to."""
    bar: float = 0.0
    """The gain, as a fraction of the objective, a change must promise (raised by regret)."""
    changes: list[ChangeSummary] = []
    start: list[ChangeSummary] = []


class ServerRow(_Wire):
    name: str
    setting: str
    state: HoldState
    target: str | None = None
    fallback: bool = False
    since_s: float = 0.0
    since: str | None = None
    startup_s: float = 0.0


class ChangeRecord(_Wire):
    server: str
    before: str
    after: str
    outcome: str
    took_s: float
    reason: str
    error: str = ""
    at: float = 0.0
    ago_s: float = 0.0
    finished_at: str | None = None
    """UTC, as the logs write it."""


class Account(_Wire):
    """One change held to account: the pool's rate before it, what the plan forecast, and what
    was realized once it settled (None until then)."""

    at: float
    servers: list[str]
    before_tok_s: float
    forecast_tok_s: float
    realized_tok_s: float | None = None
    forecast_error: float | None = None
    """(forecast - realized) / realized."""
    realized_gain: float | None = None
    """(realized - before) / before."""
    realized_gain_noise: float | None = None
    """The realized gain's standard error: how much the rates before and after moved by
    chance over their spans (batch means). A miss within it is not held against the
    forecast (the planner's bar)."""
    forecast_gain: float | None = None
    """The gain the plan forecast: its forecast of the pool the change made over its forecast
    of the pool before, less one (the same model's two figures: a bias they share cancels)."""
    note: str = ""
    """Why it has no verdict (the regime changed before it settled), if it has none."""


class PlanDocument(_Wire):
    """What `GET /plan` shows: the mode, the plan with its numbers, each server's state, the
    changes under way and past ones, their accounts, outcome counts, and the replicas per
    depth wanted now and run now."""

    mode: str
    planner: str | None
    note: str = ""
    plan: PlanSummary | None = None
    plan_age_s: float | None = None
    plan_made_at: str | None = None
    """UTC ISO times, to match the logs (the ages are in seconds)."""
    published_at: str | None = None
    servers: list[ServerRow] = []
    pending: list[str] = []
    history: list[ChangeRecord] = []
    accounts: list[Account] = []
    outcomes: dict[str, int] = {}
    replicas: dict[str, int] = {}
    current_replicas: dict[str, int] = {}


def no_planner() -> PlanDocument:
    """The document served until a planner publishes."""
    return PlanDocument(
        mode="off",
        planner=None,
        note="no planner publishes here: `specroute launch --reconfigure advise|auto` runs one",
    )
