"""Migration for non-streamed chat, completions and `/generate` requests: a backend that fails
after it took the request (the connection drops, it stalls past the attempt's deadline, it
answers a 200 that is not whole JSON) or that drains past `migration.drain_s` costs the
client nothing, because the client has seen nothing: the whole request goes to another
backend, within what is left of the request's `timeouts.reply_s`.

Resending, not continuing: a non-streamed reply shows the proxy none of its text before it
ends, so there is nothing to continue from. Asking the backend for a stream instead and
assembling the reply in the proxy would let a failure continue exactly, but it would put every
non-streamed request through the per-event relay (`python benchmarks/migration_tap.py`: about
3.8 us an event, so 3.9 ms for a 1,024-token reply sent one token an event) and rebuild a
reply SGLang writes itself (`serving_chat.py`'s `_build_chat_response`), to save the work lost
in rare failures. A resent reply is the answering backend's own, usage included.

Moves are bounded as a stream's are (`migration.max_moves`, 1 by default): a request that
brought down two backends is not sent to a third. With `max_moves = 0` a failure is retried
from the start under `retry.max_attempts`, as before migration. A reply that never left (the
connection could not be opened) is a retry, not a move; one over `limits.max_reply_bytes` ends
with its error."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable
from typing import TypeVar

import structlog

from specroute.pool import AttemptLimits, ConnectFailed, Holds, ReplyTooLarge, UpstreamFailure
from specroute.proxy.metrics import ProxyMetrics
from specroute.proxy.migrate import Moved, failure_cause

__all__ = ["RESENT", "Resend", "Resender", "unless_drained"]

log = structlog.get_logger()

RESENT = "resent"
"""The reason an attempt gives when its request goes to another backend as a move."""

_POLL_S = 0.25
"""How often a request in flight looks at its backend for a drain; once the backend drains,
the move is timed to the drain's deadline itself."""

T = TypeVar("T")


class Resend:
    """One non-streamed request's moves: how many it made (at most `limit`), by when it must
    be answered (`deadline`, on the `time.perf_counter` clock), and the failure that waits for
    its next backend (`pending`: its cause and the backend that failed)."""

    __slots__ = ("deadline", "limit", "moves", "pending")

    def __init__(self, limit: int, started: float, within_s: float) -> None:
        self.limit = limit
        self.moves = 0
        self.deadline = started + within_s
        self.pending: tuple[str, str] | None = None

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def bound(self, limits: AttemptLimits) -> AttemptLimits:
        """An attempt's limits, cut to what is left of the request's deadline."""
        left = max(0.0, self.left_s())
        if limits.reply_s <= left and limits.header_s <= left:
            return limits
        return dataclasses.replace(
            limits, header_s=min(limits.header_s, left), reply_s=min(limits.reply_s, left)
        )

    def verdict(self, failed_on: str, exc: UpstreamFailure) -> tuple[str, str] | None:
        """A failed attempt's cause and outcome: None when the failure is not a move's (the
        request never reached the backend, or the reply is too large for the proxy); outcome
        "pending" when the whole request goes to another backend, else why it cannot."""
        if isinstance(exc, ConnectFailed | ReplyTooLarge):
            return None
        cause = failure_cause(exc)
        if self.moves >= self.limit:
            return cause, "limit"
        if self.left_s() <= 0:
            return cause, "no_budget"
        self.pending = (cause, failed_on)
        return cause, "pending"


class Resender:
    """Counts and logs the moves of one relay's non-streamed requests."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def failed(
        self, request_id: str, resend: Resend, failed_on: str, exc: UpstreamFailure
    ) -> bool | None:
        """After an attempt on `failed_on` failed with `exc`: True when the request moves
        (counted once it has its next backend, `settle`), False when it ends with its error
        (counted now), None when the failure is not a move's."""
        verdict = resend.verdict(failed_on, exc)
        if verdict is None:
            return None
        cause, outcome = verdict
        if outcome == "pending":
            return True
        self._count(request_id, resend, cause, outcome, failed_on, None)
        return False

    def settle(self, request_id: str, resend: Resend | None, backend: str | None) -> None:
        """The pending move's end: "moved" to `backend`, or "no_backend" (None)."""
        if resend is None or resend.pending is None:
            return
        (cause, failed_on), resend.pending = resend.pending, None
        if backend is not None:
            resend.moves += 1
        outcome = "moved" if backend is not None else "no_backend"
        self._count(request_id, resend, cause, outcome, failed_on, backend)

    def _count(
        self,
        request_id: str,
        resend: Resend,
        cause: str,
        outcome: str,
        failed_on: str,
        backend: str | None,
    ) -> None:
        self._metrics.migrations.inc((cause, outcome))
        log.info(
            "request_migrated",
            request_id=request_id,
            cause=cause,
            outcome=outcome,
            refusal=None,
            failed_backend=failed_on,
            backend=backend,
            moves=resend.moves,
            relayed_tokens=0,
            whole=True,
        )


async def unless_drained(work: Awaitable[T], holds: Holds, name: str, after_s: float) -> T:
    """`work` (waiting on backend `name`), unless the backend has been draining for `after_s`
    seconds first: then its wait ends with `Moved` (the request is cancelled upstream as the
    connection closes). One timer per request, no task."""
    loop = asyncio.get_running_loop()
    handle: asyncio.TimerHandle | None = None
    try:
        async with asyncio.timeout(None) as timeout:

            def look() -> None:
                nonlocal handle
                held = holds.get(name)
                if held is None or held.state != "draining":
                    handle = loop.call_later(_POLL_S, look)
                    return
                due_s = held.since + after_s - time.monotonic()
                if due_s > 0:
                    handle = loop.call_later(due_s, look)
                else:
                    timeout.reschedule(loop.time())

            look()
            try:
                return await work
            finally:
                if handle is not None:
                    handle.cancel()
    except TimeoutError as exc:
        if timeout.expired():
            raise Moved("the backend is draining: the request moves to another backend") from exc
        raise
