"""Migration for non-streamed chat, completions and `/generate` requests: a backend that fails
after it took the request (the connection drops, it stalls past the attempt's deadline, it
answers a 200 that is not whole JSON) or that drains past `migration.drain_s` costs the
client nothing, because the client has seen nothing: the whole request goes to another
backend, within what is left of the request's `timeouts.reply_s`.

Resending, not continuing: a non-streamed reply shows the proxy none of its text before it
ends, so there is nothing to continue from. Asking the backend for a stream instead and
assembling the reply in the proxy would let a failure continue exactly, but it would put every
non-streamed request through the per-event relay (`python benchmarks/whole_from_stream.py`:
milliseconds for a 1,024-token answer, against microseconds for the whole body) and rebuild a
reply SGLang writes itself (`_build_chat_response` in `srt/entrypoints/openai/serving_chat.py`),
to save the work lost in rare failures. A resent reply is the answering backend's own, usage
included.

Moves are bounded as a stream's are (`migration.max_moves`, 1 by default): a request that
brought down two backends is not sent to a third. With `max_moves = 0` a failure is retried
from the start under `retry.max_attempts`, as before migration. A request that never reached
its backend (no connection) and a 5xx status (the backend's own answer) are retries, not
moves; a reply over `limits.max_reply_bytes` ends with its error."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import structlog

from specroute.pool import AttemptLimits, ConnectFailed, Holds, ReplyTooLarge, UpstreamFailure
from specroute.proxy.metrics import ProxyMetrics
from specroute.proxy.migrate import Moved, failure_cause

__all__ = ["RESENT", "DrainWatch", "Resend", "Resender"]

log = structlog.get_logger()

RESENT = "resent"
"""The reason an attempt gives when its request goes to another backend as a move."""

_POLL_S = 0.25
"""How often the requests in flight are checked for a drain past its deadline."""

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
        left = self.deadline - time.perf_counter()  # `left_s`, without the call
        if limits.reply_s <= left and limits.header_s <= left:
            return limits
        left = max(0.0, left)
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
        self, request_id: str, resend: Resend | None, failed_on: str, exc: UpstreamFailure
    ) -> bool | None:
        """After an attempt on `failed_on` failed with `exc`: True when the request moves
        (counted once it has its next backend, `settle`), False when it ends with its error
        (counted now), None when the request cannot move or the failure is not a move's."""
        if resend is None:
            return None
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


class DrainWatch:
    """Ends the wait of a non-streamed request on a backend that has been draining for
    `after_s` seconds (`Moved`; the connection closes, so the backend drops the request).
    One timer for all the waits, every `_POLL_S` while there are any: a wait costs a dict
    entry (the waiting task, cancelled when its backend drains past the deadline), and moves
    at most `_POLL_S` after the drain's deadline."""

    def __init__(self, holds: Holds, after_s: float) -> None:
        self._holds = holds
        self._after_s = after_s
        self._waits: dict[asyncio.Task[Any], str] = {}
        self._moving: set[asyncio.Task[Any]] = set()  # cancelled by `_look`, not yet raised
        self._timer: asyncio.TimerHandle | None = None

    async def wait(self, work: Awaitable[T], name: str) -> T:
        """`work`, a wait on backend `name`, unless the backend drains past the deadline."""
        task = asyncio.current_task()
        assert task is not None
        self._waits[task] = name
        if self._timer is None:
            self._timer = task.get_loop().call_later(_POLL_S, self._look)
        try:
            return await work
        except asyncio.CancelledError as exc:
            if task not in self._moving:
                raise
            self._moving.discard(task)
            if task.uncancel() > 0:  # cancelled for another reason too: that one wins
                raise
            message = "the backend is draining: the request moves to another backend"
            raise Moved(message) from exc
        finally:
            del self._waits[task]
            if task in self._moving:  # cancelled after its work ended: the cancel is spent
                self._moving.discard(task)

    def _look(self) -> None:
        """End the waits on backends drained past the deadline; look again while any wait."""
        self._timer = None
        if not self._waits:
            return
        now = time.monotonic()
        for task, name in self._waits.items():
            held = self._holds.get(name)
            if held is None or held.state != "draining" or task in self._moving:
                continue
            if now - held.since >= self._after_s:
                self._moving.add(task)
                task.cancel()
        self._timer = asyncio.get_running_loop().call_later(_POLL_S, self._look)
