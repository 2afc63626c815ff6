"""The operator's dashboard: `GET /dashboard`, one self-contained page, and `GET /dashboard/data`,
the last minutes of pool samples. A timer in the app's lifespan takes the samples, so watching
costs the request path nothing; each poll only joins bytes encoded once per sample."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from importlib import resources
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Litestar, MediaType, Response, get
from litestar.params import Parameter

from specroute.pool import Backend
from specroute.proxy.auth import PUBLIC
from specroute.proxy.state import ProxyState
from specroute.tasks import cancel

__all__ = ["BackendSample", "Dashboard", "Sample", "Sampler"]

log = structlog.get_logger()

INTERVAL_S = 1.0
HISTORY = 600
"""Samples kept: ten minutes at one a second."""
RATE_WINDOW = 5
"""Samples a tok/s rate is averaged over: the proxy counts a reply's tokens when it ends."""
PAGE_HEADERS = {
    "cache-control": "no-cache",
    # The page loads nothing from anywhere: no CDN, no fonts, only this proxy's own JSON.
    "content-security-policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
    ),
    "x-content-type-options": "nosniff",
}


class BackendSample(msgspec.Struct, kw_only=True):
    """One backend at one tick."""

    steps: int | None
    """The depth it serves at now: a server keeps its launch name across depth changes."""
    healthy: bool
    state: str
    """serving, draining, restarting (a planned depth change, not an outage) or down."""
    to: str = ""
    """While draining or restarting: the setting it moves to (`k3`)."""
    reason: str = ""
    """While draining or restarting: why the plan moves it."""
    breaker: str
    in_flight: int
    limit: int | None
    running: int | None
    queued: int | None
    tok_s: float
    """Completion tokens this proxy relayed from it per second (trailing few seconds)."""
    gen_tok_s: float | None
    """The backend's own `gen_throughput` (all its clients), from the last scrape."""
    accept_length: float | None
    """Tokens per verify between the last two scrapes, else the backend's reported value."""
    routed: int
    """Requests the policy sent to it during this tick."""


class Sample(msgspec.Struct, kw_only=True):
    """The pool at one tick: `t` is seconds since the sampler started."""

    seq: int
    t: float
    policy: str
    waiting: int
    backends: dict[str, BackendSample]
    depths: dict[str, int]
    """Requests routed per depth during this tick (`?` for a depth not yet known)."""
    classes: dict[str, float]
    """Estimated per-token acceptance (alpha) per workload class."""


class _Acceptance:
    """Tokens per verify from the change in a backend's scraped counters."""

    __slots__ = ("last", "value")

    def __init__(self) -> None:
        self.last: tuple[float, float] | None = None
        self.value: float | None = None

    def update(self, tokens: float | None, verifies: float | None) -> float | None:
        if tokens is None or verifies is None:
            return None
        if self.last is not None:
            d_tokens, d_verifies = tokens - self.last[0], verifies - self.last[1]
            if d_verifies > 0 and d_tokens >= 0:
                self.value = d_tokens / d_verifies
        self.last = (tokens, verifies)
        return self.value


