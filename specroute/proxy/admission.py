"""Admission: pick a backend through the policy, or wait in a bounded queue while every
backend is at its in-flight limit; a full queue answers 429, a long wait 503. Interactive
requests go first: no batch request is admitted while an interactive one waits, until
`reserve` interactive requests (one without a reserve) went ahead of it: a batch request waits
at most for the requests queued before it and that many more, never starved."""

from __future__ import annotations

import time
from collections.abc import Collection

import msgspec
import structlog

from specroute.config import AdmissionConfig
from specroute.errors import NoHealthyBackendError, QueueFullError, QueueTimeoutError
from specroute.lanes import INTERACTIVE
from specroute.policies import BackendView, Decision, Policy, PoolView, RouteRequest
from specroute.pool import Lease, Pool
from specroute.proxy.unavailable import unavailable

__all__ = ["Admission"]

log = structlog.get_logger()

# Waiters re-check at least this often: an open circuit closes by time, not by an event.
_RECHECK_S = 0.5


class Admission:
    def __init__(self, pool: Pool, config: AdmissionConfig, reserve: int = 0) -> None:
        self._pool = pool
        self._config = config
        self._reserve = reserve  # slots per deepest backend kept for interactive requests
        self.overtakes = max(1, reserve)
        """Interactive requests that may go ahead of one waiting batch request, at most."""
        self.interactive_admitted = 0
        self._batch_since: dict[int, int] = {}
        """Batch requests waiting, by `interactive_admitted` when each began to wait."""
        self.waiting = 0
        self.interactive_waiting = 0

    async def admit(
        self, request: RouteRequest, policy: Policy, tried: Collection[str] = ()
    ) -> tuple[Lease, Decision]:
        """A lease on the backend the policy chose, preferring backends not `tried` yet."""
        view = self._candidates(request.model, tried)
        interactive = request.lane == INTERACTIVE
        held = self._batch_due() if interactive else self.interactive_waiting
        if view is not None and held and interactive:
            self._pool.notify()  # the due batch request takes this room
        if view is None or held:
            view = await self._wait(request, tried)
        if self._reserve or self.interactive_waiting:
            view = msgspec.structs.replace(
                view, reserve=self._reserve, interactive_waiting=self.interactive_waiting
            )
        decision = _choose(policy, request, view)
        self.interactive_admitted += interactive
        chosen = _chosen(view, decision.backend)
        if chosen is None:
            chosen = view.backends[0]
            decision = Decision(
                backend=chosen.name, reason=f"policy chose {decision.backend!r}, unavailable"
            )
        return self._pool.lease(self._pool.by_name[chosen.name]), decision

    def _candidates(self, model: str | None, tried: Collection[str]) -> PoolView | None:
        view = self._pool.routing_view(model, exclude=tried)
        if view is None and tried:
            view = self._pool.routing_view(model)
        return view

    async def _wait(self, request: RouteRequest, tried: Collection[str]) -> PoolView:
        model, interactive = request.model, request.lane == INTERACTIVE
        retry_after = self._config.retry_after_s
        if not self._pool.healthy(model):
            raise self._no_healthy(model, tried)
        if self.waiting >= self._config.queue_size:
            raise QueueFullError(
                "every backend is at its limit and the wait queue is full",
                retry_after=retry_after,
            )
        deadline = time.monotonic() + self._config.queue_timeout_s
        since = self.interactive_admitted
        self.waiting += 1
        self.interactive_waiting += interactive
        if not interactive:
            self._batch_since[since] = self._batch_since.get(since, 0) + 1
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise QueueTimeoutError(
                        "timed out waiting for a free backend; "
                        + unavailable(self._pool, model, tried),
                        retry_after=retry_after,
                    )
                await self._pool.wait_changed(min(remaining, _RECHECK_S))
                view = self._candidates(model, tried)
                if view is not None and self._goes(interactive, since):
                    return view
                if not self._pool.healthy(model):
                    raise self._no_healthy(model, tried)
        finally:
            self.waiting -= 1
            if interactive:
                self.interactive_waiting -= 1
            else:
                self._batch_since[since] -= 1
                if not self._batch_since[since]:
                    del self._batch_since[since]
            self._pool.notify()  # requests held behind this one may go now

    def _batch_due(self) -> bool:
        """Whether a waiting batch request has let `overtakes` interactive ones ahead: no
        further one goes before it."""
        since = min(self._batch_since, default=None)
        return since is not None and self.interactive_admitted - since >= self.overtakes

    def _goes(self, interactive: bool, since: int) -> bool:
        """Whether a request waiting since `since` (interactive admissions) takes a free slot:
        interactive unless a batch request is due; batch when no interactive request waits
        or it is due itself."""
        if interactive:
            return not self._batch_due()
        waited = self.interactive_admitted - since >= self.overtakes
        return not self.interactive_waiting or waited

    def _no_healthy(self, model: str | None, tried: Collection[str]) -> NoHealthyBackendError:
        """The 503 that says, for each backend, why it could not take this request."""
        served = f" for model {model!r}" if model is not None else ""
        reasons = unavailable(self._pool, model, tried)
        return NoHealthyBackendError(
            f"no healthy backend{served}: {reasons}", retry_after=self._config.retry_after_s
        )


def _choose(policy: Policy, request: RouteRequest, view: PoolView) -> Decision:
    """The policy's decision; when it raises, the first candidate (its failure logged)."""
    try:
        return policy.choose(request, view)
    except Exception as exc:  # a third-party policy must not break routing
        log.exception("policy_choose_failed", policy=policy.name)
        first = view.backends[0].name
        return Decision(backend=first, reason=f"policy failed ({type(exc).__name__}); first")


def _chosen(view: PoolView, name: str) -> BackendView | None:
    """The chosen backend if the view offered it; with the pool's groups only that one is
    tested, not the whole pool."""
    if view.candidates is None:
        return next((b for b in view.backends if b.name == name), None)
    return view.candidates.get(name)
