"""When each backend's /metrics is read: often where its room is nearly gone (another replica's
requests may fill it unseen), rarely while it is idle, within a budget of scrapes per second for
the whole pool; and what that freshness costs (scrapes, seconds waiting, seconds parsing)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Callable

import structlog

from specroute.config import Config
from specroute.policies import BackendView
from specroute.policies.groups import batch
from specroute.pool.backend import Backend
from specroute.pool.client import UpstreamClient, UpstreamFailure
from specroute.pool.engines import parse_vllm_metrics
from specroute.pool.index import RoutingIndex
from specroute.pool.promtext import parse_metrics
from specroute.tasks import cancel

__all__ = ["Scraper", "scrape_interval"]

log = structlog.get_logger()

_SWEEP_S = 1.0  # how often views holding an aged-out scrape are rebuilt
_CONCURRENCY = 16


def scrape_interval(view: BackendView | None, shortest_s: float, longest_s: float) -> float:
    """Seconds to the next scrape: `longest_s` below a quarter of its capacity used by every
    client together (or capacity unknown), `shortest_s` from 90% used or one slot left, linear
    in between. (Not this replica's headroom: what it freed counts there until its next
    scrape, and that next scrape should come soon.)"""
    if view is None or not view.capacity:
        return longest_s
    room = view.capacity - batch(view)
    if room <= 1:
        return shortest_s
    used = 1.0 - room / view.capacity
    tight = min(1.0, max(0.0, (used - 0.25) / 0.65))
    return longest_s - (longest_s - shortest_s) * tight


class Scraper:
    """One task for the whole pool: a heap of due times, a token bucket for the budget."""

    def __init__(
        self,
        config: Config,
        client: UpstreamClient,
        index: RoutingIndex,
        notify: Callable[[], None],
    ) -> None:
        self._config = config
        self._client = client
        self._index = index
        self._notify = notify
        self._due: list[tuple[float, int, Backend]] = []
        self._serial = 0
        self._tokens = 1.0
        self._filled_at = time.monotonic()
        self._wake = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self.scrapes = 0
        self.failures = 0
        self.wait_s = 0.0
        self.parse_s = 0.0
        self.started = time.monotonic()

    def add(self, backend: Backend, delay_s: float = 0.0) -> None:
        """Scrape `backend` after `delay_s` (and again at its own interval from then on)."""
        self._serial += 1
        heapq.heappush(self._due, (time.monotonic() + delay_s, self._serial, backend))
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scraper")

    async def stop(self) -> None:
        await cancel([self._task, *self._running])

    def stats(self) -> dict[str, float]:
        """The freshness bill: scrapes per second and the seconds they cost."""
        elapsed = max(1e-9, time.monotonic() - self.started)
        return {
            "scrapes": self.scrapes,
            "failures": self.failures,
            "per_s": self.scrapes / elapsed,
            "wait_s": self.wait_s,
            "parse_s": self.parse_s,
            "parse_us_each": 1e6 * self.parse_s / max(1, self.scrapes),
        }

    async def _run(self) -> None:
        swept = time.monotonic()
        while True:
            now = time.monotonic()
            if now - swept >= _SWEEP_S:
                for backend in self._index.stale(now):
                    self._index.touch(backend, now)
                swept = now
            wait = self._launch_due(now)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(wait, _SWEEP_S)):
                    await self._wake.wait()

    def _launch_due(self, now: float) -> float:
        """Start every due scrape the budget allows; seconds until there is more to do."""
        budget = self._config.replicas.scrape_budget_per_s
        self._tokens = min(budget, self._tokens + (now - self._filled_at) * budget)
        self._filled_at = now
        while self._due and self._due[0][0] <= now and len(self._running) < _CONCURRENCY:
            if self._tokens < 1.0:
                return (1.0 - self._tokens) / budget
            _, _, backend = heapq.heappop(self._due)
            self._tokens -= 1.0
            task = asyncio.create_task(self._scrape(backend))
            self._running.add(task)
            task.add_done_callback(self._finished)
        return max(0.0, self._due[0][0] - now) if self._due else _SWEEP_S

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._wake.set()

    async def _scrape(self, backend: Backend) -> None:
        if self._index.view_of(backend.name) is None and not backend.reachable:
            self.add(backend, self._config.health.metrics_interval_s)
            return
        started = time.monotonic()
        try:
            status, body = await self._client.get(
                backend.url + "/metrics",
                timeout_s=self._config.health.timeout_s,
                headers=backend.auth_headers,
            )
        except UpstreamFailure:
            status, body = 0, b""
        except Exception:  # the schedule must outlive any one bad reply; log and go on
            log.exception("scrape_failed", backend=backend.name)
            status, body = 0, b""
        answered = time.monotonic()
        self.wait_s += answered - started
        if status == 200:
            text = body.decode("utf-8", "replace")
            vllm = backend.engine == "vllm"
            metrics = parse_vllm_metrics(text, backend.metrics) if vllm else parse_metrics(text)
            backend.scraped(metrics)
            self._index.scraped(backend, metrics, answered)
            self.parse_s += time.monotonic() - answered
            self.scrapes += 1
            self._notify()  # requests waiting for room look again
        else:
            self.failures += 1
        replicas = self._config.replicas
        interval = scrape_interval(
            self._index.view_of(backend.name),
            replicas.scrape_min_interval_s,
            self._config.health.metrics_interval_s,
        )
        if self._index.follows(backend):
            self.add(backend, interval)
