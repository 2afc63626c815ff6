"""The pool's backends as policies read them: one view per backend, rebuilt only when its load,
health, scrape or estimates change, kept in policy groups (`Groups`), so that a decision costs
a few group lookups rather than a view of every backend."""

from __future__ import annotations

import time
import zlib
from collections.abc import Collection

import msgspec

from specroute.config import Config
from specroute.policies import (
    BackendView,
    Candidates,
    ClassEstimate,
    Groups,
    LazyBackends,
    PoolView,
)
from specroute.policies.groups import batch
from specroute.policies.predict import iteration_time
from specroute.pool.backend import Backend
from specroute.pool.eligibility import Refusal, refusal
from specroute.pool.engines import VLLM_GAUGE_LAG_S, Engine
from specroute.pool.load import LoadMark, Share, headroom
from specroute.pool.promtext import BackendMetrics
from specroute.pool.sharing import (
    EstimatesWire,
    IterationWire,
    PeerTable,
    blend_classes,
    blend_iteration,
    class_wires,
)
from specroute.pool.telemetry import Telemetry

__all__ = ["DECODE_LOG_INTERVAL", "RoutingIndex", "gauge_lag"]

DECODE_LOG_INTERVAL = 40
"""SGLang's default `--decode-log-interval`: decode iterations between two gauge updates."""
_HISTORY_S = 10.0  # own counts kept per backend: longer than any gauge lag


def gauge_lag(engine: Engine | None, floor_s: float, view: BackendView | None) -> float:
    """How old a backend's running and queued gauges may be: SGLang writes them at each
    prefill and every `--decode-log-interval` decode iterations, so up to that many
    iterations at its batch; vLLM's lag by seconds whatever the batch (`VLLM_GAUGE_LAG_S`)."""
    if engine == "vllm":
        return max(floor_s, VLLM_GAUGE_LAG_S)
    if view is None:
        return floor_s
    return max(floor_s, DECODE_LOG_INTERVAL * iteration_time(view, batch(view)))


