"""The pool: backends from config, their background watch (health, discovery, metrics), the
candidates for a request, and in-flight leases that always come back."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Collection
from typing import Any

import msgspec
import structlog

from specroute.config import BackendConfig, Config
from specroute.policies import Outcome, PoolView
from specroute.pool.backend import Backend
from specroute.pool.client import TimedOut, UpstreamClient, UpstreamFailure
from specroute.pool.discovery import DnsDiscovery, static_entries
from specroute.pool.engine_discovery import discover_vllm, recognise
from specroute.pool.holds import BackendState, Holds
from specroute.pool.index import RoutingIndex
from specroute.pool.peers import Peers
from specroute.pool.prior import load_prior
from specroute.pool.scraper import Scraper
from specroute.pool.sharing import EstimatesWire, PeerTable, local_estimates
from specroute.pool.telemetry import Telemetry
from specroute.pool.unready import probe_failure, status_failure
from specroute.tasks import cancel

__all__ = ["Lease", "Pool"]

log = structlog.get_logger()
_json = msgspec.json.Decoder(dict[str, Any])


class Lease:
    """One request's claim on a backend; `release()` is idempotent and must run in `finally`."""

    __slots__ = (
        "_area_at_start",
        "_pool",
        "_started",
        "backend",
        "in_flight_at_start",
        "mean_in_flight",
        "released",
    )

    def __init__(self, pool: Pool, backend: Backend) -> None:
        self._pool = pool
        self.backend = backend
        now = time.monotonic()
        backend.add_in_flight(1, now)
        pool.index.moved(backend)
        backend.breaker.on_send()
        self.in_flight_at_start = backend.in_flight
        self._started = now
        self._area_at_start = backend.load_area(now)
        self.mean_in_flight: float | None = None
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            now = time.monotonic()
            elapsed = now - self._started
            if elapsed > 0:
                self.mean_in_flight = (self.backend.load_area(now) - self._area_at_start) / elapsed
            self.backend.add_in_flight(-1, now)
            self._pool.index.moved(self.backend)
            self._pool.notify()

    def observe(self, outcome: Outcome) -> None:
        """Teach the pool's estimators what this request showed (once its reply ended)."""
        self._pool.observe(outcome)