def _sum_by(values: Iterable[tuple[tuple[str, ...], float]], index: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in values:
        if len(labels) > index:
            out[labels[index]] = out.get(labels[index], 0.0) + value
    return out


def _counter(state: ProxyState, name: str) -> dict[tuple[str, ...], float]:
    """A counter's values, read defensively: the metrics' shape is not this module's."""
    values = getattr(getattr(state.metrics, name, None), "values", None)
    return values if isinstance(values, dict) else {}


class Sampler:
    """Takes a `Sample` of the pool every `interval_s` and keeps the last `size`, encoded."""

    def __init__(
        self, state: ProxyState, *, interval_s: float = INTERVAL_S, size: int = HISTORY
    ) -> None:
        self.state = state
        self.interval_s = interval_s
        self.samples: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=size)
        self.seq = 0
        self._started = time.monotonic()
        self._tokens: collections.deque[tuple[float, dict[str, float]]] = collections.deque(
            maxlen=RATE_WINDOW + 1
        )
        self._decisions: dict[str, float] = {}
        self._acceptance: dict[str, _Acceptance] = {}

    def take(self) -> Sample:
        """Read the pool, the proxy's counters and the estimates; store and return a sample."""
        state, now = self.state, time.monotonic()
        tokens = _sum_by(_counter(state, "tokens").items(), 0)
        self._tokens.append((now, tokens))
        then, old = self._tokens[0]
        span = now - then
        decisions = _sum_by(_counter(state, "decisions").items(), 1)
        routed = {name: int(n - self._decisions.get(name, 0.0)) for name, n in decisions.items()}
        self._decisions = decisions
        backends: dict[str, BackendSample] = {}
        depths: dict[str, int] = {}
        for backend in state.pool.backends:
            relayed = tokens.get(backend.name, 0.0) - old.get(backend.name, 0.0)
            sent = routed.get(backend.name, 0)
            backends[backend.name] = self._backend(backend, relayed / span if span > 0 else 0, sent)
            depth = "?" if backend.steps is None else str(backend.steps)
            depths[depth] = depths.get(depth, 0) + sent
        sample = Sample(
            seq=self.seq + 1,
            t=round(now - self._started, 3),
            policy=state.policy.name,
            waiting=state.admission.waiting,
            backends=backends,
            depths=depths,
            classes={k: round(v.alpha, 4) for k, v in state.pool.telemetry.classes().items()},
        )
        self.seq = sample.seq
        self.samples.append((sample.seq, msgspec.json.encode(sample)))
        return sample

    def _backend(self, backend: Backend, tok_s: float, routed: int) -> BackendSample:
        m = backend.metrics
        accept = self._acceptance.setdefault(backend.name, _Acceptance())
        measured = accept.update(m.generation_tokens, m.verify_calls)
        hold = self.state.pool.holds.get(backend.name)
        return BackendSample(
            steps=backend.steps,
            healthy=backend.healthy,
            state=self.state.pool.state_of(backend),
            to=hold.to if hold else "",
            reason=hold.reason if hold else "",
            breaker=backend.breaker.state.value,
            in_flight=backend.in_flight,
            limit=backend.limit,
            running=None if m.running is None else round(m.running),
            queued=None if m.queued is None else round(m.queued),
            tok_s=round(tok_s, 2),
            gen_tok_s=m.gen_throughput,
            accept_length=measured if measured is not None else m.accept_length,
            routed=routed,
        )

    def since(self, seq: int) -> bytes:
        """The data endpoint's body: every kept sample after `seq`, oldest first."""
        kept = len(self.samples)
        # Numbers run on without gaps, so the newer ones are the last; a `seq` from before a
        # restart of the proxy (larger than ours) gets everything.
        newer = kept if seq > self.seq else min(kept, self.seq - max(seq, 0))
        body = b",".join(self.samples[i][1] for i in range(kept - newer, kept))
        head = (
            f'{{"interval_s":{self.interval_s},"rate_s":{RATE_WINDOW * self.interval_s},'
            f'"seq":{self.seq},"size":{self.samples.maxlen},'
        )
        return head.encode() + b'"samples":[' + body + b"]}"

    async def run(self) -> None:
        """Sample until cancelled; a failed sample is logged and the next one tried."""
        while True:
            try:
                self.take()
            except Exception:  # the outermost boundary of a background task
                log.exception("dashboard_sample_failed")
            await asyncio.sleep(self.interval_s)


class Dashboard:
    """The page, its data route and the sampler behind them."""

    def __init__(self, state: ProxyState, *, interval_s: float = INTERVAL_S) -> None:
        self.sampler = Sampler(state, interval_s=interval_s)
        page = resources.files("specroute.proxy").joinpath("dashboard_page.html")
        self.page = page.read_bytes()

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        """Sample while the app runs."""
        task = asyncio.create_task(self.sampler.run())
        try:
            yield
        finally:
            await cancel([task])

    def handlers(self) -> list[Any]:
        """`GET /dashboard` needs no key (it holds no data); its data needs a client key."""
        page, sampler = self.page, self.sampler

        @get("/dashboard", sync_to_thread=False, opt=PUBLIC, include_in_schema=False)
        def dashboard() -> Response[bytes]:
            # Litestar appends `; charset=utf-8` to a text media type itself.
            return Response(page, media_type=MediaType.HTML, headers=PAGE_HEADERS)

        @get("/dashboard/data", sync_to_thread=False)
        def dashboard_data(since: Annotated[int, Parameter(ge=0)] = 0) -> Response[bytes]:
            """Pool samples after `since` (a `seq` from an earlier answer), one per second."""
            return Response(
                sampler.since(since),
                media_type="application/json",
                headers={"cache-control": "no-store"},
            )

        return [dashboard, dashboard_data]
