"""Moving a stream that failed mid-way to another backend (`migrate` says what moves and how
the continuation reads): admit it elsewhere, count what was relayed in that backend's tokens,
send the continuation through the relay's own attempt, and count and log each move."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import structlog

from specroute.errors import SpecrouteError
from specroute.pool import Backend, Lease, UpstreamFailure
from specroute.proxy.exchange import Exchange
from specroute.proxy.intake import Incoming
from specroute.proxy.migrate import Migration, failure_cause, tokenize_body
from specroute.proxy.state import ProxyState

__all__ = ["Attempt", "Mover", "upstream_headers"]

log = structlog.get_logger()

Attempt = Callable[[Exchange, Lease, Incoming, bool], Awaitable[str | None]]
"""The relay's one try on one backend (`Relay._attempt`)."""

_MAX_TOKENIZE_BYTES = 1 << 20


class _Count(msgspec.Struct):
    count: int


_count = msgspec.json.Decoder(_Count)


def upstream_headers(auth: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers of every request the proxy sends a backend."""
    return [(b"content-type", b"application/json"), (b"accept", b"*/*"), *auth]


class Mover:
    """Moves the failed streams of one relay, each within its request's `max_migrations`."""

    def __init__(self, state: ProxyState, attempt: Attempt) -> None:
        self._state = state
        self._attempt = attempt

    async def migrate(self, ex: Exchange, incoming: Incoming, tried: list[str]) -> None:
        """Move `ex`'s stream while it is held after a failure and moves are left; a stream
        that cannot move ends with the error event it would have ended with anyway."""
        mig = ex.migration
        assert mig is not None
        try:
            while ex.reply.held is not None and ex.failure is not None:
                failed_on, failure = ex.failure
                cause = failure_cause(failure)
                outcome = await self._move(ex, mig, incoming, tried)
                self._state.metrics.migrations.inc((cause, outcome))
                log.info(
                    "request_migrated",
                    request_id=ex.request_id,
                    cause=cause,
                    outcome=outcome,
                    refusal=mig.refusal,
                    failed_backend=failed_on,
                    backend=ex.backend,
                    moves=mig.moves,
                    relayed_tokens=mig.relayed,
                )
                if outcome not in ("moved", "failed"):
                    break
        finally:
            await ex.reply.end_held()

    async def _move(
        self, ex: Exchange, mig: Migration, incoming: Incoming, tried: list[str]
    ) -> str:
        """One move; the outcome the metric counts."""
        if mig.refusal is not None:
            return "refused"
        if mig.moves >= mig.limit:
            return "limit"
        state = self._state
        try:
            lease, decision = await state.admission.admit(incoming.request, ex.policy, tried)
        except SpecrouteError:
            return "no_backend"
        stream = ex.reply.stream
        if mig.moves == 0 and stream is not None:
            mig.ttft = stream.ttft
        mig.moves += 1
        handed = False  # the attempt releases the lease from the moment it has it
        try:
            relayed = mig.token_count()
            if relayed is None:
                relayed = await self._tokens(lease.backend, incoming.request.model, mig.text)
            if relayed is None:
                return "failed"
            mig.relayed = relayed
            body = mig.body(incoming.body, relayed, lease.backend.engine)
            if body is None:  # every token it may have was relayed: the answer is whole
                tail = mig.finish_tail()
                if tail is None:
                    return "no_budget"
                ex.reply.held, ex.reply.error = tail, None
                return "finished"
            ex.begin_attempt(lease, decision)
            state.metrics.decisions.inc((ex.policy.name, lease.backend.name))
            tried.append(lease.backend.name)
            ex.reply.error = None
            handed = True
            try:
                await self._attempt(ex, lease, incoming._replace(body=body), True)
            except SpecrouteError as exc:
                ex.reply.error = exc.message
                return "failed"
            return "moved"
        finally:
            if not handed:  # given up, or cancelled (the client left), before the attempt
                lease.release()
                lease.backend.breaker.on_abandon()  # nothing was asked of it: no verdict

    async def _tokens(self, backend: Backend, model: str | None, text: str) -> int | None:
        """`text` in `backend`'s tokens, or None if it cannot say. `/tokenize` is served by
        SGLang 0.5.23 (beside `/v1/tokenize`, `srt/entrypoints/http_server.py`) and by vLLM,
        which has no `/v1/tokenize` (`entrypoints/serve/tokenize/api_router.py`); both answer
        the count as `count`."""
        state = self._state
        timeouts = state.config.timeouts
        upstream = None
        try:
            upstream = await state.client.send(
                "POST",
                backend.url + "/tokenize",
                tokenize_body(model, text),
                upstream_headers(backend.auth_headers),
            )
            body = await upstream.read(timeouts.idle_s, _MAX_TOKENIZE_BYTES)
            if upstream.status != 200:
                return None
            return _count.decode(body).count
        except (UpstreamFailure, msgspec.DecodeError):
            return None
        finally:
            if upstream is not None:
                await upstream.aclose()
