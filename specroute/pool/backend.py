"""One backend's live state: what discovery learned, health (its probes with thresholds, and its
streams: one that stalled makes it unhealthy until a request succeeds), load, breaker."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import structlog

from specroute.batch_limit import BatchLimit
from specroute.config import AdmissionConfig, BackendConfig, BreakerConfig, HealthConfig
from specroute.policies import BackendView
from specroute.pool.breaker import CircuitBreaker
from specroute.pool.engines import PROBE_PATH, STREAM_FRAMING, Engine, VllmSettings
from specroute.pool.estimators import IterationTimeModel
from specroute.pool.promtext import BackendMetrics

__all__ = ["Backend"]

log = structlog.get_logger()


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _lifetime_accept_length(info: dict[str, Any]) -> float | None:
    """`internal_states[0].avg_spec_accept_length`, where it is a number: another SGLang
    version may shape `internal_states` otherwise, and that must not stop the proxy."""
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states else None
    value = first.get("avg_spec_accept_length") if isinstance(first, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


class Backend:
    """Mutable state of one SGLang or vLLM server, owned by the pool; policies see `view()`
    only. `engine` is None until an "auto" backend was recognised."""

    def __init__(
        self,
        config: BackendConfig,
        *,
        health: HealthConfig,
        admission: AdmissionConfig,
        breaker: BreakerConfig,
        tuned_capacity: Mapping[int, int] | None = None,
    ) -> None:
        self.config = config
        self.tuned_capacity: Mapping[int, int] = tuned_capacity or {}
        """The batch limit a tune measured per depth (`--prior`): a vLLM server's capacity
        where neither the server nor the operator gives one."""
        self.name = config.label
        self.url = config.url.rstrip("/")
        self.auth_headers: list[tuple[bytes, bytes]] = (
            [(b"authorization", b"Bearer " + config.api_key.encode())] if config.api_key else []
        )
        self._health = health
        self._overcommit = admission.overcommit
        self.breaker = CircuitBreaker(breaker.failure_threshold, breaker.open_s)
        self.reachable = False  # what its /ready probes say, with the thresholds
        self.needs_discovery = True
        self._ok_streak = 0
        self._fail_streak = 0
        self.probe_error: str | None = None  # why its last /ready check failed, for logs and 503s
        self.in_flight = 0
        self._load_area = 0.0  # integral of in_flight over time, for mean batch sizes
        self._load_since = time.monotonic()
        self.server_info: dict[str, Any] | None = None
        self.lifetime_accept_length: float | None = None  # from /server_info, if it says
        self.model_cards: tuple[dict[str, Any], ...] = ()
        self.model: str | None = None
        self.configured_steps: int | None = None
        self.algorithm: str | None = None
        self.adaptive = False
        self.table_steps: int | None = None
        """vLLM: its launcher says it runs K per batch size up to this (`declare`)."""
        self.vllm_said = False
        """vLLM: its developer-mode settings were read (they say what `declare` stands for)."""
        self.reported_capacity: int | None = None
        """Its batch limit as the server or the operator gives it (`capacity` adds the tune's)."""
        self.metrics = BackendMetrics()
        self.engine: Engine | None = None if config.engine == "auto" else config.engine
        self.seen_limits = BatchLimit()
        """A vLLM server's batch limit per depth, read from its scrapes while requests waited:
        its capacity where neither it, the operator nor a prior gives one."""

    # Discovery ---------------------------------------------------------------------------
    names_changed = 0
    """Counts changes to any backend's model names, so the pool keeps their union until one."""

    def apply_server_info(self, info: dict[str, Any]) -> None:
        """Depth, algorithm, capacity and model from SGLang's /server_info."""
        Backend.names_changed += 1
        self.server_info = info
        self.lifetime_accept_length = _lifetime_accept_length(info)
        algorithm = info.get("speculative_algorithm")
        self.algorithm = algorithm if isinstance(algorithm, str) else None
        steps = _int_or_none(info.get("speculative_num_steps"))
        self.configured_steps = steps if self.algorithm else 0
        self.adaptive = bool(info.get("speculative_adaptive"))
        self.reported_capacity = _int_or_none(info.get("max_running_requests"))
        name = info.get("served_model_name") or info.get("model_path")
        self.model = name if isinstance(name, str) else self.model
        self._configured_over()
        self.needs_discovery = False

    def apply_vllm(self, settings: VllmSettings | None) -> None:
        """Depth, method and capacity of a vLLM server (which has no /server_info outside its
        developer mode): its developer-mode settings if any, the operator's configuration
        over them; the depth otherwise follows its per-position counters (`steps`). Call after
        `apply_models`: the model is its first card."""
        Backend.names_changed += 1
        self.vllm_said = settings is not None
        self.configured_steps = settings.steps if settings else None
        self.algorithm = settings.method if settings else None
        self.reported_capacity = settings.capacity if settings else None
        self.adaptive = settings.dynamic if settings else self.table_steps is not None
        if self.model_cards:
            self.model = str(self.model_cards[0]["id"])
        self._configured_over()
        self.needs_discovery = False

    def declare(self, steps: int, dynamic: bool) -> None:
        """What its launcher says it runs (the depth loop, as launched and after each restart):
        a vLLM server outside developer mode does not say that K follows its batch size, and
        its depth then follows its counters, its accept length belongs to no one depth, and
        its memory is sized for `steps`."""
        self.table_steps = steps if dynamic else None
        if self.engine == "vllm" and not self.vllm_said:
            self.adaptive = dynamic

    def _configured_over(self) -> None:
        """The operator's `steps` and `capacity`, where set, over what the server said."""
        if self.config.steps is not None:
            self.configured_steps = self.config.steps
        if self.config.capacity is not None:
            self.reported_capacity = self.config.capacity

    @property
    def probe_path(self) -> str:
        """Its engine's cheap readiness check (SGLang's until the engine is known)."""
        return PROBE_PATH[self.engine or "sglang"]

    @property
    def stream_framing(self) -> int:
        """Events of a chat stream that are not decode iterations, on its engine."""
        return STREAM_FRAMING[self.engine or "sglang"]

    def apply_models(self, body: dict[str, Any]) -> None:
        cards = body.get("data")
        Backend.names_changed += 1
        if isinstance(cards, list):
            self.model_cards = tuple(c for c in cards if isinstance(c, dict) and "id" in c)

    @property
    def models(self) -> set[str]:
        names = {str(c["id"]) for c in self.model_cards}
        if self.model:
            names.add(self.model)
        return names

    @property
    def steps(self) -> int | None:
        """The active depth: an adaptive server's metrics follow its switches."""
        if self.adaptive and self.metrics.steps is not None:
            return round(self.metrics.steps)
        if self.configured_steps is None and self.engine == "vllm":
            return None if self.metrics.steps is None else round(self.metrics.steps)
        return self.configured_steps

    @property
    def capacity(self) -> int | None:
        """Its batch limit: the server's or the operator's; for a vLLM server that gives none,
        what the tune measured at the depth it runs now (so it follows a restart's depth), else
        what its scrapes showed it hold at that depth while requests waited (K per batch
        size: at the most it drafts, which sizes its memory)."""
        if self.reported_capacity is not None or self.engine != "vllm":
            return self.reported_capacity
        steps = self.steps
        if self.adaptive:  # K follows the batch; memory is sized for the most it drafts
            steps = self.configured_steps if self.vllm_said else self.table_steps
        if steps is None:
            return None
        tuned = self.tuned_capacity.get(steps)
        return tuned if tuned is not None else self.seen_limits.at(steps)

    def scraped(self, metrics: BackendMetrics) -> None:
        """A /metrics answer: the gauges, and what a vLLM server's show of its batch limit."""
        self.metrics = metrics
        if self.engine != "vllm" or self.adaptive:
            return
        steps = self.steps
        if self.seen_limits.read(steps, metrics.running, metrics.queued):
            # What an operator looks for when a vLLM server's capacity appears in /pool.
            log.info("batch_limit_seen", backend=self.name, steps=steps,
                     limit=self.seen_limits.at(steps), used=self.capacity)  # fmt: skip

    @property
    def limit(self) -> int | None:
        if self.config.max_in_flight is not None:
            return self.config.max_in_flight
        if self.capacity is None:
            return None
        return math.ceil(self.capacity * self._overcommit)

    # Load --------------------------------------------------------------------------------
    def load_area(self, now: float) -> float:
        """The integral of the in-flight count up to `now` (request-seconds)."""
        return self._load_area + self.in_flight * (now - self._load_since)

    def add_in_flight(self, delta: int, now: float) -> None:
        self._load_area = self.load_area(now)
        self._load_since = now
        self.in_flight += delta

    # Health ------------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        """Passing its /ready checks and with no stalled stream since its last success: SGLang
        answers /ready from its HTTP process, which stays up when its scheduler hangs."""
        return self.reachable and not self.breaker.stalled

    def on_probe(self, ok: bool, timed_out: bool = False) -> str | None:
        """Count one /ready result; return "up" or "down" when the state flips. A check that
        ran out its whole deadline (no reply, or one trickled) takes the backend out at once:
        its HTTP server is hung or crawling, and a request sent there would be too."""
        if ok:
            self._ok_streak += 1
            self._fail_streak = 0
            if not self.reachable and self._ok_streak >= self._health.success_threshold:
                self.reachable = True
                self.needs_discovery = True
                self.breaker.reset()
                return "up"
        else:
            self._fail_streak += 1
            self._ok_streak = 0
            enough = timed_out or self._fail_streak >= self._health.failure_threshold
            if self.reachable and enough:
                self.reachable = False
                return "down"
        return None

    def view(self, iteration: IterationTimeModel | None = None) -> BackendView:
        m = self.metrics
        lifetime = self.lifetime_accept_length
        return BackendView(
            name=self.name,
            url=self.url,
            model=self.model,
            steps=self.steps,
            algorithm=self.algorithm,
            adaptive=self.adaptive,
            capacity=self.capacity,
            limit=self.limit,
            healthy=self.healthy,
            in_flight=self.in_flight,
            running=None if m.running is None else round(m.running),
            queued=None if m.queued is None else round(m.queued),
            accept_length=m.accept_length if m.accept_length is not None else lifetime,
            gen_throughput=m.gen_throughput,
            iteration_intercept_s=iteration.intercept if iteration else None,
            iteration_per_token_s=iteration.slope if iteration else None,
            iteration_samples=iteration.observations if iteration else 0,
            iteration_tokens=iteration.tokens if iteration else None,
            iteration_stall_s=iteration.stall_s if iteration else 0.0,
        )