class RoutingIndex:
    """Views of the reachable backends in groups, their load marks, and the replicas' share."""

    def __init__(self, config: Config, telemetry: Telemetry, peers: PeerTable) -> None:
        replicas = config.replicas
        self._telemetry = telemetry
        self.peers = peers
        self.groups = Groups()
        self._backends: dict[str, Backend] = {}
        self._positions: dict[str, int] = {}
        self._marks: dict[str, LoadMark] = {}
        self._offsets: dict[str, int] = {}  # where each backend's slot split starts
        self.share = Share()
        self.stale_after_s = max(replicas.scrape_stale_s, 2 * config.health.metrics_interval_s)
        self.lag_s = replicas.gauge_lag_s
        self.split = replicas.split
        self._classes_of: dict[str, ClassEstimate] | None = None
        self._classes_key: tuple[int, int] | None = None
        self._classes: dict[str, ClassEstimate] = {}

    def follows(self, backend: Backend) -> bool:
        """Whether the pool still has this very backend (reachable or not): one removed, or
        replaced by a newcomer of the same name, is no longer followed."""
        return self._backends.get(backend.name) is backend

    # Changes -----------------------------------------------------------------------------
    def add(self, backend: Backend) -> None:
        """The pool took `backend` in: follow it (the pool alone adds and removes members)."""
        self._backends[backend.name] = backend
        self.touch(backend)

    def touch(self, backend: Backend, now: float | None = None) -> None:
        """Rebuild one backend's view after anything it shows changed (or drop it). A backend
        the pool no longer has is ignored: its last leases and watches must not bring it back."""
        name = backend.name
        if self._backends.get(name) is not backend:
            return
        position = self._positions.setdefault(name, len(self._positions))
        if not backend.reachable:
            self.groups.remove(name)
            return
        self.groups.put(self._view(backend, time.monotonic() if now is None else now), position)

    def touch_all(self, now: float | None = None) -> None:
        for backend in list(self._backends.values()):
            self.touch(backend, now)

    def moved(self, backend: Backend) -> None:
        """A lease came or went: only the backend's own count (and what follows from it)
        changed, so its view is patched rather than rebuilt."""
        if self._backends.get(backend.name) is not backend:  # `follows`, on every lease
            return
        now = time.monotonic()
        name, own = backend.name, backend.in_flight
        mark = self._mark(name)
        mark.moved(own, now, _HISTORY_S)
        old = self.groups.get(name)
        if old is None or not backend.reachable:
            self.touch(backend, now)
            return
        combined, room = self._load(backend, mark, now)
        view = msgspec.structs.replace(old, in_flight=own, combined=combined, headroom=room)
        self.groups.put(view, self._positions[name])

    def scraped(self, backend: Backend, metrics: BackendMetrics, now: float) -> None:
        """A /metrics answer: the backend's running and queued count, every client's."""
        if not self.follows(backend):
            return
        if metrics.running is not None or metrics.queued is not None:
            total = round((metrics.running or 0) + (metrics.queued or 0))
            self._mark(backend.name).scraped(total, backend.in_flight, now, self._lag(backend))
        self.touch(backend, now)

    def _lag(self, backend: Backend) -> float:
        """How old its gauges may be (`gauge_lag`)."""
        return gauge_lag(backend.engine, self.lag_s, self.groups.get(backend.name))

    def remove(self, name: str) -> None:
        """The pool let `name` go: no view, no marks, and no way back but `add`."""
        self.groups.remove(name)
        self._backends.pop(name, None)
        self._marks.pop(name, None)

    def stale(self, now: float) -> list[Backend]:
        """Reachable backends whose view still counts a scrape that has aged out."""
        out = []
        for backend in self._backends.values():
            view = self.groups.get(backend.name)
            mark = self._marks.get(backend.name)
            aged = mark is not None and not mark.fresh(now, self.stale_after_s)
            if view is not None and view.combined is not None and aged:
                out.append(backend)
        return out

    def _mark(self, name: str) -> LoadMark:
        mark = self._marks.get(name)
        if mark is None:
            mark = self._marks[name] = LoadMark()
        return mark

    # Views -------------------------------------------------------------------------------
    def _view(self, backend: Backend, now: float) -> BackendView:
        steps = backend.steps
        model = None if steps is None else self._telemetry.iteration_model(backend.name, steps)
        base = backend.view(model)
        combined, room = self._load(backend, self._mark(backend.name), now)
        extra: dict[str, object] = {"combined": combined, "headroom": room}
        if model is not None and self.share.replicas > 1:
            mine = IterationWire(
                backend=backend.name, steps=steps or 0, intercept_s=model.intercept,
                per_token_s=model.slope, observations=model.observations, stall_s=model.stall_s,
            )  # fmt: skip
            fit = blend_iteration(mine, self.peers.iteration(backend.name, steps or 0, now))
            extra.update(
                iteration_intercept_s=fit.intercept_s, iteration_per_token_s=fit.per_token_s,
                iteration_samples=fit.observations, iteration_stall_s=fit.stall_s,
            )  # fmt: skip
        return msgspec.structs.replace(base, **extra)

    def _load(self, backend: Backend, mark: LoadMark, now: float) -> tuple[int | None, int | None]:
        """(combined, headroom) of one backend now."""
        own, name = backend.in_flight, backend.name
        offset = self._offsets.get(name)
        if offset is None:
            offset = self._offsets[name] = zlib.crc32(name.encode())  # the same on every replica
        room = headroom(
            mark, own, backend.capacity, self.share, now=now,
            stale_after_s=self.stale_after_s, offset=offset, split=self.split,
        )  # fmt: skip
        return mark.combined(own, now, self.stale_after_s), room

    def view_of(self, name: str) -> BackendView | None:
        return self.groups.get(name)

    def classes(self, instance: str, now: float) -> dict[str, ClassEstimate]:
        """Acceptance and lengths per class, blended over this replica and its live peers;
        rebuilt only when either learned something."""
        own = self._telemetry.classes()  # the same object until something is learned
        peers = self.peers.live(now)
        key = (self.peers.version, len(peers))  # a peer aging out changes it too
        if own is not self._classes_of or key != self._classes_key:
            mine = EstimatesWire(instance=instance, classes=class_wires(self._telemetry))
            self._classes = own if not peers else blend_classes([mine, *peers])
            self._classes_of, self._classes_key = own, key
        return self._classes

    def candidates(self, model: str | None, exclude: Collection[str], now: float) -> Candidates:
        """The groups, with the test a request's backend must pass (`refusal`: reachable,
        circuit allowing, serving `model`, under its limit, with several replicas its share of
        the room, not excluded)."""
        backends = self._backends
        shared = self.share.replicas > 1

        def usable(view: BackendView) -> bool:
            found = backends.get(view.name)
            why = refusal(
                found, view.headroom, model=model, exclude=exclude, shared=shared, now=now
            )
            return why is None

        return Candidates(self.groups, usable)

    def refusal(
        self, backend: Backend, model: str | None, exclude: Collection[str], now: float
    ) -> Refusal | None:
        """Why `backend` may not take a request for `model` now (None: it may), by the same
        rule `candidates` routes with."""
        found = self._backends.get(backend.name)
        view = self.groups.get(backend.name)
        return refusal(
            found if found is backend else None,
            None if view is None else view.headroom,
            model=model,
            exclude=exclude,
            shared=self.share.replicas > 1,
            now=now,
        )

    def pool_view(self, candidates: Candidates, classes: dict[str, ClassEstimate]) -> PoolView:
        groups = self.groups
        return PoolView(
            backends=LazyBackends(candidates),
            classes=classes,
            prior_alpha=self._telemetry.acceptance.prior_alpha,
            in_flight_total=groups.batch_total,
            capacity_total=groups.capacity_total if groups.capacity_known else None,
            candidates=candidates,
        )