class Pool:
    """Backends plus the tasks that keep their state fresh."""

    def __init__(self, config: Config, client: UpstreamClient) -> None:
        self._config = config
        self.client = client
        prior = load_prior(config.prior.path) if config.prior.path is not None else None
        self.tuned_capacity = prior.capacity if prior is not None else {}
        """The batch limit per depth the prior's tune measured (vLLM servers report none)."""
        self.backends = tuple(
            Backend(
                b,
                health=config.health,
                admission=config.admission,
                breaker=config.breaker,
                tuned_capacity=self.tuned_capacity,
            )
            for b in static_entries(config.backends)
        )
        self.by_name = {b.name: b for b in self.backends}
        self._names_key: tuple[tuple[Backend, ...], int] | None = None
        self._names: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self.telemetry = prior.telemetry() if prior is not None else Telemetry()
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._dns = DnsDiscovery(config.backends, self)
        self.holds = Holds()
        """Backends the launcher's actuator is draining or restarting: offered to no policy."""
        self.instance = secrets.token_hex(8)
        """This process among the proxy's replicas: peers know it by this."""
        table = PeerTable(self.instance, config.replicas.peer_stale_s)
        self.index = RoutingIndex(config, self.telemetry, table)
        self.scraper = Scraper(config, client, self.index, self.notify)
        self.peers = Peers(config, client, table, self._peers_changed)

    # Lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Probe every backend once (so /ready is right at once), then watch in background."""
        async with asyncio.TaskGroup() as group:
            for backend in self.backends:
                group.create_task(self._first_look(backend))
        self._tasks = [asyncio.create_task(self._watch(b)) for b in self.backends]
        for backend in self.backends:
            self._follow(backend)
        self.scraper.start()
        await self._dns.start()
        await self.peers.start()

    async def add_backend(self, config: BackendConfig) -> None:
        """A backend found at run time (DNS discovery): look at it once, then watch it."""
        c = self._config
        backend = Backend(config, health=c.health, admission=c.admission, breaker=c.breaker,
                          tuned_capacity=self.tuned_capacity)  # fmt: skip
        await self._first_look(backend)
        self.backends = (*self.backends, backend)
        self.by_name[backend.name] = backend
        self._tasks.append(asyncio.create_task(self._watch(backend), name=backend.name))
        self._follow(backend)
        self.notify()

    def remove_backend(self, name: str) -> None:
        """Forget a backend that left (requests already on it finish through their lease)."""
        self.backends = tuple(b for b in self.backends if b.name != name)
        self.by_name.pop(name, None)
        self.index.remove(name)
        for task in [t for t in self._tasks if t.get_name() == name]:
            task.cancel()
            self._tasks.remove(task)
        self.notify()

    async def stop(self) -> None:
        await self.peers.stop()
        await self.scraper.stop()
        await self._dns.stop()
        await cancel(self._tasks)
        self._tasks = []

    # Requests ----------------------------------------------------------------------------
    def healthy(self, model: str | None = None) -> list[Backend]:
        return [b for b in self.backends if b.healthy and (model is None or _serves(b, model))]

    def routing_view(self, model: str | None, exclude: Collection[str] = ()) -> PoolView | None:
        """What a policy sees, from the live groups: only the members it reads are tested
        (reachable, circuit, limit or replica share, model, not in `exclude`); None when no
        backend may take the request now."""
        now = time.monotonic()
        candidates = self.index.candidates(model, self.holds.excluding(exclude), now)
        if not candidates.any():
            return None
        return self.index.pool_view(candidates, self.index.classes(self.instance, now))

    def state_of(self, backend: Backend) -> BackendState:
        """serving, draining, restarting (a planned restart, whatever its health) or down."""
        return self.holds.state_of(backend.name, backend.healthy)

    def local_estimates(self) -> EstimatesWire:
        """What this replica learned itself, for its peers (`GET /pool/estimates`)."""
        return local_estimates(self.telemetry, self.instance)

    def _follow(self, backend: Backend) -> None:
        self.index.add(backend)
        self.scraper.add(backend)

    def _peers_changed(self) -> None:
        """The blend or this replica's share of the room may have moved: views again."""
        self.index.share = self.peers.table.share(time.monotonic())
        self.index.touch_all()
        self.notify()

    def observe(self, outcome: Outcome) -> None:
        """Feed one outcome into the estimators (acceptance, lengths, iteration time)."""
        backend = self.by_name.get(outcome.backend)
        if backend is None:
            return
        self.telemetry.observe(
            outcome,
            capacity=backend.capacity,
            scraped=backend.view().accept_length,
            acceptance=not backend.adaptive,
            framing=backend.stream_framing,
        )
        self.index.touch(backend)

    def lease(self, backend: Backend) -> Lease:
        return Lease(self, backend)

    def stalled(self, backend: Backend, phase: str, limit_s: float) -> None:
        """One of `backend`'s streams stayed quiet past its limit (`phase`: before its first
        token or between chunks): the backend is unhealthy and its circuit open."""
        if backend.healthy:
            log.warning("backend_stalled", backend=backend.name, phase=phase, limit_s=limit_s)
        backend.breaker.on_stall(time.monotonic())
        self.notify()

    def misbehaved(self, backend: Backend, error: str) -> None:
        """`backend` answered 200 with what its route does not promise: broken as a stalled
        one is, unhealthy with its circuit open until a request succeeds."""
        if backend.healthy:
            log.warning("backend_bad_reply", backend=backend.name, error=error)
        backend.breaker.on_stall(time.monotonic())
        self.notify()

    def known_models(self) -> frozenset[str]:
        """Every name the backends list: their models and any LoRA adapters they loaded."""
        return self._model_names()[0]

    def base_models(self) -> frozenset[str]:
        """The models the backends serve, without the LoRA adapters SGLang lists beside them
        (their cards name a `parent`)."""
        return self._model_names()[1]

    def _model_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """(known, base), kept until a backend comes, goes or lists other names: every request
        reads them, and the union over a pool of hundreds costs more than the decision."""
        key = (self.backends, Backend.names_changed)
        if (
            self._names_key is None
            or self._names_key[0] is not key[0]
            or self._names_key[1] != key[1]
        ):
            known = frozenset().union(*(b.models for b in self.backends))
            base = {b.model for b in self.backends if b.model}
            for backend in self.backends:
                base.update(str(c["id"]) for c in backend.model_cards if not c.get("parent"))
            self._names = (known, frozenset(base))
            self._names_key = key
        return self._names

    def notify(self) -> None:
        """Wake requests waiting for a free slot."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout_s: float) -> None:
        """Return when a slot frees or health changes, or after `timeout_s` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    # Background watch --------------------------------------------------------------------
    async def _first_look(self, backend: Backend) -> None:
        for _ in range(self._config.health.success_threshold):
            await self._probe(backend)
        if backend.reachable:
            await self._discover(backend)
        else:  # never up, so never "down": say so once, with why
            reason = backend.probe_error or "not ready yet"
            log.warning("backend_down", backend=backend.name, url=backend.url, reason=reason)

    async def _watch(self, backend: Backend) -> None:
        health = self._config.health
        next_discovery = time.monotonic() + health.discovery_interval_s
        while True:
            await asyncio.sleep(health.interval_s)
            try:
                await self._probe(backend)
                now = time.monotonic()
                if backend.reachable and (backend.needs_discovery or now >= next_discovery):
                    await self._discover(backend)
                    next_discovery = now + health.discovery_interval_s
            except Exception:  # the watch must outlive any one bad reply; log and go on
                log.exception("backend_watch_failed", backend=backend.name)

    async def _get(self, backend: Backend, path: str) -> tuple[int, bytes]:
        return await self.client.get(
            backend.url + path,
            timeout_s=self._config.health.timeout_s,
            headers=backend.auth_headers,
        )

    async def _probe(self, backend: Backend) -> None:
        timed_out = False
        try:
            if backend.engine is None:  # unknown until one says: probed as SGLang meanwhile
                backend.engine = await recognise(lambda path: self._get(backend, path))
                if backend.engine is not None:
                    log.info("backend_engine", backend=backend.name, engine=backend.engine)
            status, _ = await self._get(backend, backend.probe_path)
            ok = status == 200
            backend.probe_error = None if ok else status_failure(status, backend.probe_path)
        except UpstreamFailure as exc:
            ok = False
            backend.probe_error = probe_failure(exc, self._config.health.timeout_s)
            timed_out = isinstance(exc, TimedOut)
        flip = backend.on_probe(ok, timed_out)
        if flip is not None:
            self._log_flip(backend, flip)
            self.index.touch(backend)
            self.notify()

    def _log_flip(self, backend: Backend, flip: str) -> None:
        """Up at info; down at warning, except during a planned restart (the launcher's
        actuator holds it `restarting`): that is expected, logged at info with the change."""
        where = {"backend": backend.name, "url": backend.url, "steps": backend.steps}
        hold = self.holds.get(backend.name)
        if flip == "up":
            log.info("backend_up", **where)
        elif hold is not None and hold.state == "restarting":
            log.info("backend_restarting", **where, to=hold.to, reason=hold.reason,
                     probe=backend.probe_error)  # fmt: skip
        else:
            log.warning("backend_down", **where, reason=backend.probe_error)

    async def _discover(self, backend: Backend) -> None:
        try:
            if backend.engine == "vllm":
                await discover_vllm(lambda path: self._get(backend, path), backend)
                self.index.touch(backend)
                self._log_discovered(backend)
                return
            status, body = await self._get(backend, "/server_info")
            if status == 200:
                backend.apply_server_info(_json.decode(body))
                # The new depth routes at once: readmission after a restart waits on it.
                self.index.touch(backend)
            status, body = await self._get(backend, "/v1/models")
            if status == 200:
                backend.apply_models(_json.decode(body))
        except (UpstreamFailure, msgspec.DecodeError) as exc:
            log.warning("discovery_failed", backend=backend.name, error=str(exc))
            return
        self.index.touch(backend)
        self._log_discovered(backend)

    def _log_discovered(self, backend: Backend) -> None:
        log.info(
            "backend_discovered",
            backend=backend.name,
            engine=backend.engine,
            model=backend.model,
            steps=backend.steps,
            algorithm=backend.algorithm,
            adaptive=backend.adaptive,
            capacity=backend.capacity,
        )


def _serves(backend: Backend, model: str) -> bool:
    models = backend.models
    return not models or model in models
